"""Every message ends handled or dead-lettered with its reason, never dropped (issue 32,
item 5).  A GM consumer that raised (not a refusal) after it had opened a batch's seal
put the batch back on its queue; it came back behind its own sequence number and was
acknowledged as ``stale_seq``: a FINISHED event vanished.  Now a batch the core did not
take is released (seal and message id) and taken when it comes back; the seal's window
takes a batch that comes back behind later ones, once.  No broker: the service is
built, not started, and its consumer's guard is driven by hand."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from common import codec
from common.config import FederationConfig
from common.ids import GmId, LmId, NodeIndex, TaskId, UserId
from common.messages import EventKind, TaskEvent, TaskEvents
from global_master.app import GmService
from runtime.broker import HANDLER_ATTEMPTS, Broker, Exchanges
from security import sealing
from security.access import Access
from security.identity import gm, lm
from security.secret import Secret
from security.tokens import TokenStore

CFG = FederationConfig().validate()
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
LM0 = lm("lm0")
GM0 = gm("gm0")
BODY = b"events"


class Kept:
    def __init__(self) -> None:
        self.published: list[Any] = []

    async def publish(self, message: Any, routing_key: str, **_: Any) -> None:
        self.published.append(message)


class Delivery:
    """A broker delivery, and what its consumer did with it."""

    def __init__(self, body: bytes, headers: dict[str, Any], message_id: str | None = None):
        self.body, self.headers, self.message_id = body, headers, message_id
        self.redelivered = False
        self.outcome = ""

    async def ack(self) -> None:
        self.outcome = "acked"

    async def nack(self, requeue: bool = True) -> None:
        self.outcome = "requeued" if requeue else "rejected"

    async def reject(self, requeue: bool = False) -> None:
        self.outcome = "rejected"

    def again(self) -> Delivery:
        back = Delivery(self.body, self.headers, self.message_id)
        back.redelivered = True
        return back


def consumer(b: Broker, handler: Any) -> Any:
    """The guarded consumer ``Broker.consume`` makes of ``handler``."""
    return b.guarded("fed.gm.gm0.events", handler)


# ------------------------------------------------------------------ the seal's window
def opener(window: int) -> sealing.Opener:
    return sealing.Opener(sealing.keyring_for(SECRET, [LM0]), "events.gm0", window=window)


def sealed(seq: int, epoch: int = 1) -> dict[str, object]:
    key = sealing.sealing_key(SECRET, LM0)
    return dict(sealing.seal(BODY, LM0, epoch, seq, key, stream="events.gm0"))


def test_a_window_takes_a_late_sequence_number_once_and_nothing_older() -> None:
    o = opener(4)
    assert isinstance(o.open(sealed(5), BODY), sealing.Opened)
    assert isinstance(o.open(sealed(3), BODY), sealing.Opened)  # late, within the window
    for seq, reason in ((3, "stale_seq"), (5, "stale_seq"), (1, "stale_seq")):
        got = o.open(sealed(seq), BODY)
        assert isinstance(got, sealing.Dropped), seq
        assert got.reason == reason
    assert isinstance(o.open(sealed(2), BODY), sealing.Opened)
    assert isinstance(o.open(sealed(9, epoch=0), BODY), sealing.Dropped)  # an older epoch


def test_a_released_message_is_taken_again_when_it_comes_back() -> None:
    o = opener(4)
    first = o.open(sealed(7), BODY)
    assert isinstance(first, sealing.Opened)
    assert isinstance(o.open(sealed(8), BODY), sealing.Opened)
    o.release(first)
    assert isinstance(o.open(sealed(7), BODY), sealing.Opened)
    assert isinstance(o.open(sealed(7), BODY), sealing.Dropped)  # once


def test_without_a_window_the_order_is_strict() -> None:
    o = opener(0)
    first = o.open(sealed(7), BODY)
    assert isinstance(first, sealing.Opened)
    o.release(first)
    assert isinstance(o.open(sealed(7), BODY), sealing.Dropped)
    assert isinstance(o.open(sealed(6), BODY), sealing.Dropped)


# ------------------------------------------------------- the GM's event consumer
def service(home: Path, monkeypatch: pytest.MonkeyPatch) -> GmService:
    monkeypatch.setenv("MEGHA_RUN_DIR", str(home / "run"))
    store = TokenStore.in_home(home)
    store.add("u0", gm="gm0", share=1.0, now=0.0)
    svc = GmService(CFG, GmId("gm0"), Access(gm("gm0"), CFG, SECRET, users_file=store.path))
    dlx = Kept()
    svc.broker._ex = Exchanges(dlx, dlx, dlx, dlx)  # type: ignore[arg-type]
    return svc


def finished_batch(seq: int) -> Delivery:
    ev = TaskEvent(
        kind=EventKind.FINISHED, lm=LmId("lm0"), gm=GmId("gm0"), user=UserId("u0"),
        task_id=TaskId("t1"), attempt=1, node=NodeIndex(0), node_free=(1,), node_version=1,
        at=time.time(),
    )  # fmt: skip
    body = codec.encode(TaskEvents(lm=LmId("lm0"), epoch=1, events=(ev,)))
    key = {GM0: sealing.sealing_key(SECRET, LM0, GM0)}
    headers = dict(sealing.seal(body, LM0, 1, seq, key, stream="events.gm0"))
    return Delivery(body, headers, message_id=f"lm0.1.{seq}")


def test_a_finished_event_whose_handling_raised_is_handled_when_it_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = service(tmp_path, monkeypatch)
    fed: list[object] = []
    calls = 0

    def feed_once_broken(msg: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug, once")
        fed.append(msg)

    svc.feed = feed_once_broken  # type: ignore[method-assign]
    guarded = consumer(svc.broker, svc._on_events)
    first = finished_batch(5)
    asyncio.run(guarded(first))
    assert first.outcome == "requeued"
    later = finished_batch(6)  # another batch overtakes it on the way back
    asyncio.run(guarded(later))
    back = first.again()
    asyncio.run(guarded(back))
    assert back.outcome == "acked"
    assert len(fed) == 2  # both batches reached the core
    assert svc.event_seals.drops.get(sealing.DropReason.STALE_SEQ, 0) == 0
    again = first.again()  # the broker delivers it once more: now it is a duplicate
    asyncio.run(guarded(again))
    assert again.outcome == "acked"
    assert len(fed) == 2


def test_a_message_that_fails_twice_is_dead_lettered_even_if_it_came_redelivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch redelivered after a GM crash (``redelivered`` set) that raises gets its
    retries; one that raises every time is dead-lettered with its reason."""
    b = Broker(CFG, "gm0")
    dlx = Kept()
    b._ex = Exchanges(dlx, dlx, dlx, dlx)  # type: ignore[arg-type]

    async def broken(msg: object) -> None:
        raise RuntimeError("always")

    guarded = consumer(b, broken)
    msg = finished_batch(1).again()
    for _ in range(HANDLER_ATTEMPTS - 1):
        asyncio.run(guarded(msg))
        assert msg.outcome == "requeued"
        assert not dlx.published
        msg = msg.again()
    asyncio.run(guarded(msg))
    assert msg.outcome == "acked"  # after its dead letter
    (letter,) = dlx.published
    assert letter.headers["x-megha-reason"] == "handler_error"


