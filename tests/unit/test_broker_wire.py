"""What ``runtime.broker`` puts on the wire without aio_pika's objects: the properties of
a message (byte for byte what pamqp makes of them), and the acks of a consumer channel
(one ``multiple`` ack for the lowest deliveries in hand, never one that takes a delivery
not acked)."""

from __future__ import annotations

import asyncio
import datetime
import decimal
from typing import Any

import aio_pika
import aiormq.exceptions
import pytest
from pamqp import frame as amqp_frame
from pamqp import header
from pamqp.commands import Basic

from runtime import broker
from runtime.broker import Delivery, Properties, _Acks

TABLES: list[dict[str, Any] | None] = [
    None,
    {},
    {"x-megha-sender": "lm:lm0", "x-megha-epoch": 1764300000000, "x-megha-seq": 7},
    {"é-ü": "naïve ☃", "b": True, "c": False, "z": "", "a": "x" * 300},
    {f"i{v}": v for v in (0, -1, 127, 128, -128, -129, 32767, 32768, 65535, 65536,
                          2**31 - 1, 2**31, 2**32 - 1, 2**32, -(2**31) - 1, 2**63 - 1)},
    {"f": 1.5, "d": decimal.Decimal("1.25"), "n": None, "t": {"k": [1, "two", {"x": 3}]},
     "ba": bytearray(b"\x00\xff"), "ts": datetime.datetime(2026, 11, 29, 3, 0, 0)},
    {"k" * 200: "a name pamqp cuts to 128 bytes"},
]  # fmt: skip


@pytest.mark.parametrize("headers", TABLES)
@pytest.mark.parametrize("content_type", [None, "application/x-msgpack"])
@pytest.mark.parametrize("delivery_mode", [None, 1, 2])
@pytest.mark.parametrize("message_id", [None, "", "lm0.1.42"])
def test_properties_marshal_as_pamqp_does(
    headers: dict[str, Any] | None,
    content_type: str | None,
    delivery_mode: int | None,
    message_id: str | None,
) -> None:
    ours = Properties(content_type, headers, delivery_mode, message_id)
    theirs = Basic.Properties(
        content_type=content_type, headers=headers, delivery_mode=delivery_mode,
        message_id=message_id,
    )  # fmt: skip
    assert ours.marshal() == theirs.marshal()
    assert ours == theirs


def test_other_properties_and_bad_values_go_through_pamqp() -> None:
    ours = Properties("text/plain", {"a": 1}, 2, "m")
    ours.priority, ours.app_id = 3, "megha"
    theirs = Basic.Properties(
        content_type="text/plain", headers={"a": 1}, delivery_mode=2, message_id="m",
        priority=3, app_id="megha",
    )  # fmt: skip
    assert ours.marshal() == theirs.marshal()
    with pytest.raises(TypeError, match="bad"):
        Properties(None, {"bad": object()}, 2, "m").marshal()


def test_a_message_gets_an_id_of_its_own_kept_across_retries() -> None:
    a, b = broker.persistent(b"a"), broker.transient(b"b", headers={"h": 1})
    assert a.message_id
    assert b.message_id
    assert a.message_id != b.message_id
    assert a.delivery_mode == 2
    assert b.delivery_mode is None
    assert b.headers == {"h": 1}
    assert a.headers is None
    assert broker.persistent(b"c", message_id="lm0.1.1").message_id == "lm0.1.1"


class Channel:
    """As much of an aiormq channel as ``_Acks`` and ``Delivery`` use."""

    number = 2

    def __init__(self) -> None:
        self.is_closed = False
        self.write_queue: asyncio.Queue[Any] = asyncio.Queue()
        self.sent: list[tuple[str, int, bool]] = []

    async def basic_nack(self, tag: int, requeue: bool = True) -> None:
        self.sent.append(("nack", tag, requeue))

    async def basic_reject(self, tag: int, requeue: bool = False) -> None:
        self.sent.append(("reject", tag, requeue))

    def written(self) -> list[tuple[str, int, bool]]:
        """The ack frames queued for the socket, in order."""
        while not self.write_queue.empty():
            payload = self.write_queue.get_nowait().payload
            while payload:
                used, channel, f = amqp_frame.unmarshal(payload)
                assert channel == self.number
                assert isinstance(f, Basic.Ack)
                self.sent.append(("ack", f.delivery_tag, f.multiple))
                payload = payload[used:]
        return self.sent


