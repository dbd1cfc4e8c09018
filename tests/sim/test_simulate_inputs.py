"""``megha simulate`` refuses inputs that would give wrong figures, and runs what it is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megha_cli.main import main


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--limit-jobs", "0"),
        ("--limit-jobs", "-3"),
        ("--time-scale", "-1"),
        ("--time-scale", "0"),
        ("--time-scale", "nan"),
        ("--duration-scale", "-0.5"),
        ("--duration-scale", "inf"),
        # a GM deciding nothing per turn, or heartbeats every 0 s, never advanced time
        ("--batch", "0"),
        ("--update-period", "0"),
        ("--update-period", "-5"),
        ("--rate", "nan"),
        ("--jobs-count", "-1"),
        ("--tasks-per-job", "0"),
        ("--mean-duration", "-1"),
        ("--task-constraint-prob", "2"),
        ("--p-altruism", "2"),  # only a DAG run builds Carbyne: the others ignored it
        ("--p-altruism", "-0.1"),
        ("--network-delay", "-0.001"),
        ("--gm-decision-cost", "-1"),
    ],
)
def test_a_value_out_of_range_is_an_argument_error(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--quiet", f"{option}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err
    assert value in err


def test_a_task_longer_than_the_live_admission_limit_runs_in_every_scheduler(
    tmp_path: Path,
) -> None:
    """A trace is replayed as written: the live GM's cap on task duration (7 days by
    default) is an operator's setting, not applied to a trace."""
    trace = tmp_path / "long.tr"
    trace.write_text("0.0 2 500000.5 1e6 1.0\n")
    out = tmp_path / "r"
    args = ["simulate", "--trace", str(trace), "--workers", "20", "--gms", "2", "--lms", "2"]
    assert main([*args, "--update-period", "1000", "--quiet", "--out", str(out)]) == 0
    schedulers = json.loads((out / "summary.json").read_text())["schedulers"]
    assert set(schedulers) == {"megha", "sparrow", "centralized"}
    for name, s in schedulers.items():
        assert s["failed_tasks"] == 0, name
        assert s["jobs_completed"] == 1, name
        assert s["jobs_failed"] == 0, name
        assert s["jct_s"]["mean"] == pytest.approx(1e6, abs=1.0), name


def test_a_dag_sweep_runs_every_point_with_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--workload dag`` with several --gms / --workers runs each point, as trace runs do."""
    args = ["simulate", "--workload", "dag", "--jobs-count", "4", "--rate", "1"]
    args += ["--workers", "20,40", "--gms", "1,2", "--lms", "2", "--policies", "drf,sjf"]
    # serially, so each point's progress bars show here (a cluster's workers have none)
    assert main([*args, "--cluster", "serial", "--out", str(tmp_path)]) == 0
    for point in ("w20_g1_l2", "w20_g2_l2", "w40_g1_l2", "w40_g2_l2"):
        summary = json.loads((tmp_path / point / "summary.json").read_text())
        assert set(summary["schedulers"]) == {"drf", "sjf"}
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert sorted((r["scheduler"], r["workers"], r["gms"]) for r in sweep) == sorted(
        (p, w, g) for p in ("drf", "sjf") for w in (20, 40) for g in (1, 2)
    )
    err = capsys.readouterr().err
    assert "drf: " in err
    assert "sjf: " in err
