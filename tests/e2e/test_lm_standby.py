"""An LM with a standby (``lm_standby``): the active process is killed with SIGKILL
mid-run and not restarted; its standby takes over under a newer epoch, learns what
runs from the worker pool, and GMs and the pool follow it.  Nothing is lost, nothing
runs twice."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from tests.e2e.conftest import (
    assert_all_done,
    assert_each_ran_once,
    kill,
    service_state,
    submit_with_fault,
)
from workload.synthetic import WorkloadSpec, synthetic_jobs

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


def _lm_processes(cfg: FederationConfig, home: Path, lm: str) -> dict[str, Any]:
    """The state pages of both processes of ``lm``, by process name."""
    return {name: service_state(cfg, home, name) for name in (lm, f"{lm}-standby")}


def test_the_standby_takes_over_from_a_killed_lm(
    make_federation: Callable[..., Federation],
) -> None:
    cfg, home = make_federation(gms=2, lms=2, nodes_per_lm=6, heartbeat_s=0.5, lm_standby=True)
    procs = _lm_processes(cfg, home, "lm0")
    (active,) = [n for n, st in procs.items() if st["active"]]
    (standby,) = [n for n, st in procs.items() if st["standby"]]
    before = procs[active]["epoch"]
    shown = _status(home)
    assert f"{standby}: standby" in shown
    assert f"{active}: epoch {before}" in shown
    jobs = synthetic_jobs(
        40, rate=25.0, tasks_per_job=3, mean_duration=4.0,
        spec=WorkloadSpec(profile=cfg.profile, constraints=False), users=cfg.user_configs,
        rng=random.Random(12),
    )  # fmt: skip
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]
    # tasks of seconds run on lm0 after job 20, and go on meanwhile
    sub = asyncio.run(submit_with_fault(cfg, home, jobs, at=20, fault=kill(home, active)))
    assert_all_done(sub, ids)
    now = service_state(cfg, home, standby)
    assert now["active"]
    assert now["epoch"] > before
    # it learnt the running tasks back: from the journal it shares with the former, or the pool
    assert now["counters"]["journal_restored"] + now["counters"]["recovered"] > 0
    assert now["running_tasks"] == 0
    assert_each_ran_once(cfg, home, ids)
    gms = [service_state(cfg, home, g) for g in cfg.gm_ids]
    assert sum(g["counters"]["lm_restarts_seen"] for g in gms) >= 1
    shown = _status(home)
    assert f"{active}: unreachable" in shown
    assert f"{standby}: epoch {now['epoch']}" in shown


def _status(home: Path) -> str:
    """What ``megha status`` prints about the federation in ``home``."""
    out = subprocess.run(
        [sys.executable, "-m", "megha_cli.main", "status", "--state-dir", str(home)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout
