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
  share, one task at a time (work conserving, as Mesos's or YARN's DRF); those
  extra tasks are beyond the job's share: ALTRUISTIC in the GM's sense.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from common.ids import JobId, UserId
from common.model import Task
from global_master.policy.jobs import (
    Ask,
    JobQueues,
    JobState,
    admit,
    breadth_first,
    breadth_first_asks,
    round_robin,
)
from global_master.policy.vectors import EPS, Vec, dominant, fits_in, give, take


def drf_allocation(
    capacity: Sequence[float], demands: Sequence[Sequence[float]], weights: Sequence[float]
) -> list[Vec]:
    """Weighted DRF by progressive filling, each job capped at its demand; one
    allocation vector per job.

    A sweep over the fill level ``lam`` (dominant share per unit of weight): job k's
    dominant share is ``w_k * lam`` until it reaches its demand's (at ``lam_k``) or a
    resource it uses fills up.  Events in order: O(n log n + n m) for n jobs, m
    resources.
    """
    m = len(capacity)
    caps = [dominant(d, capacity) for d in demands]
    dirs = [[x / c for x in d] if c > 0 else [0.0] * m for d, c in zip(demands, caps, strict=True)]
    return _fill(capacity, caps, dirs, weights)


def _fill(
    capacity: Sequence[float],
    caps: Sequence[float],
    dirs: Sequence[Vec],
    weights: Sequence[float],
) -> list[Vec]:
    """``drf_allocation`` given each job's dominant share of its demand (``caps``) and
    its demand per unit of dominant share (``dirs``)."""
    n, m = len(caps), len(capacity)
    share = [0.0] * n
    order = sorted((caps[k] / weights[k], k) for k in range(n) if caps[k] > 0 and weights[k] > 0)
    active = {k for _, k in order}
    rate = [sum(weights[k] * dirs[k][r] for k in active) for r in range(m)]
    base = [0.0] * m  # what frozen jobs hold
    full: set[int] = set()
    nxt = 0
    while active:
        while order[nxt][1] not in active:
            nxt += 1
        lam_cap = order[nxt][0]
        lam_full, r_full = lam_cap, -1
        for r in range(m):
            if r not in full and rate[r] > EPS:
                lam = max(0.0, (capacity[r] - base[r]) / rate[r])
                if lam < lam_full:
                    lam_full, r_full = lam, r
        if r_full < 0:  # the next job's demand is met before any resource fills
            frozen = [order[nxt][1]]
            lam = lam_cap
        else:
            full.add(r_full)
            frozen = [k for k in active if dirs[k][r_full] > 0]
            lam = lam_full
        for k in frozen:
            share[k] = min(caps[k], weights[k] * lam)
            active.discard(k)
            for r in range(m):
                rate[r] -= weights[k] * dirs[k][r]
                base[r] += share[k] * dirs[k][r]
    return [[share[k] * x for x in dirs[k]] for k in range(n)]


def job_allocations(
    jobs: Sequence[JobState], cap: Sequence[float], shares: Mapping[UserId, float]
) -> list[Vec]:
    """``A_k`` of every job: DRF over running + runnable demand, a user's weight split
    evenly among its jobs."""
    m = len(cap)
    per_user: dict[UserId, int] = {}
    caps: list[float] = []
    dirs: list[Vec] = []
    for j in jobs:
        # the job's demand, its dominant share and direction: the same floats as
        # drf_allocation makes of them, kept until the job's tasks change
        hit = j.kept("drf_direction")
        if hit is None or hit[0] != cap:
            d = j.demand(m)
            c = dominant(d, cap)
            hit = (list(cap), c, [x / c for x in d] if c > 0 else [0.0] * m)
            j.keep_for_stamp("drf_direction", hit)
        caps.append(hit[1])
        dirs.append(hit[2])
        per_user[j.user] = per_user.get(j.user, 0) + 1
    weights = [shares.get(j.user, 1.0) / per_user[j.user] for j in jobs]
    return _fill(cap, caps, dirs, weights)


def room_left(job: JobState, alloc: Sequence[float]) -> Vec:
    """``A_k`` minus what the job already holds (holding nothing: ``a - 0.0`` is ``a``)."""
    held = job._held
    if not held:
        return list(alloc)
    return [a - u for a, u in zip(alloc, held, strict=True)]


class DrfQueues(JobQueues):
    """Weighted DRF across jobs (strict shares), breadth-first within a job."""

    name = "drf"

    def __init__(self, *args: Any, work_conserving: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.work_conserving = work_conserving

    def plan(self, now: float, cap: list[float]) -> tuple[list[Ask], dict[JobId, Vec]]:
        jobs = self.active()
        allocs = job_allocations(jobs, cap, self.shares)
        pools = {j.job_id: room_left(j, a) for j, a in zip(jobs, allocs, strict=True)}
        asks = round_robin([breadth_first_asks(j) for j in jobs])
        if self.work_conserving:
            within = [
                t
                for j in jobs
                for t in admit(breadth_first(j), list(pools[j.job_id]), force_first=not j.running)
            ]
            asks += [Ask(t, altruistic=True) for t in self._fill(jobs, cap, within)]
        return asks, pools

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
            j.job_id: deque(t for t in breadth_first(j) if t.task_id not in chosen) for j in jobs
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
