"""The federation's RabbitMQ side, shared by every service and the request generator.

The topology -- exchanges, queues, bindings, routing keys -- is one table
(``common.broker_names``, ``security.broker_acl.topology``), declared by the
operator only (``megha up``: with the broker users it provisions, or
``declare_topology``); services open it passively, each logged in as its own
broker user where the federation has them, so the broker enforces who publishes,
binds and consumes what.

``Broker`` publishes persistent messages with confirms (an unroutable one raises),
consumes with a bounded prefetch, and wraps every consumer so that nothing loops
forever: bad input is dead-lettered at once with its reason (and at most the first
``DEAD_LETTER_BODY`` bytes of its body), as is a delivery whose AMQP properties the
client library cannot read (``unreadable_properties``) or that are larger than
``MAX_PROPERTIES_BYTES`` (``headers_too_large``: never parsed, never copied); any
other exception requeues the message once and dead-letters it (``handler_error``)
when it fails a second time in this process.  A dead letter keeps its message's own
headers only up to ``DEAD_LETTER_HEADERS`` bytes, so it always fits one frame.
The broker may be a cluster (``broker_url`` lists its nodes, comma-separated): a lost
connection fails over to the next node that answers, the process's setups (queues,
consumers) run again there, then ``on_reconnect`` (a GM asks for fresh snapshots).
With ``queue_type = "quorum"`` every durable queue is a quorum queue, replicated
over the cluster, so losing one node loses no job, event or outcome.

The hot path skips aio-pika's per-message objects (issue 35): a consumer gets a
``Delivery`` straight from aiormq's channel, and its acks go out once per turn of the
event loop, the lowest ones as one ``multiple`` ack (``_Acks``).  A publish of an
``Outgoing`` (its ``Properties`` made once) is marshalled here, method, header and body
frames in one ``bytes`` (``publish_frames``), and written straight to the socket when
nothing waits in aiormq's write queue (``_write``; acks too); its confirm is registered
in aiormq's channel as aiormq's ``basic_publish`` registers it (``_send_publish``), and
a confirm that finds the channel's frame queue empty settles its publishes in the
connection's reader (``_ConfirmFrames``): no channel lock, drain future, writer task or
channel reader task per publish.  Whenever the order of delivery tags could suffer
(another publish holds the channel's lock, the write queue is full), aiormq's own
``basic_publish`` publishes.  Messages stay persistent and confirmed.  pamqp's generic
readers and writers are bypassed only for the shapes this federation sends (a delivery,
a confirm, a header table of strings, integers and booleans), to the same bytes and
values; anything else goes through pamqp.  A frame already whole in the socket's buffer
is taken from it at once (``_get_frame``), not through aiormq's three awaited reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

import aio_pika
import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractQueue,
)
from aiormq.abc import AbstractChannel as RawChannel
from aiormq.abc import ChannelFrame, DeliveredMessage
from aiormq.connection import FrameReceiver, TCPTransportFactory, TLSTransportFactory
from pamqp import body as amqp_body
from pamqp import constants
from pamqp import encode as amqp_encode
from pamqp import frame as amqp_frame
from pamqp import header as amqp_header
from pamqp.commands import Basic
from pamqp.common import FieldTable, FieldValue
from pamqp.exceptions import PAMQPException

from common.config import FederationConfig
from common.errors import InvalidInput, MeghaError
from runtime.poison import delivery_key
from runtime.retry import Backoff, retry
from security.broker_acl import BrokerLayout, topology

REASON_HEADER = "x-megha-reason"
SIZE_HEADER = "x-megha-size"
"""A dead letter's original body size, in bytes."""
TRUNCATED_HEADER = "x-megha-truncated"
"""Whether a dead letter's body was cut to its first ``DEAD_LETTER_BODY`` bytes."""
DEAD_LETTER_BODY = 64 * 1024
"""The most of a refused message's body a dead letter keeps: enough to see what it
was, not enough for a user to fill the broker with refused garbage (the dead-letter
queue is bounded too: ``security.broker_acl.DEFAULT_MAX_DEAD_LETTER_BYTES``)."""
UNREADABLE_HEADER = "x-megha-unreadable"
"""Set, alone, on a delivery whose properties the AMQP client could not read; the
consumer dead-letters it (``unreadable_properties``) without handling it."""
TOO_LARGE_HEADER = "x-megha-properties-too-large"
"""Set, alone, on a delivery whose properties (its header table and the rest) are larger
than ``MAX_PROPERTIES_BYTES``: their size.  They are never parsed; the consumer
dead-letters the delivery (``headers_too_large``) without handling it."""
PROPERTIES_BYTES_HEADER = "x-megha-properties-bytes"
"""Set on every delivery read (over any value a publisher gave): the bytes of its
properties on the wire, which no body limit counts."""
DROPPED_HEADERS = "x-megha-headers-dropped"
"""On a dead letter: how many of its message's own headers did not fit in it."""
MAX_PROPERTIES_BYTES = 16 * 1024
"""The most bytes of AMQP properties a delivery may carry (a sealed message has about
300).  The broker passes any table on unread, up to its frame (128 KiB), and counts
none of it against a queue's byte limit: a 122 KiB table cost ~100 ms of CPU to parse,
per delivery, before any check."""
DEAD_LETTER_HEADERS = 8 * 1024
"""The most bytes of a message's own headers its dead letter copies: with the reason's
headers it fits one frame whatever the message carried (a copy of a table near the
frame size did not, and the broker closed the connection on every redelivery)."""
_MARKERS = frozenset({UNREADABLE_HEADER, TOO_LARGE_HEADER, PROPERTIES_BYTES_HEADER})
log = logging.getLogger("megha.broker")

_pamqp_read_content_header = amqp_header.ContentHeader.unmarshal
_pamqp_read_deliver = Basic.Deliver.unmarshal
_pamqp_read_ack = Basic.Ack.unmarshal
_U16, _U32, _TAG_AND_BITS = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">qB")
_TABLE_INTS = {ord(k): struct.Struct(f">{f}") for k, f in
               (("b", "b"), ("s", "h"), ("u", "H"), ("I", "i"), ("i", "I"), ("l", "q"))}  # fmt: skip
"""The table's integer types pamqp decodes as these structs (``pamqp.decode``)."""
_FAST_FLAGS = 0x8000 | 0x2000 | 0x1000 | 0x0080
"""Content type, headers, delivery mode, message id: what this federation's messages set."""


class _Slow(Exception):
    """Not a shape the fast readers know: pamqp's own reader decides."""


def _short_str(data: bytes, at: int) -> tuple[str, int]:
    end = at + 1 + data[at]
    if end > len(data):
        raise _Slow
    return data[at + 1 : end].decode(), end


