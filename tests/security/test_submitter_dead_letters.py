"""The operator's request generator reads the federation's dead letters (``megha bench``:
a refused job's tasks end as failed, with the reason).  A dead letter's body is whatever
its publisher sent, and a message the broker dead-letters itself (one that expired in
its queue: a user sets a message's TTL; a rejected one) keeps every header its publisher
set.  So a user could put another user's job in a body, with a forged
``x-megha-queue``, and have the broker dead-letter it: the bench then counted that
user's tasks as refused (and listed every job anyone had refused).  Only a GM's refusal
of a job from its own user's queue counts now."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from common import codec
from common.config import FederationConfig
from common.ids import JobId, TaskId, UserId
from common.messages import SubmitJob
from common.model import TaskSpec
from request_generator.submitter import Submitter
from security.access import Access
from security.identity import OPERATOR
from security.secret import Secret

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
CFG = FederationConfig().validate()


@dataclass
class Delivery:
    """What ``Submitter._on_dead`` reads of a delivery."""

    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)


def job(jid: str, who: str, n: int = 2) -> SubmitJob:
    tasks = tuple(
        TaskSpec(task_id=TaskId(f"{jid}.t{i}"), job_id=JobId(jid), user=UserId(who),
                 demand=(1,), duration=1.0)
        for i in range(n)
    )  # fmt: skip
    return SubmitJob(job_id=JobId(jid), user=UserId(who), token="x", submitted_at=time.time(),
                     tasks=tasks)  # fmt: skip


def submitter(*, keep: bool) -> Submitter:
    """The operator's submitter, which submitted u0's job ``victim`` (not opened)."""
    sub = Submitter(CFG, Access(OPERATOR, CFG, SECRET), {"u0": "t0", "u1": "t1"}, keep=keep)
    victim = job("victim", "u0")
    sub.outcomes.submitted(victim.tasks, victim.submitted_at)
    for s in victim.tasks:
        sub.submitted[(s.user, s.task_id)] = s
    return sub


def read(sub: Submitter, *letters: Delivery) -> None:
    async def run() -> None:
        for d in letters:
            await sub._on_dead(d)  # type: ignore[arg-type]

    asyncio.run(run())


def gm_dead_letter(body: bytes, queue_of: str, reason: str, **extra: Any) -> Delivery:
    """A GM's dead letter of a message it took from ``queue_of``'s queue: the publisher's
    headers, then the GM's own (``runtime.broker.Broker.dead_letter``)."""
    return Delivery(body, {**extra, "x-megha-reason": reason,
                           "x-megha-queue": CFG.user_queue(queue_of)})  # fmt: skip


def broker_dead_letter(body: bytes, queue_of: str, **forged: Any) -> Delivery:
    """A message the broker dead-lettered itself (it expired in ``queue_of``'s queue):
    the publisher's headers, and the broker's ``x-death``."""
    death = [{"reason": "expired", "queue": CFG.user_queue(queue_of), "count": 1}]
    return Delivery(body, {**forged, "x-death": death, "x-first-death-reason": "expired"})


def test_another_user_s_job_in_a_dead_letter_fails_none_of_that_user_s_tasks() -> None:
    for keep in (True, False):
        sub = submitter(keep=keep)
        body = codec.encode(job("victim", "u0"))  # u0's job, published by u1
        forged = {"x-megha-reason": "forged", "x-megha-queue": CFG.user_queue("u0")}
        read(
            sub,
            gm_dead_letter(body, "u1", "wrong_queue"),  # the GM took it from u1's queue
            broker_dead_letter(body, "u1", **forged),  # u1 set a TTL; it expired unread
            gm_dead_letter(body, "u0", "bad_token", **{"x-death": []}),  # x-death forged
        )
        assert sub.outcomes.failed == {}, keep
        assert len(sub.outcomes.outstanding) == 2, keep
        assert sub.refused == {}, keep


def test_a_gm_s_refusal_of_the_submitter_s_own_job_fails_its_tasks() -> None:
    for keep in (True, False):
        sub = submitter(keep=keep)
        read(sub, gm_dead_letter(codec.encode(job("victim", "u0")), "u0", "bad_token"))
        assert set(sub.outcomes.failed.values()) == {"refused: bad_token"}, keep
        assert len(sub.outcomes.failed) == 2, keep
        assert sub.outcomes.outstanding == {}, keep
        assert sub.refused == {"victim": "bad_token"}, keep


def test_refusals_of_jobs_the_submitter_never_sent_are_not_kept() -> None:
    sub = submitter(keep=False)
    read(sub, *(gm_dead_letter(codec.encode(job(f"junk{i}", "u1")), "u1", "bad_token")
                for i in range(50)))  # fmt: skip
    assert sub.refused == {}
    assert len(sub.outcomes.outstanding) == 2
