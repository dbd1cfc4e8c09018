"""A job its GM's service refuses before the core sees it (``user_backlog``: shed
unread) is told to its user -- on its outcome stream, and in its job's record, which
``megha job ID`` and the front door read -- when its first fields show it is its user's
with the user's current token; a forged one is no one's to tell.  No broker: the
service is built, its publishing caught."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from common import codec
from common.config import FederationConfig
from common.ids import GmId, JobId, UserId
from common.jobspec import JobDef
from common.messages import AdmitJob, JobRefusal
from global_master.app import GmService
from security.access import Access
from security.identity import gm
from security.secret import Secret
from security.tokens import TokenStore
from tests.conftest import make_lm, sync_views

CFG = FederationConfig().validate()
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")


class Delivery:
    def __init__(self, body: bytes) -> None:
        self.body, self.headers, self.message_id = body, {}, "m"
        self.redelivered = False
        self.acks = 0

    async def ack(self) -> None:
        self.acks += 1


def service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[GmService, str, list[str], list[JobRefusal]]:
    """gm0's service for user u0 (its token), its broker caught: the reasons of what it
    dead-letters, and the refusals it tells."""
    monkeypatch.setenv("MEGHA_RUN_DIR", str(tmp_path / "run"))
    store = TokenStore.in_home(tmp_path)
    token = store.add("u0", gm="gm0", share=1.0, now=0.0)
    svc = GmService(CFG, GmId("gm0"), Access(gm("gm0"), CFG, SECRET, users_file=store.path))
    dead: list[str] = []
    told: list[JobRefusal] = []

    async def dead_letter(msg: Any, queue: str, reason: str, detail: str) -> None:
        dead.append(reason)

    async def publish(exchange: str, key: str, body: Any, **_: Any) -> None:
        told.append(codec.decode(body.body, expect=JobRefusal))

    svc.broker.dead_letter = dead_letter  # type: ignore[method-assign]
    svc.broker.publish = publish  # type: ignore[method-assign]
    return svc, token, dead, told


def test_a_shed_job_of_its_user_is_recorded_and_told_a_forged_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, token, dead, told = service(tmp_path, monkeypatch)
    monkeypatch.setattr(svc.unread, "take", lambda user, size, redelivered: "u0 has 9 MiB unread")

    def job(job_id: str, with_token: str) -> Delivery:
        sub = JobDef.single(2, [1], 1.0, name=job_id).submission(job_id, "u0", with_token, 1.0)
        return Delivery(codec.encode(sub))

    async def run() -> None:
        async with svc.sup:
            await svc._on_job(UserId("u0"), job("mine", token))  # type: ignore[arg-type]
            await svc._on_job(UserId("u0"), job("forged", "mgu_" + "0" * 40))  # type: ignore[arg-type]
            await svc._on_job(UserId("u0"), Delivery(b"\x93garbage"))  # type: ignore[arg-type]
            for _ in range(20):
                await asyncio.sleep(0)

    asyncio.run(run())
    assert dead == ["user_backlog"] * 3  # every one refused, with its reason
    assert [(n.user, n.job_id, n.reason) for n in told] == [("u0", "mine", "user_backlog")]
    book = svc.core.book
    assert book is not None
    rec = book.get(UserId("u0"), JobId("mine"))
    assert rec is not None
    assert book.summary(rec, svc.core.ledger)["reason"] == "user_backlog: u0 has 9 MiB unread"
    assert book.get(UserId("u0"), JobId("forged")) is None


def test_a_poison_job_of_its_user_is_recorded_and_told_unless_its_gm_holds_that_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A front-door job its GM died handling (dead-lettered ``poison``) read "submitted"
    for 10 minutes, then ``unknown_job``: now its record says failed and why.  A copy of
    a job the GM admitted is not that job: nothing told, its record untouched."""
    from runtime import poison

    svc, token, dead, told = service(tmp_path, monkeypatch)
    monkeypatch.setattr(svc.poison, "verdict", lambda key, redelivered: poison.Verdict.POISON)

    def sub(job_id: str) -> Any:
        return JobDef.single(2, [1, 1], 1.0, name=job_id).submission(job_id, "u0", token, 1.0)

    sync_views(svc.core, *(make_lm(lm) for lm in CFG.lm_ids))
    svc.core.handle(AdmitJob(job=sub("held")), 1.0)  # admitted by the core before its GM died

    async def run() -> None:
        async with svc.sup:
            for jid in ("killer", "held"):
                await svc._on_job(UserId("u0"), Delivery(codec.encode(sub(jid))))  # type: ignore[arg-type]
            for _ in range(20):
                await asyncio.sleep(0)

    asyncio.run(run())
    assert dead == ["poison", "poison"]
    assert [(n.job_id, n.reason) for n in told] == [("killer", "poison")]
    book = svc.core.book
    assert book is not None
    killer = book.get(UserId("u0"), JobId("killer"))
    assert killer is not None
    assert book.summary(killer, svc.core.ledger)["state"] == "failed"
    assert book.summary(killer, svc.core.ledger)["reason"].startswith("poison: gm0 died handling")
    held = book.get(UserId("u0"), JobId("held"))
    assert held is not None
    assert not held.refused