def _read_table(data: bytes, at: int) -> tuple[dict[str, FieldValue], int]:
    """A field table of strings, integers and booleans, as ``pamqp.decode.field_table``
    reads it; ``_Slow`` for anything else (another type, a string that is not UTF-8, a
    length past the table)."""
    (length,) = _U32.unpack_from(data, at)
    at += 4
    end = at + length
    if end > len(data):
        raise _Slow
    out: dict[str, FieldValue] = {}
    while at < end:
        key_end = at + 1 + data[at]
        if key_end >= end:
            raise _Slow
        key = data[at + 1 : key_end].decode()
        kind, at = data[key_end], key_end + 1
        value: FieldValue
        if kind == 0x53:  # S
            (n,) = _U32.unpack_from(data, at)
            if at + 4 + n > end:
                raise _Slow
            value, at = data[at + 4 : at + 4 + n].decode(), at + 4 + n
        elif kind == 0x74 and at < end:  # t
            value, at = bool(data[at]), at + 1
        elif kind in _TABLE_INTS and at + _TABLE_INTS[kind].size <= end:
            (value,) = _TABLE_INTS[kind].unpack_from(data, at)
            at += _TABLE_INTS[kind].size
        else:
            raise _Slow
        out[key] = value
    if at != end:
        raise _Slow
    return out, end


def _read_properties(props: Basic.Properties, data: bytes) -> None:
    """``Basic.Properties.unmarshal`` of the properties a federation's messages carry
    (``_FAST_FLAGS``; ``data`` from the flags on); ``_Slow`` for any other."""
    (flags,) = _U16.unpack_from(data, 0)
    if flags & ~_FAST_FLAGS:
        raise _Slow
    at = 2
    if flags & 0x8000:
        props.content_type, at = _short_str(data, at)
    if flags & 0x2000:
        props.headers, at = _read_table(data, at)
    if flags & 0x1000:
        props.delivery_mode, at = data[at], at + 1
    if flags & 0x0080:
        props.message_id, at = _short_str(data, at)


def _read_content_header(self: amqp_header.ContentHeader, data: bytes) -> None:
    """``ContentHeader.unmarshal``, the same values, without pamqp's walk over every
    property's type for the properties of this federation's own messages (pamqp reads
    any other, and raises what it raises)."""
    try:
        self.class_id, self.weight, self.body_size = struct.unpack_from(">HHQ", data, 0)
        _read_properties(self.properties, data[12:])
    except (_Slow, IndexError, struct.error, UnicodeDecodeError):
        self.properties = Basic.Properties()
        _pamqp_read_content_header(self, data)


def _read_deliver(self: Basic.Deliver, data: bytes) -> None:
    """``Basic.Deliver.unmarshal``, the same values, read directly (one per delivery)."""
    try:
        consumer_tag, at = _short_str(data, 0)
        tag, bits = _TAG_AND_BITS.unpack_from(data, at)
        exchange, at = _short_str(data, at + 9)
        routing_key, at = _short_str(data, at)
    except (_Slow, IndexError, struct.error, UnicodeDecodeError):
        _pamqp_read_deliver(self, data)
        return
    self.consumer_tag, self.delivery_tag, self.redelivered = consumer_tag, tag, bool(bits & 1)
    self.exchange, self.routing_key = exchange, routing_key


def _read_ack(self: Basic.Ack, data: bytes) -> None:
    """``Basic.Ack.unmarshal`` (a publisher confirm), the same values, read directly."""
    try:
        tag, bits = _TAG_AND_BITS.unpack_from(data, 0)
    except struct.error:
        _pamqp_read_ack(self, data)
        return
    self.delivery_tag, self.multiple = tag, bool(bits & 1)


_pamqp_marshal_publish = Basic.Publish.marshal
_PUBLISH_FRAMES: dict[tuple[object, ...], bytes] = {}
"""Marshalled ``Basic.Publish`` methods, by their fields (a process publishes to a few
routing keys: users', GMs', LMs'); at most ``MAX_PUBLISH_FRAMES``."""
MAX_PUBLISH_FRAMES = 4096


def _marshal_publish(self: Basic.Publish) -> bytes:
    """``Basic.Publish.marshal``, remembered by its fields (it is the same for every
    message to one exchange and routing key)."""
    key = (self.ticket, self.exchange, self.routing_key, self.mandatory, self.immediate)
    out = _PUBLISH_FRAMES.get(key)
    if out is None:
        out = _pamqp_marshal_publish(self)
        if len(_PUBLISH_FRAMES) < MAX_PUBLISH_FRAMES:
            _PUBLISH_FRAMES[key] = out
    return out


Basic.Publish.marshal = _marshal_publish  # type: ignore[method-assign,assignment]
Basic.Deliver.unmarshal = _read_deliver  # type: ignore[method-assign,assignment]
Basic.Ack.unmarshal = _read_ack  # type: ignore[method-assign,assignment]


def _read_content_header_or_mark(self: amqp_header.ContentHeader, data: bytes) -> None:
    """``ContentHeader.unmarshal``, except that properties it cannot read -- a publisher
    may send any (a timestamp past the year 9999, arrays nested 20,000 deep, a header
    name or a message id that is not UTF-8), and the broker passes them on unread --
    become one marker header, and so do properties larger than
    ``MAX_PROPERTIES_BYTES``, unread.  Raised, they closed the whole connection, and
    the message, requeued, closed the next one: one user's job stopped its GM taking
    anyone's."""
    size = len(data) - 12  # class, weight and body size come first
    if size > MAX_PROPERTIES_BYTES:
        self.class_id, self.weight, self.body_size = struct.unpack(">HHQ", data[0:12])
        self.properties = Basic.Properties(headers={TOO_LARGE_HEADER: size})
        return
    try:
        _read_content_header(self, data)
    except Exception as exc:
        self.class_id, self.weight, self.body_size = struct.unpack(">HHQ", data[0:12])
        detail = f"{type(exc).__name__}: {exc}"[:200]
        self.properties = Basic.Properties(headers={UNREADABLE_HEADER: detail})
        return
    if self.properties.headers is None:
        self.properties.headers = {}
    self.properties.headers[PROPERTIES_BYTES_HEADER] = size


amqp_header.ContentHeader.unmarshal = _read_content_header_or_mark  # type: ignore[method-assign]

