"""Job-aware ordering and priorities through a live federation (issue 34 items 3-4):
GMs running ``srpt``, a job file whose jobs name priority classes, ``megha bench --jobs``."""

from __future__ import annotations

import asyncio
import csv
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from common.config import FederationConfig
from request_generator.bench import BenchOptions, run_bench

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


def _job(
    job_id: str, user: str, arrival: float, count: int, duration: float, priority: int
) -> dict[str, object]:
    stage = {"id": 0, "parents": [], "count": count, "demand": [1], "duration": duration}
    return {"id": job_id, "user": user, "arrival": arrival, "priority": priority, "stages": [stage]}


def test_a_higher_class_goes_ahead_of_a_backlog_and_every_task_runs_once(
    make_federation: Callable[..., Federation], tmp_path: Path
) -> None:
    cfg, home = make_federation(
        gms=1, lms=1, nodes_per_lm=2, heartbeat_s=0.5, worker_timeout_s=3.0,
        queue_policy="srpt",
    )  # fmt: skip
    (user,) = [u.user for u in cfg.user_configs]
    doc = {
        "format": "megha-dag/1",
        "resources": ["slots"],
        "jobs": [
            _job("backlog", user, 0.0, 8, 0.6, 0),  # 4 rounds of the 2 slots
            # more work than the backlog has left (srpt alone would serve it last), but a
            # class above: it is not served behind the backlog
            _job("urgent", user, 0.3, 2, 3.0, 2),
        ],
    }
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(doc))
    opts = BenchOptions(
        jobs_file=str(path), out=str(tmp_path / "out"), floor_samples=20, timeout_s=60.0,
        progress=False,
    )  # fmt: skip
    summary = asyncio.run(run_bench(cfg, opts, home))
    assert summary["tasks_finished"] == 10
    assert summary["unfinished_tasks"] == 0
    with (tmp_path / "out" / "tasks.csv").open() as f:
        rows = list(csv.DictReader(f))
    starts = {r["task_id"]: float(r["started_at"]) for r in rows}
    assert len(starts) == 10  # each task once in the file, every one started
    urgent = [float(r["started_at"]) for r in rows if r["job_id"].endswith(".urgent")]
    backlog = sorted(float(r["started_at"]) for r in rows if r["job_id"].endswith(".backlog"))
    assert len(urgent) == 2
    # the urgent class started before the backlog's last round: it did not wait its turn;
    # it found both slots held by the backlog and preempted (class 0 below class 2)
    assert max(urgent) < backlog[-1]
    assert any(
        float(r["preempted_running_s"]) > 0 for r in rows if r["job_id"].endswith(".backlog")
    )
