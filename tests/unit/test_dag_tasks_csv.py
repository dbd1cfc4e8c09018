"""``megha simulate --workload dag`` writes a task CSV per policy, with the same columns
and rows as a trace run's ``tasks-<scheduler>.csv`` (one writer for both)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from common.metrics import TASK_COLUMNS
from megha_cli.main import main

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
