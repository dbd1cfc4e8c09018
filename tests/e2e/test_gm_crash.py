"""A GM is killed with SIGKILL mid-run and restarted: no job is lost, no task runs twice."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from common.metrics import duplicate_launches
from megha_cli.federation import restart
from request_generator.submitter import Submitter
from request_generator.workload import WorkloadSpec, synthetic_jobs
from tests.e2e.conftest import launches, pid_of, service_state

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_gm_killed_mid_run_loses_no_job_and_runs_no_task_twice(
    make_federation: Callable[..., Federation], queue_type: str
) -> None:
    # One active user (u0, served by gm0): nobody to preempt, so every task starts once.
    cfg, home = make_federation(
        gms=2, lms=2, nodes_per_lm=8, users="u0:0.5@gm0,u1:0.5@gm1", heartbeat_s=0.5,
        queue_type=queue_type,
    )  # fmt: skip
    users = [u for u in cfg.user_configs if u.user == "u0"]
    jobs = synthetic_jobs(
        60, rate=30.0, tasks_per_job=4, mean_duration=0.3,
        spec=WorkloadSpec(profile=cfg.profile, constraints=False), users=users,
        rng=random.Random(3),
    )  # fmt: skip
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]
    outcome = asyncio.run(_drive(cfg, home, jobs))
    done, killed_at = outcome
    assert killed_at > 0
    assert sorted(done) == sorted(ids), f"lost: {sorted(set(ids) - set(done))[:10]}"
    # no task ran twice: the workers started each exactly once
    log = launches(cfg, home)
    assert duplicate_launches(log) == {"count": 0, "tasks": []}
    assert sum(1 for r in log if r["what"] == "start") == len(ids)
    gm = service_state(cfg, home, "gm0")
    assert gm["jobs_unacked"] == 0
    assert gm["queued"] == 0
    # the restarted GM got back the jobs its predecessor had not finished placing
    assert gm["counters"]["jobs_redelivered"] > 0


async def _drive(cfg: FederationConfig, home: Path, jobs: list[Any]) -> tuple[list[Any], float]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    t0 = time.time()
    killed_at = 0.0
    try:
        for i, job in enumerate(jobs):
            await asyncio.sleep(max(0.0, t0 + job.arrival - time.time()))
            await sub.submit(job)
            if i == len(jobs) // 2:
                # mid-run: queued, in-flight and running tasks all exist now
                os.killpg(pid_of(home, "gm0"), signal.SIGKILL)
                killed_at = time.time() - t0
        await asyncio.sleep(0.3)
        await asyncio.get_running_loop().run_in_executor(None, restart, home, cfg, "gm0")
        ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]
        out = sub.outcomes
        deadline = time.time() + 60
        while time.time() < deadline and not all(out.done(i) for i in ids):
            out.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.changed.wait(), timeout=0.5)
        assert not out.bad_events, out.bad_events[:3]
        assert not out.failed, dict(list(out.failed.items())[:5])
        done = [i for i in ids if out.done(i)]
        return done, killed_at
    finally:
        await sub.close()
