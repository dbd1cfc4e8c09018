"""An LM is killed with SIGKILL mid-run and restarted: the new incarnation rebuilds what
runs from its worker pool, GMs follow its new epoch, nothing is lost, nothing runs twice."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from common.config import FederationConfig
from tests.e2e.conftest import (
    assert_all_done,
    assert_each_ran_once,
    kill,
    restarted,
    service_state,
    submit_with_fault,
)
from workload.synthetic import WorkloadSpec, synthetic_jobs

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
    # tasks of seconds run on lm0 after job 20, and go on meanwhile
    sub = asyncio.run(submit_with_fault(
        cfg, home, jobs, at=20, fault=kill(home, "lm0"),
        after=restarted(cfg, home, "lm0", wait_s=0.5),
    ))  # fmt: skip
    assert_all_done(sub, ids)
    lm0 = service_state(cfg, home, "lm0")
    assert lm0["epoch"] > before
    # it learnt the running tasks back: from its journal, or from its pool
    assert lm0["counters"]["journal_restored"] + lm0["counters"]["recovered"] > 0
    assert lm0["running_tasks"] == 0
    # no task ran twice (two attempts at once, or to its end twice); an attempt stopped
    # for a newer one (a request that got no answer while the LM was down) may restart it
    assert_each_ran_once(cfg, home, ids)
    gms = [service_state(cfg, home, g) for g in cfg.gm_ids]
    assert sum(g["counters"]["lm_restarts_seen"] for g in gms) >= 1
