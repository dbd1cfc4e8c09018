"""Random DAG shapes (diamonds, fan-in and fan-out, chains, several roots and sinks,
disconnected parts, stages of very different sizes, instant tasks, stages no node
holds) through every queue policy, in the real simulator: every task ends or its job
fails explicitly, no task starts before its parent stages end, a completed job took at
least its critical path, and the same jobs give the same run."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.cluster import ClusterSpec
from common.dag import DagJob, make_job
from common.ids import GmId, LmId, UserId
from common.model import NodeSpec, UserConfig
from global_master.policy import POLICIES, make_policy
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation, SimResult

GMS = [GmId("gm0"), GmId("gm1")]
USERS = [UserConfig(UserId(f"u{i}"), GMS[i % 2], 0.25) for i in range(4)]
CLUSTERS = [
    ClusterSpec(LmId(f"lm{k}"), [NodeSpec((100,)) for _ in range(3)], [GMS[0], GMS[1], GMS[k]])
    for k in range(2)
]


@st.composite
def dags(draw: st.DrawFn, job_id: str) -> DagJob:
    """One job: stage ``s`` depends on any earlier stages (none: a root)."""
    n = draw(st.integers(1, 8))
    stages = []
    for s in range(n):
        parents = draw(st.lists(st.integers(0, s - 1), max_size=4, unique=True)) if s else []
        demand = draw(st.sampled_from([1, 10, 40, 100, 150]))  # 150: no node holds it
        duration = draw(st.sampled_from([0.0, 0.01, 1.0, 7.5]))
        count = draw(st.sampled_from([1, 2, 5, 12]))
        stages.append((s, [((demand,), duration)] * count, parents))
    ids = draw(st.permutations(range(n)))  # stage ids in no particular order
    shuffled = [(ids[s], tasks, [ids[p] for p in ps]) for s, tasks, ps in stages]
    user = draw(st.sampled_from([u.user for u in USERS]))
    arrival = draw(st.sampled_from([0.0, 0.5, 3.0]))
    return make_job(job_id, user, arrival, draw(st.permutations(shuffled)))


def _run(policy: str, jobs: list[DagJob]) -> SimResult:
    factory = make_policy(policy, USERS, seed=1)
    sim = MeghaSimulation(CLUSTERS, GMS, USERS, SimConfig(), queues_factory=factory)
    sim.add_jobs(copy.deepcopy(jobs))
    return sim.run()


def _check(jobs: list[DagJob], res: SimResult) -> None:
    assert res.stuck == 0
    by_id = {t.task_id: t for t in res.tasks}
    for job in jobs:
        completed = job.job_id in res.job_completion
        assert completed != (job.job_id in res.failed_jobs)
        ends: dict[int, float | None] = {}
        for s in job.stages:
            times = [by_id[t.task_id].finished_at for t in s.tasks]
            ends[s.stage_id] = max(times) if min(times) >= 0 else None
        for s in job.stages:
            for t in s.tasks:
                ran = by_id[t.task_id]
                assert not completed or ran.finished_at >= ran.first_started_at >= 0
                if ran.first_started_at >= 0:
                    for p in s.parents:
                        end = ends[p]
                        assert end is not None
                        assert ran.first_started_at >= end
        if completed:
            assert res.job_completion[job.job_id] >= job.critical_path() - 1e-9


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_dags_keep_the_invariants_under_every_policy(
    policy: str, data: st.DataObject
) -> None:
    k = data.draw(st.integers(1, 3))
    jobs = [data.draw(dags(f"j{i}")) for i in range(k)]
    res = _run(policy, jobs)
    _check(jobs, res)
    again = _run(policy, jobs)
    assert [(t.task_id, t.first_started_at, t.finished_at) for t in again.tasks] == [
        (t.task_id, t.first_started_at, t.finished_at) for t in res.tasks
    ]
