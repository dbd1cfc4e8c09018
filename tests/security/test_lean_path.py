"""The lean path of a service's message routes (``runtime.fastpath``, ``http._Lane``)
answers every request as aiohttp's path does -- the same status, body, headers that
matter and signature, the same refusals counted -- and hands aiohttp every request it
does not read, unchanged: each case is sent to the same app served both ways."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections.abc import Callable

import pytest
from aiohttp import web

from runtime import http
from security import signing
from security.access import Access
from security.identity import OPERATOR as OPERATOR_ID
from security.identity import Identity, lm
from tests import raw_http
from tests.lean_service import CFG, POOL, SECRET, Pool, call, pool_app, stop
from tests.served import refused, served

OPERATOR = Access(OPERATOR_ID, CFG, SECRET)
LM0_ID = lm("lm0")

IGNORED = frozenset({"date", signing.HEADER_TIMESTAMP.lower(), signing.HEADER_SIGNATURE.lower()})
"""Headers that differ between any two answers (the time, and the signature over it)."""


def _read(sock: socket.socket) -> bytes:
    """One answer: its head, and its body by ``Content-Length`` (or until closed)."""
    got = bytearray()
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            return bytes(got)
        got += chunk
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    fields = dict(
        line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line
    )
    length = int(fields.get("Content-Length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _answer(raw: bytes) -> tuple[int, bytes, dict[str, str]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), body, headers


def _exchange(port: int, requests: list[bytes], *, split: bool = False) -> list[bytes]:
    """Each request on one connection, one after the other's answer (``split``: a byte
    at a time); then whether the service closed it (b"closed")."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
        for req in requests:
            if split:
                for i in range(len(req)):
                    sock.sendall(req[i : i + 1])
            else:
                sock.sendall(req)
            out.append(_read(sock))
        sock.settimeout(0.3)
        try:
            out.append(b"closed" if sock.recv(1) == b"" else b"more")
        except TimeoutError:
            out.append(b"open")
    return out


def _both(
    requests: Callable[[], list[bytes]], *, split: bool = False, ready: bool = True
) -> tuple[list[bytes], list[bytes], web.Application, web.Application]:
    """The answers of the app served by the lean path, then by aiohttp, to the same
    bytes (each app has its own replay cache)."""
    sent = requests()

    async def run(lean: bool) -> tuple[list[bytes], web.Application]:
        pool = Pool()
        pool.ready = ready
        app = pool_app(pool)
        runner = http.ServiceRunner(app, lean=lean)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            got = await asyncio.to_thread(_exchange, port, sent, split=split)
        finally:
            await runner.cleanup()
        return got, app

    lean, lean_app = asyncio.run(run(True))
    slow, slow_app = asyncio.run(run(False))
    return lean, slow, lean_app, slow_app


def _same(lean: list[bytes], slow: list[bytes], caller: Identity = LM0_ID) -> None:
    assert len(lean) == len(slow)
    for a, b in zip(lean, slow, strict=True):
        if a in (b"closed", b"open", b"more"):
            assert a == b
            continue
        (sa, ba, ha), (sb, bb, hb) = _answer(a), _answer(b)
        assert (sa, ba) == (sb, bb)
        assert {k: v for k, v in ha.items() if k not in IGNORED} == {
            k: v for k, v in hb.items() if k not in IGNORED
        }
        if signing.HEADER_SIGNATURE.lower() in ha:
            key = signing.signing_key(SECRET, POOL, caller)
            for raw in (a, b):
                status, body, headers = _answer(raw)
                nonce = headers[signing.HEADER_NONCE.lower()]
                signing.verify_response(headers, status, body, nonce, POOL, key, time.time())


