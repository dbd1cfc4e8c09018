"""Virtual time: an event heap of ``(time, seq, callback, args)`` (SimPy's shape).

The monotone ``seq`` breaks ties in insertion order, so a run is a pure function of
its inputs and seed.  Model code asks ``now`` and schedules callbacks; nothing here
knows about schedulers.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

_push = heapq.heappush

_FIRST = 1 << 62
"""Arrivals (``EventLoop.arrival``) take sequence numbers below every other event's."""


class EventLoop:
    """A discrete-event loop in virtual seconds."""

    __slots__ = ("_heap", "_seq", "events", "now")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.now = 0.0
        self.events = 0

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at virtual time ``t`` (never in the past)."""
        self._seq = seq = self._seq + 1
        now = self.now
        _push(self._heap, (t if t > now else now, seq, fn, args))

    def arrival(self, t: float, rank: int, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` at ``t`` before every other event of that instant, after
        the arrivals of lower ``rank``: as if every arrival had been scheduled with
        ``at`` before anything else, though each is scheduled only when the one before
        it arrives (a streamed workload, never held whole)."""
        heapq.heappush(self._heap, (t if t > self.now else self.now, rank - _FIRST, fn, args))

    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq = seq = self._seq + 1
        now = self.now
        t = now + delay
        _push(self._heap, (t if t > now else now, seq, fn, args))

    def __len__(self) -> int:
        return len(self._heap)

    def run(
        self,
        *,
        until: float | None = None,
        stop: Callable[[], bool] | None = None,
        progress: Callable[[float], None] | None = None,
        progress_every: int = 200_000,
    ) -> None:
        """Process events in time order until the heap is empty, ``until``, or ``stop()``."""
        heap = self._heap
        pop = heapq.heappop
        n = 0
        mark = progress_every
        while heap:
            entry = pop(heap)
            t = entry[0]
            if until is not None and t > until:
                heapq.heappush(heap, entry)  # (the same entry: its place is unchanged)
                break
            self.now = t
            entry[2](*entry[3])
            n += 1
            if n == mark:
                mark += progress_every
                if progress is not None:
                    progress(t)
                if stop is not None and stop():
                    break
        self.events += n
