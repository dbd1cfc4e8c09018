"""What a client without credentials can hold of a service: its connections.

aiohttp read a request's headers -- 128 of up to 8 KiB each -- before any middleware
checked a credential, kept them ~1.6 MiB per connection (300 connections grew an LM by
480 MiB, kept after they closed), and held a connection that never finished a request
for the whole keep-alive (300 s for the peers), as it did one that had been refused or
had asked for ``/health``.  Now a request has at most ``MAX_HEADERS`` header lines, a
connection's first request must come whole within ``HEAD_TIMEOUT_S`` (else 408
``request_timeout``), only a proven caller keeps its connection open, and a service
holds at most ``MAX_UNPROVEN`` connections without one (the oldest goes, 503
``too_many_connections``): two clients holding 24,000 idle connections took all 20,000
of an LM's file descriptors before (``benchmarks/bench_flood.py``)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiohttp import web

from common.config import FederationConfig
from runtime import http
from runtime.prometheus import ServiceMetrics
from security import signing
from security.access import Access
from security.identity import OPERATOR, lm
from security.secret import Secret
from tests import raw_http
from tests.served import refused, served

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
CFG = FederationConfig().validate()


def lm0_app() -> web.Application:
    app = http.base_app(CFG, Access(lm("lm0"), CFG, SECRET))
    app[http.METRICS_KEY] = ServiceMetrics("megha_lm", dict, dict)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/health", health)
    return app


def signed_ping(last: bool = False) -> bytes:
    key = signing.signing_key(SECRET, OPERATOR, lm("lm0"))
    headers = {
        "Host": "x",
        "Content-Length": "0",
        **signing.sign("POST", "/v1/ping", b"", OPERATOR, key, time.time()),
    }
    if last:
        headers["Connection"] = "close"
    lines = [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(["POST /v1/ping HTTP/1.1", *lines]) + "\r\n\r\n").encode()


def parse(data: bytes) -> raw_http.Answer:
    """One answer, as bytes."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return raw_http.Answer(
        status=int(status_line.split()[1]),
        content_type=headers.get("content-type", "").split(";")[0],
        body=body,
        headers=headers,
    )


def read_one(sock: socket.socket) -> raw_http.Answer:
    """One answer from a connection that stays open (its ``Content-Length`` says where
    it ends)."""
    got = bytearray()
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        assert chunk, "closed before an answer"
        got += chunk
    answer = parse(bytes(got))
    length = int(answer.headers.get("content-length", "0"))
    body = bytearray(answer.body)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed within an answer"
        body += chunk
    return parse(bytes(got).partition(b"\r\n\r\n")[0] + b"\r\n\r\n" + bytes(body))