_aiormq_get_frame = FrameReceiver.get_frame
_FRAME_HEAD = struct.Struct(">BHI")
"""A frame's type, channel and payload size (``pamqp.frame.frame_parts``)."""
_UNMARSHAL = {
    constants.FRAME_METHOD: amqp_frame._unmarshal_method_frame,
    constants.FRAME_HEADER: amqp_frame._unmarshal_header_frame,
    constants.FRAME_BODY: amqp_body.ContentBody,
}
"""What ``pamqp.frame.unmarshal`` makes of a method, header or body frame's payload (a
body's is its value)."""


async def _get_frame(self: FrameReceiver) -> tuple[int, int, Any]:
    """``FrameReceiver.get_frame``: a method, header or body frame already whole in the
    reader's buffer is taken from it at once, the same frame (aiormq read each frame
    with three awaited reads into a ``BytesIO`` under a lock, then pamqp looked for a
    protocol header and split the frame again: per delivery, three times); with the
    buffer empty or a frame not all here yet, it waits for the socket's next data and
    looks again (aiormq's reader took the first frame of every read).  Anything else --
    a heartbeat, the connection's start, an error pending, the stream's end, a frame
    without its end byte -- goes through aiormq's own reader."""
    reader = getattr(self, "reader", None)
    buf = getattr(reader, "_buffer", None)
    if buf is None:
        return await _aiormq_get_frame(self)
    waited = False
    while True:
        if not self.started or self.lock.locked() or reader._exception is not None:  # type: ignore[union-attr]
            return await _aiormq_get_frame(self)
        if len(buf) >= 8:
            kind, channel, size = _FRAME_HEAD.unpack_from(buf, 0)
            end = 7 + size
            read = _UNMARSHAL.get(kind)
            if read is None or not size:
                return await _aiormq_get_frame(self)
            if len(buf) > end:
                if buf[end] != constants.FRAME_END:
                    return await _aiormq_get_frame(self)
                payload = bytes(buf[7:end])
                del buf[: end + 1]
                reader._maybe_resume_transport()  # type: ignore[union-attr]
                try:
                    return end + 1, channel, read(payload)
                except PAMQPException as exc:
                    raise aiormq.exceptions.InvalidFrameError(str(exc)) from exc
        if waited and reader._eof:  # type: ignore[union-attr]
            raise _ended(buf)  # as aiormq's reader, waiting, raises it
        if reader._eof or reader._waiter is not None:  # type: ignore[union-attr]
            return await _aiormq_get_frame(self)
        waited = True
        await _more_data(reader)


def _ended(buf: bytearray) -> aiormq.exceptions.AMQPConnectionError:
    """What aiormq's reader raises when the stream ends with ``buf`` all there is of
    the frame it reads (the partial frame dropped, as its last read drops it)."""
    n = len(buf)
    if n == 0:
        got, expected = 0, 1
    elif n < 7:
        got, expected = n - 1, 6
    else:
        got, expected = n - 7, _FRAME_HEAD.unpack_from(buf, 0)[2] + 1
    buf.clear()
    return aiormq.exceptions.AMQPConnectionError(
        f"Server connection unexpectedly closed. Read {got} bytes but {expected} bytes expected"
    )


async def _more_data(reader: Any) -> None:
    """The socket's next data (or its end) in ``reader``'s buffer; its errors as aiormq's
    reader raises them."""
    try:
        await reader._wait_for_data("get_frame")
    except ConnectionRefusedError as exc:
        raise aiormq.exceptions.AMQPConnectionError(f"Server connection refused: {exc!r}") from exc
    except ConnectionResetError as exc:
        raise aiormq.exceptions.AMQPConnectionError(f"Server connection reset: {exc!r}") from exc
    except ConnectionError as exc:
        raise aiormq.exceptions.AMQPConnectionError(f"Server connection error: {exc!r}") from exc
    except OSError as exc:
        raise aiormq.exceptions.AMQPConnectionError(f"Server communication error: {exc!r}") from exc


FrameReceiver.get_frame = _get_frame  # type: ignore[method-assign]

_FRAME_END = bytes((constants.FRAME_END,))
_HEADER_HEAD = struct.Struct(">BHIHHQ")
"""A content header frame's type, channel and size, then its class, weight and body size."""
_BODY_HEAD = struct.Struct(">BHI")
_PUBLISH_HEADS: dict[tuple[int, str, str, bool], bytes] = {}
"""Whole ``Basic.Publish`` method frames, by channel, exchange, routing key and mandatory
flag (at most ``MAX_PUBLISH_FRAMES``)."""


def publish_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    properties: Basic.Properties,
    body: bytes,
    max_content: int,
) -> bytes:
    """The frames of one publish -- method, content header, body in frames of at most
    ``max_content`` bytes -- as one ``bytes``: what aiormq's ``basic_publish`` writes
    (``ChannelFrame.marshall`` of pamqp's frames), byte for byte, the method frame made
    once per exchange and routing key."""
    key = (channel, exchange, routing_key, mandatory)
    head = _PUBLISH_HEADS.get(key)
    if head is None:
        method = Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
        head = amqp_frame.marshal(method, channel)
        if len(_PUBLISH_HEADS) < MAX_PUBLISH_FRAMES:
            _PUBLISH_HEADS[key] = head
    props = properties.marshal()
    size = 12 + len(props)
    header = _HEADER_HEAD.pack(constants.FRAME_HEADER, channel, size, Basic.frame_id, 0, len(body))
    parts = [head, header, props, _FRAME_END]
    for at in range(0, len(body), max_content):
        chunk = body[at : at + max_content]
        parts += (_BODY_HEAD.pack(constants.FRAME_BODY, channel, len(chunk)), chunk, _FRAME_END)
    return b"".join(parts)


def _remember_writer(create: Any) -> Any:
    """``TransportFactory.create``, keeping the stream writer it made on the factory (one
    per aiormq connection): ``_write`` writes to it directly."""

    async def create_and_remember(self: Any, url: Any, **kwargs: Any) -> Any:
        reader, writer = await create(self, url, **kwargs)
        self.megha_writer = writer
        return reader, writer

    return create_and_remember


for _factory in (TCPTransportFactory, TLSTransportFactory):
    _factory.create = _remember_writer(_factory.create)  # type: ignore[method-assign]
WRITE_BUFFER_LIMIT = 64 * 1024
"""Past this many bytes unsent in the socket's buffer, frames wait in aiormq's queue."""