class Raw:
    """An aiormq ``DeliveredMessage``."""

    def __init__(self, tag: int, headers: dict[str, Any] | None = None) -> None:
        self.body = b"body"
        self.delivery = Basic.Deliver("c", tag, redelivered=tag == 3)
        self.header = type("H", (), {"properties": Basic.Properties(headers=headers)})()


def deliveries(ch: Channel, n: int) -> tuple[_Acks, list[Delivery]]:
    acks = _Acks(ch)  # type: ignore[arg-type]
    return acks, [Delivery(Raw(t), acks) for t in range(1, n + 1)]  # type: ignore[arg-type]


async def turn() -> None:
    """One turn of the event loop: the acks of the last are sent."""
    await asyncio.sleep(0)


def test_acks_in_order_go_as_one_multiple_ack() -> None:
    async def run() -> list[tuple[str, int, bool]]:
        ch = Channel()
        _, ds = deliveries(ch, 4)
        for d in ds[:3]:
            await d.ack()
        await turn()
        return ch.written()

    assert asyncio.run(run()) == [("ack", 3, True)]


def test_an_ack_above_a_delivery_in_hand_goes_alone() -> None:
    async def run() -> list[tuple[str, int, bool]]:
        ch = Channel()
        acks, ds = deliveries(ch, 6)
        for i in (0, 2, 3, 5):  # 2 and 5 in hand
            await ds[i].ack()
        await turn()
        await ds[1].ack()
        await ds[4].ack()
        await turn()
        assert not acks.in_hand
        return ch.written()

    assert asyncio.run(run()) == [
        ("ack", 1, False), ("ack", 3, False), ("ack", 4, False), ("ack", 6, False),
        ("ack", 5, True),  # 2 and 5 now; 1, 3, 4 and 6 went before
    ]  # fmt: skip


def test_a_nack_goes_at_once_and_no_multiple_ack_passes_over_a_delivery_in_hand() -> None:
    async def run() -> list[tuple[str, int, bool]]:
        ch = Channel()
        _, ds = deliveries(ch, 4)
        await ds[1].nack(requeue=True)
        await ds[0].ack()
        await ds[2].ack()
        await ds[3].reject(requeue=False)
        await turn()
        return ch.written()

    assert asyncio.run(run()) == [
        ("nack", 2, True), ("reject", 4, False), ("ack", 3, True),  # 1 and 3: 2 was nacked
    ]  # fmt: skip


def test_a_delivery_is_settled_once_and_one_without_acks_never() -> None:
    async def run() -> None:
        ch = Channel()
        _, (d, *_) = deliveries(ch, 1)
        assert (d.body, d.delivery_tag, d.redelivered, d.headers) == (b"body", 1, False, {})
        await d.ack()
        with pytest.raises(aio_pika.exceptions.MessageProcessError):
            await d.nack()
        free = Delivery(Raw(3, {"h": "v"}), None)  # type: ignore[arg-type]
        assert free.redelivered
        assert free.headers == {"h": "v"}
        with pytest.raises(TypeError):
            await free.ack()

    asyncio.run(run())


def test_acks_on_a_closed_channel_are_dropped_for_the_broker_to_redeliver() -> None:
    async def run() -> list[tuple[str, int, bool]]:
        ch = Channel()
        _, ds = deliveries(ch, 2)
        await ds[0].ack()
        ch.is_closed = True
        await turn()
        return ch.written()

    assert asyncio.run(run()) == []


def test_a_long_held_delivery_does_not_keep_every_later_tag() -> None:
    async def run() -> int:
        ch = Channel()
        acks, ds = deliveries(ch, 1000)
        for d in ds[1:]:  # the first is held (a GM's job waits for its tasks)
            await d.ack()
            await turn()
        ch.written()
        return len(acks._lowest)

    assert asyncio.run(run()) < 200


