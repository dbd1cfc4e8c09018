"""A worker pool is killed with SIGKILL mid-run: its LM declares the nodes dead after
missed heartbeats and their tasks are placed again; no task is lost."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from common import codec
from common.config import FederationConfig
from common.ids import GmId, LmId, NodeIndex, TaskId
from common.messages import StopTask, StopTasks
from federation.processes import restart
from security.access import Access
from security.identity import lm, workers
from tests.e2e.conftest import (
    assert_all_done,
    incarnation,
    kill,
    pid_of,
    post,
    restarted,
    service_state,
    submit_with_fault,
)
from workload.synthetic import WorkloadSpec, synthetic_jobs

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


def test_a_restarted_pool_takes_commands_only_once_its_lm_answered_its_registration(
    make_federation: Callable[..., Federation],
) -> None:
    """Before its LM answered its registration a pool refuses starts and stops with
    503 ``not_ready`` (the LM sends them again): a start taken earlier would run
    behind the registration's back, and the LM, told nothing runs there, would run
    the task a second time."""
    cfg, home = make_federation(gms=1, lms=1, nodes_per_lm=2, heartbeat_s=0.3)
    epoch = service_state(cfg, home, "lm0-workers")["epoch"]  # the LM's incarnation
    raw = codec.encode(StopTasks(lm=LmId("lm0"), epoch=epoch, tasks=(StopTask(
        node=NodeIndex(0), user=cfg.user_configs[0].user, task_id=TaskId("probe"),
        attempt=1, gm=GmId("gm0"),
    ),)))  # fmt: skip
    as_lm = Access.in_home(home, cfg, lm("lm0"))

    def stop() -> tuple[int, str]:
        bound = incarnation(cfg.worker_url("lm0"))  # the pool's, restarted or not
        signed = as_lm.sign(workers("lm0"), "POST", "/v1/stop", raw, time.time(), bound)
        return post(cfg.worker_url("lm0") + "/v1/stop", raw, signed)

    assert stop() == (200, "")
    lm_pid = pid_of(home, "lm0")
    os.killpg(lm_pid, signal.SIGSTOP)  # the LM reads nothing: the registration waits
    try:
        os.killpg(pid_of(home, "lm0-workers"), signal.SIGKILL)
        restart(home, cfg, "lm0-workers")
        assert stop() == (503, "not_ready")
        assert service_state(cfg, home, "lm0-workers")["registered"] is False
    finally:
        os.killpg(lm_pid, signal.SIGCONT)
    deadline = time.monotonic() + 15.0
    while not service_state(cfg, home, "lm0-workers")["registered"]:
        assert time.monotonic() < deadline, "the LM never answered the registration"
        time.sleep(0.1)
    assert stop() == (200, "")
