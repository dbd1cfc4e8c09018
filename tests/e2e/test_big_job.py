"""A job of thousands of tasks, live: decoded off the GM's event loop (its body is past
``DECODE_OFF_LOOP``), admitted in slices, every task run once, and the user's next
job still queued behind it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from common import codec
from common.config import FederationConfig
from common.ids import JobId, TaskId, UserId
from common.model import TaskSpec
from global_master.app import DECODE_OFF_LOOP
from request_generator.workload import Job, to_submission
from tests.e2e.conftest import (
    assert_all_done,
    assert_each_ran_once,
    launches,
    service_state,
    submit_with_fault,
)

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


def test_a_job_of_thousands_of_tasks_runs_once_each_and_keeps_its_place(
    make_federation: Callable[..., Federation],
) -> None:
    cfg, home = make_federation(
        gms=2, lms=2, nodes_per_lm=8, users="u0:0.5@gm0,u1:0.5@gm1", heartbeat_s=0.5
    )
    tag = uuid.uuid4().hex[:6]
    pad = "x" * 170  # long ids: past DECODE_OFF_LOOP with a few thousand tasks

    def job(name: str, n: int, arrival: float) -> Job:
        tasks = [
            TaskSpec(task_id=TaskId(f"{name}.{pad}.t{i}"), job_id=JobId(name),
                     user=UserId("u0"), demand=(1,), duration=0.0)
            for i in range(n)
        ]  # fmt: skip
        return Job(job_id=JobId(name), user=UserId("u0"), arrival=arrival, tasks=tasks)

    big, small = job(f"big{tag}", 4_500, 0.0), job(f"small{tag}", 3, 0.0)
    assert len(codec.encode(to_submission(big, "", 0.0))) >= DECODE_OFF_LOOP
    jobs = [big, small]
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]

    async def nothing() -> None:
        return None

    sub = asyncio.run(submit_with_fault(cfg, home, jobs, at=1, fault=nothing, timeout_s=120.0))
    assert not sub.outcomes.bad_events, sub.outcomes.bad_events[:3]
    assert_all_done(sub, ids)
    assert_each_ran_once(cfg, home, ids)
    # the small job came second: its tasks were queued behind the big one's, so they
    # started after most of those (had it been admitted while the big one was being
    # decoded, they would have started first)
    starts = sorted((r["at"], r["task_id"]) for r in launches(cfg, home) if r["what"] == "start")
    order = [tid for _, tid in starts]
    first_small = min(order.index(t.task_id) for t in small.tasks)
    assert first_small >= len(big.tasks) // 2, first_small
    gm = service_state(cfg, home, "gm0")
    assert gm["jobs_admitting"] == 0
    assert gm["jobs_unacked"] == 0
    assert gm["counters"]["jobs_admitted"] == 2