def _write(ch: Any, payload: bytes) -> None:
    """Frames of channel ``ch`` to the socket: written at once when nothing waits in
    aiormq's write queue (so no frame sent before them is passed over) and the socket
    keeps up; else queued behind the others (aiormq's writer task writes them)."""
    queue: asyncio.Queue[ChannelFrame] = ch.write_queue
    factory = getattr(getattr(ch, "connection", None), "_transport_factory", None)
    writer = getattr(factory, "megha_writer", None)
    if (
        writer is not None
        and queue.empty()
        and not writer.transport.is_closing()
        and writer.transport.get_write_buffer_size() < WRITE_BUFFER_LIMIT
    ):
        writer.write(payload)
        return
    frame = ChannelFrame(payload=payload, should_close=False)
    try:
        queue.put_nowait(frame)
    except asyncio.QueueFull:  # the writer is behind: wait for room, in order
        asyncio.get_running_loop().create_task(queue.put(frame))


def _send_publish(
    ch: Any,
    exchange: str,
    routing_key: str,
    properties: Basic.Properties,
    body: bytes,
    mandatory: bool,
) -> tuple[asyncio.Future[Any], int, str] | None:
    """Publish on aiormq channel ``ch`` (with confirms) at once, without awaiting: the
    frames, marshalled here, go to the connection's write queue, and the confirm's future
    is registered as aiormq's ``basic_publish`` registers it (by delivery tag, and the
    message id for a return), so aiormq's reader settles it.  ``None`` when this cannot
    be done here and now -- another publish of the channel holds its lock (the delivery
    tags must follow the order on the wire), the write queue is full, the message has
    no id -- and aiormq's own ``basic_publish`` must."""
    message_id = properties.message_id
    if (
        not ch.publisher_confirms
        or not message_id
        or ch._Channel__lock.locked()
        or ch.write_queue.full()
    ):
        return None
    if ch.is_closed:
        raise aiormq.exceptions.ChannelInvalidStateError(f"{ch!r} closed")
    payload = publish_frames(
        ch.number, exchange, routing_key, mandatory, properties, body, ch.max_content_size
    )
    ch.delivery_tag += 1
    tag = ch.delivery_tag
    confirmation: asyncio.Future[Any] = ch.loop.create_future()
    ch.confirmations[tag] = confirmation
    ch.message_id_delivery_tag[message_id] = tag
    _write(ch, payload)
    if not getattr(ch, "_megha_confirms_watched", False):
        ch._megha_confirms_watched = True
        ch._closing.add_done_callback(_fail_confirms_of(ch))
    return confirmation, tag, message_id


def _fail_confirms_of(ch: Any) -> Callable[[asyncio.Future[Any]], None]:
    """When channel ``ch`` closes, every confirm still awaited fails with its reason (what
    aiormq's future store does to the futures it made; ``_send_publish``'s are not in it)."""

    def fail(closing: asyncio.Future[Any]) -> None:
        exc: BaseException | None = None
        if not closing.cancelled():
            exc = closing.exception()
        if exc is None or isinstance(exc, asyncio.CancelledError):
            exc = aiormq.exceptions.ChannelInvalidStateError(f"{ch!r} closed")
        for confirmation in list(ch.confirmations.values()):
            if isinstance(confirmation, asyncio.Future) and not confirmation.done():
                confirmation.set_exception(exc)

    return fail


class _ConfirmFrames(asyncio.Queue):  # type: ignore[type-arg]
    """The frame queue of a publisher channel (``_take_confirms_at_once``): a confirm that
    finds it empty settles its publishes at once, in aiormq's connection reader, as
    aiormq's ``_on_confirm_frame`` would in the channel's own reader task one turn later
    (a hop per confirm); anything else, and a confirm behind other frames, is queued."""

    megha_channel: Any

    def put_nowait(self, item: Any) -> None:
        frame = item[1]
        if type(frame) in _CONFIRMS and self.empty():
            _confirm(self.megha_channel, frame)
            return
        super().put_nowait(item)


_CONFIRMS = (Basic.Ack, Basic.Nack)


def _confirm(ch: Any, frame: Basic.Ack | Basic.Nack) -> None:
    """aiormq's ``_on_confirm_frame``, the publishes a ``multiple`` confirm settles
    settled in one pass (aiormq scheduled one callback per publish)."""
    if not ch.publisher_confirms:
        return
    tag = frame.delivery_tag
    confirmations = ch.confirmations
    if tag not in confirmations:
        log.error("Unexpected confirmation frame %r from broker", frame)
        return
    if frame.multiple:
        for t in [t for t in confirmations if t <= tag]:
            ch._confirm_delivery(t, frame)
    else:
        ch._confirm_delivery(tag, frame)


def _take_confirms_at_once(ch: Any) -> None:
    """Publisher channel ``ch``'s confirms settle in the connection's reader
    (``_ConfirmFrames``).  The queue object stays the one its reader awaits."""
    if type(ch.frames) is asyncio.Queue:
        frames: Any = ch.frames
        frames.__class__ = _ConfirmFrames
        frames.megha_channel = ch


def _forget(ch: Any, tag: int, message_id: str) -> None:
    """A publish ended: its message id no longer names its delivery tag (a return would
    find it by its id), as aiormq forgets it."""
    if ch.message_id_delivery_tag.get(message_id) == tag:
        del ch.message_id_delivery_tag[message_id]


def properties_bytes(msg: Delivery) -> int:
    """The bytes of a delivery's AMQP properties on the wire (0 if not known)."""
    headers = msg.headers or {}
    size = headers.get(PROPERTIES_BYTES_HEADER, headers.get(TOO_LARGE_HEADER, 0))
    return size if isinstance(size, int) else 0


def _sendable(headers: Mapping[str, FieldValue] | None) -> dict[str, FieldValue]:
    """The headers of a delivery that can be sent again, up to ``DEAD_LETTER_HEADERS``
    bytes of them (the count of the rest in ``DROPPED_HEADERS``): the AMQP client reads
    some values it cannot write (a string that is not UTF-8 comes as bytes)."""
    out: dict[str, FieldValue] = {}
    room, dropped = DEAD_LETTER_HEADERS, 0
    for name, value in (headers or {}).items():
        if name in _MARKERS:
            continue
        try:
            size = len(amqp_encode.short_string(name)) + len(amqp_encode.encode_table_value(value))
        except (TypeError, ValueError):
            dropped += 1
            continue
        if size > room:
            dropped += 1
            continue
        room -= size
        out[name] = value
    if dropped:
        out[DROPPED_HEADERS] = dropped
    return out


