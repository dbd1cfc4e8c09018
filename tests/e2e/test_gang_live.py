"""Gang stages live: 3 GMs whose users submit gangs of 2-200 tasks at once, on a
federation of 3 LMs (300 slots) through the real broker and gunicorn processes.  No
partial gang ever starts: every gang runs whole (the pools' logs), no task runs twice,
no LM refused a commit, and no hold outlives its gang."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from common.ids import JobId, TaskId, UserId
from common.model import TaskSpec
from request_generator.bench import BenchOptions, run_bench
from tests.e2e.conftest import (
    Federation,
    assert_all_done,
    assert_each_ran_once,
    launches,
    service_state,
    submit_with_fault,
)
from workload.jobs import Job

pytestmark = pytest.mark.e2e

SIZES = (200, 2, 57, 120, 9, 33)


def _gang(name: str, user: str, n: int, duration: float) -> Job:
    tasks = [
        TaskSpec(task_id=TaskId(f"{name}.t{i}"), job_id=JobId(name), user=UserId(user),
                 demand=(1,), duration=duration)
        for i in range(n)
    ]  # fmt: skip
    return Job(job_id=JobId(name), user=UserId(user), arrival=0.0, tasks=tasks, gang=True)


def test_three_gms_submitting_gangs_at_once_start_none_of_them_in_part(
    make_federation: Callable[..., Federation],
) -> None:
    cfg, home = make_federation(
        gms=3, lms=3, nodes_per_lm=100, users="u0:0.34@gm0,u1:0.33@gm1,u2:0.33@gm2",
        heartbeat_s=0.5,
    )  # fmt: skip
    tag = uuid.uuid4().hex[:6]
    rng = random.Random(7)
    jobs: list[Job] = []
    for k, size in enumerate(SIZES):
        for u in range(3):  # every GM's user submits a gang of each size, all at once
            jobs.append(_gang(f"g{tag}{k}u{u}", f"u{u}", size, round(rng.uniform(0.3, 1.0), 2)))
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]

    async def nothing() -> None:
        return None

    sub = asyncio.run(submit_with_fault(cfg, home, jobs, at=0, fault=nothing, timeout_s=240.0))
    assert not sub.outcomes.bad_events, sub.outcomes.bad_events[:3]
    assert_all_done(sub, ids)
    assert_each_ran_once(cfg, home, ids)
    started: dict[str, int] = defaultdict(int)
    for r in launches(cfg, home):
        if r["what"] == "start":
            started[r["task_id"].rsplit(".", 1)[0]] += 1
    assert started == {j.job_id: len(j.tasks) for j in jobs}
    for gm in cfg.gm_ids:
        gangs = service_state(cfg, home, gm)["gangs"]
        assert gangs["partial_starts"] == 0, gangs
        assert gangs["committed"] == len(SIZES), gangs
        assert gangs["open"] == 0, gangs


def test_a_job_file_with_gang_stages_runs_them_whole_under_carbyne(
    make_federation: Callable[..., Federation], tmp_path: Path
) -> None:
    """``megha bench --jobs`` with a job file's ``"gang": true`` and ``"min"`` stages."""
    cfg, home = make_federation(
        gms=2, lms=2, nodes_per_lm=6, heartbeat_s=0.5, queue_policy="carbyne",
    )  # fmt: skip
    users = [u.user for u in cfg.user_configs]
    jobs = [
        {"id": f"mpi{i}", "user": users[i % len(users)], "arrival": 0.1 * i, "stages": [
            {"id": 0, "count": 2, "demand": [1], "duration": 0.2},
            {"id": 1, "parents": [0], "count": 10, "demand": [1], "duration": 0.3, "gang": True,
             "min": 8},
            {"id": 2, "parents": [1], "count": 1, "demand": [1], "duration": 0.05}]}
        for i in range(4)
    ]  # fmt: skip
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps({"format": "megha-dag/1", "resources": ["slots"], "jobs": jobs}))
    opts = BenchOptions(jobs_file=str(path), out=str(tmp_path / "out"), floor_samples=20,
                        timeout_s=90.0, progress=False)  # fmt: skip
    summary = asyncio.run(run_bench(cfg, opts, home))
    assert summary["tasks_finished"] == 4 * 13
    assert summary["unfinished_tasks"] == 0
    committed = sum(service_state(cfg, home, gm)["gangs"]["committed"] for gm in cfg.gm_ids)
    assert committed == 4
    assert all(service_state(cfg, home, gm)["gangs"]["partial_starts"] == 0 for gm in cfg.gm_ids)
