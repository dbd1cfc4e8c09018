"""``megha user revoke`` on a live federation in the secure set-up (issue 32, item 2):
the user's running tasks are stopped on their pools and end ``user_revoked``, its
queued ones end too, its broker login is gone, and another user of the same GM runs
on untouched."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import aio_pika
import aiormq
import pytest

from common.config import FederationConfig
from federation.users import revoke_user
from global_master.revocation import USER_REVOKED
from security.access import Access
from security.identity import user
from tests.e2e.conftest import service_state, submit_with_fault
from workload.synthetic import WorkloadSpec, synthetic_jobs

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


def test_a_revoked_users_tasks_end_and_its_login_goes(
    make_federation: Callable[..., Federation],
) -> None:
    cfg, home = make_federation(gms=1, lms=1, nodes_per_lm=4, users="u0:0.5@gm0,u1:0.5@gm0")
    u0, u1 = cfg.user_configs
    spec = WorkloadSpec(profile=cfg.profile, constraints=False)
    # u0: more tasks of a minute than there are nodes (some run, some wait); u1: short
    slow = synthetic_jobs(6, rate=50.0, tasks_per_job=1, mean_duration=60.0, spec=spec,
                          users=[u0], rng=random.Random(1))  # fmt: skip
    quick = synthetic_jobs(6, rate=5.0, tasks_per_job=1, mean_duration=0.3, spec=spec,
                           users=[u1], rng=random.Random(2))  # fmt: skip
    jobs = sorted([*slow, *quick], key=lambda j: j.arrival)
    url = Access.in_home(home, cfg, user("u0")).broker_urls()[0]

    async def revoke() -> None:
        await asyncio.sleep(1.0)  # u0's first tasks run by now
        await asyncio.get_running_loop().run_in_executor(None, revoke_user, home, "u0")

    sub = asyncio.run(submit_with_fault(cfg, home, jobs, at=len(jobs) - 1, fault=revoke))
    out = sub.outcomes
    mine = [(t.user, t.task_id) for j in slow for t in j.tasks]
    theirs = [(t.user, t.task_id) for j in quick for t in j.tasks]
    assert {k: out.failed.get(k) for k in mine} == dict.fromkeys(mine, USER_REVOKED)
    assert all(k in out.finished for k in theirs)
    lm0 = service_state(cfg, home, "lm0")
    assert lm0["counters"]["revoked_stops"] > 0  # some were running: their pool stopped them
    assert service_state(cfg, home, "lm0-workers")["running"] == 0

    async def login() -> None:
        await aio_pika.connect(url, timeout=5)

    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        asyncio.run(login())