# ------------------------------------------------------------ what is read, fast
PROPERTIES = [
    Basic.Properties(),
    Basic.Properties(content_type="application/x-msgpack", delivery_mode=2, message_id="p.1"),
    *(Basic.Properties(content_type="application/x-msgpack", headers=t, message_id="m")
      for t in TABLES if t is not None and len(next(iter(t), "")) <= 128),
    Basic.Properties(headers={"x": "y"}, priority=5, app_id="a"),  # other properties
]  # fmt: skip


def _header_frame(props: Basic.Properties) -> bytes:
    return header.ContentHeader(body_size=42, properties=props).marshal()


@pytest.mark.parametrize("props", PROPERTIES)
def test_properties_are_read_as_pamqp_reads_them(props: Basic.Properties) -> None:
    data = _header_frame(props)
    ours, theirs = header.ContentHeader(), header.ContentHeader()
    broker._read_content_header(ours, data)
    broker._pamqp_read_content_header(theirs, data)
    assert ours.body_size == theirs.body_size == 42
    assert ours.properties == theirs.properties


@pytest.mark.parametrize(
    "raw",
    [
        b"S\x00\x00\x00\x02\xff\xfe",  # not UTF-8: pamqp keeps the bytes
        b"S\x00\x00\x00\x09ab",  # a string past the table
        b"I\x00\x01",  # an integer cut short
        b"Z",  # no such type
    ],
)
def test_a_table_the_fast_reader_does_not_know_is_read_by_pamqp(raw: bytes) -> None:
    entry = b"\x01k" + raw
    table = len(entry).to_bytes(4, "big") + entry
    data = (60).to_bytes(2, "big") + bytes(2) + (7).to_bytes(8, "big") + b"\x20\x00" + table
    ours, theirs = header.ContentHeader(), header.ContentHeader()
    try:
        broker._pamqp_read_content_header(theirs, data)
    except Exception as exc:  # pamqp refuses it: so does ours, alike
        with pytest.raises(type(exc)):
            broker._read_content_header(ours, data)
        return
    broker._read_content_header(ours, data)
    assert ours.properties == theirs.properties


@pytest.mark.parametrize(
    "method",
    [
        Basic.Deliver("ctag-1", 1, False, "megha.events", "gm.gm0.lm0"),
        Basic.Deliver("", 2**63 - 1, True, "", ""),
        Basic.Deliver("é" * 100, 77, True, "x" * 127, "k.ü"),
        Basic.Ack(5, False),
        Basic.Ack(2**40, True),
    ],
)
def test_deliveries_and_confirms_are_read_as_pamqp_reads_them(method: Any) -> None:
    data = method.marshal()
    ours, theirs = type(method)(), type(method)()
    ours.unmarshal(data)
    pamqp_read = (
        broker._pamqp_read_deliver
        if isinstance(method, Basic.Deliver)
        else (broker._pamqp_read_ack)
    )
    pamqp_read(theirs, data)
    for name in method.__slots__:
        assert getattr(ours, name) == getattr(theirs, name) == getattr(method, name), name


@pytest.mark.parametrize(
    "fields",
    [("megha.submit", "u0", True, False), ("megha.events", "gm.gm0.lm0", True, False),
     ("", "", False, False), ("x", "é.ü", False, True)],
)  # fmt: skip
def test_a_publish_method_is_marshalled_once_and_the_same(fields: tuple[Any, ...]) -> None:
    exchange, key, mandatory, immediate = fields
    method = Basic.Publish(0, exchange, key, mandatory, immediate)
    assert method.marshal() == broker._pamqp_marshal_publish(method)
    assert method.marshal() == broker._pamqp_marshal_publish(method)  # remembered
    other = Basic.Publish(0, exchange, key + "x", mandatory, immediate)
    assert other.marshal() == broker._pamqp_marshal_publish(other) != method.marshal()


