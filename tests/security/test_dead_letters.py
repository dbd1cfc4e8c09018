"""What ``Broker.dead_letter`` logs and republishes of a refused message (no broker: the
dead-letter exchange is a stand-in that keeps what it is given)."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import aio_pika
import pytest
from pamqp import frame, header

from common.config import FederationConfig
from runtime import broker
from runtime.broker import Broker, Exchanges


class KeptExchange:
    """Keeps every message published to it."""

    def __init__(self) -> None:
        self.published: list[aio_pika.Message] = []

    async def publish(self, message: aio_pika.Message, routing_key: str, **_: Any) -> None:
        self.published.append(message)


class Refused:
    """A delivered message, as much of it as ``dead_letter`` uses."""

    def __init__(self, body: bytes, headers: dict[str, Any] | None = None) -> None:
        self.body = body
        self.headers = headers or {}
        self.acked = False

    async def ack(self) -> None:
        self.acked = True

    async def reject(self, requeue: bool = False) -> None:
        raise AssertionError("the dead-letter publish did not fail")


def dead_letter(body: bytes, reason: str, detail: str) -> tuple[aio_pika.Message, Refused]:
    """Dead-letter one message through a ``Broker``; what reached the exchange."""
    b = Broker(FederationConfig().validate(), "gm0")
    dlx = KeptExchange()
    other = KeptExchange()
    b._ex = Exchanges(other, other, other, dlx)  # type: ignore[arg-type]
    msg = Refused(body, {"x-megha-tag": "t"})
    asyncio.run(b.dead_letter(msg, "fed.user.u0", reason, detail))  # type: ignore[arg-type]
    (out,) = dlx.published
    return out, msg


def test_a_dead_letter_detail_cannot_forge_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="megha.broker")
    detail = "job 'a\n2026-11-26 07:30:00,000 gm megha.gm INFO FORGED-LINE' is active"
    out, msg = dead_letter(b"job", "duplicate_job_id\r", detail)
    (message,) = [r.getMessage() for r in caplog.records if r.name == "megha.broker"]
    assert message.isprintable(), message
    assert "FORGED-LINE" in message
    assert out.headers is not None
    assert out.headers[broker.REASON_HEADER] == "duplicate_job_id\r"
    assert msg.acked


def test_a_large_refused_body_is_dead_lettered_cut_with_its_size() -> None:
    body = bytes(range(256)) * (3 * broker.DEAD_LETTER_BODY // 256)  # 3 x the prefix
    out, msg = dead_letter(body, "too_large", "body of 196608 bytes exceeds 65536")
    assert out.body == body[: broker.DEAD_LETTER_BODY]
    assert out.headers is not None
    assert out.headers[broker.SIZE_HEADER] == len(body)
    assert out.headers[broker.TRUNCATED_HEADER] is True
    assert out.headers[broker.REASON_HEADER] == "too_large"
    assert out.headers["x-megha-tag"] == "t"  # its own headers are kept
    assert out.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert msg.acked


def test_a_small_refused_body_is_dead_lettered_whole() -> None:
    body = b"\xc1" * broker.DEAD_LETTER_BODY
    out, _ = dead_letter(body, "malformed_body", "not msgpack")
    assert out.body == body
    assert out.headers is not None
    assert out.headers[broker.SIZE_HEADER] == len(body)
    assert out.headers[broker.TRUNCATED_HEADER] is False


# ------------------------------------------- headers a client may send and we may not
class Marshalled(KeptExchange):
    """Encodes what it is given, as the channel does before a message leaves."""

    async def publish(self, message: aio_pika.Message, routing_key: str, **_: Any) -> None:
        header.ContentHeader(body_size=len(message.body), properties=message.properties).marshal()
        await super().publish(message, routing_key)


def _delivered(properties: bytes, body: bytes = b"job") -> header.ContentHeader:
    """The content header of a delivery whose properties are ``properties`` (flags and
    values, as a client sent them: the broker passes them on unread), as the AMQP client
    reads it off the wire."""
    payload = struct.pack(">HHQ", 60, 0, len(body)) + properties
    wire = struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    _, _, got = frame.unmarshal(wire)
    assert isinstance(got, header.ContentHeader)
    assert got.body_size == len(body)
    return got


HEADERS_FLAG = b"\x20\x00"
TIMESTAMP_FLAG = b"\x00\x40"
MESSAGE_ID_FLAG = b"\x00\x80"


def _table(*items: bytes) -> bytes:
    raw = b"".join(items)
    return struct.pack(">I", len(raw)) + raw


def _nested_arrays(depth: int) -> bytes:
    value = b"V"
    for _ in range(depth):
        value = b"A" + struct.pack(">I", len(value)) + value
    return value


@pytest.mark.parametrize(
    "properties",
    [
        TIMESTAMP_FLAG + struct.pack(">Q", 2**63),  # the year 292,278,994
        HEADERS_FLAG + _table(b"\x01t" + b"T" + struct.pack(">Q", 2**64 - 1)),
        HEADERS_FLAG
        + _table(b"\x01a" + _nested_arrays(2_000)),  # RecursionError (10 KB: under the size bound)
        HEADERS_FLAG + _table(b"\x02\xff\xfe" + b"V"),  # a key that is not UTF-8
        MESSAGE_ID_FLAG + b"\x02\xff\xfe",  # a message id that is not UTF-8
    ],
    ids=["timestamp", "timestamp_header", "deep_nesting", "key_not_utf8", "message_id_not_utf8"],
)
def test_properties_the_client_cannot_read_are_a_delivery_to_refuse(properties: bytes) -> None:
    """The AMQP client raised reading them, which closed the whole connection: the
    message came back on the next one, and closed it again, so one user's job stopped
    its GM taking anyone's.  Read, they are a marker header the consumer refuses."""
    got = _delivered(properties)
    assert got.properties.headers is not None
    assert broker.UNREADABLE_HEADER in got.properties.headers


