"""The simulator drives the real cores: accounting, exact ledgers, determinism, baselines."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from common.cluster import PROFILES, default_users, make_federation, parse_users
from common.ids import GmId
from common.model import UserConfig
from megha_cli.main import main
from reporting.tally import summarize_tasks
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation, SimResult
from simulator.sparrow import SparrowSimulation
from workload.synthetic import WorkloadSpec, synthetic_jobs

GMS = [GmId("gm0"), GmId("gm1"), GmId("gm2")]


def _run_megha(
    seed: int,
    *,
    workers: int = 120,
    jobs: int = 40,
    rate: float = 20.0,
    users: list[UserConfig] | None = None,
    profile: str = "slots",
) -> SimResult:
    users = users or default_users(GMS)
    clusters = make_federation(workers, GMS, 4, PROFILES[profile], True, random.Random(seed + 1))
    work = synthetic_jobs(
        jobs,
        rate=rate,
        tasks_per_job=10,
        mean_duration=1.0,
        spec=WorkloadSpec(profile=profile),
        users=users,
        rng=random.Random(seed),
    )
    sim = MeghaSimulation(clusters, GMS, users, SimConfig(update_period_s=1.0))
    sim.add_jobs(work)
    return sim.run()


def test_every_task_is_accounted_for() -> None:
    r = _run_megha(3)
    done = [t for t in r.tasks if t.finished_at >= 0]
    assert len(done) + len(r.failed) == len(r.tasks) == 400
    assert r.stuck == 0
    assert len(r.job_completion) == 40 - len({t.job_id for t in r.tasks if t.key in r.failed})


def test_components_add_up_to_allocation_time() -> None:
    r = _run_megha(4)
    for t in r.tasks:
        if t.started_at < 0:
            continue
        # allocation time runs to the final start; a run thrown away by a preemption is
        # its own component, so the components add up to it exactly
        spent = t.components()
        assert sum(spent) == pytest.approx(t.allocation_time, abs=1e-9)
        assert t.allocation_time == pytest.approx(t.started_at - t.submitted_at, abs=1e-9)
        assert min(spent) >= 0
        # the two network hops are always there (GM -> LM -> worker)
        assert spent[2] >= 2 * SimConfig().network_delay_s - 1e-12


def test_same_seed_same_result() -> None:
    a, b = _run_megha(5), _run_megha(5)
    sa, sb = summarize_tasks(a.tasks), summarize_tasks(b.tasks)
    assert json.dumps(sa, sort_keys=True) == json.dumps(sb, sort_keys=True)
    assert a.counters == b.counters
    c = _run_megha(6)
    assert json.dumps(summarize_tasks(c.tasks), sort_keys=True) != json.dumps(sa, sort_keys=True)


def test_contention_triggers_fairness_and_loses_nothing() -> None:
    users = parse_users("q1:0.1@gm0,q2:0.25@gm1,q3:0.15@gm1,q4:0.5@gm2", GMS)
    r = _run_megha(7, workers=40, jobs=80, rate=40.0, users=users)
    assert r.counters["requeues"] > 0
    assert r.counters["preemption_attempts"] > 0
    finished = sum(1 for t in r.tasks if t.finished_at >= 0)
    assert finished + len(r.failed) == len(r.tasks)
    assert r.stuck == 0


def test_multi_resource_profile_runs() -> None:
    r = _run_megha(8, workers=12, jobs=30, rate=10.0, profile="paper")
    assert sum(1 for t in r.tasks if t.finished_at >= 0) + len(r.failed) == len(r.tasks)


def test_sparrow_batch_sampling_and_late_binding() -> None:
    clusters = make_federation(100, GMS, 2, PROFILES["slots"], False, random.Random(1))
    jobs = synthetic_jobs(
        20,
        rate=5.0,
        tasks_per_job=10,
        mean_duration=1.0,
        spec=WorkloadSpec(constraints=False),
        users=default_users(GMS),
        rng=random.Random(2),
    )
    sp = SparrowSimulation(clusters, rng=random.Random(3))
    sp.add_jobs(jobs)
    r = sp.run()
    assert r.counters["probes"] == 2 * 200
    assert all(t.finished_at >= 0 for t in r.tasks)
    # late binding: each task starts after three message delays at the least
    assert min(t.allocation_time for t in r.tasks) == pytest.approx(0.0015)


def test_megha_tail_beats_sparrow_under_load() -> None:
    """A loaded cluster: Sparrow's random probes queue behind long tasks; Megha's view doesn't."""
    clusters = make_federation(200, GMS, 4, PROFILES["slots"], False, random.Random(1))
    users = default_users(GMS)

    def jobs() -> list:  # type: ignore[type-arg]
        return synthetic_jobs(
            150,
            rate=12.0,
            tasks_per_job=10,
            mean_duration=1.2,
            spec=WorkloadSpec(constraints=False),
            users=users,
            rng=random.Random(9),
        )

    sim = MeghaSimulation(clusters, GMS, users)
    sim.add_jobs(jobs())
    megha = summarize_tasks(sim.run().tasks)["allocation_time_s"]
    sp = SparrowSimulation(clusters, rng=random.Random(9))
    sp.add_jobs(jobs())
    sparrow = summarize_tasks(sp.run().tasks)["allocation_time_s"]
    assert megha["p99"] < sparrow["p99"]


def test_cli_writes_summary_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    rc = main(
        [
            "simulate", "--workload", "synthetic", "--jobs-count", "15", "--tasks-per-job", "5",
            "--workers", "60", "--gms", "2", "--lms", "3", "--seed", "2", "--quiet",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["schedulers"]) == {"megha", "sparrow", "centralized"}
    for s in summary["schedulers"].values():
        assert set(s["allocation_time_s"]) == {"p50", "p90", "p99", "p999", "max", "mean"}
        assert set(s["components_s"]) == {
            "queueing",
            "processing",
            "communication",
            "worker_queueing",
            "preempted_running",
        }
        assert s["tasks"] == 75
        assert "jct_s" in s
        assert "counters" in s
    assert summary["wall_s"] > 0
    assert summary["cpu_s"] > 0
    for name in ("allocation_cdf.png", "components.png", "tasks-megha.csv"):
        assert (out / name).stat().st_size > 0
    assert "megha" in capsys.readouterr().out


def test_cli_same_seed_identical_summary(tmp_path: Path) -> None:
    def once(d: str) -> dict:  # type: ignore[type-arg]
        args = ["simulate", "--jobs-count", "10", "--tasks-per-job", "4", "--workers", "40"]
        main([*args, "--gms", "2", "--lms", "2", "--quiet", "--out", str(tmp_path / d)])
        data = json.loads((tmp_path / d / "summary.json").read_text())
        for k in ("wall_s", "cpu_s", "timing"):
            data.pop(k)
        return data  # type: ignore[no-any-return]

    assert once("a") == once("b")


def test_cli_sweep(tmp_path: Path) -> None:
    rc = main(
        [
            "simulate", "--jobs-count", "8", "--tasks-per-job", "3", "--workers", "30,60",
            "--gms", "2", "--lms", "2", "--baselines", "", "--quiet", "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert rc == 0
    assert (tmp_path / "w30_g2_l2" / "summary.json").exists()
    assert len(json.loads((tmp_path / "sweep.json").read_text())) == 2
    assert (tmp_path / "sweep.png").exists()


def test_cli_bad_input_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "trace", "--quiet"]) == 2
    assert "needs --trace" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--workers", "0"])
