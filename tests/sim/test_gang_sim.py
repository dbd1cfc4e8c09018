"""Gang stages of a DAG job file, simulated under several queue policies: each gang
stage's tasks start together (one commit), a ``min`` gang starts at least ``min``,
and the tasks that come after wait for the whole gang to finish."""

from __future__ import annotations

import pytest

from common.cluster import ClusterSpec
from common.dag import parse_jobs
from common.ids import GmId, LmId, UserId
from common.model import NodeSpec, UserConfig
from global_master.policy import make_policy
from simulator.megha_sim import MeghaSimulation

DOC = {
    "format": "megha-dag/1",
    "resources": ["slots"],
    "jobs": [
        {"id": "mpi", "user": "u0", "arrival": 0.0, "stages": [
            {"id": 0, "count": 4, "demand": [1], "duration": 2.0},
            {"id": 1, "parents": [0], "count": 30, "demand": [1], "duration": 5.0, "gang": True},
            {"id": 2, "parents": [1], "count": 1, "demand": [1], "duration": 1.0}]},
        {"id": "train", "user": "u1", "arrival": 0.5, "stages": [
            {"id": 0, "count": 40, "demand": [1], "duration": 3.0, "gang": True, "min": 32}]},
        {"id": "small", "user": "u1", "arrival": 0.2, "stages": [
            {"id": 0, "count": 20, "demand": [1], "duration": 1.0}]},
    ],
}  # fmt: skip
GM = GmId("gm0")


@pytest.mark.parametrize("policy", ["fifo", "drf", "carbyne"])
def test_gang_stages_start_together_under_each_policy(policy: str) -> None:
    _, jobs = parse_jobs(DOC)
    nodes = [NodeSpec(capacity=(1,)) for _ in range(24)]
    clusters = [ClusterSpec(LmId(f"lm{i}"), nodes, [GM] * 24) for i in range(2)]
    users = [UserConfig(UserId("u0"), GM, 0.5), UserConfig(UserId("u1"), GM, 0.5)]
    sim = MeghaSimulation(clusters, [GM], users, queues_factory=make_policy(policy, users))
    sim.add_jobs(jobs)
    r = sim.run()
    assert r.stuck == 0
    assert not r.failed
    starts: dict[str, list[float]] = {}
    for t in r.tasks:
        starts.setdefault(t.task_id.rsplit(".t", 1)[0], []).append(t.first_started_at)
    for stage in ("mpi.s1", "train.s0"):
        assert max(starts[stage]) - min(starts[stage]) < 0.01, (stage, starts[stage])
    assert min(starts["mpi.s2"]) >= max(starts["mpi.s1"]) + 5.0
    assert sim.gms[GM].gang.stats["committed"] == 2
