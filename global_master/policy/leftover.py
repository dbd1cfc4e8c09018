"""Carbyne's leftover scheduler (seed §3.3, Pseudocode 1 line 6).

The leftover is what the entitled capacity holds beyond the running tasks and the
DEFAULT tasks of this plan.  It goes to ALTRUISTIC tasks (runnable, not needed now):

* **SRTF** (default): jobs with the least remaining work first -- work in dominant
  share x seconds of the tasks not yet finished -- and, within a job, the task best
  aligned with the leftover first (packing);
* **packing first** (``carbyne-pack``): all candidates in packing order (Tetris).

Either way a task is admitted only if it fits in what is left of the leftover.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.model import Task
from global_master.policy.jobs import JobState, admit
from global_master.policy.packing import alignment, pack
from global_master.policy.vectors import Vec, dominant


def remaining_work(job: JobState, now: float, capacity: Sequence[float]) -> float:
    """Work left (dominant share x seconds): SRTF's measure of a job."""
    w = job.memo("waiting_work")
    if w is None:
        w = sum(
            dominant(t.demand, capacity) * t.duration
            for st in job.stages.values()
            for t in st.waiting
        )
        job.cached["waiting_work"] = (job.version, w)
    total = float(w)
    for t, since in job.running.values():
        total += dominant(t.demand, capacity) * max(0.0, since + t.duration - now)
    return total


def schedule_leftover(
    candidates: list[tuple[JobState, list[Task]]],
    leftover: Vec,
    cap: Sequence[float],
    now: float,
    *,
    packing_first: bool = False,
) -> list[Task]:
    """The ALTRUISTIC tasks the leftover runs, in order; ``leftover`` is consumed."""
    if packing_first:
        return pack([t for _, ts in candidates for t in ts], leftover, cap)
    out: list[Task] = []
    ranked = sorted(candidates, key=lambda c: (remaining_work(c[0], now, cap), c[0].arrival))
    for _, ts in ranked:
        ordered = sorted(ts, key=lambda t: -alignment(t.demand, leftover, cap))
        out.extend(admit(ordered, leftover))
    return out