CASES: dict[str, tuple[Callable[[], list[bytes]], list[int]]] = {
    "an answer": (lambda: [call(stop("echo"))], [200]),
    "no answer": (lambda: [call(stop("none"))], [204]),
    "a core's conflict": (lambda: [call(stop("conflict"))], [409]),
    "a core's bad request": (lambda: [call(stop("wrong"))], [422]),
    "invalid input": (lambda: [call(stop("invalid"))], [422]),
    "a server bug": (lambda: [call(stop("bug"))], [500]),
    "a body not msgpack": (lambda: [call(b"\x01\x02")], [400]),
    "a message of another lm": (lambda: [call(stop("echo", "lm1"))], [403]),
    "another incarnation": (lambda: [call(stop("echo"), incarnation="f" * 16)], [401]),
    "no incarnation": (lambda: [call(stop("echo"), incarnation="")], [401]),
    "unsigned": (
        lambda: [b"POST /v1/stop HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab"],
        [401],
    ),
    "another body than signed": (lambda: [call(stop("echo"), signed_body=b"x")], [401]),
    "a body over the limit": (
        lambda: [
            call(b"").replace(b"Content-Length: 0", b"Content-Length: %d" % (CFG.max_body + 1))
        ],
        [413],
    ),
    "a caller not allowed": (
        lambda: [call(stop("echo"), sender=Access(lm("lm1"), CFG, SECRET))],
        [401],
    ),
    "a replay": (lambda: [(c := call(stop("echo"))), c], [200, 401]),
    "keep-alive, three calls": (
        lambda: [call(stop("echo")), call(stop("none")), call(stop("conflict"))],
        [200, 204, 409],
    ),
    "a lean call, then aiohttp's": (
        lambda: [call(stop("echo")), b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"],
        [200, 200],
    ),
    "a ping by a peer not allowed to": (
        lambda: [call(b"", "/v1/ping")],
        [403],
    ),
    "HTTP/1.0": (lambda: [call(stop("echo")).replace(b"HTTP/1.1", b"HTTP/1.0", 1)], [200]),
    "Connection: close": (lambda: [call(stop("echo"), extra={"Connection": "close"})], [200]),
    "a repeated signed header": (
        lambda: [call(stop("echo"), extra={"x-megha-nonce": "A" * 20})],
        [401],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_case_is_answered_as_aiohttp_answers_it(case: str) -> None:
    requests, statuses = CASES[case]
    lean, slow, lean_app, slow_app = _both(requests)
    _same(lean, slow)
    answered = [_answer(raw)[0] for raw in lean if raw not in (b"closed", b"open", b"more")]
    assert answered[: len(statuses)] == statuses
    assert _counted(lean_app) == _counted(slow_app)


def _counted(app: web.Application) -> list[str]:
    """The app's counters (refusals by reason, requests by route), not their times."""
    text = app[http.METRICS_KEY].render().decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_the_operators_pings_are_answered_on_the_lean_path_as_aiohttp_answers_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served_lean: list[str] = []
    handle = http._Lane._handle

    async def counted(lane: http._Lane, path: str, *a: object) -> object:
        served_lean.append(path)
        return await handle(lane, path, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(http._Lane, "_handle", counted)
    pings = [call(b"", "/v1/ping", sender=OPERATOR), call(b"xy", "/v1/ping", sender=OPERATOR)]
    lean, slow, lean_app, slow_app = _both(lambda: [*pings, call(stop("echo"))])
    _same(lean[:2], slow[:2], caller=OPERATOR_ID)
    _same(lean[2:], slow[2:])
    assert [_answer(raw)[0] for raw in lean[:3]] == [200, 200, 200]
    assert _counted(lean_app) == _counted(slow_app)
    assert served_lean == ["/v1/ping", "/v1/ping", "/v1/stop"]  # not handed to aiohttp


def test_a_request_a_byte_at_a_time_is_answered_the_same() -> None:
    lean, slow, *_ = _both(lambda: [call(stop("echo")), call(stop("none"))], split=True)
    _same(lean, slow)
    assert [_answer(raw)[0] for raw in lean[:2]] == [200, 204]


def test_a_pool_not_ready_refuses_the_same() -> None:
    lean, slow, *_ = _both(lambda: [call(stop("echo"))], ready=False)
    _same(lean, slow)
    assert _answer(lean[0])[0] == 503


@pytest.mark.parametrize(("what", "data", "reason"), raw_http.MALFORMED)
def test_bytes_the_parser_cannot_read_are_refused_as_aiohttp_does(
    what: str, data: bytes, reason: str
) -> None:
    for bad in (data, data.replace(b"/v1/ping", b"/v1/stop").replace(b"/health", b"/v1/stop")):
        lean, slow, lean_app, slow_app = _both(lambda bad=bad: [bad])
        _same(lean, slow)
        assert refused(lean_app, reason, "workers") == refused(slow_app, reason, "workers") == 1


def test_a_lean_call_then_malformed_bytes_on_the_same_connection() -> None:
    """Handed over after a lean call: aiohttp refuses what follows as it would."""
    lean, slow, *_ = _both(lambda: [call(stop("echo")), b"POST /v1/stop HTTP/1.1\nHost: x\n\n"])
    _same(lean, slow)
    assert [_answer(raw)[0] for raw in lean[:2]] == [200, 400]


def test_pipelined_calls_are_answered_in_order() -> None:
    """Two lean calls and aiohttp's in one write: three answers, in order, then closed
    (``/health`` is public)."""
    sent = call(stop("echo")) + call(stop("none")) + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"

    async def run() -> bytes:
        async with served(pool_app()) as port:
            return await asyncio.to_thread(_until_closed, port, sent)

    got = asyncio.run(run())
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", got)
    assert statuses == [b"200", b"204", b"200"]
    assert got.endswith(b'"incarnation": "0123456789abcdef"}')


def _until_closed(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
        sock.sendall(data)
        got = bytearray()
        while chunk := sock.recv(65536):
            got += chunk
    return bytes(got)


def test_a_graceful_shutdown_waits_for_the_call_being_served() -> None:
    async def run() -> bytes:
        pool = Pool()
        pool.hold.clear()
        runner = http.ServiceRunner(pool_app(pool), shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        sent = asyncio.create_task(asyncio.to_thread(_exchange, port, [call(stop("echo"))]))
        await asyncio.wait_for(pool.fed.wait(), 10.0)
        cleanup = asyncio.create_task(runner.cleanup())
        await asyncio.sleep(0.1)
        assert not cleanup.done()  # waits for the call in flight
        pool.hold.set()
        got = await sent
        await cleanup
        return got[0]

    assert _answer(asyncio.run(run()))[0] == 200


def test_a_body_never_finished_is_closed_with_the_keep_alive() -> None:
    async def run() -> bytes:
        runner = http.ServiceRunner(pool_app(), keepalive_timeout=0.2)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            half = call(stop("echo"))[:-3]
            got = await asyncio.to_thread(_exchange, port, [half])
            return got[0]
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) == b""  # closed, no answer


def test_with_the_access_log_on_every_call_is_aiohttps(caplog: pytest.LogCaptureFixture) -> None:
    """The access log is aiohttp's: a connection that writes it takes no lean path."""
    caplog.set_level(logging.INFO, logger="aiohttp.access")

    async def run() -> list[bytes]:
        async with served(pool_app()) as port:
            return await asyncio.to_thread(_exchange, port, [call(stop("echo"))])

    got = asyncio.run(run())
    assert _answer(got[0])[0] == 200
    assert any('"POST /v1/stop HTTP/1.1" 200' in r.getMessage() for r in caplog.records)