def test_a_batch_refused_for_its_body_moves_nothing_of_its_sender_s_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sealed by lm1 at a newer epoch, about lm0: dead-lettered ``sender_mismatch``; it
    moved lm1's position in the stream to that epoch, so lm1's own later batches were
    dropped as ``stale_epoch``."""
    svc = service(tmp_path, monkeypatch)
    fed: list[object] = []
    svc.feed = fed.append  # type: ignore[method-assign]
    guarded = consumer(svc.broker, svc._on_events)
    lm1 = lm("lm1")
    key = {GM0: sealing.sealing_key(SECRET, lm1, GM0)}
    about_lm0 = finished_batch(1)
    headers = dict(sealing.seal(about_lm0.body, lm1, 2**62, 1, key, stream="events.gm0"))
    asyncio.run(guarded(Delivery(about_lm0.body, headers, message_id="x")))
    (letter,) = svc.broker.ex.dlx.published  # type: ignore[attr-defined]
    assert letter.headers["x-megha-reason"] == "sender_mismatch"
    ev = TaskEvent(
        kind=EventKind.FINISHED, lm=LmId("lm1"), gm=GmId("gm0"), user=UserId("u0"),
        task_id=TaskId("t2"), attempt=1, node=NodeIndex(0), node_free=(1,), node_version=1,
        at=time.time(),
    )  # fmt: skip
    body = codec.encode(TaskEvents(lm=LmId("lm1"), epoch=5, events=(ev,)))
    real = Delivery(body, dict(sealing.seal(body, lm1, 5, 1, key, stream="events.gm0")), "lm1.5.1")
    asyncio.run(guarded(real))
    assert real.outcome == "acked"
    assert len(fed) == 1  # lm1's own batch was taken
