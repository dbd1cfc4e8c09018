"""DAG jobs through a live federation whose GMs run Carbyne (issue 4, `megha bench --jobs`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from common.errors import ConfigError
from request_generator.bench import BenchOptions, run_bench

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


def _job(job_id: str, user: str, arrival: float) -> dict[str, object]:
    # two roots, a barrier stage needing both, then a final stage: 4 stages, 7 tasks
    return {
        "id": job_id,
        "user": user,
        "arrival": arrival,
        "stages": [
            {"id": 0, "parents": [], "count": 2, "demand": [1], "duration": 0.3},
            {"id": 1, "parents": [], "count": 2, "demand": [1], "duration": 0.1},
            {"id": 2, "parents": [0, 1], "count": 2, "demand": [1], "duration": 0.1},
            {"id": 3, "parents": [2], "count": 1, "demand": [1], "duration": 0.05},
        ],
    }


def test_dag_jobs_of_a_file_and_of_an_alibaba_trace_run_stage_by_stage_under_carbyne(
    make_federation: Callable[..., Federation], tmp_path: Path
) -> None:
    cfg, home = make_federation(
        gms=2, lms=2, nodes_per_lm=4, heartbeat_s=0.5, worker_timeout_s=3.0,
        queue_policy="carbyne",
    )  # fmt: skip
    users = [u.user for u in cfg.user_configs]
    doc = {
        "format": "megha-dag/1",
        "resources": ["slots"],
        "jobs": [_job(f"d{i}", users[i % len(users)], 0.1 * i) for i in range(6)],
    }
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(doc))
    summary = run_whole(cfg, home, tmp_path / "out", 42, 6, jobs_file=str(path))
    assert summary["jct_s"]["mean"] > 0.45  # the critical path is 0.3 + 0.1 + 0.05 s
    assert summary["makespan_s"] >= summary["jct_s"]["max"] - 1e-6
    assert 0 < summary["jain"]["min"] <= summary["jain"]["max"] <= 1.0 + 1e-9
    assert_barriers(tmp_path / "out" / "tasks.csv", {"s2": ("s0", "s1"), "s3": ("s2",)})
    alibaba_replay(cfg, home, tmp_path / "alibaba")  # the same federation, a trace's DAGs


def run_whole(
    cfg: FederationConfig, home: Path, out: Path, tasks: int, jobs: int, **workload: Any
) -> dict[str, Any]:
    """``megha bench`` of ``workload`` (``BenchOptions``): every one of ``tasks`` finished,
    every one of ``jobs`` completed; its summary."""
    opts = BenchOptions(out=str(out), floor_samples=20, timeout_s=60.0, progress=False, **workload)
    summary = asyncio.run(run_bench(cfg, opts, home))
    assert summary["tasks"] == tasks
    assert summary["tasks_finished"] == tasks
    assert summary["unfinished_tasks"] == 0
    assert summary["jobs_completed"] == jobs
    return summary


def assert_barriers(tasks_csv: Path, parents: dict[str, tuple[str, ...]]) -> None:
    """No task of a stage (``job.stage.task`` ids) started before every task of its
    ``parents`` stages in its job finished, by the bench's ``tasks.csv``."""
    rows = [r.split(",") for r in tasks_csv.read_text().splitlines()]
    col = {name: i for i, name in enumerate(rows[0])}
    times: dict[str, tuple[float, float]] = {
        r[col["task_id"]]: (float(r[col["started_at"]]), float(r[col["finished_at"]]))
        for r in rows[1:]
    }
    for tid, (start, _) in times.items():
        job, stage, _ = tid.rsplit(".", 2)
        before = parents.get(stage, ())
        for other, (_, end) in times.items():
            if other.startswith(job + ".") and other.rsplit(".", 2)[1] in before:
                assert start >= end, f"{tid} started before its parent {other} finished"


def test_a_job_file_that_does_not_fit_the_federation_is_refused_up_front(
    make_federation: Callable[..., Federation], tmp_path: Path
) -> None:
    cfg, home = make_federation(gms=1, lms=1, nodes_per_lm=2)
    doc = {
        "format": "megha-dag/1",
        "resources": ["cpu", "mem"],
        "jobs": [_job("x", cfg.user_configs[0].user, 0.0)],
    }
    path = tmp_path / "two.json"
    path.write_text(json.dumps(doc).replace('"demand": [1]', '"demand": [1, 1]'))
    with pytest.raises(ConfigError, match="resource types"):
        asyncio.run(run_bench(cfg, BenchOptions(jobs_file=str(path), progress=False), home))


def alibaba_replay(cfg: FederationConfig, home: Path, tmp_path: Path) -> None:
    """``megha bench --trace-format alibaba2018``: the published ``batch_task`` rows (a
    DAG named by its tasks: ``J3_1_2`` runs after stages 1 and 2), read as ``megha
    simulate`` reads them, run on a live federation, every barrier held; a job of
    more tasks than a job may hold is skipped and counted, not the run refused."""
    from common.messages import MAX_JOB_TASKS
    from tests.unit.test_trace_readers import batch_task, write

    tmp_path.mkdir()
    rows = []
    for j in range(4):  # seconds of the trace: x0.02 of it live
        at = 1000 + 10 * j
        rows += [
            batch_task("M1", 2, f"j_{j}", "Terminated", at, at + 10),
            batch_task("M2", 1, f"j_{j}", "Terminated", at, at + 5),
            batch_task("J3_1_2", 2, f"j_{j}", "Terminated", at + 10, at + 12),
        ]
    rows.append(batch_task("M1", MAX_JOB_TASKS + 1, "j_big", "Terminated", 1001, 1100))
    trace = write(tmp_path / "batch_task.csv", rows)
    summary = run_whole(
        cfg, home, tmp_path / "out", 20, 4, trace_format="alibaba2018",
        trace_files=(str(trace),), time_scale=0.02, duration_scale=0.02,
    )  # fmt: skip
    read = summary["workload"]["trace_read"]
    assert read["format"] == "alibaba2018"
    assert read["unsubmittable_jobs"] == 1
    assert_barriers(tmp_path / "out" / "tasks.csv", {"s3": ("s1", "s2")})
