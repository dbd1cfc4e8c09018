"""DAG job files of production shapes through ``megha simulate``: a bad DAG is one line
naming the job and stage (never a traceback), a good one of any shape runs, and a file
written by ``write_jobs`` reads back with the same stages, gangs included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.dag import load_jobs, make_job, write_jobs
from megha_cli.main import main


def _stage(sid: int, parents: list[int] | None = None, **more: Any) -> dict[str, Any]:
    st = {"id": sid, "parents": parents or [], "count": 1, "demand": [1], "duration": 1.0}
    return {**st, **more}


def _simulate(
    tmp_path: Path, stages: list[dict[str, Any]], policies: str = "fifo,drf,sjf,carbyne"
) -> int:
    jobs = [{"id": "etl", "user": "u0", "arrival": 0.0, "stages": stages}]
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"format": "megha-dag/1", "resources": ["units"], "jobs": jobs}))
    args = ["simulate", "--jobs", str(path), "--workers", "2", "--gms", "1", "--lms", "1"]
    args += ["--users", "u0:1@gm0", "--policies", policies, "--quiet"]
    return main([*args, "--out", str(tmp_path / "out")])


@pytest.mark.parametrize(
    ("stages", "says"),
    [
        ([_stage(0, [1]), _stage(1, [2]), _stage(2, [0])], "cycle through stage"),
        ([_stage(0), _stage(3, [3])], "stage 3 depends on itself"),
        ([_stage(0), _stage(1, [9])], "stage 1 depends on unknown stage 9"),
        ([_stage(4), _stage(4)], "duplicate stage id 4"),
        ([_stage(0), {"id": 1, "parents": [0], "tasks": []}], "stage 1: tasks must be"),
        ([_stage(0), _stage(1, [0], count=0)], "stage 1: count must be a positive"),
        ([_stage(0), _stage(1, [0], duration=-0.5)], "stage 1: duration must be"),
    ],
)
def test_a_bad_dag_is_one_line_naming_job_and_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stages: list[dict[str, Any]], says: str
) -> None:
    assert _simulate(tmp_path, stages) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert "job etl" in err[-1]
    assert says in err[-1]


def test_zero_durations_and_a_fan_in_of_1000_run(tmp_path: Path) -> None:
    """Instant stages and a barrier over 1,000 roots are valid DAGs: every task ends."""
    roots = [_stage(i, duration=0.0) for i in range(1000)]
    sink = _stage(1000, list(range(1000)), duration=0)
    assert _simulate(tmp_path, [*roots, sink], "fifo,srpt,drf,tetris") == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for figures in summary["schedulers"].values():
        assert (figures["jobs_completed"], figures["failed_tasks"]) == (1, 0)


def test_gang_stages_survive_a_write_and_a_read(tmp_path: Path) -> None:
    """``write_jobs`` wrote gang stages as ordinary ones: read back, they ran task by task."""
    job = make_job(
        "g", "u0", 0.0,
        [(0, [((1,), 1.0)], []), (1, [((1,), 2.0)] * 4, [0]), (2, [((1,), 1.0)] * 3, [1])],
        gangs=[0, 3, 3],
    )  # fmt: skip
    path = tmp_path / "jobs.json"
    write_jobs(path, [job], ["units"])
    _, (back,) = load_jobs(path)
    assert [(s.stage_id, s.parents, s.gang) for s in back.stages] == [
        (0, (), 0), (1, (0,), 3), (2, (1,), 3)
    ]  # fmt: skip
