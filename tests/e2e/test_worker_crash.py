"""A worker pool is killed with SIGKILL mid-run: its LM declares the nodes dead after
missed heartbeats and their tasks are placed again; no task is lost."""

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
from megha_cli.federation import restart
from request_generator.submitter import Submitter
from request_generator.workload import WorkloadSpec, synthetic_jobs
from tests.e2e.conftest import pid_of, service_state

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


def test_dead_worker_pool_tasks_are_placed_again(
    make_federation: Callable[..., Federation],
) -> None:
    cfg, home = make_federation(gms=1, lms=2, nodes_per_lm=4, heartbeat_s=0.3, worker_timeout_s=1.5)
    jobs = synthetic_jobs(
        20, rate=10.0, tasks_per_job=2, mean_duration=1.0,
        spec=WorkloadSpec(profile=cfg.profile, constraints=False), users=cfg.user_configs,
        rng=random.Random(5),
    )  # fmt: skip
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]
    done, failed = asyncio.run(_drive(cfg, home, jobs, ids))
    assert not failed
    assert sorted(done) == sorted(ids), f"lost: {sorted(set(ids) - set(done))[:10]}"
    lm0 = service_state(cfg, home, "lm0")
    assert lm0["counters"]["workers_lost"] > 0
    assert lm0["nodes_alive"] == lm0["nodes"]  # the restarted pool's nodes came back


async def _drive(
    cfg: FederationConfig, home: Path, jobs: list[Any], ids: list[Any]
) -> tuple[list[Any], dict[Any, str]]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    t0 = time.time()
    try:
        for i, job in enumerate(jobs):
            await asyncio.sleep(max(0.0, t0 + job.arrival - time.time()))
            await sub.submit(job)
            if i == 8:
                os.killpg(pid_of(home, "lm0-workers"), signal.SIGKILL)
        await asyncio.sleep(max(0.0, t0 + 3.5 - time.time()))  # the LM noticed by now
        await asyncio.get_running_loop().run_in_executor(None, restart, home, cfg, "lm0-workers")
        out = sub.outcomes
        deadline = time.time() + 60
        while time.time() < deadline and not all(out.done(i) for i in ids):
            out.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.changed.wait(), timeout=0.5)
        await asyncio.sleep(1.0)  # a heartbeat of the restarted pool
        return [i for i in ids if out.done(i)], dict(out.failed)
    finally:
        await sub.close()
