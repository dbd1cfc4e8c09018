"""Shortest job first (Carbyne's JCT upper bound, seed §5.1).

Jobs in the order of their remaining critical path (the critical path method,
``common.dag.finish_times``), shortest first, ties by arrival; within a job its
runnable tasks breadth-first.  Every runnable task is an ask against what is free
(work conserving); no fairness, so every task is ALTRUISTIC: never a reason to preempt.
"""

from __future__ import annotations

from common.ids import JobId
from global_master.policy.jobs import Ask, JobQueues
from global_master.policy.vectors import Vec


class SjfQueues(JobQueues):
    """Shortest job first by remaining critical path; breadth-first within a job."""

    name = "sjf"

    def plan(self, now: float, cap: list[float]) -> tuple[list[Ask], dict[JobId, Vec]]:
        jobs = sorted(self.active(), key=lambda j: (j.critical_path(now), j.arrival, j.job_id))
        # no fairness: no task has a share behind it
        return [Ask(t, altruistic=True) for j in jobs for t in j.breadth_first()], {}
