"""A worker pool is killed with SIGKILL mid-run: its LM declares the nodes dead after
missed heartbeats and their tasks are placed again; no task is lost."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from common.config import FederationConfig
from request_generator.workload import WorkloadSpec, synthetic_jobs
from tests.e2e.conftest import assert_all_done, kill, restarted, service_state, submit_with_fault

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
    # the pool dies after job 8; it is restarted once its LM noticed (3.5 s in)
    sub = asyncio.run(submit_with_fault(
        cfg, home, jobs, at=8, fault=kill(home, "lm0-workers"),
        after=restarted(cfg, home, "lm0-workers", wait_s=2.5),
    ))  # fmt: skip
    assert_all_done(sub, ids)
    time.sleep(1.0)  # a heartbeat of the restarted pool
    lm0 = service_state(cfg, home, "lm0")
    assert lm0["counters"]["workers_lost"] > 0
    assert lm0["nodes_alive"] == lm0["nodes"]  # the restarted pool's nodes came back
