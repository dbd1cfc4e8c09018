"""A GM is killed with SIGKILL mid-run and restarted: no job is lost, no task runs twice."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from common.config import FederationConfig
from common.ids import JobId, TaskId, UserId
from common.model import TaskSpec
from tests.e2e.conftest import (
    assert_all_done,
    assert_each_ran_once,
    kill,
    launches,
    restarted,
    service_state,
    submit_with_fault,
)
from workload.jobs import Job
from workload.synthetic import WorkloadSpec, synthetic_jobs

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
    # mid-run (queued, in-flight and running tasks all exist), then restarted
    sub = asyncio.run(submit_with_fault(
        cfg, home, jobs, at=len(jobs) // 2, fault=kill(home, "gm0"),
        after=restarted(cfg, home, "gm0", wait_s=0.3),
    ))  # fmt: skip
    assert not sub.outcomes.bad_events, sub.outcomes.bad_events[:3]
    assert_all_done(sub, ids)
    # no task ran twice: the workers started each exactly once
    assert_each_ran_once(cfg, home, ids)
    log = launches(cfg, home)
    assert sum(1 for r in log if r["what"] == "start") == len(ids)
    gm = service_state(cfg, home, "gm0")
    assert gm["jobs_unacked"] == 0
    assert gm["queued"] == 0
    # the restarted GM got back the jobs its predecessor had not finished placing
    assert gm["counters"]["jobs_redelivered"] > 0


def test_tasks_preempted_together_survive_their_gm_s_crash(
    make_federation: Callable[..., Federation],
) -> None:
    """u1 fills every slot; u0's tasks preempt two of u1's, whose job was acknowledged:
    gm1 keeps both returned tasks on the broker, then is killed and restarted.  Both
    run again, as a newer attempt than the one stopped, and nothing ends twice."""
    cfg, home = make_federation(
        gms=2, lms=2, nodes_per_lm=3, users="u0:0.5@gm0,u1:0.5@gm1", heartbeat_s=0.5,
        preempt_grace_s=0.0, preempt_below=1.0, victims_younger_than_wait=False,
    )  # fmt: skip
    slots = 2 * 3

    def job(user: str, name: str, n: int, duration: float, arrival: float) -> Job:
        tasks = [
            TaskSpec(task_id=TaskId(f"{name}.t{i}"), job_id=JobId(name), user=UserId(user),
                     demand=(1,), duration=duration)
            for i in range(n)
        ]  # fmt: skip
        return Job(job_id=JobId(name), user=UserId(user), arrival=arrival, tasks=tasks)

    tag = uuid.uuid4().hex[:6]
    jobs = [job("u1", f"a{tag}", slots, 5.0, 0.0), job("u0", f"z{tag}", 2, 1.0, 1.0)]
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]

    async def crash_once_preempted() -> None:
        await asyncio.sleep(1.5)  # the preemptions are done; their returns are held
        await kill(home, "gm1")()

    sub = asyncio.run(submit_with_fault(
        cfg, home, jobs, at=1, fault=crash_once_preempted,
        after=restarted(cfg, home, "gm1", wait_s=0.3), timeout_s=60.0,
    ))  # fmt: skip
    assert not sub.outcomes.bad_events, sub.outcomes.bad_events[:3]
    assert_all_done(sub, ids)
    assert_each_ran_once(cfg, home, ids)
    log = launches(cfg, home)
    stopped = {r["task_id"] for r in log if r["what"] == "stop"}
    assert len(stopped) == 2, log  # the two u0 tasks took two of u1's slots
    again = {r["task_id"]: r["attempt"] for r in log if r["what"] == "start" and r["attempt"] > 1}
    assert again == dict.fromkeys(stopped, 2), log
    assert service_state(cfg, home, "gm1")["jobs_unacked"] == 0
