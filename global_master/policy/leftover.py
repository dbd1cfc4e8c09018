"""Carbyne's leftover scheduler (seed §3.3, Pseudocode 1 line 6).

The leftover is what the entitled capacity holds beyond the running tasks and the
DEFAULT tasks of this plan.  It goes to ALTRUISTIC tasks (runnable, not needed now):

* **SRTF** (default): jobs with the least remaining work first -- work in dominant
  share x seconds of the tasks not yet finished -- and, within a job, the task best
  aligned with the leftover first (packing);
* **packing first** (``carbyne-pack``): all candidates in packing order (Tetris).

Either way the result is an order: a task runs on the leftover only if it fits in what
is left of it when its turn comes.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.model import Task
from global_master.policy.jobs import JobState, admit
from global_master.policy.packing import alignment, pack
from global_master.policy.vectors import Vec


def schedule_leftover(
    candidates: list[tuple[JobState, list[Task]]],
    leftover: Vec,
    cap: Sequence[float],
    now: float,
    *,
    packing_first: bool = False,
) -> list[Task]:
    """Every candidate in the order the leftover goes to them (first fit in that order
    is what the leftover runs); ``leftover`` is consumed by those that fit."""
    if packing_first:
        return pack([t for _, ts in candidates for t in ts], leftover, cap)
    out: list[Task] = []
    ranked = sorted(candidates, key=lambda c: (c[0].remaining_work(now, cap), c[0].arrival))
    for _, ts in ranked:
        ordered = sorted(ts, key=lambda t: -alignment(t.demand, leftover, cap))
        admit(ordered, leftover)
        out.extend(ordered)
    return out
