"""Shortest job first (Carbyne's JCT upper bound, seed §5.1).

A job's length is found by the critical path method run with its resources: its
remaining DAG list-scheduled alone on the entitled capacity (``job_finish``; on an
idle cluster of unbounded size this is the plain critical path, on a real one it also
counts a wide stage's tasks that cannot all run at once).  Jobs go shortest remaining
first, ties by arrival; within a job the tasks on its longest remaining path first
(CPM), then breadth-first.  Every runnable task is an ask against what is free (work
conserving); no fairness, so every task is ALTRUISTIC: never a reason to preempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice

from common.dag import finish_times
from common.ids import JobId
from common.model import Task
from global_master.policy.altruism import job_finish
from global_master.policy.altruism_tail import TailRun, chain_tail
from global_master.policy.jobs import PLAN_WINDOW, Ask, JobQueues, JobState, StageState
from global_master.policy.vectors import Vec


def job_finish_alone(job: JobState, now: float, cap: list[float]) -> float:
    """When the job's remaining DAG would end if it had ``cap`` to itself (kept until
    one of its tasks changes; a large job's, ``JobState.memo``)."""
    hit = job.memo("finish_alone")
    if hit is None:
        hit = job_finish(now, cap, cap, job)
        job.keep("finish_alone", hit)
    return float(hit)


def critical_first(job: JobState, cap: Sequence[float] = ()) -> list[Task]:
    """Runnable tasks, longest remaining path to the job's end first (CPM), then
    breadth-first: the plan's window of them (``PLAN_WINDOW``)."""
    hit = job.memo("critical_first")
    if hit is None:
        tail = _longest_to_end(job, cap)
        rank = {t.task_id: k for k, t in enumerate(job.breadth_first())}
        hit = sorted(
            job.queued.values(),
            key=lambda t: (-tail.get(job.stage_of[t.task_id], 0.0), rank[t.task_id]),
        )
        job.keep("critical_first", hit)
    queued = job.queued  # (kept a few task ends ago: some may have started since)
    return list(islice((t for t in hit if t.task_id in queued), PLAN_WINDOW))


def _longest_to_end(job: JobState, cap: Sequence[float]) -> dict[int, float]:
    """Each stage's longest path to the job's end: ``finish_times`` on the reversed DAG
    (its keys: the stages with a child), each stage as long as its longest waiting task.
    A chain the job ends with (``altruism_tail``, as ``job_finish`` finds it) enters as
    its first link's value, kept: the same floats, from the stages before it only."""
    children = job.children()
    found = chain_tail(job, cap) if cap else None
    stages: Mapping[int, StageState] = job.stages
    floor: dict[int, float] | None = None
    rev: Mapping[int, list[int]] = children
    if found is not None:
        tail, front = found
        stages = TailRun(job, found, cap, forward=True).head(stages)
        rev = {s: children[s] for s in stages if s in children}
        entry = tail.links[front]
        paths = tail.critical()
        if entry in paths:  # a stage of length 0 that ends no sooner than its value
            rev[entry] = []
            floor = {entry: paths[entry]}
    length = {
        s: max((t.duration for t in st.waiting.values()), default=0.0) for s, st in stages.items()
    }
    if floor is not None:
        length.update(dict.fromkeys(floor, 0.0))
    return finish_times(rev, length, not_before=floor)


class SjfQueues(JobQueues):
    """Shortest remaining job first by resource-aware critical path; CPM within a job."""

    name = "sjf"

    def plan(self, now: float, cap: list[float]) -> tuple[list[Ask], dict[JobId, Vec]]:
        jobs = sorted(
            self.active(), key=lambda j: (job_finish_alone(j, now, cap), j.arrival, j.job_id)
        )
        # no fairness: no task has a share behind it
        return [Ask(t, altruistic=True) for j in jobs for t in critical_first(j, cap)], {}
