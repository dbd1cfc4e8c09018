"""The GM's front door publishes a submission within ``frontdoor.PUBLISH_S`` or refuses
it: a full user queue (the broker nacks every publish) is 429 ``queue_full``, a broker
that does not confirm 503 ``broker_unavailable``.  The publish was retried for ever: the
request hung, and the job went into the queue once it drained, long after its caller
had given up on it (and perhaps submitted it again).  No broker: the service is built,
not started; its broker's ``publish`` is a stand-in that retries as the real one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from common.config import FederationConfig
from common.ids import GmId, JobId, UserId
from common.messages import SubmitJob
from global_master import frontdoor
from global_master.app import GmService
from runtime import broker as amqp
from runtime.retry import Backoff, retry
from security.access import Access
from security.identity import gm
from security.secret import Secret
from security.tokens import TokenStore
from tests.conftest import make_task

CFG = FederationConfig().validate()
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")


class Broker:
    """``runtime.broker.Broker.publish``'s retrying, over a publish that always fails
    with ``error`` (``None``: hangs, as a broker that never confirms)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error, self.tries = error, 0

    async def publish(
        self, exchange: str, key: str, message: object, *, policy: Backoff | None = None
    ) -> None:
        async def once() -> None:
            self.tries += 1
            if self.error is None:
                await asyncio.Event().wait()
            raise self.error  # type: ignore[misc]

        policy = policy or Backoff(first_s=0.05, cap_s=2.0, deadline_s=None)  # the default
        await retry(once, policy, what="publish", retry_on=(amqp.Nacked, ConnectionError))


@pytest.mark.parametrize(
    ("error", "reason"),
    [(amqp.Nacked("nack"), "queue_full"), (ConnectionError("down"), "broker_unavailable"),
     (None, "broker_unavailable")],
)  # fmt: skip
def test_a_job_the_broker_does_not_take_is_refused_in_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException | None, reason: str
) -> None:
    monkeypatch.setattr(frontdoor, "PUBLISH_S", 0.3)
    store = TokenStore.in_home(tmp_path)
    token = store.add("u0", gm="gm0", share=1.0, now=0.0)
    svc = GmService(CFG, GmId("gm0"), Access(gm("gm0"), CFG, SECRET, users_file=store.path))
    svc.broker = svc.refusals.broker = Broker(error)  # type: ignore[assignment]
    job = SubmitJob(job_id=JobId("j"), user=UserId("u0"), token=token, submitted_at=0.0,
                    tasks=(make_task(job="j"),))  # fmt: skip
    door = svc.front_door()

    async def go() -> None:
        async with asyncio.timeout(5.0):  # (for ever, before)
            await door.publish(job)

    began = time.monotonic()
    with pytest.raises(frontdoor.NotQueued) as refused:
        asyncio.run(go())
    assert refused.value.reason == reason
    assert "'j'" in str(refused.value)  # the job's id, to submit it again by
    assert time.monotonic() - began < 2.0
    assert svc.broker.tries >= 1  # type: ignore[attr-defined]
