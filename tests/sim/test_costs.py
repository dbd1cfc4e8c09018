"""The simulator's server model (issue 12): GMs and LMs as servers with busy time."""

from __future__ import annotations

import random

import pytest

from common.cluster import ClusterSpec, make_federation, profile
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.model import NodeSpec, TaskSpec, UserConfig
from simulator.config import SimConfig
from simulator.costs import fit_service
from simulator.megha_sim import MeghaSimulation
from workload.jobs import Job
from workload.synthetic import WorkloadSpec, synthetic_jobs

GM = GmId("gm0")
U = UserId("u0")
FREE = SimConfig(
    network_delay_s=0.0,
    gm_decision_s=0.0,
    gm_message_s=0.0,
    update_node_s=0.0,
    lm_validation_s=0.0,
    lm_message_s=0.0,
    update_period_s=100.0,
)


def _three_tasks(cfg: SimConfig) -> list[float]:
    """One job of three 1-s tasks at t = 0 on three one-slot nodes; allocation times."""
    clusters = [ClusterSpec(LmId("lm0"), [NodeSpec((1,)) for _ in range(3)], [GM] * 3)]
    specs = [
        TaskSpec(task_id=TaskId(f"j.t{i}"), job_id=JobId("j"), user=U, demand=(1,), duration=1.0)
        for i in range(3)
    ]
    sim = MeghaSimulation(clusters, [GM], [UserConfig(U, GM, 1.0)], cfg)
    sim.add_jobs([Job(job_id=JobId("j"), user=U, arrival=0.0, tasks=specs)])
    res = sim.run()
    assert res.stuck == 0
    return sorted(t.allocation_time for t in res.tasks)


def test_an_lm_serves_launch_requests_one_at_a_time() -> None:
    """The GM pays 1 ms to admit the job, then decides all three at 1 ms (one request
    each); the LM pays 2 ms per request, in turn: starts at 3, 5 and 7 ms."""
    cfg = SimConfig(**{**FREE.__dict__, "gm_service_s": 0.001, "lm_service_s": 0.002})
    assert _three_tasks(cfg) == pytest.approx([0.003, 0.005, 0.007])


def test_each_hop_draws_a_live_sample() -> None:
    """A hop of 4 ms, everything else free: GM -> LM -> worker is two hops, 8 ms."""
    cfg = SimConfig(**{**FREE.__dict__, "hop_samples_s": (0.004,)})
    assert _three_tasks(cfg) == pytest.approx([0.008] * 3)


def test_fit_service_makes_busy_time_match_the_live_cpu() -> None:
    assert fit_service(3.0, 1.0, 1000) == pytest.approx(0.002)
    assert fit_service(0.5, 1.0, 1000) == 0.0
    assert fit_service(1.0, 0.0, 0) == 0.0


def _p99(n_gms: int, service_s: float) -> float:
    gms = [GmId(f"gm{i}") for i in range(n_gms)]
    users = [UserConfig(UserId(f"u{i}"), g, 1.0 / n_gms) for i, g in enumerate(gms)]
    clusters = make_federation(400, gms, 4, profile("slots"), False, random.Random(1))
    jobs = synthetic_jobs(
        200, rate=40.0, tasks_per_job=5, mean_duration=1.0,
        spec=WorkloadSpec(constraints=False), users=users, rng=random.Random(1),
    )  # fmt: skip
    cfg = SimConfig(update_period_s=1.0, gm_service_s=service_s)
    sim = MeghaSimulation(clusters, gms, users, cfg)
    sim.add_jobs(jobs)
    res = sim.run()
    xs = sorted(t.allocation_time for t in res.tasks)
    return xs[int(0.99 * (len(xs) - 1))]


def test_a_busy_gm_queues_and_more_gms_share_the_load() -> None:
    """200 tasks/s.  At 4 ms a message one GM is saturated and its tail grows; four
    GMs each take a quarter and keep it short.  With the cores' costs alone (a few
    microseconds) the number of GMs barely matters."""
    assert _p99(1, 0.004) > 4 * _p99(4, 0.004)
    assert _p99(1, 0.0) == pytest.approx(_p99(4, 0.0), rel=0.5)
