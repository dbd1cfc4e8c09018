"""The GM service's side of admitting a job: a delivery it holds is settled by the core's
verdict; if the core raises on it (a bug, perhaps with part of the job taken), the job
ends explicitly -- an ``internal_error`` the consumer's guard dead-letters -- and the
delivery is forgotten, never held unanswered.  No broker: the service is built, not
started."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from common.errors import MeghaError
from common.ids import GmId, JobId, UserId
from common.messages import AdmitJob, SubmitJob
from global_master.app import KEEPS_LINGER_S, GmService
from security.access import Access
from security.identity import gm
from security.secret import Secret
from security.tokens import TokenStore
from tests.conftest import make_task

CFG = FederationConfig().validate()
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
U0 = UserId("u0")


@dataclass
class Delivery:
    """What the service reads of a broker delivery."""

    body: bytes = b""
    redelivered: bool = False
    headers: dict[str, Any] = field(default_factory=dict)


def service(home: Path) -> tuple[GmService, str]:
    store = TokenStore.in_home(home)
    token = store.add("u0", gm="gm0", share=1.0, now=0.0)
    return GmService(CFG, GmId("gm0"), Access(gm("gm0"), CFG, SECRET, users_file=store.path)), token


def test_a_job_the_core_raises_on_ends_explicitly_and_is_not_held(
    tmp_path: Path,
) -> None:
    svc, token = service(tmp_path)
    job = SubmitJob(job_id=JobId("j"), user=U0, token=token, submitted_at=0.0,
                    tasks=(make_task(job="j"),))  # fmt: skip
    fed: list[object] = []

    def broken(msg: object) -> None:
        raise RuntimeError("a bug in the core")

    svc.feed = broken  # type: ignore[method-assign]
    with pytest.raises(MeghaError) as failed:
        asyncio.run(svc._admit(U0, job, Delivery()))  # type: ignore[arg-type]
    assert failed.value.reason == "internal_error"
    assert "a bug in the core" in str(failed.value)
    assert not svc.deliveries

    svc.feed = fed.append  # type: ignore[method-assign]
    asyncio.run(svc._admit(U0, job, Delivery(redelivered=True)))  # type: ignore[arg-type]
    assert fed == [AdmitJob(job=job, redelivered=True)]
    assert (U0, JobId("j"), False) in svc.deliveries


def test_keep_ends_of_a_turn_go_to_each_lm_as_one_message_in_the_order_made(
    tmp_path: Path,
) -> None:
    """The core names one job per ``KeepEnds`` and LM; the service sends those of one
    loop turn to one LM as one message, one message at a time, in the order the core
    made them: a job's "keep" retried while its LM is away never lands after its "let
    go" (the LM would keep the job's ends for ever)."""
    from common.ids import LmId
    from common.messages import KeepEnds

    svc, _ = service(tmp_path)
    core = svc.core
    landed: dict[LmId, list[list[tuple[str, bool]]]] = {}

    class AwayAtFirst:
        def __init__(self, lm: LmId) -> None:
            self.lm = lm

        async def post(self, path: str, msg: KeepEnds, **_: Any) -> None:
            assert (path, msg.gm, msg.lm) == ("/v1/keep-ends", "gm0", self.lm)
            if not landed.get(self.lm):  # the LM is away: the first post takes a while
                await asyncio.sleep(0.05)
            landed.setdefault(self.lm, []).append([(j.job_id, j.keep) for j in msg.jobs])

    a, b = (U0, JobId("a")), (U0, JobId("b"))

    async def turns() -> None:
        async with svc.sup:
            for lm in core.lms:
                svc.lms[lm] = AwayAtFirst(lm)  # type: ignore[assignment]
            svc.driver.carry_out(core._keep_ends(a) + core._keep_ends(b))  # one turn
            await asyncio.sleep(0.01)  # its messages are on their way
            svc.driver.carry_out(core._keep_ends(a, keep=False))
            svc.driver.carry_out(core._keep_ends(b, keep=False))
            for _ in range(100):
                await asyncio.sleep(0.01)
                if all(len(landed.get(lm, ())) == 2 for lm in core.lms):
                    break

    asyncio.run(turns())
    both = [[("a", True), ("b", True)], [("a", False), ("b", False)]]
    assert landed == dict.fromkeys(core.lms, both)
    assert svc.keeps.traffic() == {"messages": 2 * len(core.lms), "items": 4 * len(core.lms)}
    # to a busy LM they linger longer than the completion path's messages: in no hurry
    assert svc.keeps.linger_s == KEEPS_LINGER_S > CFG.linger_s


def test_the_job_history_is_written_before_the_outcomes_it_records_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history's records of a loop turn go in one write at its end; an outcome
    leaves only after the records of its message are written, even when the flush that
    takes it resumes in the same turn, before that turn's end (its previous publication
    confirmed just then)."""
    from common.config import STATE_ENV
    from common.effects import Record, ToUser
    from common.messages import TaskOutcome
    from common.model import Task
    from global_master.lifecycle import JobEnded

    monkeypatch.setenv(STATE_ENV, str(tmp_path / "state"))
    svc, _ = service(tmp_path)
    history = svc.history
    assert history is not None
    logged_at_publish: list[int] = []
    confirm: asyncio.Future[None] | None = None

    async def publish(*_: Any) -> None:
        logged_at_publish.append(history.journal.records_logged)
        if confirm is not None and len(logged_at_publish) == 1:
            await confirm

    svc.broker.publish = publish  # type: ignore[assignment,method-assign]

    def outcome() -> ToUser:
        return ToUser(U0, TaskOutcome(task=Task(spec=make_task(job="j")), finished=True))

    async def turns() -> None:
        nonlocal confirm
        await history.open()
        confirm = asyncio.get_running_loop().create_future()
        async with svc.sup:
            svc.driver.carry_out([outcome()])
            for _ in range(100):  # its publication waits for its confirm
                await asyncio.sleep(0)
                if logged_at_publish:
                    break
            confirm.set_result(None)  # the flush resumes first in the next turn
            svc.driver.carry_out([Record((JobEnded(U0, JobId("j"), 1.0),)), outcome()])
            for _ in range(100):
                await asyncio.sleep(0)
                if len(logged_at_publish) == 2:
                    break
        history.close()

    asyncio.run(turns())
    assert logged_at_publish == [0, 1]
    assert history.writes == 1


def test_the_state_page_shows_the_allocations_of_the_last_window_only(tmp_path: Path) -> None:
    import time

    from global_master.pages import ALLOCATION_WINDOW_S, state_page

    svc, _ = service(tmp_path)
    now = time.time()
    for age, a in ((ALLOCATION_WINDOW_S + 5.0, 0.5), (ALLOCATION_WINDOW_S / 2, 0.25), (1.0, 0.125)):
        svc.recent_allocations.append((now - age, a))
    page = state_page(svc)
    assert [a for _, a in page["allocations"]["recent"]] == [0.25, 0.125]
