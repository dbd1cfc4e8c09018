"""Packing (Tetris, Grandl et al.; Carbyne's efficiency heuristic).

* ``alignment``: Tetris's score of a demand against free resources -- the dot product
  of the two, each normalised by the capacity they are measured against.
* ``pack``: greedy packing of tasks into a room, repeatedly the fitting task best
  aligned with what is still free.
* ``packing_node``: the node choice of the packing policies (Tetris, Carbyne).
* ``TetrisQueues``: Tetris with its fairness knob ``f`` at zero: every runnable task of
  every job competes, in packing order; no fairness, so no task is ever a reason to
  preempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from common.ids import JobId
from common.model import Resources, Task
from global_master.policy.jobs import PLAN_WINDOW, Ask, JobQueues
from global_master.policy.vectors import Vec, fits_in, take

if TYPE_CHECKING:
    from global_master.view import LmView


def alignment(demand: Sequence[float], free: Sequence[float], capacity: Sequence[float]) -> float:
    """Tetris's packing score: the dot product of demand and free resources, normalised."""
    return sum((d / c) * (f / c) for d, f, c in zip(demand, free, capacity, strict=True) if c > 0)


def pack(tasks: list[Task], free: Vec, cap: Sequence[float]) -> list[Task]:
    """Packing order: repeatedly the fitting task best aligned with what is still free
    (tasks with equal demands score alike: one candidate per distinct demand), then
    the tasks that did not fit, in their original order; ``free`` is consumed."""
    if not any(fits_in(d, free) for d in {t.spec.demand for t in tasks}):
        return list(tasks)  # (what is free holds none of them: the usual deep backlog)
    groups: dict[Resources, list[Task]] = {}
    for t in tasks:
        groups.setdefault(t.spec.demand, []).append(t)
    for g in groups.values():
        g.reverse()  # pop() from the end keeps the original order
    out: list[Task] = []
    while groups:
        fitting = [d for d in groups if fits_in(d, free)]
        if not fitting:
            break
        best = max(fitting, key=lambda d: alignment(d, free, cap))
        g = groups[best]
        out.append(g.pop())
        if not g:
            del groups[best]
        take(free, best)
    packed = {t.task_id for t in out}
    return out + [t for t in tasks if t.task_id not in packed]


def packing_node(view: LmView, eligible: Any, demand: Resources) -> int:
    """The eligible node that fits ``demand`` with the best alignment score (Tetris)."""
    best, best_score = -1, -1.0
    free, capacity = view.free, view.capacity
    for i in (eligible & view.avail).search(1):
        f = free[i]
        if all(x >= d for x, d in zip(f, demand, strict=True)):
            score = alignment(demand, f, capacity[i])
            if score > best_score:
                best, best_score = i, score
    return best


class TetrisQueues(JobQueues):
    """Tetris with its fairness knob at zero: every runnable task competes, in packing
    order; no fairness."""

    name = "tetris"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.choose_node = packing_node

    def plan(self, now: float, cap: list[float]) -> tuple[list[Ask], dict[JobId, Vec]]:
        jobs = self.active()
        tasks = [t for j in jobs for t in islice(j.queued.values(), PLAN_WINDOW)]
        # no fairness (knob f = 0): no task has a share behind it
        return [Ask(t, altruistic=True) for t in pack(tasks, self.free(cap, jobs), cap)], {}
