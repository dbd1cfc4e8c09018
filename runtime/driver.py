"""Drives a pure core on the event loop: messages in, effects carried out.

A service builds one ``CoreDriver`` around its core and registers, per effect type,
what carrying it out means (post to a peer, publish, acknowledge...).  ``feed`` is
the only way a message reaches the core; the answer to a request (``Reply``) is
returned to the caller.  ``After`` effects become timers that feed their message
back.  ``Batcher`` collects what leaves during one loop turn and sends it as one
message per destination (events per GM, starts per worker pool, reports per LM).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from common.effects import After, Effect, Reply
from runtime.clock import steady
from runtime.supervisor import Supervisor


class Core(Protocol):
    def handle(self, msg: object, now: float) -> list[Effect]: ...


K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
E = TypeVar("E")


class CoreDriver:
    """Feeds a core its messages and carries out the effects it returns, with the time
    of ``clock``: the process's steady clock (``runtime.clock``), never the wall clock,
    since leases and liveness are decided on it."""

    def __init__(
        self, core: Core, supervisor: Supervisor, *, clock: Callable[[], float] = steady
    ) -> None:
        self.core = core
        self.sup = supervisor
        self.clock = clock
        self._handlers: dict[type, Callable[[Any], None]] = {After: self._after}
        self.tap: Callable[[object, float], None] | None = None
        """Sees every message fed, with its time (the parity test records through it)."""

    def on(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """Carry out effects of type ``kind`` with ``handler``."""
        self._handlers[kind] = handler

    def feed(self, msg: object) -> object | None:
        """Hand ``msg`` to the core now; carry out its effects; return its reply, if any."""
        now = self.clock()
        if self.tap is not None:
            self.tap(msg, now)
        return self.carry_out(self.core.handle(msg, now))

    def carry_out(self, effects: Sequence[Effect]) -> object | None:
        reply: object | None = None
        handlers = self._handlers
        for eff in effects:
            if type(eff) is Reply:
                reply = eff.msg
                continue
            try:
                handler = handlers[type(eff)]
            except KeyError:
                raise TypeError(f"no handler for {type(eff).__name__} effects") from None
            handler(eff)
        return reply

    def _after(self, eff: After) -> None:
        asyncio.get_running_loop().call_later(eff.delay, self.feed, eff.msg)

    def every(self, period_s: float, make: Callable[[], object], what: str) -> None:
        """Feed ``make()`` every ``period_s`` seconds (a periodic timer message)."""

        async def tick() -> None:
            while True:
                await asyncio.sleep(period_s)
                steady.observe()  # a step of the wall clock shows on the state page
                self.feed(make())

        self.sup.run_forever(tick(), what)


class Traffic:
    """Messages on one path and the items they carried (``items / messages`` is the
    mean batch): what ``/v1/state`` shows under ``batches``."""

    __slots__ = ("items", "messages")

    def __init__(self) -> None:
        self.messages = 0
        self.items = 0

    def note(self, items: int) -> None:
        self.messages += 1
        self.items += items

    def as_dict(self) -> dict[str, int]:
        return {"messages": self.messages, "items": self.items}


class EndLag:
    """Task ends that passed a point of the completion path, and their summed lag there:
    that point's clock minus the end on the worker (benchmarks: where an end's way to its
    GM goes, segment by segment; ``common.metrics``' ``end_lag_s`` is the GM's own)."""

    __slots__ = ("ends", "lag_s")

    def __init__(self) -> None:
        self.ends = 0
        self.lag_s = 0.0

    def note(self, ends: Iterable[float], now: float) -> None:
        """``ends``: when each end passing now happened (the same clock as ``now``)."""
        for at in ends:
            self.ends += 1
            self.lag_s += now - at

    def as_dict(self) -> dict[str, float]:
        return {"ends": self.ends, "lag_s": round(self.lag_s, 6)}


class Batcher(Generic[K, T]):
    """Items collected during one loop turn, flushed once per key.

    ``flush(key, items)`` runs as a supervised job; items added while it runs go into
    the next flush of that key, so one destination gets one message at a time, in
    order.  With ``linger_s``, a *busy* destination's flush starts no sooner than that
    after its previous one began (Nagle's rule), so its items travel together and
    messages per item fall as the rate grows.  Busy: its items arrive fast enough that
    lingering gathers at least ``min_batch`` of them (the rate is estimated from the
    previous flushes, over windows of ``rate_window_s``: the latest complete one, or the
    current one so far once that says busy); a quiet destination's item goes at once,
    never waiting.

    With ``headroom`` (free slots where the items come from), lingering is bounded
    by what it holds: an ended task's slot counts as busy until its report or event
    arrives, so items that wait up to ``w`` at ``r`` per second hold up to ``r * w``
    slots (Little's law).  The wait is cut to ``headroom / (2 * r)``, ``r`` the rate
    over every key: while slots are plenty the batching saves CPU at no cost, and as
    they run out the items leave sooner, at once when none is free.
    """

    def __init__(
        self,
        sup: Supervisor,
        flush: Callable[[K, list[T]], Awaitable[None]],
        what: str,
        *,
        max_items: int = 5000,
        linger_s: float = 0.0,
        min_batch: int = 4,
        rate_window_s: float | None = None,
        headroom: Callable[[], int] | None = None,
    ) -> None:
        self.sup = sup
        self._flush = flush
        self.what = what
        self.max_items = max_items
        self.linger_s = linger_s
        self.min_batch = min_batch
        self.headroom = headroom
        self._began: dict[K, float] = {}
        self._rate: dict[K, float] = {}
        """Items per second of each key over its latest complete window."""
        self._window: dict[K, tuple[float, int]] = {}
        """Each key's current window: when it began, items flushed in it so far."""
        self.rate_window_s = max(10 * linger_s, 0.1) if rate_window_s is None else rate_window_s
        self._pending: dict[K, list[T]] = {}
        self._busy: set[K] = set()
        self._added: dict[K, int] = {}
        self._sent: dict[K, int] = {}
        self._waiters: list[tuple[dict[K, int], asyncio.Future[None]]] = []
        """Callers in ``sent``: their tickets and the future a flush that sends the last
        of them sets (a future each, no condition and its lock to take and wake)."""
        self._flushing: set[K] = set()
        """Keys whose flush is under way (handed its items, awaiting its answer)."""
        self._handed: dict[K, list[asyncio.Future[None]]] = {}
        self.sent_traffic = Traffic()

    def add(self, key: K, item: T) -> int:
        """Queue ``item`` for ``key``; returns its ticket (see ``sent``)."""
        items = self._pending.get(key)
        if items is None:
            items = self._pending[key] = []
            if key not in self._busy:
                self._busy.add(key)
                self.sup.spawn(self._drain(key), self.what)
        items.append(item)
        n = self._added[key] = self._added.get(key, 0) + 1
        return n

    async def sent(self, tickets: dict[K, int]) -> None:
        """Wait until the items with these tickets (per key) have been flushed."""
        if self._done(tickets):
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((tickets, fut))
        await fut

    def _done(self, tickets: dict[K, int]) -> bool:
        sent = self._sent
        return all(sent.get(k, 0) >= n for k, n in tickets.items())

    def _wake_sent(self) -> None:
        """Wake the callers of ``sent`` whose tickets have all been flushed (and drop
        those no longer waiting: cancelled)."""
        waiting = []
        for entry in self._waiters:
            fut = entry[1]
            if fut.done():
                continue
            if self._done(entry[0]):
                fut.set_result(None)
            else:
                waiting.append(entry)
        self._waiters = waiting

    async def handed(self, key: K) -> None:
        """Wait until the items queued for ``key`` so far are handed to a flush and it
        has sent them, so what the caller does next -- answering whoever sent them --
        goes after them.  At once if ``key`` has nothing queued, lingers, or is busy
        with an earlier flush (its items would wait for that flush's answer: nothing to
        gain by waiting with them)."""
        if self.linger_s > 0 or key in self._flushing or not self._pending.get(key):
            return
        fut = asyncio.get_running_loop().create_future()
        self._handed.setdefault(key, []).append(fut)
        await fut
        # the flush has sent up to its first wait; an aiohttp client writes the body
        # from a task of its own, started then: one turn more lets it go first
        await asyncio.sleep(0)

    def _wake_handed(self, key: K) -> None:
        for fut in self._handed.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    def _lingers(self, key: K, now: float) -> bool:
        if self.linger_s <= 0:
            return False
        began = self._began.get(key)
        if began is None or now - began > self.rate_window_s + self.linger_s:
            return False  # quiet for a while: whatever it was, it is not busy now
        return self._rate_of(key, now) * self.linger_s >= self.min_batch

    def _rate_of(self, key: K, now: float) -> float:
        """Items per second: the latest complete window's, or the current window's so
        far if that is already more (counted over ``rate_window_s`` at least, it is a
        low bound of what its window will show).  A destination that turns busy lingers
        once ``min_batch`` items a linger have come over a window's length, not a whole
        window after: at 1,000 tasks/s, 0.12 s after a quiet spell instead of 0.5 s
        (and 2 s at ``linger_s`` 0.2), during which it sent a message per round trip."""
        rate = self._rate.get(key, 0.0)
        window = self._window.get(key)
        if window is not None and window[1]:
            rate = max(rate, window[1] / max(self.rate_window_s, now - window[0], 1e-6))
        return rate

    def _linger_until(self, key: K, now: float) -> float:
        """When a busy key's next flush may begin (loop time)."""
        began = self._began.get(key, -math.inf)
        until = began + self.linger_s
        if self.headroom is not None:
            recent = began - self.rate_window_s - self.linger_s
            rate = sum(self._rate_of(k, now) for k, b in self._began.items() if b >= recent)
            if rate > 0:
                until = min(until, began + max(self.headroom(), 0) / (2 * rate))
        return until

    def _note_rate(self, key: K, n: int, now: float) -> None:
        """A flush of ``n`` items begins.  The rate is items per second over windows of
        ``rate_window_s`` (a burst of a few items is not a busy destination)."""
        self._began[key] = now
        window = self._window.get(key)
        if window is None:  # this flush's items came before any window began
            self._window[key] = (now, 0)
            return
        start, count = window[0], window[1] + n
        if now - start >= self.rate_window_s:
            self._rate[key] = count / max(now - start, 1e-6)
            start, count = now, 0
        self._window[key] = (start, count)

    def traffic(self) -> dict[str, int]:
        """Messages sent and items they carried (operators; benchmarks)."""
        return self.sent_traffic.as_dict()

    def pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    async def _drain(self, key: K) -> None:
        try:
            await asyncio.sleep(0)  # let the current turn add its items
            loop = asyncio.get_running_loop()
            # without a linger, the rates are never asked for: not kept either
            lingers = self.linger_s > 0
            while True:
                if lingers:
                    now = loop.time()
                    if self._lingers(key, now):
                        wait = self._linger_until(key, now) - now
                        if wait > 0:
                            await asyncio.sleep(wait)
                items = self._pending.pop(key, None)
                if not items:
                    return
                if lingers:
                    self._note_rate(key, len(items), loop.time())
                self._flushing.add(key)
                self._wake_handed(key)  # they resume once this flush has sent and waits
                n, most = len(items), self.max_items
                for i in range(0, n, most):
                    chunk = items if n <= most else items[i : i + most]
                    await self._flush(key, chunk)
                    self.sent_traffic.note(len(chunk))
                    self._sent[key] = self._sent.get(key, 0) + len(chunk)
                    if self._waiters:
                        self._wake_sent()
                self._flushing.discard(key)
        finally:
            self._flushing.discard(key)
            self._wake_handed(key)
            self._busy.discard(key)
            if self._pending.get(key):  # added after the last pop: drain again
                self._busy.add(key)
                self.sup.spawn(self._drain(key), self.what)