OnMessage = Callable[["Delivery"], Awaitable[None]]
PUBLISH_ERRORS = (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError)
TRANSIENT = (
    aio_pika.exceptions.AMQPConnectionError,
    aio_pika.exceptions.ChannelInvalidStateError,
    aio_pika.exceptions.ChannelClosed,
    ConnectionError,
    RuntimeError,
    TimeoutError,
)
"""Publish failures worth another try once the connection recovers (a refusal -- an
unroutable message, a nack -- is not one of them)."""
CONNECT_ERRORS = (ConnectionError, OSError, aio_pika.exceptions.AMQPError, TimeoutError)
CONNECT_TIMEOUT_S = 5.0
HANDLER_ATTEMPTS = 5
"""Times a handler may raise on one message before it is dead-lettered: each failure
puts it back after ``RETRY_FIRST_S`` doubled per failure (0.05 to 0.8 s): a burst of
failures (a peer away, a transient bug) passes, a message that always fails ends as a
dead letter within ~1.5 s."""
RETRY_FIRST_S = 0.05
MAX_FAILURES_KEPT = 10_000


Headers = Mapping[str, str | int]
MSGPACK = "application/x-msgpack"
_UNSET = (None,) * 9
"""The properties other than the content type, headers, delivery mode and message id."""
_SHORT_STRINGS: dict[str, bytes] = {}


def _short_string(value: str) -> bytes:
    """``amqp_encode.short_string``, remembered (content types)."""
    out = _SHORT_STRINGS.get(value)
    if out is None:
        out = _SHORT_STRINGS[value] = amqp_encode.short_string(value)
    return out


def _table(headers: FieldTable) -> bytes:
    """``amqp_encode.field_table``, byte for byte, without its per-value dispatch for
    the strings, integers and booleans a message's headers hold (anything else, and a
    name pamqp would cut, goes through pamqp's own)."""
    parts = []
    for name, value in sorted(headers.items()):
        key = name.encode()
        if len(key) > 128:
            return amqp_encode.field_table(headers)
        parts.append(len(key).to_bytes(1, "big") + key)
        if type(value) is str:
            raw = value.encode()
            parts.append(b"S" + len(raw).to_bytes(4, "big") + raw)
        elif type(value) is int:
            parts.append(amqp_encode.table_integer(value))
        elif type(value) is bool:
            parts.append(b"t\x01" if value else b"t\x00")
        else:
            try:
                parts.append(amqp_encode.encode_table_value(value))
            except TypeError:
                return amqp_encode.field_table(headers)  # its error, with the name
    out = b"".join(parts)
    return len(out).to_bytes(4, "big") + out


class Properties(Basic.Properties):
    """``Basic.Properties`` made without validation (its values are this module's own)
    and marshalled without pamqp's generic walk over every property when only the
    content type, headers, delivery mode and message id are set (the bytes are the same;
    ``tests/unit/test_broker_wire.py`` compares them)."""

    def __init__(
        self,
        content_type: str | None,
        headers: FieldTable | None,
        delivery_mode: int | None,
        message_id: str | None,
    ) -> None:
        self.content_type = content_type
        self.content_encoding = None
        self.headers = headers
        self.delivery_mode = delivery_mode
        self.priority = None
        self.correlation_id = None
        self.reply_to = None
        self.expiration = None
        self.message_id = message_id
        self.timestamp = None
        self.message_type = None
        self.user_id = None
        self.app_id = None
        self.cluster_id = ""

    def marshal(self) -> bytes:
        others = (self.content_encoding, self.priority, self.correlation_id, self.reply_to,
                  self.expiration, self.timestamp, self.message_type, self.user_id, self.app_id)  # fmt: skip
        if self.cluster_id or others != _UNSET:
            return super().marshal()
        flags, parts = 0, []
        if self.content_type:
            flags |= 0x8000
            parts.append(_short_string(self.content_type))
        if self.headers is not None:
            flags |= 0x2000
            parts.append(_table(self.headers))
        if self.delivery_mode is not None:
            flags |= 0x1000
            parts.append(amqp_encode.octet(self.delivery_mode))
        if self.message_id:
            flags |= 0x0080
            parts.append(amqp_encode.short_string(self.message_id))
        return flags.to_bytes(2, "big") + b"".join(parts)


_ID_PREFIX = os.urandom(8).hex()
_ids = itertools.count()


def _message_id() -> str:
    """An id unique to this message (a random prefix per process and a count): what
    aiormq would draw a UUID for, per publish, to match a returned message to its
    confirm; an id kept across the publish's retries."""
    return f"{_ID_PREFIX}.{next(_ids)}"


class Outgoing:
    """A message to publish: its body and its AMQP properties, made once (an
    ``aio_pika.Message`` sets ~20 attributes through a guarded ``__setattr__`` and
    builds its properties again at each publish).  Its message id matches a returned
    message to its publish: publish it again only after the last publish of it ended
    (a retry), never twice at once."""

    __slots__ = ("body", "properties")

    def __init__(self, body: bytes, properties: Basic.Properties) -> None:
        self.body = body
        self.properties = properties

    @property
    def headers(self) -> FieldTable | None:
        return self.properties.headers

    @property
    def delivery_mode(self) -> int | None:
        return self.properties.delivery_mode

    @property
    def message_id(self) -> str | None:
        return self.properties.message_id


def persistent(
    body: bytes, *, message_id: str | None = None, headers: Headers | None = None
) -> Outgoing:
    """A persistent message (delivery mode 2): a durable queue keeps it on disk."""
    props = Properties(MSGPACK, dict(headers) if headers else None, 2, message_id or _message_id())
    return Outgoing(body, props)


def transient(
    body: bytes, *, message_id: str | None = None, headers: Headers | None = None
) -> Outgoing:
    """A message the broker may keep in memory only (no delivery mode)."""
    props = Properties(
        MSGPACK, dict(headers) if headers else None, None, message_id or _message_id()
    )
    return Outgoing(body, props)


_ACK_FRAME = struct.Struct(">BHIHHQBB")
"""A ``Basic.Ack`` method frame: type, channel, size (13), class and method ids, delivery
tag, ``multiple`` bit, frame end."""


def ack_frame(channel: int, tag: int, multiple: bool) -> bytes:
    """The method frame of ``Basic.Ack(tag, multiple)`` on ``channel``: what
    ``ChannelFrame.marshall`` makes of it, byte for byte, without pamqp's generic walk."""
    return _ACK_FRAME.pack(constants.FRAME_METHOD, channel, 13, 60, 80, tag, int(multiple),
                           constants.FRAME_END)  # fmt: skip


