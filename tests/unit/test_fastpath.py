"""The lean path's reading of a request head (``runtime.fastpath``): a peer's usual call
is read; anything else is handed over to aiohttp; and what is read is what aiohttp's own
parser reads from the same bytes (Hypothesis, on calls and their mutations)."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import fastpath
from runtime.fastpath import HANDOVER, Head, parse_head
from tests.lean_service import call, stop

ROUTES = frozenset({b"/v1/stop", b"/v1/start"})
CALL = call(stop("echo"))
BASES = (CALL, call(b""), call(stop("x"), "/v1/start"))
"""Calls to mutate (made once: Hypothesis replays its draws on the same bytes)."""


def test_a_peers_call_is_read() -> None:
    """Its head: the body may come later (the connection waits for it)."""
    head = parse_head(CALL, ROUTES)
    assert isinstance(head, Head)
    assert head.path == "/v1/stop"
    assert CALL[head.size : head.size + head.length] == stop("echo")
    assert parse_head(CALL[: head.size + 1], ROUTES) == head
    assert ("Host", "127.0.0.1") in head.fields


@pytest.mark.parametrize("cut", [1, 5, 6, 20, len(CALL) // 2, CALL.index(b"\r\n\r\n") + 3])
def test_a_head_not_whole_in_what_came_is_handed_over(cut: int) -> None:
    assert parse_head(CALL[:cut], ROUTES) is HANDOVER


HANDED_OVER = {
    "another method": CALL.replace(b"POST", b"PUT", 1),
    "another path": CALL.replace(b"/v1/stop", b"/v1/ping", 1),
    "a query": CALL.replace(b"/v1/stop", b"/v1/stop?a=1", 1),
    "HTTP/1.0": CALL.replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "chunked": CALL.replace(b"Host:", b"Transfer-Encoding: chunked\r\nHost:", 1),
    "Expect": CALL.replace(b"Host:", b"Expect: 100-continue\r\nHost:", 1),
    "Upgrade": CALL.replace(b"Host:", b"Upgrade: websocket\r\nHost:", 1),
    "Content-Encoding": CALL.replace(b"Host:", b"Content-Encoding: gzip\r\nHost:", 1),
    "Connection: close": CALL.replace(b"Host:", b"Connection: close\r\nHost:", 1),
    "no Host": CALL.replace(b"Host: 127.0.0.1\r\n", b"", 1),
    "no Content-Length": CALL.replace(b"Content-Length", b"X-Length", 1),
    "a repeated header": CALL.replace(b"Host:", b"Content-Type: a\r\nHost:", 1),
    "a signed header twice": CALL.replace(b"Host:", b"X-Megha-Nonce: x\r\nHost:", 1),
    "a Content-Length with a sign": CALL.replace(b"Content-Length: ", b"Content-Length: +", 1),
    "a Content-Length with leading zeros": CALL.replace(
        b"Content-Length: ", b"Content-Length: 0", 1
    ),
    "obs-fold": CALL.replace(b"Host: 127.0.0.1\r\n", b"Host: 127.0.0.1\r\n  more\r\n", 1),
    "a bare LF": CALL.replace(b"\r\nHost", b"\nHost", 1),
    "a byte beyond ASCII": CALL.replace(b"Host: 127", b"Host: \xe9127", 1),
    "a control byte": CALL.replace(b"Host: 127", b"Host: \x01127", 1),
    "a space before the colon": CALL.replace(b"Host:", b"Host :", 1),
    "TLS": b"\x16\x03\x01\x02\x00\x01",
    "too many fields": CALL.replace(
        b"Host:", b"".join(b"X-%d: 1\r\n" % i for i in range(fastpath.MAX_FIELDS)) + b"Host:", 1
    ),
    "a head too long": CALL.replace(b"Host:", b"X-A: " + b"a" * fastpath.MAX_HEAD + b"\r\nHost:"),
}


@pytest.mark.parametrize("what", sorted(HANDED_OVER))
def test_anything_else_is_handed_over(what: str) -> None:
    assert parse_head(HANDED_OVER[what], ROUTES) is HANDOVER


def _aiohttp_reads(data: bytes) -> tuple[object, bytes] | HttpProcessingError | None:
    """What aiohttp's parser (as a service's connections use it) reads first from
    ``data``: the message and its body, its error, or None (nothing whole yet)."""
    loop = asyncio.new_event_loop()
    try:
        parser = HttpRequestParser(
            mock.Mock(), loop, 2**16, max_line_size=8190, max_headers=32, max_field_size=8190
        )
        try:
            messages, _, _ = parser.feed_data(data)
        except HttpProcessingError as exc:
            return exc
        if not messages:
            return None
        msg, payload = messages[0]
        body = b"".join(bytes(chunk) for chunk in getattr(payload, "_buffer", ()))
        return msg, body
    finally:
        loop.close()


def _check_same(data: bytes) -> None:
    head = parse_head(data, ROUTES)
    if head is HANDOVER:
        return  # aiohttp reads it, whatever it is
    assert isinstance(head, Head)
    # the request only: what follows it is read (or handed over) as the next one
    theirs = _aiohttp_reads(data[: head.size + head.length])
    assert isinstance(theirs, tuple), theirs
    msg, body = theirs
    assert (msg.method, msg.path, msg.version) == ("POST", head.path, (1, 1))  # type: ignore[attr-defined]
    flags = (msg.should_close, msg.chunked, msg.upgrade, msg.compression)  # type: ignore[attr-defined]
    assert flags == (False, False, False, None)
    # field names are case-insensitive (RFC 9110 5.1): aiohttp gives known ones in its
    # own spelling ("HoSt" -> "Host"), the fast path keeps the sender's
    theirs_fields = [(k.lower(), v) for k, v in msg.headers.items()]  # type: ignore[attr-defined]
    assert theirs_fields == [(k.lower(), v) for k, v in head.fields]
    if len(data) >= head.size + head.length:
        assert body == data[head.size : head.size + head.length]


INTERESTING = [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"\x00", b"\x7f", b"\xff", b"0",
               b"Content-Length: 9\r\n", b"Transfer-Encoding: chunked\r\n", b"Host: y\r\n",
               b"\r\n\r\n", b"HTTP/1.0", b"/v1/start", b"Connection: keep-alive\r\n"]  # fmt: skip


@st.composite
def mutated_calls(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        what = draw(st.sampled_from(["insert", "delete", "replace", "cut"]))
        piece = draw(st.sampled_from(INTERESTING) | st.binary(min_size=1, max_size=4))
        if what == "insert":
            data[at:at] = piece
        elif what == "delete":
            del data[at : at + len(piece)]
        elif what == "replace":
            data[at : at + len(piece)] = piece
        else:
            del data[at:]
    return bytes(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_calls())
def test_what_is_read_here_aiohttp_reads_the_same(data: bytes) -> None:
    _check_same(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_are_read_as_aiohttp_reads_them_or_handed_over(data: bytes) -> None:
    _check_same(b"POST /v1/stop HTTP/1.1\r\n" + data)
    _check_same(data)


def test_an_answer_is_written_as_aiohttp_writes_it() -> None:
    """The status line, the headers given, Content-Length (none for a 204), Date,
    Server, and Connection: close when the connection closes after it."""
    empty = fastpath.answer_bytes(204, b"", {"X-A": "1"}, close=False).decode("latin-1")
    lines = empty.split("\r\n")
    assert lines[:2] == ["HTTP/1.1 204 No Content", "X-A: 1"]
    assert [line.split(":")[0] for line in lines[2:]] == ["Date", "Server", "", ""]
    closing = fastpath.answer_bytes(401, b"{}", {}, close=True)
    assert closing.startswith(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\nDate: ")
    assert closing.endswith(b"\r\nConnection: close\r\n\r\n{}")