class Delivered(Refused):
    redelivered = False


def test_a_delivery_with_unreadable_properties_is_dead_lettered_unhandled() -> None:
    b = Broker(FederationConfig().validate(), "gm0")
    dlx = Marshalled()
    b._ex = Exchanges(dlx, dlx, dlx, dlx)  # type: ignore[arg-type]
    handled: list[object] = []

    async def handler(msg: object) -> None:
        handled.append(msg)

    props = _delivered(HEADERS_FLAG + _table(b"\x01a" + _nested_arrays(2_000))).properties
    msg = Delivered(b"job", props.headers)
    asyncio.run(b.guarded("fed.user.u0", handler)(msg))  # type: ignore[arg-type]
    assert handled == []
    (out,) = dlx.published
    assert out.headers is not None
    assert out.headers[broker.REASON_HEADER] == "unreadable_properties"
    assert msg.acked


def test_headers_the_client_read_but_cannot_send_again_are_left_out_of_the_dead_letter() -> None:
    """A string header that is not UTF-8 is read as bytes, which cannot be sent again:
    the dead letter raised (TypeError), and the refused job was neither dead-lettered
    nor acknowledged."""
    got = _delivered(HEADERS_FLAG + _table(b"\x01s" + b"S" + struct.pack(">I", 2) + b"\xff\xfe"))
    headers = {**(got.properties.headers or {}), "x-megha-tag": "t"}
    b = Broker(FederationConfig().validate(), "gm0")
    dlx = Marshalled()
    b._ex = Exchanges(dlx, dlx, dlx, dlx)  # type: ignore[arg-type]
    msg = Refused(b"job", headers)
    asyncio.run(b.dead_letter(msg, "fed.user.u0", "bad_token", "bad token for user 'u0'"))  # type: ignore[arg-type]
    (out,) = dlx.published
    assert out.headers is not None
    assert "s" not in out.headers
    assert out.headers["x-megha-tag"] == "t"
    assert out.headers[broker.REASON_HEADER] == "bad_token"
    assert msg.acked
