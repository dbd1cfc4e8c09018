"""A worker pool's task timers: one loop timer per tick for every end due in it, fed
at the pool's first wake-up after it is due.

The core asks for a timer per synthetic task (``After(duration, TaskDue)``).  A loop
timer each, at 1,000 tasks/s over three pools, woke each pool about once per task end
(0.85 context switches per task live): the loop's wake-up, the end handled with the
caches cold (about 50 us against 6 us in a hot loop), a journal write of its own, for
one end at a time (``benchmarks/bench_pool_service.py``).

Here the ends due within the same tick of ``tick_s`` share one loop timer, which comes
``grace_s`` after the tick's end; a busy pool is woken before that anyway (a start
comes, its reports leave or are answered) and ``run_due`` then feeds what is due by
now, so most ticks are emptied first and their timers cancelled: the ends ride on
wake-ups the pool has anyway, many in one turn, with one journal write.

A task ends at most ``tick_s + grace_s`` after its duration, never before it (it holds
its resources at least that long); ends fed together go in the order they were asked
for within a tick.  A quiet pool (fewer ends than one a tick) keeps a loop timer per
end: alone in its tick, an end would only wait, and its report leaves at once.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections.abc import Callable

from common.effects import After

log = logging.getLogger("megha.worker.timers")


class _Tick:
    __slots__ = ("due", "handle")

    def __init__(self) -> None:
        self.due: list[tuple[float, object]] = []
        """(when it is due, the message), loop time."""
        self.handle: asyncio.TimerHandle | None = None


RATE_WINDOW_S = 1.0
"""Timers asked for are counted over windows this long (the rate that says busy)."""


class DueTimers:
    """``After`` effects carried out by ticks of ``tick_s`` while busy, a loop timer
    each otherwise (``tick_s`` 0: always).

    Busy: the timers asked for over the latest window came at ``busy_per_tick`` or more
    per tick, or those of the current window so far already did.  A quiet pool's end
    gains nothing by waiting for others (it would be alone in its tick) and its report
    leaves at once, not with a batch: it keeps a timer of its own, on time."""

    def __init__(
        self,
        feed: Callable[[object], object],
        tick_s: float,
        grace_s: float = 0.0,
        *,
        busy_per_tick: float = 1.0,
    ) -> None:
        if not tick_s >= 0 or not grace_s >= 0:
            raise ValueError("tick_s and grace_s must be >= 0")
        self.feed = feed
        self.tick_s = tick_s
        self.grace_s = grace_s if tick_s > 0 else 0.0
        """How long after its tick's end a tick's timer comes: the wake-ups in between
        (``run_due``) feed what is due first."""
        self.busy_per_tick = busy_per_tick
        self.rate = 0.0
        """Timers asked for per second over the latest whole window."""
        self._window = (-math.inf, 0)
        """The current window: when it began (loop time), timers asked for in it."""
        self._ticks: dict[int, _Tick] = {}
        """Messages waiting, by tick (tick ``k`` ends at ``k * tick_s``, loop time)."""
        self._order: list[int] = []
        """The ticks waiting, a heap (a tick fired or emptied stays until popped)."""
        self.timers = 0
        """Loop timers armed so far."""
        self.fed = 0
        """Messages fed so far."""
        self.late_s = 0.0
        """How long after they were due the messages fed so far were fed, summed (the
        ends' wait here: ``late_s / fed`` is the mean)."""

    def after(self, eff: After) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        began, asked = self._window
        if now - began >= RATE_WINDOW_S:
            if asked:  # (the first window: nothing asked before it, its rate unknown)
                self.rate = asked / (now - began)
            began, asked = now, 0
        self._window = (began, asked + 1)
        # the current window so far, over a window's length at least, once it says more
        # (a low bound of its rate): a pool turning busy ticks after ``busy_per_tick``
        # asked a tick over a window, not a whole window after (a timer and a wake-up
        # each until then: 1 s of them, 333 a pool, at the bench's 1,000 tasks/s)
        rate = max(self.rate, (asked + 1) / max(RATE_WINDOW_S, now - began))
        if self.tick_s <= 0 or rate * self.tick_s < self.busy_per_tick:
            self.timers += 1
            loop.call_later(eff.delay, self._fire_one, eff.msg)
            return
        due = now + max(eff.delay, 0.0)
        k = math.ceil(due / self.tick_s)
        tick = self._ticks.get(k)
        if tick is None:
            tick = self._ticks[k] = _Tick()
            tick.handle = loop.call_at(k * self.tick_s + self.grace_s, self._fire, k)
            heapq.heappush(self._order, k)
            self.timers += 1
        tick.due.append((due, eff.msg))

    def pending(self) -> int:
        """Messages waiting for their time."""
        return sum(len(t.due) for t in self._ticks.values())

    def run_due(self) -> int:
        """Feed now every message due by now (before its tick's timer); how many."""
        if not self._order:
            return 0
        now = asyncio.get_running_loop().time()
        order, ticks = self._order, self._ticks
        fed = 0
        while order and (order[0] - 1) * self.tick_s < now:  # the tick has begun
            k = order[0]
            tick = ticks.get(k)
            if tick is None:  # fired already
                heapq.heappop(order)
                continue
            if k * self.tick_s <= now:  # all of it is due
                heapq.heappop(order)
                del ticks[k]
                if tick.handle is not None:
                    tick.handle.cancel()
                fed += self._feed_all(tick.due)
                continue
            ready = [d for d in tick.due if d[0] <= now]
            if ready:
                tick.due = [d for d in tick.due if d[0] > now]
                fed += self._feed_all(ready)
                if not tick.due:
                    heapq.heappop(order)
                    del ticks[k]
                    if tick.handle is not None:
                        tick.handle.cancel()
            break  # the ticks after it have not begun
        return fed

    def _fire_one(self, msg: object) -> None:
        self.fed += 1  # (on time, as the loop's timers go)
        self.feed(msg)

    def _fire(self, k: int) -> None:
        tick = self._ticks.pop(k, None)
        if tick is not None:
            self._feed_all(tick.due)

    def _feed_all(self, due: list[tuple[float, object]]) -> int:
        self.fed += len(due)
        now = asyncio.get_running_loop().time()
        self.late_s += sum(max(now - at, 0.0) for at, _ in due)
        feed = self.feed
        for _, msg in due:
            try:
                feed(msg)
            except Exception:  # as the loop does with a timer's: logged, the others go on
                log.exception("timer message %s failed", type(msg).__name__)
        return len(due)
