"""A DAG job file takes the workload options a trace takes: ``--time-scale``,
``--duration-scale`` and ``--limit-jobs`` change it in ``megha simulate`` and in
``megha bench``'s workload, never silently nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from common.dag import DagJob, make_job, write_jobs
from common.errors import ConfigError
from megha_cli.main import main
from request_generator.bench import BenchOptions, build_workload
from workload.dags import scale_jobs


def _jobs() -> list[DagJob]:
    """Three one-task jobs for u0, one node's worth each: each runs alone on an idle
    federation, so its JCT is its duration (plus the network and costs, set to 0)."""
    return [make_job(f"j{k}", "u0", 100.0 * k, [(0, [((100,), 2.0 + k)], [])]) for k in range(3)]


def _simulate(tmp_path: Path, *options: str) -> dict[str, Any]:
    jobs_file = tmp_path / "jobs.json"
    write_jobs(jobs_file, _jobs(), ["units"])
    out = tmp_path / "out"
    args = ["simulate", "--jobs", str(jobs_file), "--workers", "2", "--gms", "1", "--lms", "1"]
    args += ["--users", "u0:1@gm0", "--policies", "drf", "--quiet", "--out", str(out)]
    args += ["--network-delay", "0", "--gm-decision-cost", "0", "--lm-validation-cost", "0"]
    assert main([*args, *options]) == 0
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def test_simulate_scales_and_limits_a_job_file(tmp_path: Path) -> None:
    plain = _simulate(tmp_path / "plain")
    assert plain["jobs"] == 3
    jct = plain["schedulers"]["drf"]["job_jct_s"]
    assert jct == pytest.approx({"j0": 2.0, "j1": 3.0, "j2": 4.0}, abs=1e-3)

    scaled = _simulate(tmp_path / "scaled", "--duration-scale", "10", "--time-scale", "0.5")
    drf = scaled["schedulers"]["drf"]
    # 20 s, 30 s, 40 s tasks arriving 50 s apart: j0 still runs when j1 comes
    assert drf["job_jct_s"] == pytest.approx({"j0": 20.0, "j1": 30.0, "j2": 40.0}, abs=1e-3)
    assert drf["makespan_s"] == pytest.approx(100.0 + 40.0, abs=1e-3)

    limited = _simulate(tmp_path / "limited", "--limit-jobs", "2")
    assert limited["jobs"] == 2
    assert set(limited["schedulers"]["drf"]["job_jct_s"]) == {"j0", "j1"}


def test_bench_scales_and_limits_a_job_file(tmp_path: Path) -> None:
    jobs_file = tmp_path / "jobs.json"
    slots = [make_job(f"j{k}", "u0", 100.0 * k, [(0, [((1,), 2.0 + k)], [])]) for k in range(3)]
    write_jobs(jobs_file, slots, ["slots"])  # a live federation's units (common.units)
    cfg = FederationConfig(gms=1, lms=1, nodes_per_lm=2, users="u0:1@gm0").validate()
    opts = BenchOptions(jobs_file=str(jobs_file), time_scale=0.5, duration_scale=10.0)
    jobs = build_workload(cfg, opts)
    assert [j.arrival for j in jobs] == [0.0, 50.0, 100.0]
    assert [t.duration for j in jobs for t in j.tasks] == [20.0, 30.0, 40.0]
    limited = build_workload(cfg, BenchOptions(jobs_file=str(jobs_file), limit_jobs=1))
    assert len(limited) == 1


def test_a_slots_file_means_whole_nodes_in_the_simulator_as_live(tmp_path: Path) -> None:
    """Three one-slot tasks of 2 s on 2 workers: in ``slots`` (one per node, as a live
    federation of the default profile counts) the third waits for a node; in the
    simulator's own units (1/100 of a node) all three fit at once."""
    job = [make_job("j", "u0", 0.0, [(0, [((1,), 2.0)] * 3, [])])]
    jct = {}
    for names in (["slots"], ["units"]):
        jobs_file = tmp_path / f"{names[0]}.json"
        write_jobs(jobs_file, job, names)
        out = tmp_path / names[0]
        args = ["simulate", "--jobs", str(jobs_file), "--workers", "2", "--gms", "1"]
        args += ["--lms", "1", "--users", "u0:1@gm0", "--policies", "drf", "--quiet"]
        args += ["--out", str(out), "--network-delay", "0", "--gm-decision-cost", "0"]
        assert main([*args, "--lm-validation-cost", "0"]) == 0
        summary = json.loads((out / "summary.json").read_text())
        jct[names[0]] = summary["schedulers"]["drf"]["job_jct_s"]["j"]
    assert jct == pytest.approx({"slots": 4.0, "units": 2.0}, abs=1e-3)


def test_a_file_in_simulator_units_is_refused_live(tmp_path: Path) -> None:
    jobs_file = tmp_path / "jobs.json"
    write_jobs(jobs_file, _jobs(), ["cpu"])
    cfg = FederationConfig(gms=1, lms=1, nodes_per_lm=2, users="u0:1@gm0").validate()
    with pytest.raises(ConfigError, match="simulator's units") as err:
        build_workload(cfg, BenchOptions(jobs_file=str(jobs_file)))
    assert err.value.reason == "units_not_live"


def test_a_limit_below_one_is_refused() -> None:
    for bad in (0, -1):
        with pytest.raises(ConfigError):
            scale_jobs(_jobs(), limit_jobs=bad)
