"""Weighted DRF across jobs (seed lecture notes on DRF; Carbyne's inter-job scheduler).

* ``drf_allocation``: progressive filling.  Every job's allocation grows along its
  demand vector, its dominant share at a rate proportional to its weight, until its
  demand is met or a resource it uses is exhausted.  The result ``A_k`` is exact (no
  iteration tolerance beyond ``EPS``) and never exceeds the capacity.
* ``job_allocations``: a job's demand is what it runs plus what is runnable; the
  jobs of one user split the user's weight (its configured share).
* ``DrfQueues`` admits each job's runnable tasks breadth-first while they fit in
  ``A_k`` minus what the job holds -- strict shares, as in the paper's Fig. 2b.
  ``drf-wc`` then hands what is left to the job with the lowest weighted dominant
  share, one task at a time (work conserving, as Mesos's or YARN's DRF).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from common.ids import JobId, TaskId, UserId
from common.model import Task
from global_master.policy.jobs import JobQueues, JobState, admit, round_robin
from global_master.policy.vectors import EPS, Vec, dominant, fits_in, give, take


def drf_allocation(
    capacity: Sequence[float], demands: Sequence[Sequence[float]], weights: Sequence[float]
) -> list[Vec]:
    """Weighted DRF by progressive filling, each job capped at its demand; one
    allocation vector per job."""
    n, m = len(demands), len(capacity)
    dirs: list[Vec] = []
    caps: list[float] = []
    share = [0.0] * n
    active: set[int] = set()
    for k, d in enumerate(demands):
        dom = dominant(d, capacity)
        caps.append(dom)
        dirs.append([x / dom for x in d] if dom > 0 else [0.0] * m)
        if dom > 0 and weights[k] > 0:
            active.add(k)
    used = [0.0] * m
    while active:
        step = min((caps[k] - share[k]) / weights[k] for k in active)
        for r in range(m):
            rate = sum(weights[k] * dirs[k][r] for k in active)
            if rate > 0:
                step = min(step, max(0.0, (capacity[r] - used[r]) / rate))
        for k in active:
            share[k] += weights[k] * step
        used = [sum(share[k] * dirs[k][r] for k in range(n)) for r in range(m)]
        full = {r for r in range(m) if used[r] >= capacity[r] - EPS * max(1.0, capacity[r])}
        for k in list(active):
            if share[k] >= caps[k] - EPS or any(dirs[k][r] > 0 for r in full):
                active.discard(k)
    return [[share[k] * x for x in dirs[k]] for k in range(n)]


def job_allocations(
    jobs: Sequence[JobState], cap: Sequence[float], shares: Mapping[UserId, float]
) -> list[Vec]:
    """``A_k`` of every job: DRF over running + runnable demand, a user's weight split
    evenly among its jobs."""
    m = len(cap)
    per_user: dict[UserId, int] = {}
    demands: list[Vec] = []
    for j in jobs:
        d = j.usage(m)
        for t in j.queued.values():
            give(d, t.demand)
        demands.append(d)
        per_user[j.user] = per_user.get(j.user, 0) + 1
    weights = [shares.get(j.user, 1.0) / per_user[j.user] for j in jobs]
    return drf_allocation(cap, demands, weights)


def room_left(job: JobState, alloc: Sequence[float]) -> Vec:
    """``A_k`` minus what the job already holds."""
    return [a - u for a, u in zip(alloc, job.usage(len(alloc)), strict=True)]


class DrfQueues(JobQueues):
    """Weighted DRF across jobs (strict shares), breadth-first within a job."""

    name = "drf"

    def __init__(self, *args: Any, work_conserving: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.work_conserving = work_conserving

    def plan(self, now: float, cap: list[float]) -> tuple[list[Task], set[TaskId]]:
        jobs = self.active()
        allocs = job_allocations(jobs, cap, self.shares)
        lists = [
            admit(j.breadth_first(), room_left(j, a), force_first=not j.running)
            for j, a in zip(jobs, allocs, strict=True)
        ]
        plan = round_robin(lists)
        if self.work_conserving:
            plan.extend(self._fill(jobs, cap, plan))
        return plan, set()

    def _fill(self, jobs: list[JobState], cap: list[float], taken: list[Task]) -> list[Task]:
        """What is left, lowest dominant share first (one task at a time)."""
        m = len(cap)
        free = self.free(cap, jobs)
        held = {j.job_id: j.usage(m) for j in jobs}
        chosen = {t.task_id for t in taken}
        for t in taken:
            take(free, t.demand)
            give(held[t.job_id], t.demand)
        # free only shrinks here: a task that does not fit now never will, drop it
        waiting = {
            j.job_id: deque(t for t in j.breadth_first() if t.task_id not in chosen) for j in jobs
        }
        out: list[Task] = []
        while True:
            best: tuple[float, JobId] | None = None
            for jid, ts in waiting.items():
                while ts and not fits_in(ts[0].demand, free):
                    ts.popleft()
                if not ts:
                    continue
                w = self.shares.get(self.jobs[jid].user, 1.0) or 1.0
                ds = dominant(held[jid], cap) / w
                if best is None or ds < best[0]:
                    best = (ds, jid)
            if best is None:
                return out
            jid = best[1]
            t = waiting[jid].popleft()
            out.append(t)
            take(free, t.demand)
            give(held[jid], t.demand)
