"""Carbyne's leftover scheduler (seed §3.3, Pseudocode 1 line 6).

The leftover is what the entitled capacity holds beyond the running tasks and the
DEFAULT tasks of this plan.  It goes to ALTRUISTIC tasks (runnable, not needed now):

* **SRTF** (default): jobs with the least remaining work first -- work in dominant
  share x seconds of the tasks not yet finished -- each job's tasks in its own order
  (latest start first: its critical tasks); what does not fit then goes by packing;
* **packing first** (``carbyne-pack``): all candidates in packing order (Tetris).

Either way the result is an order: a task runs on the leftover only if it fits in what
is left of it when its turn comes.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.model import Task
from global_master.policy.jobs import JobState, admit
from global_master.policy.packing import pack
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
    is what the leftover runs); ``leftover`` is consumed by those that fit.

    ``candidates`` are (job, its ALTRUISTIC tasks in its own order: the most critical
    first).  SRTF: jobs least remaining work first, each job's tasks first fit in its
    order; then what did not fit, packed into what is left (Tetris)."""
    if packing_first:
        return pack([t for _, ts in candidates for t in ts], leftover, cap)
    out: list[Task] = []
    rest: list[Task] = []
    ranked = sorted(candidates, key=lambda c: (c[0].remaining_work(now, cap), c[0].arrival))
    for _, ts in ranked:
        fit = admit(ts, leftover)
        if not fit:  # (the usual case once the leftover is spent)
            rest += ts
            continue
        out.extend(fit)
        taken = {t.task_id for t in fit}
        rest.extend(t for t in ts if t.task_id not in taken)
    return out + pack(rest, leftover, cap)
