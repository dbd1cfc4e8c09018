"""``runtime.broker``'s lean publish path on real aiormq channels (over a fake
connection): the bytes it writes are aiormq's, its confirms are settled by aiormq's
own bookkeeping (acks, ``multiple`` acks, nacks, returns, a channel closing), it gives
way to aiormq's ``basic_publish`` whenever the order of delivery tags could suffer, and
frames go straight to the socket only when nothing waits before them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import aiormq.exceptions
import pytest
from aiormq.abc import ChannelFrame
from aiormq.base import Base
from aiormq.channel import Channel
from pamqp import body as amqp_body
from pamqp import frame as amqp_frame
from pamqp import header
from pamqp.commands import Basic

from runtime import broker
from runtime.broker import Properties

FRAME_MAX = 4096


class Writer:
    """A stream writer whose socket keeps up (or not: ``backlog``)."""

    def __init__(self, backlog: int = 0) -> None:
        self.data: list[bytes] = []
        self.transport = SimpleNamespace(
            is_closing=lambda: False, get_write_buffer_size=lambda: backlog
        )

    def write(self, data: bytes) -> None:
        self.data.append(data)


class Connection(Base):
    """As much of an aiormq connection as a channel needs, never opened."""

    is_opened = False

    def __init__(self, writer: Writer | None = None) -> None:
        super().__init__(loop=asyncio.get_running_loop())
        self.publisher_confirms = True
        self.connection_tune = SimpleNamespace(frame_max=FRAME_MAX)
        self.write_queue: asyncio.Queue[ChannelFrame] = asyncio.Queue(maxsize=10)
        self._transport_factory = SimpleNamespace(megha_writer=writer)

    async def _on_close(self, exc: Any = None) -> None:
        return None

    def __str__(self) -> str:
        return "fake"


def channel(writer: Writer | None = None) -> Channel:
    """A publisher channel, its confirms settled by ``runtime.broker``."""
    ch = Channel(Connection(writer), 3, publisher_confirms=True)  # type: ignore[arg-type]
    broker._take_confirms_at_once(ch)
    return ch


def send(ch: Channel, body: bytes = b"b", mid: str = "m", mandatory: bool = True) -> Any:
    props = Properties(broker.MSGPACK, {"x-megha-seq": 1}, 2, mid)
    return broker._send_publish(ch, "megha.events", "gm.gm0.lm0", props, body, mandatory)


def queued(ch: Channel) -> list[bytes]:
    out = []
    while not ch.write_queue.empty():
        out.append(ch.write_queue.get_nowait().payload)
    return out


def frames_of(data: bytes) -> list[Any]:
    out = []
    while data:
        used, _, f = amqp_frame.unmarshal(data)
        out.append(f)
        data = data[used:]
    return out


@pytest.mark.parametrize(
    "size", [0, 1, 600, FRAME_MAX - 9, FRAME_MAX - 8, FRAME_MAX - 7, 3 * FRAME_MAX + 5]
)
@pytest.mark.parametrize("mandatory", [True, False])
def test_a_publish_writes_what_aiormq_would(size: int, mandatory: bool) -> None:
    async def run() -> None:
        ch = channel()
        body = bytes(i % 251 for i in range(size))
        props = Properties(broker.MSGPACK, {"x-megha-seq": 7, "x-megha-to": "gm:gm0"}, 2, "m1")
        sent = broker._send_publish(ch, "megha.events", "gm.gm0.lm0", props, body, mandatory)
        assert sent is not None
        theirs = ChannelFrame.marshall(
            channel_number=3,
            frames=[
                Basic.Publish(
                    exchange="megha.events", routing_key="gm.gm0.lm0", mandatory=mandatory
                ),
                header.ContentHeader(body_size=len(body), properties=props),
                *ch._split_body(body),
            ],
        )
        assert queued(ch) == [theirs.payload]
        sent[0].cancel()

    asyncio.run(run())


def test_confirms_settle_their_publishes_at_once_as_aiormq_does() -> None:
    async def run() -> None:
        ch = channel()
        sent = [send(ch, mid=f"m{i}") for i in range(1, 5)]
        assert [tag for _, tag, _ in sent] == [1, 2, 3, 4]
        assert ch.message_id_delivery_tag == {"m1": 1, "m2": 2, "m3": 3, "m4": 4}
        await ch.frames.put((0, Basic.Ack(delivery_tag=2, multiple=True)))
        assert [f.done() for f, _, _ in sent] == [True, True, False, False]  # no turn
        assert ch.frames.empty()
        await ch.frames.put((0, Basic.Nack(delivery_tag=3)))
        await ch.frames.put((0, Basic.Ack(delivery_tag=4)))
        assert isinstance(sent[0][0].result(), Basic.Ack)
        with pytest.raises(aiormq.exceptions.DeliveryError) as nacked:
            sent[2][0].result()
        assert isinstance(nacked.value.frame, Basic.Nack)
        assert isinstance(sent[3][0].result(), Basic.Ack)
        assert not ch.confirmations
        for _, tag, mid in sent:
            broker._forget(ch, tag, mid)
        assert not ch.message_id_delivery_tag
        await ch.close()

    asyncio.run(run())


def test_a_returned_publish_raises_and_a_confirm_behind_other_frames_waits_its_turn() -> None:
    async def run() -> None:
        ch = channel()
        (returned, _, _), (taken, _, _) = send(ch, mid="lost"), send(ch, mid="kept")
        props = Properties(broker.MSGPACK, None, 2, "lost")
        for f in (
            Basic.Return(312, "NO_ROUTE", "megha.events", "gm.nobody"),
            header.ContentHeader(body_size=1, properties=props),
            amqp_body.ContentBody(b"b"),
            Basic.Ack(delivery_tag=2, multiple=True),
        ):
            ch.frames.put_nowait((0, f))
        assert ch.frames.qsize() == 4  # the ack is behind the return: queued, in order
        assert not taken.done()
        for _ in range(10):
            await asyncio.sleep(0)
        with pytest.raises(aiormq.exceptions.DeliveryError):
            returned.result()
        assert isinstance(taken.result(), Basic.Ack)
        await ch.close()

    asyncio.run(run())


def test_a_channel_closing_fails_the_confirms_it_still_owes() -> None:
    async def run() -> None:
        ch = channel()
        confirmation, _, _ = send(ch)
        await ch.close(aiormq.exceptions.ChannelClosed(320, "connection forced"))
        await asyncio.sleep(0)
        with pytest.raises(aiormq.exceptions.ChannelClosed):
            confirmation.result()
        with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
            send(ch, mid="after")

    asyncio.run(run())


def test_aiormq_publishes_when_the_order_of_delivery_tags_could_suffer() -> None:
    async def run() -> None:
        ch = channel()
        async with ch.lock:  # an aiormq publish between its tag and its frames
            assert send(ch) is None
        assert send(ch, mid="") is None  # no id to match a return with
        for _ in range(10):
            ch.write_queue.put_nowait(ChannelFrame(payload=b"", should_close=False))
        assert send(ch) is None  # the writer is behind
        assert ch.delivery_tag == 0
        assert not ch.confirmations
        queued(ch)
        assert send(ch) is not None
        await ch.close()

    asyncio.run(run())


def test_frames_go_straight_to_the_socket_only_when_none_wait_before_them() -> None:
    async def run() -> None:
        writer = Writer()
        ch = channel(writer)
        send(ch, mid="a")
        assert len(writer.data) == 1
        assert not queued(ch)
        ch.write_queue.put_nowait(ChannelFrame(payload=b"before", should_close=False))
        send(ch, mid="b")
        assert len(writer.data) == 1
        assert [frames_of(p)[0].__class__ for p in queued(ch)[1:]] == [Basic.Publish]
        slow = channel(Writer(backlog=broker.WRITE_BUFFER_LIMIT))
        send(slow)
        assert len(queued(slow)) == 1
        await ch.close()
        await slow.close()

    asyncio.run(run())


def test_acks_go_straight_to_the_socket_too() -> None:
    async def run() -> None:
        writer = Writer()
        ch = channel(writer)
        acks = broker._Acks(ch)
        acks.delivered(1)
        acks.ack(1)
        await asyncio.sleep(0)
        assert [(type(f), f.delivery_tag) for f in frames_of(writer.data[0])] == [(Basic.Ack, 1)]
        await ch.close()

    asyncio.run(run())
