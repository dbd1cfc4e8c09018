"""An LM is killed with SIGKILL mid-run and restarted: the new incarnation rebuilds what
runs from its worker pool, GMs follow its new epoch, nothing is lost, nothing runs twice."""

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


def test_lm_killed_mid_run_is_rebuilt_from_its_workers(
    make_federation: Callable[..., Federation],
) -> None:
    cfg, home = make_federation(gms=2, lms=2, nodes_per_lm=6, heartbeat_s=0.5)
    jobs = synthetic_jobs(
        40, rate=25.0, tasks_per_job=3, mean_duration=4.0,
        spec=WorkloadSpec(profile=cfg.profile, constraints=False), users=cfg.user_configs,
        rng=random.Random(11),
    )  # fmt: skip
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]
    before = service_state(cfg, home, "lm0")["epoch"]
    done, failed = asyncio.run(_drive(cfg, home, jobs, ids))
    assert not failed, dict(list(failed.items())[:5])
    assert sorted(done) == sorted(ids), f"lost: {sorted(set(ids) - set(done))[:10]}"
    lm0 = service_state(cfg, home, "lm0")
    assert lm0["epoch"] > before
    assert lm0["counters"]["recovered"] > 0  # it learnt the running tasks from its pool
    assert lm0["running_tasks"] == 0
    # no task ran twice (two attempts at once, or to its end twice); an attempt stopped
    # for a newer one (a request that got no answer while the LM was down) may restart it
    log = launches(cfg, home)
    assert duplicate_launches(log) == {"count": 0, "tasks": []}
    assert {(r["user"], r["task_id"]) for r in log if r["what"] == "end"} == set(ids)
    gms = [service_state(cfg, home, g) for g in cfg.gm_ids]
    assert sum(g["counters"]["lm_restarts_seen"] for g in gms) >= 1


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
            if i == 20:  # tasks of seconds are running on lm0 now, and go on meanwhile
                os.killpg(pid_of(home, "lm0"), signal.SIGKILL)
                await asyncio.sleep(0.5)
                await asyncio.get_running_loop().run_in_executor(None, restart, home, cfg, "lm0")
        out = sub.outcomes
        deadline = time.time() + 60
        while time.time() < deadline and not all(out.done(i) for i in ids):
            out.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.changed.wait(), timeout=0.5)
        return [i for i in ids if out.done(i)], dict(out.failed)
    finally:
        await sub.close()