class _Acks:
    """The acks of one consumer channel, sent together once per turn of the event loop:
    acks of the lowest deliveries in hand go as one ``multiple`` ack up to the highest of
    them (what is acked is exactly what was acked one by one before), the others one
    by one; a nack or a reject goes at once.  Every delivery of the channel that needs
    an ack must come through ``Broker.consume`` (a ``multiple`` ack would take one it
    does not know of); deliveries without (``no_ack``) are not counted by the broker."""

    def __init__(self, channel: RawChannel) -> None:
        self.channel = channel
        self.in_hand: set[int] = set()
        """Delivered, needing an ack, not settled."""
        self._lowest: list[int] = []
        """A heap of delivery tags: its smallest in ``in_hand`` is the lowest in hand."""
        self._acked: list[int] = []
        """Acked since the last flush, not sent."""
        self._flushing = False
        self.frames_sent = 0

    def delivered(self, tag: int) -> None:
        self.in_hand.add(tag)
        heapq.heappush(self._lowest, tag)

    def ack(self, tag: int) -> None:
        self._acked.append(tag)
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def settled(self, tag: int) -> None:
        """``tag`` was nacked or rejected (sent by the caller)."""
        self.in_hand.discard(tag)

    def _flush(self) -> None:
        self._flushing = False
        acked, self._acked = sorted(self._acked), []
        for tag in acked:
            self.in_hand.discard(tag)
        lowest = self._lowest
        while lowest and lowest[0] not in self.in_hand:
            heapq.heappop(lowest)
        if len(lowest) > 2 * len(self.in_hand) + 64:  # settled tags under a long-held one
            lowest[:] = self.in_hand
            heapq.heapify(lowest)
        first = lowest[0] if lowest else acked[-1] + 1
        below = [t for t in acked if t < first]
        frames = [(t, False) for t in acked if t > first]
        if below:
            frames.insert(0, (below[-1], len(below) > 1))
        if self.channel.is_closed:  # the broker put them back: they come again
            return
        number = self.channel.number
        self.frames_sent += len(frames)
        _write(self.channel, b"".join([ack_frame(number, t, m) for t, m in frames]))


class Delivery:
    """One delivery from a queue: its body, headers and ids, settled once (acked,
    nacked or rejected); what an ``aio_pika.IncomingMessage`` was, without its ~20
    guarded attributes and its second task per delivery."""

    __slots__ = (
        "_acks",
        "_settled",
        "body",
        "delivery_tag",
        "headers",
        "message_id",
        "redelivered",
    )  # fmt: skip

    def __init__(self, raw: DeliveredMessage, acks: _Acks | None) -> None:
        props = raw.header.properties
        self.body: bytes = raw.body
        self.headers: dict[str, FieldValue] = props.headers or {}
        self.message_id: str | None = props.message_id
        deliver = raw.delivery
        self.redelivered = bool(getattr(deliver, "redelivered", False))
        self.delivery_tag: int = getattr(deliver, "delivery_tag", 0)
        self._acks = acks
        self._settled = acks is None
        if acks is not None:
            acks.delivered(self.delivery_tag)

    def _settle(self) -> _Acks:
        if self._acks is None:
            raise TypeError("a delivery consumed without acks cannot be settled")
        if self._settled:
            raise aio_pika.exceptions.MessageProcessError("Message already processed", self)
        self._settled = True
        return self._acks

    async def ack(self) -> None:
        """Acked with the channel's other acks of this turn of the loop."""
        self.ack_now()

    def ack_now(self) -> None:
        """``ack`` without a coroutine (a caller in a loop callback or a core's effect):
        the same ack, with the channel's others of this turn."""
        self._settle().ack(self.delivery_tag)

    async def nack(self, requeue: bool = True) -> None:
        acks = self._settle()
        acks.settled(self.delivery_tag)
        await acks.channel.basic_nack(self.delivery_tag, requeue=requeue)

    async def reject(self, requeue: bool = False) -> None:
        acks = self._settle()
        acks.settled(self.delivery_tag)
        await acks.channel.basic_reject(self.delivery_tag, requeue=requeue)


async def connect(url: str) -> AbstractConnection:
    """One plain connection to the broker node at ``url``."""
    conn: AbstractConnection = await aio_pika.connect(url, timeout=CONNECT_TIMEOUT_S)
    return conn


async def connect_any(urls: Sequence[str], *, start: int = 0) -> tuple[AbstractConnection, int]:
    """A connection to the first broker node that answers, trying ``urls`` in turn from
    ``start``; raises the last error when none does."""
    last: BaseException | None = None
    for k in range(len(urls)):
        i = (start + k) % len(urls)
        try:
            return await connect(urls[i]), i
        except CONNECT_ERRORS as exc:
            last = exc
    assert last is not None
    raise last


class Exchanges:
    """The four exchanges of a federation, opened (not declared) on one channel."""

    def __init__(
        self,
        submit: AbstractExchange,
        state: AbstractExchange,
        events: AbstractExchange,
        dlx: AbstractExchange,
    ) -> None:
        self.submit = submit
        self.state = state
        self.events = events
        self.dlx = dlx


