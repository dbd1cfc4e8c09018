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
from global_master.app import GmService
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


def test_keep_ends_to_one_lm_leave_in_the_order_the_core_made_them(tmp_path: Path) -> None:
    """A job's "keep" retried while its LM is away must not land after its "let go"
    (the LM would keep the job's ends for ever): posts to one LM go one after another."""
    from common.effects import ToLm
    from common.ids import LmId
    from common.messages import KeepEnds

    svc, _ = service(tmp_path)
    landed: list[bool] = []

    class SlowFirst:
        async def post(self, path: str, msg: KeepEnds, **_: Any) -> None:
            assert path == "/v1/keep-ends"
            if msg.keep:  # the LM is away: the first post takes a while to land
                await asyncio.sleep(0.05)
            landed.append(msg.keep)

    lm0 = LmId("lm0")
    svc.lms[lm0] = SlowFirst()  # type: ignore[assignment]

    async def both() -> None:
        asks = [KeepEnds(gm=GmId("gm0"), lm=lm0, user=U0, job_id=JobId("j"), keep=k)
                for k in (True, False)]  # fmt: skip
        await asyncio.gather(*(svc._send(ToLm(lm0, m)) for m in asks))

    asyncio.run(both())
    assert landed == [True, False]
