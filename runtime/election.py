"""The leader election of an LM and its standby: who holds the exclusive leader queue.

Declaring ``<name>.lm.<lm>.leader`` exclusively succeeds for one connection only; the
other is answered ``RESOURCE_LOCKED`` (405): it lost the race, the other process
leads.  Every other answer is not a lost race and must not be taken for one (issue 32,
item 3): a full ``max-queues`` (406 ``PRECONDITION_FAILED``: "queue limit ... is
reached"), a permission refused (403), the queue declared otherwise (406), a broker
gone.  Taken for "someone else leads", a standby waited for ever while no one led.

``Election.tried`` sorts each attempt's answer into ``LEADS``, ``LOST``, ``REFUSED``
or ``UNREACHABLE`` and says how long to wait before the next: a lost race or an
unreachable broker again after ``period_s`` (the holder's death frees the queue at
once); a refusal after a back-off doubling up to ``max_backoff_s``, logged each time
with the broker's words and counted (``page``: the LM's ``/v1/state`` ``leader``).
"""

from __future__ import annotations

import enum
import logging
from typing import Any

import aio_pika
import aiormq

log = logging.getLogger("megha.election")


class Outcome(enum.Enum):
    LEADS = "leads"
    LOST = "lost_race"
    """Another process holds the leader queue."""
    REFUSED = "refused"
    """The broker refused the declaration for another reason: no one may lead."""
    UNREACHABLE = "unreachable"
    """No connection, or it went during the attempt."""


UNREACHABLE_ERRORS = (
    aio_pika.exceptions.AMQPConnectionError,
    aio_pika.exceptions.ChannelInvalidStateError,
    ConnectionError,
    TimeoutError,
    RuntimeError,
)


def classify(exc: BaseException | None) -> Outcome:
    """The outcome of an attempt that raised ``exc`` (None: it did not)."""
    if exc is None:
        return Outcome.LEADS
    if isinstance(exc, aiormq.exceptions.ChannelLockedResource):
        return Outcome.LOST
    if isinstance(exc, aiormq.exceptions.AMQPChannelError):
        return Outcome.REFUSED  # precondition (a full max-queues), access, not found...
    if isinstance(exc, UNREACHABLE_ERRORS):
        return Outcome.UNREACHABLE
    raise exc


class Election:
    """One process's attempts at the lead: their outcomes, counted, and the waits."""

    def __init__(self, who: str, period_s: float, max_backoff_s: float = 30.0) -> None:
        self.who = who
        self.period_s = period_s
        self.max_backoff_s = max_backoff_s
        self.counts = dict.fromkeys((o.value for o in Outcome), 0)
        self.last_refusal = ""
        self._backoff = period_s

    def tried(self, exc: BaseException | None) -> tuple[Outcome, float]:
        """Note an attempt that raised ``exc`` (None: it took the lead); the outcome and
        the seconds to wait before the next attempt."""
        outcome = classify(exc)
        self.counts[outcome.value] += 1
        if outcome is not Outcome.REFUSED:
            self._backoff = self.period_s
            return outcome, self.period_s
        self.last_refusal = str(exc)[:500]
        wait, self._backoff = self._backoff, min(self._backoff * 2, self.max_backoff_s)
        log.error(
            "%s: the broker refused the leader queue (not a lost race: no one may lead); "
            "again in %.1f s: %s", self.who, wait, self.last_refusal,
        )  # fmt: skip
        return outcome, wait

    def page(self) -> dict[str, Any]:
        """What the state page shows."""
        return {"attempts": dict(self.counts), "last_refusal": self.last_refusal}
