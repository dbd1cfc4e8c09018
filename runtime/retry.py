"""The one retry policy of the live federation: exponential backoff with jitter.

Every internal call that can fail transiently (an HTTP post to a peer, a publish, a
broker connection) goes through ``retry``.  A call is retried while it raises one of
``retry_on`` and the policy's deadline is not passed; every retried call must be
idempotent (launches by attempt, reports by attempt, events by message id).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger("megha.retry")

T = TypeVar("T")


class GiveUp(Exception):
    """The deadline passed; ``last`` is the last error seen."""

    def __init__(self, what: str, attempts: int, last: BaseException | None) -> None:
        super().__init__(f"{what}: gave up after {attempts} attempts ({last!r})")
        self.attempts = attempts
        self.last = last


@dataclass(frozen=True)
class Backoff:
    """Delays ``first * factor**k``, capped, each scaled by a random factor in
    ``[1 - jitter, 1 + jitter]``; ``deadline_s`` bounds the whole call (None: forever)."""

    first_s: float = 0.02
    factor: float = 2.0
    cap_s: float = 1.0
    jitter: float = 0.5
    deadline_s: float | None = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.cap_s, self.first_s * self.factor**attempt)
        return base * (1.0 + self.jitter * (2.0 * rng.random() - 1.0))


_RNG = random.Random()


async def retry(
    call: Callable[[], Awaitable[T]],
    policy: Backoff,
    *,
    what: str,
    retry_on: tuple[type[BaseException], ...],
    on_retry: Callable[[BaseException], None] | None = None,
    rng: random.Random = _RNG,
    failed: BaseException | None = None,
    start: float | None = None,
) -> T:
    """``await call()`` until it succeeds, retrying on ``retry_on`` with backoff.

    ``failed``: the caller made the first try itself, at ``start`` (``time.monotonic``),
    and it failed with this (``on_retry`` already told of it): the first try here is the
    second, after its delay, within the same deadline."""
    start = time.monotonic() if start is None else start
    attempt = 0
    last: BaseException | None = failed
    while True:
        if last is None or attempt:
            try:
                return await call()
            except retry_on as exc:
                last = exc
                if on_retry is not None:
                    on_retry(exc)
        delay = policy.delay(attempt, rng)
        attempt += 1
        if policy.deadline_s is not None and time.monotonic() + delay - start > policy.deadline_s:
            raise GiveUp(what, attempt, last)
        if attempt in (1, 10) or attempt % 100 == 0:
            log.warning("%s: attempt %d failed (%r); retrying", what, attempt, last)
        await asyncio.sleep(delay)