def partial_head(port: int, parts: list[bytes]) -> raw_http.Answer:
    """A request head sent in ``parts`` and never finished: the service's answer, read
    until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
        for part in parts:
            sock.sendall(part)
        got = bytearray()
        while chunk := sock.recv(65536):
            got += chunk
    return parse(bytes(got))


def test_a_connection_without_a_whole_request_is_answered_408_and_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http, "HEAD_TIMEOUT_S", 0.2)
    app = lm0_app()

    async def run() -> list[raw_http.Answer]:
        async with served(app) as port:
            idle = asyncio.to_thread(partial_head, port, [])
            trickle = asyncio.to_thread(
                partial_head, port, [b"POST /v1/launch HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: "]
            )
            answers = list(await asyncio.gather(idle, trickle))
            # a request that came whole in time is not cut off later
            answers.append(await asyncio.to_thread(raw_http.exchange, port, signed_ping(True)))
            return answers

    idle, trickle, ping = asyncio.run(run())
    for got in (idle, trickle):
        assert (got.status, got.content_type) == (408, "application/json")
        assert got.json()["error"] == "request_timeout"
    assert ping.status == 200
    assert refused(app, "request_timeout") == 2


def test_a_request_with_more_header_lines_than_any_call_needs_is_refused() -> None:
    many = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 100) for i in range(http.MAX_HEADERS + 1))

    async def run() -> list[raw_http.Answer]:
        async with served(lm0_app()) as port:
            over = b"POST /v1/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n" + many + b"\r\n"
            return [
                await asyncio.to_thread(raw_http.exchange, port, over),
                await asyncio.to_thread(raw_http.exchange, port, signed_ping(True)),
            ]

    over, ping = asyncio.run(run())
    assert (over.status, over.json()["error"]) == (400, "bad_http_request")
    assert ping.status == 200


def test_only_a_proven_caller_keeps_its_connection() -> None:
    """A public page or a refusal closes the connection with the answer (``exchange``
    reads until the service closes it: ``TimeoutError`` otherwise); a signed call keeps
    it for the next call."""

    def keeps_it(port: int) -> list[int]:
        statuses = []
        with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
            for _ in range(2):
                sock.sendall(signed_ping())
                statuses.append(read_one(sock).status)
        return statuses

    async def run() -> tuple[list[raw_http.Answer], list[int]]:
        async with served(lm0_app()) as port:
            closed = [
                await asyncio.to_thread(raw_http.exchange, port, data, timeout=5.0)
                for data in (
                    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"POST /v1/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                )
            ]
            return closed, await asyncio.to_thread(keeps_it, port)

    (health, unsigned), kept = asyncio.run(run())
    assert health.status == 200
    assert (unsigned.status, unsigned.json()["error"]) == (401, "missing_credentials")
    assert kept == [200, 200]


def test_connections_without_a_proven_caller_are_capped_oldest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One client opening connections faster than ``HEAD_TIMEOUT_S`` closes them held
    every file descriptor of the service: beyond ``MAX_UNPROVEN`` the oldest such
    connection is answered 503 ``too_many_connections`` and closed, while a proven
    caller's connection stays and new callers are served."""
    monkeypatch.setattr(http, "MAX_UNPROVEN", 4)

    def flood(port: int) -> tuple[list[int], list[raw_http.Answer], list[bool], int]:
        with socket.create_connection(("127.0.0.1", port), timeout=10.0) as peer:
            statuses = [send_ping(peer)]  # proven: it never counts
            idle = [socket.create_connection(("127.0.0.1", port), timeout=10.0) for _ in range(6)]
            try:
                # the two oldest went when the fifth and sixth came
                evicted = [read_to_close(s) for s in idle[:2]]
                statuses.append(send_ping(peer))
                new = raw_http.exchange(port, signed_ping(True))  # a new caller: served
                evicted.append(read_to_close(idle[2]))  # ... and the oldest left went
                still_open = [is_open(s) for s in idle[3:]]
            finally:
                for s in idle:
                    s.close()
            statuses.append(send_ping(peer))
        return statuses, evicted, still_open, new.status

    app = lm0_app()

    async def run() -> tuple[list[int], list[raw_http.Answer], list[bool], int]:
        async with served(app) as port:
            return await asyncio.to_thread(flood, port)

    statuses, evicted, still_open, new = asyncio.run(run())
    assert statuses == [200, 200, 200]
    assert new == 200
    for got in evicted:
        assert (got.status, got.json()["error"]) == (503, "too_many_connections")
    assert still_open == [True, True, True]
    assert refused(app, "too_many_connections") == 3


def send_ping(sock: socket.socket) -> int:
    sock.sendall(signed_ping())
    return read_one(sock).status


def read_to_close(sock: socket.socket) -> raw_http.Answer:
    got = bytearray()
    while chunk := sock.recv(65536):
        got += chunk
    return parse(bytes(got))


def is_open(sock: socket.socket) -> bool:
    """Nothing comes on ``sock`` for a while, and it is not closed."""
    sock.settimeout(0.3)
    try:
        return bool(sock.recv(1)) and False
    except TimeoutError:
        return True
