"""A job larger than a GM's admission slice, simulated: the GM's ``AdmitMore`` timers
are events of the loop, every task runs, and the user's next job keeps its place."""

from __future__ import annotations

import random

from common.cluster import PROFILES, default_users, make_federation
from common.ids import GmId, JobId, TaskId, UserId
from common.model import TaskSpec
from simulator.megha_sim import MeghaSimulation, SimResult
from workload.jobs import Job

GMS = [GmId("gm0")]


def _job(name: str, n: int, arrival: float, user: UserId) -> Job:
    specs = [
        TaskSpec(task_id=TaskId(f"{name}.t{i}"), job_id=JobId(name), user=user,
                 demand=(1,), duration=0.5)
        for i in range(n)
    ]  # fmt: skip
    return Job(JobId(name), user, arrival, specs)


def _run() -> SimResult:
    users = default_users(GMS)
    user = users[0].user
    clusters = make_federation(120, GMS, 2, PROFILES["slots"], True, random.Random(1))
    sim = MeghaSimulation(clusters, GMS, users)
    # 2,500 tasks: three slices at the default admit_slice of 1,000
    sim.add_jobs([_job("big", 2_500, 0.0, user), _job("next", 4, 0.0, user)])
    return sim.run()


def test_a_job_of_several_slices_runs_whole_and_the_next_job_waits_its_turn() -> None:
    r = _run()
    assert r.stuck == 0
    assert not r.failed
    assert len(r.tasks) == 2_504
    assert set(r.job_completion) == {JobId("big"), JobId("next")}
    first_start = {}
    for t in r.tasks:
        first_start.setdefault(t.job_id, []).append(t.first_started_at)
    # FIFO within the user: the next job's tasks start after the big job's first ones
    assert min(first_start[JobId("next")]) >= sorted(first_start[JobId("big")])[1_000]


def test_same_seed_same_result() -> None:
    a, b = _run(), _run()
    assert [(t.key, t.started_at) for t in a.tasks] == [(t.key, t.started_at) for t in b.tasks]
