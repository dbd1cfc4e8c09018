"""Garbage-collector pauses of a service process, for operators and benchmarks.

A cyclic collection stops the event loop while it runs, and a full one (generation 2)
walks every object the collector tracks: in a busy GM that is a pause of 0.1 s or
more, every task it was deciding on waits that long.  ``start`` freezes what start-up
made (``gc.freeze``: imports, the config, the core's tables -- about 50,000 objects
per service), so no later collection walks them again, lets ``YOUNG`` allocations
pass between young collections, then times every collection per generation: how many,
the total and the longest pause.  ``/v1/state`` shows them (``gc``);
``benchmarks/bench_live.py`` keeps them per step.
"""

from __future__ import annotations

import gc
import time
from typing import Any

GENERATIONS = 3
YOUNG = 20_000
"""Net allocations of tracked objects between young collections in a service (CPython's
default is 700).  A busy service makes and drops a few messages' worth of small objects
per task: at 700 the three GMs collected 350-370 times from start to the end of a 15-s
step at 3,000 tasks/s (9 times at 20,000), each time moving what was alive (tasks in
flight, messages being read) on to be walked again in the older generation.  Waiting
for 20,000 lets most of it die first.  At 3,000 tasks/s (8 alternating pairs of 15-s
steps in three sittings) the GMs' collections paused them 0.12-0.22 s per step instead
of 0.26-0.61 s, tasks waited for room in a GM's view 24% less often, and allocation p99
was 46-144 ms (median 79) instead of 91-252 (median 164); CPU per task the same."""


class GcWatch:
    """Counts and times the collector's passes in this process."""

    def __init__(self) -> None:
        self.collections = [0] * GENERATIONS
        self.pause_total_s = [0.0] * GENERATIONS
        self.pause_max_s = [0.0] * GENERATIONS
        self.frozen = 0
        self._began = 0.0
        self._thresholds = gc.get_threshold()

    def start(self) -> None:
        """Collect and freeze what exists now; collect the young generation every
        ``YOUNG`` allocations; time every collection from here on."""
        gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        if self._on_gc not in gc.callbacks:  # (started once: the thresholds it found kept)
            self._thresholds = gc.get_threshold()
            gc.set_threshold(YOUNG, *self._thresholds[1:])
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        """Stop timing; the thresholds are what ``start`` found and frozen objects are
        collectable again (a test process runs many services one after the other)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
            gc.set_threshold(*self._thresholds)
        gc.unfreeze()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        g = info["generation"]
        pause = time.perf_counter() - self._began
        self.collections[g] += 1
        self.pause_total_s[g] += pause
        self.pause_max_s[g] = max(self.pause_max_s[g], pause)

    def page(self) -> dict[str, Any]:
        return {
            "frozen_objects": self.frozen,
            "generations": [
                {
                    "collections": self.collections[g],
                    "pause_total_s": round(self.pause_total_s[g], 6),
                    "pause_max_s": round(self.pause_max_s[g], 6),
                }
                for g in range(GENERATIONS)
            ],
        }
