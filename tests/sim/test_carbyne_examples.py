"""Carbyne's worked examples through the real simulator (real GM and LM cores)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from common.cluster import ClusterSpec
from common.dag import DagJob, make_job
from common.ids import GmId, JobId, LmId, UserId
from common.model import NodeSpec, UserConfig
from global_master.policy import CarbyneQueues, make_policy
from simulator.config import SimConfig
from simulator.dag_run import run_policies, with_arrivals
from simulator.megha_sim import MeghaSimulation
from workload.dags import carbyne_fig2_jobs, synthetic_dag_jobs

GM = GmId("gm0")
USERS = [UserConfig(UserId("u1"), GM, 0.5), UserConfig(UserId("u2"), GM, 0.5)]
ONE_NODE = [ClusterSpec(LmId("lm0"), [NodeSpec((100,))], [GM])]
ZERO = SimConfig(
    network_delay_s=0.0,
    gm_decision_s=0.0,
    gm_message_s=0.0,
    update_node_s=0.0,
    lm_validation_s=0.0,
    lm_message_s=0.0,
)


def _run(policy: str) -> dict[JobId, float]:
    sim = MeghaSimulation(ONE_NODE, [GM], USERS, ZERO, queues_factory=make_policy(policy, USERS))
    sim.add_jobs(carbyne_fig2_jobs())
    res = sim.run()
    assert res.stuck == 0
    assert not res.failed
    return res.job_completion


def test_fig2_without_altruism_average_jct_is_2_05() -> None:
    jct = _run("drf")
    assert jct[JobId("J1")] == pytest.approx(2.1)
    assert jct[JobId("J2")] == pytest.approx(2.0)
    assert sum(jct.values()) / 2 == pytest.approx(2.05)


def test_fig2_with_carbyne_average_jct_is_1_55_and_j1_is_not_slowed() -> None:
    queues: list[CarbyneQueues] = []

    def factory(gm: GmId, mine: list[UserId]) -> CarbyneQueues:
        q = CarbyneQueues(mine, shares={u.user: u.share for u in USERS}, trace_yields=True)
        queues.append(q)
        return q

    sim = MeghaSimulation(ONE_NODE, [GM], USERS, ZERO, queues_factory=factory)
    jobs = carbyne_fig2_jobs()
    sim.add_jobs(jobs)
    res = sim.run()
    jct = res.job_completion
    assert jct[JobId("J1")] == pytest.approx(2.1)
    assert jct[JobId("J2")] == pytest.approx(1.0)
    assert sum(jct.values()) / 2 == pytest.approx(1.55)
    # J1 yields 0.29 at t = 0 (0.08 from S0, 0.21 from one S1 task) once both jobs are
    # in (the simulator delivers the two arrivals one after the other at t = 0) ...
    yields = queues[0].yields
    assert yields is not None
    t0, first = next(y for y in yields if len(y[1]) == 2)
    assert t0 == 0.0
    assert first[JobId("J1")] == pytest.approx([29])
    # ... and the leftover runs J2's second task and one more S1 task of J1, altruistically
    at0 = {t.task_id for t in res.tasks if t.started_at == 0.0}
    assert {"J2.s0.t0", "J2.s0.t1"} <= at0
    assert sum(1 for t in at0 if t.startswith("J1.s1")) == 2
    assert not any(t.startswith("J1.s0") for t in at0)


def test_every_policy_runs_a_dag_workload_to_completion(tmp_path: Path) -> None:
    """Two GMs, two LMs, the default delays: every job of every policy completes."""
    gms = [GmId("gm0"), GmId("gm1")]
    users = [
        UserConfig(UserId("a"), gms[0], 0.25),
        UserConfig(UserId("b"), gms[0], 0.25),
        UserConfig(UserId("c"), gms[1], 0.5),
    ]
    clusters = [
        ClusterSpec(
            LmId(f"lm{k}"), [NodeSpec((100,)) for _ in range(4)], [gms[0], gms[0], gms[1], gms[1]]
        )
        for k in range(2)
    ]
    jobs = synthetic_dag_jobs(12, rate=0.5, users=users, node_capacity=(100,), rng=random.Random(5))
    policies = ["fifo", "drf", "drf-wc", "tetris", "sjf", "carbyne", "carbyne-pack"]
    summary = run_policies(jobs, clusters, gms, users, policies, SimConfig(), seed=1, out=tmp_path)
    for p in policies:
        s = summary["schedulers"][p]
        assert s["jobs_completed"] == 12, p
        assert s["stuck_tasks"] == 0, p
        assert s["jct_s"]["mean"] > 0
        assert 0 < s["jain"]["min"] <= s["jain"]["mean"] <= s["jain"]["max"] <= 1
        assert (tmp_path / f"shares-{p}.png").exists()
    assert summary["schedulers"]["carbyne"]["leftover"]["reused_share_s"] > 0
    again = run_policies(jobs, clusters, gms, users, ["carbyne"], SimConfig(), seed=1)
    assert (
        again["schedulers"]["carbyne"]["job_jct_s"] == summary["schedulers"]["carbyne"]["job_jct_s"]
    )


def test_cli_replays_a_job_file_with_carbyne_on_and_off(tmp_path: Path) -> None:
    """``megha simulate --jobs FILE``: Fig. 2 from a job file, both policies side by side."""
    import json

    from common.dag import write_jobs
    from megha_cli.main import main

    jobs_file = tmp_path / "fig2.json"
    write_jobs(jobs_file, carbyne_fig2_jobs(), ["units"])
    out = tmp_path / "out"
    rc = main(
        [
            "simulate",
            "--jobs",
            str(jobs_file),
            "--workers",
            "1",
            "--gms",
            "1",
            "--lms",
            "1",
            "--users",
            "u1:0.5@gm0,u2:0.5@gm0",
            "--policies",
            "drf,carbyne",
            "--network-delay",
            "0",
            "--gm-decision-cost",
            "0",
            "--lm-validation-cost",
            "0",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())["schedulers"]
    assert summary["drf"]["jct_s"]["mean"] == pytest.approx(2.05, abs=0.01)
    assert summary["carbyne"]["jct_s"]["mean"] == pytest.approx(1.55, abs=0.01)


# ------------------------------------------------------- the baselines' mechanisms
def _offline(policy: str, jobs: list[DagJob], nodes: list[NodeSpec]) -> dict[JobId, float]:
    """``jobs`` all at time 0 on one LM of ``nodes``, no delays; JCT per job."""
    names = sorted({j.user for j in jobs})
    users = [UserConfig(u, GM, 1.0 / len(names)) for u in names]
    clusters = [ClusterSpec(LmId("lm0"), nodes, [GM] * len(nodes))]
    sim = MeghaSimulation(clusters, [GM], users, ZERO, queues_factory=make_policy(policy, users))
    sim.add_jobs(with_arrivals(jobs, "offline"))
    res = sim.run()
    assert res.stuck == 0
    assert len(res.job_completion) == len(jobs)
    return res.job_completion


def test_sjf_runs_the_job_with_the_shorter_critical_path_first() -> None:
    """One node, two jobs of the same width: DRF shares the node, SJF runs the short
    job first and lowers the average JCT."""
    short = make_job("short", "u1", 0.0, [(0, [((50,), 1.0)] * 4, [])])
    long = make_job("long", "u2", 0.0, [(0, [((50,), 5.0)] * 4, [])])
    node = [NodeSpec((100,))]
    sjf = _offline("sjf", [short, long], node)
    drf = _offline("drf", [short, long], node)
    assert sjf[JobId("short")] == pytest.approx(2.0)
    assert sjf[JobId("long")] == pytest.approx(12.0)
    assert sum(sjf.values()) < sum(drf.values())


def test_sjf_is_never_worse_than_drf_on_jct_offline() -> None:
    """Twelve synthetic DAG jobs at once on two nodes: SJF's average JCT is at most DRF's."""
    jobs = synthetic_dag_jobs(12, rate=1.0, users=USERS, node_capacity=(100,), rng=random.Random(3))
    nodes = [NodeSpec((100,)) for _ in range(2)]
    sjf = _offline("sjf", jobs, nodes)
    drf = _offline("drf", jobs, nodes)
    assert sum(sjf.values()) <= sum(drf.values())


def test_tetris_packs_complementary_tasks_together() -> None:
    """One node (10, 10); tasks (4,4), (4,4), (6,6), (6,6) of 1 s.  Taken in job order
    (SJF's tie-break) the two small ones share the node and each large one then runs
    alone: 3 s.  Tetris pairs each large task with a small one: 2 s."""
    jobs = [
        make_job(name, "u1", 0.0, [(0, [(demand, 1.0)], [])])
        for name, demand in (("a", (4, 4)), ("b", (4, 4)), ("c", (6, 6)), ("d", (6, 6)))
    ]
    node = [NodeSpec((10, 10))]
    assert max(_offline("sjf", jobs, node).values()) == pytest.approx(3.0)
    assert max(_offline("tetris", jobs, node).values()) == pytest.approx(2.0)


def test_cli_offline_arrivals_start_every_job_at_zero(tmp_path: Path) -> None:
    """``--arrivals offline``: Fig. 2 with J2 arriving late in the file runs as Fig. 2."""
    import json

    from common.dag import write_jobs
    from megha_cli.main import main

    j1, j2 = carbyne_fig2_jobs()
    j2.arrival = 50.0
    jobs_file = tmp_path / "late.json"
    write_jobs(jobs_file, [j1, j2], ["units"])
    args = ["simulate", "--jobs", str(jobs_file), "--workers", "1", "--gms", "1", "--lms", "1"]
    args += ["--users", "u1:0.5@gm0,u2:0.5@gm0", "--policies", "drf,carbyne", "--quiet"]
    args += ["--network-delay", "0", "--gm-decision-cost", "0", "--lm-validation-cost", "0"]
    args += ["--arrivals", "offline", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["arrivals"] == "offline"
    assert summary["schedulers"]["carbyne"]["jct_s"]["mean"] == pytest.approx(1.55, abs=0.01)
    assert summary["versus_best"]["carbyne"]["jct_vs_best"] == pytest.approx(1.0)
    assert summary["versus_best"]["drf"]["jct_vs_best"] == pytest.approx(2.05 / 1.55, abs=0.01)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_carbyne_offline_beats_drf_on_jct_and_makespan(seed: int) -> None:
    """Twelve synthetic DAG jobs at once on two nodes: the leftover Carbyne collects
    lowers the average JCT below DRF's, and the makespan is no longer."""
    jobs = synthetic_dag_jobs(
        12, rate=1.0, users=USERS, node_capacity=(100,), rng=random.Random(seed)
    )
    nodes = [NodeSpec((100,)) for _ in range(2)]
    drf = _offline("drf", jobs, nodes)
    carbyne = _offline("carbyne", jobs, nodes)
    assert sum(carbyne.values()) < sum(drf.values())
    assert max(carbyne.values()) <= max(drf.values())


def test_a_policy_that_completed_no_job_is_not_the_best_jct() -> None:
    """Its average JCT of no job reads 0: it was the 'best', and every other policy's
    factor to it 1.0.  It has none (None: strict JSON has no infinity)."""
    from simulator.dag_run import versus_best

    def figures(mean: float, completed: int) -> dict[str, object]:
        jain = {"mean": 1.0}
        return {"jct_s": {"mean": mean}, "jobs_completed": completed, "makespan_s": 9.0,
                "jain": jain}  # fmt: skip

    rel = versus_best({"a": figures(2.0, 3), "b": figures(4.0, 3), "none": figures(0.0, 0)})
    assert rel["a"]["jct_vs_best"] == 1.0
    assert rel["b"]["jct_vs_best"] == 2.0
    assert rel["none"]["jct_vs_best"] is None
