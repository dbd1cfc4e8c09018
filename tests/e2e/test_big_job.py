"""A job of thousands of tasks, live: decoded off the GM's event loop (its body is past
``DECODE_OFF_LOOP``), admitted in slices, every task run once, and the user's next
job still queued behind it."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from client.api import Client
from common import codec
from common.config import FederationConfig
from common.ids import JobId, TaskId, UserId
from common.messages import SubmitJob
from common.model import TaskSpec
from federation.processes import kill as signal_service
from global_master.app import DECODE_OFF_LOOP
from request_generator.submitter import Submitter
from security.access import Access, load_tokens
from security.identity import user
from tests.e2e.conftest import (
    Federation,
    assert_all_done,
    assert_each_ran_once,
    kill,
    launches,
    listen_dead_letters,
    restarted,
    service_state,
    submit_with_fault,
)
from workload.jobs import Job, to_submission

pytestmark = pytest.mark.e2e

PAD = "x" * 170
"""Long task ids: a job of a few thousand tasks gets past ``DECODE_OFF_LOOP``."""


def _job(name: str, user: str, n: int, duration: float, *, pad: str = "", cpu: int = 1) -> Job:
    """A job of ``n`` tasks of one slot (``cpu``) each."""
    ids = [f"{name}.{pad}.t{i}" if pad else f"{name}.t{i}" for i in range(n)]
    tasks = [TaskSpec(task_id=TaskId(tid), job_id=JobId(name), user=UserId(user),
                      demand=(cpu,), duration=duration) for tid in ids]  # fmt: skip
    return Job(job_id=JobId(name), user=UserId(user), arrival=0.0, tasks=tasks)


def test_a_job_of_thousands_of_tasks_runs_once_each_and_keeps_its_place(
    make_federation: Callable[..., Federation],
) -> None:
    cfg, home = make_federation(
        gms=2, lms=2, nodes_per_lm=8, users="u0:0.5@gm0,u1:0.5@gm1", heartbeat_s=0.5
    )
    tag = uuid.uuid4().hex[:6]
    big = _job(f"big{tag}", "u0", 4_500, 0.0, pad=PAD)
    small = _job(f"small{tag}", "u0", 3, 0.0, pad=PAD)
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


def test_a_gm_killed_while_it_places_a_large_job_runs_none_of_it_twice(
    make_federation: Callable[..., Federation],
) -> None:
    """SIGKILL the GM while a job of thousands of tasks (decoded in a thread, admitted in
    slices) is being placed, restart it: the job comes back from the broker, the tasks
    that ran are not run again, the others are."""
    cfg, home = make_federation(gms=1, lms=2, nodes_per_lm=8, users="u0:1.0@gm0",
                                heartbeat_s=0.5)  # fmt: skip
    big = _job(f"killed{uuid.uuid4().hex[:6]}", "u0", 4_500, 0.05, pad=PAD)
    assert len(codec.encode(to_submission(big, "", 0.0))) >= DECODE_OFF_LOOP
    ids = [(t.user, t.task_id) for t in big.tasks]

    async def kill_mid_placement() -> None:
        await asyncio.sleep(2.0)  # admitted, some hundreds of tasks run
        await kill(home, "gm0")()

    sub = asyncio.run(submit_with_fault(
        cfg, home, [big], at=0, fault=kill_mid_placement,
        after=restarted(cfg, home, "gm0", wait_s=0.3), timeout_s=150.0,
    ))  # fmt: skip
    assert not sub.outcomes.bad_events, sub.outcomes.bad_events[:3]
    assert_all_done(sub, ids)
    assert_each_ran_once(cfg, home, ids)
    gm = service_state(cfg, home, "gm0")
    assert gm["counters"]["jobs_redelivered"] == 1
    assert gm["counters"]["redelivered_skipped"] > 0  # ran or running: not run again
    assert gm["jobs_unacked"] == 0


def test_a_user_past_max_user_tasks_is_refused_and_others_are_served(
    make_federation: Callable[..., Federation],
) -> None:
    """u0 may hold 50 tasks on its GM: a job that would pass that is dead-lettered with
    ``user_task_limit``; u1's jobs go on; once u0's tasks have ended it may submit again."""
    cfg, home = make_federation(
        gms=1, lms=1, nodes_per_lm=4, users="u0:0.5@gm0,u1:0.5@gm0", heartbeat_s=0.5,
        max_user_tasks=50,
    )  # fmt: skip
    outcome = asyncio.run(_over_the_limit(cfg, home))
    assert outcome["refused"] == {"over": "user_task_limit"}
    # the user learnt it on its own stream (job_refusal), each of the job's tasks failed
    assert outcome["told_the_user"] == {"over": "user_task_limit"}
    assert outcome["user_sees_failed"] == {"refused: user_task_limit"}
    assert outcome["finished"] == {"first": 40, "other-user": 40, "after": 20}
    assert service_state(cfg, home, "gm0")["counters"]["jobs_refused"] == 1


async def _over_the_limit(cfg: FederationConfig, home: Path) -> dict[str, Any]:
    # u1 through the operator; u0 as itself, reading no dead letters, only its own
    # outcome stream (one listener per user's stream: listeners would share it)
    sub = Submitter(cfg, Access.in_home(home, cfg), load_tokens(home), ["u1"])
    await sub.open()
    own = Submitter(cfg, Access.in_home(home, cfg, user("u0")), load_tokens(home), ["u0"])
    await own.open()
    refused: dict[str, str] = {}

    async def on_dead(msg: Any) -> None:
        job = codec.decode(msg.body, expect=SubmitJob)
        refused[job.job_id] = str(msg.headers["x-megha-reason"])

    await listen_dead_letters(sub, cfg, on_dead)

    def job(name: str, user: str, n: int) -> Job:
        return _job(name, user, n, 0.2)

    jobs = {"first": job("first", "u0", 40), "other-user": job("other-user", "u1", 40)}
    for j in jobs.values():
        await (own if j.user == "u0" else sub).submit(j)
    over = job("over", "u0", 20)
    await own.submit(over)  # 40 held + 20 > 50

    def finished(name: str) -> int:
        got = (own if jobs[name].user == "u0" else sub).outcomes.finished
        return sum(1 for t in jobs[name].tasks if (t.user, t.task_id) in got)

    async def until(pred: Callable[[], bool]) -> None:
        for _ in range(600):
            if pred():
                return
            await asyncio.sleep(0.1)

    await until(lambda: bool(refused) and bool(own.refused) and finished("first") == 40)
    jobs["after"] = job("after", "u0", 20)  # u0 holds nothing now: within its limit
    await own.submit(jobs["after"])
    await until(lambda: all(finished(n) == len(j.tasks) for n, j in jobs.items()))
    await sub.close()
    await own.close()
    return {
        "refused": refused,
        "finished": {n: finished(n) for n in jobs},
        "told_the_user": own.refused,
        "user_sees_failed": {own.outcomes.failed.get((t.user, t.task_id)) for t in over.tasks},
    }


def test_a_flood_of_large_jobs_is_shed_not_held_in_the_gm_s_memory(
    make_federation: Callable[..., Federation],
) -> None:
    """Large jobs arriving faster than the GM decodes them: past 16 x ``max_body`` bytes
    waiting, the GM refuses them at once (``user_backlog``) instead of holding every
    delivery the broker's prefetch allows; every job gets its answer, and it serves on."""
    cfg, home = make_federation(
        gms=1, lms=1, nodes_per_lm=2, users="u0:1.0@gm0", heartbeat_s=0.5,
        max_body=2 * 1024 * 1024,
    )  # fmt: skip
    reasons = asyncio.run(_flood(cfg, home, jobs=80))
    assert sum(reasons.values()) == 80, reasons
    # each was shed unread (when it would take the user's held deliveries past the bound)
    # or read whole, then refused for what it asks (no node is that big); how many are
    # shed depends on how fast this machine reads them (the shedding rule itself:
    # tests/unit/test_unread_jobs.py), the bound below does not
    assert set(reasons) <= {"user_backlog", "impossible_resources"}, reasons
    # and its user reads each as failed, with why -- shed ones too, which its GM refused
    # before its core saw them (they read "submitted", then unknown)
    c = Client.connect(user="u0", state_dir=home)
    views = [c.status(f"flood{k}") for k in range(80)]
    assert {v.state for v in views} == {"failed"}
    told = {v.reason.split(":")[0] for v in views}  # "REASON: detail"
    assert told == set(reasons), (told, reasons)
    unread = service_state(cfg, home, "gm0")["unread_job_bytes"]
    assert unread["peak_per_user"] <= unread["limit_per_user"] == 16 * cfg.max_body
    assert unread["now"] == 0
    with urllib.request.urlopen(cfg.url("gm0") + "/health", timeout=10) as resp:
        assert resp.status == 200


async def _flood(cfg: FederationConfig, home: Path, jobs: int) -> dict[str, int]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    reasons: dict[str, int] = {}

    async def on_dead(msg: Any) -> None:
        reason = str(msg.headers["x-megha-reason"])
        reasons[reason] = reasons.get(reason, 0) + 1

    await listen_dead_letters(sub, cfg, on_dead)
    bodies = []
    for k in range(jobs):
        big = _job(f"flood{k}", "u0", 6_000, 0.0, pad=PAD, cpu=10_000)  # no node is that big
        bodies.append(codec.encode(to_submission(big, sub.token("u0"), 0.0)))
        assert DECODE_OFF_LOOP <= len(bodies[-1]) <= cfg.max_body
    # all at once, while the GM is stopped (SIGSTOP): they reach it together when it
    # resumes, faster than it reads them, however fast this machine decodes
    signal_service(home, "gm0", signal.SIGSTOP)
    try:
        await asyncio.gather(*(sub.publish_raw(UserId("u0"), b) for b in bodies))
        await asyncio.sleep(0.5)  # the broker pushes what the GM's prefetch allows
    finally:
        signal_service(home, "gm0", signal.SIGCONT)
    for _ in range(600):
        if sum(reasons.values()) >= jobs:
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return reasons