def _frames_of(data: bytes, chunks: list[int]) -> tuple[list[Any], list[Any]]:
    """What ``FrameReceiver`` reads from ``data`` fed in ``chunks`` (sizes; the rest
    at the end), with runtime.broker's reader and with aiormq's own, until EOF."""
    return _read_frames(data, chunks, broker._get_frame), _read_frames(
        data, chunks, broker._aiormq_get_frame
    )


def _read_frames(data: bytes, chunks: list[int], get: Any) -> list[Any]:
    from aiormq.connection import FrameReceiver

    async def feed(reader: asyncio.StreamReader) -> None:
        at = 0
        for n in [*chunks, len(data)]:  # a chunk at a time, the reader reading between
            reader.feed_data(data[at : at + n])
            at += n
            await asyncio.sleep(0)
        reader.feed_eof()

    async def read() -> list[Any]:
        reader = asyncio.StreamReader()
        feeding = asyncio.get_running_loop().create_task(feed(reader))
        await asyncio.sleep(0)
        receiver = FrameReceiver(reader)
        receiver.started = True
        out = []
        while True:
            try:
                out.append(await get(receiver))
            except (StopAsyncIteration, AttributeError):
                break
            except Exception as exc:  # the same refusal either way
                out.append(type(exc))
                break
        await feeding
        return out

    return asyncio.run(read())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, type | int):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if hasattr(a, "value") and not hasattr(a, "__slots__"):  # a body
        return bool(a.value == b.value)
    if isinstance(a, header.ContentHeader):
        return (a.body_size, a.properties) == (b.body_size, b.properties)
    return all(getattr(a, n) == getattr(b, n) for n in getattr(a, "__slots__", ()))


def _delivery_bytes(tag: int, body: bytes) -> bytes:
    from pamqp import body as amqp_body
    from pamqp import heartbeat

    props = Properties("application/x-msgpack", {"x-megha-seq": tag}, 2, f"m{tag}")
    return b"".join(
        amqp_frame.marshal(f, 1)
        for f in (
            Basic.Deliver("ctag", tag, False, "megha.events", "gm.gm0.lm0"),
            header.ContentHeader(0, len(body), props),
            amqp_body.ContentBody(body),
            Basic.Ack(tag, True),
        )
    ) + amqp_frame.marshal(heartbeat.Heartbeat(), 0)


@pytest.mark.parametrize(
    "chunks",
    [[], [1], [7], [8], [40], [3, 50, 1, 200], [1] * 64],
)
def test_frames_are_read_from_the_buffer_as_aiormq_reads_them(chunks: list[int]) -> None:
    data = b"".join(_delivery_bytes(t, b"x" * t) for t in (1, 2, 300))
    ours, theirs = _frames_of(data, chunks)
    assert len(ours) == len(theirs) == 16  # 15 frames, then the stream's end mid-frame
    assert all(_same(a, b) for a, b in zip(ours, theirs, strict=True))
    assert ours[-1] is aiormq.exceptions.AMQPConnectionError


def test_whole_frames_in_the_buffer_are_taken_without_aiormq_reader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow: list[int] = []
    aiormq_get_frame = broker._aiormq_get_frame

    async def counted(receiver: Any) -> Any:
        slow.append(1)
        return await aiormq_get_frame(receiver)

    monkeypatch.setattr(broker, "_aiormq_get_frame", counted)
    data = b"".join(_delivery_bytes(t, b"y" * 10) for t in (1, 2))
    ours = _read_frames(data, [], broker._get_frame)
    assert len(ours) == 11
    assert len(slow) == 2  # the two heartbeats (the stream's end, waited for, raised here)


def test_a_frame_without_its_end_byte_is_refused_as_aiormq_refuses_it() -> None:
    good = _delivery_bytes(1, b"abc")
    first = 8 + int.from_bytes(good[3:7], "big")  # the deliver frame, its end byte last
    bad = good[: first - 1] + b"\x00" + good[first:]
    for data in (bad, good[:20]):
        ours, theirs = _frames_of(data, [])
        assert len(ours) == len(theirs)
        assert all(_same(a, b) for a, b in zip(ours, theirs, strict=True))
        assert ours[-1] is aiormq.exceptions.AMQPConnectionError or isinstance(ours[-1], type)