async def open_exchanges(ch: AbstractChannel, cfg: FederationConfig) -> Exchanges:
    """The federation's exchanges, as the operator declared them (``declare_topology``)."""

    async def get(name: str) -> AbstractExchange:
        try:
            ex: AbstractExchange = await ch.get_exchange(name, ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise TopologyMissing(
                f"exchange {name!r} does not exist: start the federation with `megha up` "
                "(it declares the topology)"
            ) from None
        return ex

    return Exchanges(
        await get(cfg.submit_exchange),
        await get(cfg.state_exchange),
        await get(cfg.events_exchange),
        await get(cfg.dead_letter_exchange),
    )


async def open_queue(ch: AbstractChannel, name: str) -> AbstractQueue:
    """A queue of the federation's topology, opened passively."""
    try:
        q: AbstractQueue = await ch.get_queue(name, ensure=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        raise TopologyMissing(f"queue {name!r} does not exist (`megha up` declares it)") from None
    return q


class Nacked(Exception):
    """The broker did not take a message (a nack): it may take it later (a quorum queue
    whose leader is being elected), or never (a full queue that rejects publishes):
    retried as the caller's policy says."""


class TopologyMissing(ConnectionError):
    """An exchange or queue the operator should have declared is not there (it may yet
    come: a process retries as it retries a connection)."""


def layout_of(cfg: FederationConfig) -> BrokerLayout:
    return BrokerLayout.from_config(cfg)


async def declare_topology(cfg: FederationConfig, url: str) -> None:
    """Declare every exchange, queue and binding of the federation (``security.broker_acl``'s
    table) as the operator at ``url``; idempotent."""
    topo = topology(layout_of(cfg))
    conn = await connect(url)
    try:
        ch = await conn.channel()
        kinds = {"topic": aio_pika.ExchangeType.TOPIC, "fanout": aio_pika.ExchangeType.FANOUT}
        for e in topo.exchanges:
            await ch.declare_exchange(e.name, kinds[e.type], durable=True)
        for q in topo.queues:
            try:
                await ch.declare_queue(q.name, durable=True, arguments=dict(q.arguments))
            except aiormq.exceptions.ChannelPreconditionFailed as exc:
                # declared before with other arguments (limits added since): RabbitMQ
                # keeps a queue's arguments for its life; it serves as it is
                log.warning(
                    "queue %s exists with other arguments, kept as it is (%s); "
                    "`megha down --purge` then `megha up` declares it anew",
                    q.name,
                    exc,
                )
                ch = await conn.channel()
        for b in topo.bindings:
            queue = await ch.get_queue(b.queue)
            await queue.bind(b.exchange, routing_key=b.routing_key)
    finally:
        await conn.close()


Setup = Callable[[], Awaitable[None]]


class Broker:
    """One process's connection: a confirming publisher channel and a consumer channel.

    The connection fails over: when it closes, the broker nodes are tried in turn
    (``cfg.broker_urls``, a cluster) until one answers; the channels and exchanges
    are made again, then every registered setup (queue declarations, consumers) runs
    again, then ``on_reconnect``.  Publishes wait for the connection meanwhile.
    """

    def __init__(self, cfg: FederationConfig, name: str, urls: Sequence[str] | None = None) -> None:
        self.cfg = cfg
        self.name = name
        self.urls = list(urls) if urls is not None else cfg.broker_urls
        """Every broker node, logged in as this process's party."""
        self.conn: AbstractConnection | None = None
        self.pub: AbstractChannel | None = None
        self.sub: AbstractChannel | None = None
        self._ex: Exchanges | None = None
        self._prefetch = cfg.prefetch
        self._setups: list[Setup] = []
        self._url_index = 0
        self._connected = asyncio.Event()
        self._closing = False
        self._pub_nacked = False
        self._pub_lock = asyncio.Lock()
        self._recovery: asyncio.Task[None] | None = None
        self.on_reconnect: Callable[[], None] | None = None
        self.on_disconnect: Callable[[], None] | None = None
        self.dead_lettered = 0
        self.publish_errors = 0
        self.handler_errors = 0
        self.reconnects = 0
        self._failures: dict[str, int] = {}
        self._acks: list[_Acks] = []
        """Messages whose handler raised once in this process (by ``delivery_key``)."""

    @property
    def ex(self) -> Exchanges:
        assert self._ex is not None, "the broker is not open"
        return self._ex

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def url(self) -> str:
        """The broker node this process is connected to (or will try next), without
        its password."""
        u = urlparse(self.urls[self._url_index])
        return f"{u.scheme}://{u.username or ''}@{u.hostname}:{u.port or 5672}{u.path}"

    async def open(self, *, prefetch: int | None = None) -> None:
        """Connect (retrying for up to a minute) and make the channels and exchanges."""
        if prefetch is not None:
            self._prefetch = prefetch
        await retry(
            self._connect_once,
            Backoff(first_s=0.2, cap_s=2.0, deadline_s=60.0),
            what=f"{self.name}: connect to the broker",
            retry_on=CONNECT_ERRORS,
        )

    async def _connect_once(self) -> None:
        conn, i = await connect_any(self.urls, start=self._url_index)
        self._url_index = i
        try:
            pub = await conn.channel(publisher_confirms=True, on_return_raises=True)
            _take_confirms_at_once(await pub.get_underlay_channel())
            ex = await open_exchanges(pub, self.cfg)
            sub = await conn.channel(publisher_confirms=False)
            await sub.set_qos(prefetch_count=self._prefetch)
            self.conn, self.pub, self.sub, self._ex = conn, pub, sub, ex
            for setup in self._setups:
                await setup()
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        conn.close_callbacks.add(self._lost)
        self._connected.set()

    def _lost(self, *_: object) -> None:
        """The connection closed: fail over unless this process is shutting down."""
        self._connected.clear()
        if self._closing:
            return
        log.warning("%s: broker connection to %s lost; failing over", self.name, self.url)
        if self.on_disconnect is not None:
            self.on_disconnect()
        self._url_index = (self._url_index + 1) % len(self.urls)
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        await retry(
            self._connect_once,
            Backoff(first_s=0.1, cap_s=2.0, deadline_s=None),
            what=f"{self.name}: reconnect to the broker",
            retry_on=CONNECT_ERRORS,
        )
        self.reconnects += 1
        log.warning("%s: broker connection recovered on %s", self.name, self.url)
        if self.on_reconnect is not None:
            self.on_reconnect()

    async def _reopen_pub(self) -> None:
        """A fresh publisher channel (and its exchanges), once for concurrent callers."""
        async with self._pub_lock:
            if not self._pub_nacked or self.conn is None:
                return
            old = self.pub
            pub = await self.conn.channel(publisher_confirms=True, on_return_raises=True)
            _take_confirms_at_once(await pub.get_underlay_channel())
            self._ex = await open_exchanges(pub, self.cfg)
            self.pub = pub
            self._pub_nacked = False
            if old is not None and not old.is_closed:
                with contextlib.suppress(*PUBLISH_ERRORS):
                    await old.close()

    async def add_setup(self, setup: Setup) -> None:
        """Run ``setup`` now and after every reconnection (declare queues, consume)."""
        self._setups.append(setup)
        if self.connected:
            await setup()

    async def close(self) -> None:
        self._closing = True
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._recovery
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        message: Outgoing | aio_pika.Message,
        *,
        mandatory: bool = True,
        policy: Backoff | None = None,
    ) -> None:
        """Publish to the exchange named by its role (``submit``, ``events``, ``state``,
        ``dlx``) and wait for the broker's confirm, retrying transient failures and nacks
        as ``policy`` says (default: until it is taken; across a failover the exchange is
        looked up again on each attempt).  Raises ``GiveUp`` when the policy's deadline
        passes, ``DeliveryError`` when the message is returned unroutable."""

        async def once() -> None:
            if not self._connected.is_set():
                raise ConnectionError("not connected to the broker")
            if self._pub_nacked:
                await self._reopen_pub()
            ex: AbstractExchange = getattr(self.ex, exchange)
            pub = self.pub
            if pub is None or pub.is_closed:
                raise aiormq.exceptions.ChannelInvalidStateError(f"{pub!r} closed")
            ch = await pub.get_underlay_channel()
            properties = message.properties
            try:
                sent = _send_publish(ch, ex.name, routing_key, properties, message.body, mandatory)
                if sent is None:  # aiormq's publish, as aio_pika's exchange made it
                    await ch.basic_publish(
                        message.body,
                        exchange=ex.name,
                        routing_key=routing_key,
                        properties=properties,
                        mandatory=mandatory,
                    )
                else:
                    confirmation, tag, message_id = sent
                    try:
                        await confirmation
                    finally:
                        _forget(ch, tag, message_id)
            except aiormq.exceptions.DeliveryError as exc:
                if isinstance(exc.frame, Basic.Nack):  # e.g. a quorum queue electing a leader
                    # a channel that saw a queue's leader go keeps nacking it: a new one
                    # finds it (not so a full classic queue's: closing it fails all confirms)
                    self._pub_nacked = self.cfg.queue_type == "quorum"
                    raise Nacked(str(exc)) from exc
                raise  # returned (unroutable): another try would not route it either

        def count(_: BaseException) -> None:
            self.publish_errors += 1

        await retry(
            once,
            policy or Backoff(first_s=0.05, cap_s=2.0, deadline_s=None),
            what=f"{self.name}: publish to {exchange}/{routing_key}",
            retry_on=(*TRANSIENT, Nacked),
            on_retry=count,
        )

    async def dead_letter(self, msg: Delivery, queue: str, reason: str, detail: str) -> None:
        """Refuse a message: to the dead-letter exchange with its reason, its size and
        at most the first ``DEAD_LETTER_BODY`` bytes of its body, then ack."""
        self.dead_lettered += 1
        # the detail (and a reason) may quote the message: %r keeps it on one log line
        log.info("%s: dead-lettering a message from %s: %r (%r)", self.name, queue, detail, reason)
        try:
            body = msg.body
            headers = {
                **_sendable(msg.headers),
                REASON_HEADER: reason,
                "x-megha-detail": detail[:500],
                "x-megha-queue": queue,
                SIZE_HEADER: len(body),
                TRUNCATED_HEADER: len(body) > DEAD_LETTER_BODY,
            }
            letter = Outgoing(body[:DEAD_LETTER_BODY], Properties(None, headers, 2, _message_id()))
            await self.ex.dlx.publish(letter, routing_key="")  # type: ignore[call-overload]
        except PUBLISH_ERRORS:  # the queue's own dead-lettering still keeps the message
            log.exception("%s: dead-letter publish failed; rejecting instead", self.name)
            with contextlib.suppress(*PUBLISH_ERRORS):
                await msg.reject(requeue=False)
            return
        with contextlib.suppress(*PUBLISH_ERRORS):
            await msg.ack()

    async def consume(
        self, queue: AbstractQueue, handler: OnMessage, *, no_ack: bool = False, guard: bool = True
    ) -> None:
        """Consume ``queue`` with ``handler`` (through aiormq's channel: a ``Delivery``
        each, no ``aio_pika.IncomingMessage``); guarded (``guarded``), nothing a handler
        raises loops forever."""
        ch = await queue.channel.get_underlay_channel()
        acks = None if no_ack else self._acks_of(ch)
        take = self.guarded(queue.name, handler, no_ack=no_ack) if guard else handler

        async def deliver(raw: DeliveredMessage) -> None:
            await take(Delivery(raw, acks))

        await ch.basic_consume(queue.name, deliver, no_ack=no_ack)

    def _acks_of(self, ch: RawChannel) -> _Acks:
        """The acks of channel ``ch`` (one ``_Acks`` per channel: ``multiple`` acks count
        every delivery of it)."""
        self._acks = [a for a in self._acks if not a.channel.is_closed]
        for a in self._acks:
            if a.channel is ch:
                return a
        a = _Acks(ch)
        self._acks.append(a)
        return a

    def guarded(self, queue: str, handler: OnMessage, *, no_ack: bool = False) -> OnMessage:
        """``handler``, with a refusal (``MeghaError``) dead-lettered and any other
        exception logged and retried (``_failed``); with ``no_ack``, both dropped."""

        async def guarded(msg: Delivery) -> None:
            try:
                _check_properties(msg)
                await handler(msg)
            except MeghaError as exc:
                if not no_ack:
                    await self.dead_letter(msg, queue, exc.reason, str(exc))
            except Exception as exc:
                self.handler_errors += 1
                log.exception("%s: consumer of %s failed", self.name, queue)
                if not no_ack:
                    await self._failed(msg, queue, exc)

        return guarded

    async def _failed(self, msg: Delivery, queue: str, exc: Exception) -> None:
        """A handler raised something other than a refusal: the message goes back to its
        queue after a pause (longer each time); the ``HANDLER_ATTEMPTS``-th time it fails
        here it is dead-lettered (``handler_error``).  Counted per message in this
        process, not by the broker's ``redelivered`` flag: a message redelivered after a
        crash gets its retries too."""
        key = delivery_key(queue, msg.body)
        failures = self._failures.pop(key, 0) + 1
        with contextlib.suppress(*PUBLISH_ERRORS):
            if failures >= HANDLER_ATTEMPTS:
                await self.dead_letter(msg, queue, "handler_error", f"{type(exc).__name__}: {exc}")
                return
            self._failures[key] = failures
            while len(self._failures) > MAX_FAILURES_KEPT:
                del self._failures[next(iter(self._failures))]
            await asyncio.sleep(RETRY_FIRST_S * 2 ** (failures - 1))
            await msg.nack(requeue=True)


def _check_properties(msg: Delivery) -> None:
    """Refuse a delivery whose properties were too large or not readable (unhandled)."""
    headers = msg.headers or {}
    unreadable = headers.get(UNREADABLE_HEADER)
    if unreadable is not None:
        raise InvalidInput(
            f"properties not readable: {unreadable!r}", reason="unreadable_properties"
        )
    too_large = headers.get(TOO_LARGE_HEADER)
    if too_large is not None:
        raise InvalidInput(
            f"properties of {too_large!r} bytes, more than {MAX_PROPERTIES_BYTES}",
            reason="headers_too_large",
        )


async def delete_topology(cfg: FederationConfig, url: str | None = None) -> None:
    """Remove every queue and exchange of the federation's topology, as the operator at
    ``url`` (default: the config's broker); what is absent already is skipped."""
    topo = topology(layout_of(cfg))
    conn, _ = await connect_any([url] if url else cfg.broker_urls)
    try:
        leaders = [cfg.lm_leader_queue(lm) for lm in cfg.lm_ids]
        for q in [*(q.name for q in topo.queues), *leaders]:
            ch = await conn.channel()
            try:
                await ch.queue_delete(q)
            except Exception:  # absent already: nothing to remove
                pass
            finally:
                if not ch.is_closed:
                    await ch.close()
        for e in topo.exchanges:
            ch = await conn.channel()
            try:
                await ch.exchange_delete(e.name)
            except Exception:  # absent already
                pass
            finally:
                if not ch.is_closed:
                    await ch.close()
    finally:
        await conn.close()
