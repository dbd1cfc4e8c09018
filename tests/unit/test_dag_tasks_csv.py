"""``megha simulate --workload dag`` writes a task CSV per policy, with the same columns
and rows as a trace run's ``tasks-<scheduler>.csv`` (one writer for both)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from megha_cli.main import main
from reporting.tasks import TASK_COLUMNS

pytestmark = pytest.mark.timeout(120)


def test_a_dag_simulation_writes_tasks_per_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--workload", "dag", "--jobs-count", "3", "--rate", "1", "--workers", "10"]
    args += ["--gms", "1", "--lms", "1", "--policies", "drf,fifo", "--quiet"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    assert "tasks-*.csv" in capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    for policy in ("drf", "fifo"):
        with (tmp_path / f"tasks-{policy}.csv").open() as fh:
            rows = list(csv.reader(fh))
        assert tuple(rows[0]) == TASK_COLUMNS
        assert len(rows) - 1 == summary["tasks"]
        assert len({r[TASK_COLUMNS.index("task_id")] for r in rows[1:]}) == summary["tasks"]


def test_each_row_says_how_the_task_ended_and_why_it_failed(tmp_path: Path) -> None:
    """A refused task had -1 for every time, as a task the run left unfinished: the
    ``state`` and ``failure`` columns tell them apart."""
    stage = {"id": 0, "count": 2, "demand": [1], "duration": 1.0}
    jobs = {
        "format": "megha-dag/1",
        "resources": ["cpu"],
        "jobs": [
            {"id": "ok", "user": "u0", "arrival": 0, "stages": [stage]},
            {"id": "big", "user": "u0", "arrival": 0,
             "stages": [{**stage, "count": 1, "demand": [10**6]}]},
        ],
    }  # fmt: skip
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    args = ["simulate", "--jobs", str(path), "--workers", "10", "--gms", "1", "--lms", "1"]
    assert main([*args, "--policies", "drf", "--quiet", "--out", str(tmp_path / "out")]) == 0
    with (tmp_path / "out" / "tasks-drf.csv").open() as fh:
        ended = {r["task_id"]: (r["state"], r["failure"]) for r in csv.DictReader(fh)}
    assert ended == {
        "ok.s0.t0": ("finished", ""),
        "ok.s0.t1": ("finished", ""),
        "big.s0.t0": ("failed", "refused: impossible_resources"),
    }
