"""Every process of the federation goes at once (a host reboot, ``megha down`` then
``megha up``) while tasks run, queue and end; the broker keeps its data.  Every accepted
task still finishes, and none runs twice: the LMs' and pools' journals (issue 30)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from common.metrics import duplicate_launches
from federation.operator import find_everywhere
from federation.processes import kill_all, start_federation, stop_federation
from request_generator.submitter import Submitter
from security.access import Access
from tests.e2e.conftest import assert_all_done, launches, service_state
from workload.synthetic import WorkloadSpec, synthetic_jobs

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


def diagnosis(
    cfg: FederationConfig, home: Path, sub: Submitter, ids: list[Any], before: list[Any]
) -> dict[str, Any]:
    """For each task with no outcome: what every GM and the pools' logs say of it."""
    access = Access.in_home(home, cfg)
    lost = [i for i in ids if not sub.outcomes.done(i)]
    after = launches(cfg, home)
    out: dict[str, Any] = {}
    for user, task_id in lost[:3]:
        out[f"{user}/{task_id}"] = {
            "gms": find_everywhere(cfg, access, str(task_id)),
            "launched_before": [r for r in before if r["task_id"] == task_id],
            "launched_after": [r for r in after if r["task_id"] == task_id],
        }
    return out


async def run_across_restart(
    cfg: FederationConfig, home: Path, how: str, *, down_at: float, down_for: float
) -> tuple[Submitter, list[dict[str, Any]], list[Any]]:
    users = list(cfg.user_configs)
    jobs = synthetic_jobs(
        50, rate=25.0, tasks_per_job=4, mean_duration=1.5,
        spec=WorkloadSpec(profile=cfg.profile, constraints=False), users=users,
        rng=random.Random(7),
    )  # fmt: skip
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]
    sub = Submitter.operator(cfg, home)
    await sub.open()
    t0 = time.time()
    before: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    try:
        for job in jobs:
            await asyncio.sleep(max(0.0, t0 + job.arrival - time.time()))
            await sub.submit(job)
        await asyncio.sleep(max(0.0, t0 + down_at - time.time()))
        # what the pools ran so far (their logs go with their processes)
        before = await loop.run_in_executor(None, launches, cfg, home)
        if how == "sigkill":
            kill_all(home)
        else:
            await loop.run_in_executor(None, lambda: stop_federation(home, quiet=True))
        await asyncio.sleep(down_for)
        await loop.run_in_executor(None, lambda: start_federation(cfg, home, quiet=True))
        out = sub.outcomes
        deadline = time.time() + 90.0
        while time.time() < deadline and not all(out.done(i) for i in ids):
            out.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.changed.wait(), timeout=0.5)
    finally:
        await sub.close()
    return sub, before, ids


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["down", "sigkill"])
def test_a_whole_restart_loses_no_accepted_task_and_runs_none_twice(
    make_federation: Callable[..., Federation], how: str
) -> None:
    cfg, home = make_federation(
        gms=2, lms=2, nodes_per_lm=10, users="u0:0.5@gm0,u1:0.5@gm1", heartbeat_s=0.5,
    )  # fmt: skip
    # 200 tasks of ~1.5 s on 20 slots: when everything goes, some ended, some run,
    # most wait in the GMs' queues (their jobs settled once an LM took every task)
    sub, before, ids = asyncio.run(run_across_restart(cfg, home, how, down_at=3.0, down_for=1.0))
    assert not sub.outcomes.bad_events, sub.outcomes.bad_events[:3]
    assert all(sub.outcomes.done(i) for i in ids), diagnosis(cfg, home, sub, ids, before)
    assert_all_done(sub, ids)
    after = launches(cfg, home)
    ended_before = Counter((r["user"], r["task_id"]) for r in before if r["what"] == "end")
    ended_after = Counter((r["user"], r["task_id"]) for r in after if r["what"] == "end")
    # something was running or done when everything went, and the rest ran after it
    assert ended_before
    assert ended_after
    # no task ran to its end twice, across the restart or within either half (a task
    # may also have ended unseen, between the last look at the pools and their end)
    twice = (ended_before + ended_after) - Counter(set(ended_before) | set(ended_after))
    assert not twice, sorted(twice)[:10]
    assert duplicate_launches(after) == {"count": 0, "tasks": []}
    # the LMs took back what their former processes held
    for lm in cfg.lm_ids:
        assert service_state(cfg, home, lm)["counters"]["journal_restored"] > 0
