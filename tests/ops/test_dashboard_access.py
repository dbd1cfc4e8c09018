"""Who may see the dashboard, and how much of it (issue 32, item 9): it had no
authentication, no Host or Origin check (a DNS name rebound to 127.0.0.1 let any web
page read the federation's state), and ``/events`` streams without bound.  Served
in-process on a federation whose services are all gone (the page still serves)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from common.config import FederationConfig
from megha_cli.dashboard import server


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _config() -> FederationConfig:
    return replace(
        FederationConfig(), gms=1, lms=1, nodes_per_lm=2,
        broker_url=f"amqp://guest:guest@127.0.0.1:{_closed_port()}/",
        addresses={n: f"127.0.0.1:{_closed_port()}" for n in ("gm0", "lm0", "lm0-workers")},
    ).validate()  # fmt: skip


@contextlib.asynccontextmanager
async def dashboard(home: Path) -> AsyncIterator[tuple[web.Application, int]]:
    port = _closed_port()
    app = server.build_app(_config(), home, interval_s=1000.0, port=port)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield app, port
    finally:
        await runner.cleanup()


async def get(port: int, path: str, **headers: str) -> tuple[int, str]:
    """GET ``path`` (no redirect followed): the status and the refusal's reason."""
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
        http.get(f"http://127.0.0.1:{port}{path}", headers=headers, allow_redirects=False) as resp,
    ):
        reason = (await resp.json())["error"] if resp.status in (401, 403, 503) else ""
        return resp.status, reason


def test_nothing_without_the_token_but_health(tmp_path: Path) -> None:
    async def run() -> list[tuple[int, str]]:
        async with dashboard(tmp_path) as (_, port):
            paths = ["/", "/api/snapshot", "/events", "/static/app.js", "/api/task/u0/t1"]
            return [await get(port, p) for p in [*paths, "/health"]]

    got = asyncio.run(run())
    assert got[:-1] == [(401, "no_token")] * 5
    assert got[-1] == (200, "")


def test_the_token_opens_it_as_a_cookie_or_a_bearer(tmp_path: Path) -> None:
    token = server.dashboard_token(tmp_path)
    assert (tmp_path / server.TOKEN_FILE).stat().st_mode & 0o077 == 0
    assert server.dashboard_url(tmp_path, "0.0.0.0", 8099).endswith(f":8099/?token={token}")

    async def run() -> tuple[int, str, tuple[int, str], tuple[int, str], tuple[int, str]]:
        async with dashboard(tmp_path) as (_, port):
            # as a browser keeps it (aiohttp keeps no cookie of an IP address unless unsafe)
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
                url = f"http://127.0.0.1:{port}"
                async with http.get(f"{url}/?token={token}", allow_redirects=False) as resp:
                    status, cookie = resp.status, resp.headers.get("Set-Cookie", "")
                async with http.get(f"{url}/api/snapshot") as resp:  # the cookie kept
                    with_cookie = (resp.status, "")
            bearer = await get(port, "/api/snapshot", Authorization=f"Bearer {token}")
            wrong = await get(port, "/?token=not-it")
            return status, cookie, with_cookie, bearer, wrong

    status, cookie, with_cookie, bearer, wrong = asyncio.run(run())
    assert status == 303
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert with_cookie == (200, "")
    assert bearer == (200, "")
    assert wrong == (401, "bad_token")


def test_another_host_or_origin_is_refused_even_with_the_token(tmp_path: Path) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 asks
    for the dashboard with the victim's cookie; its Host and Origin give it away."""
    token = server.dashboard_token(tmp_path)
    auth = f"Bearer {token}"

    async def run() -> list[tuple[int, str]]:
        async with dashboard(tmp_path) as (_, port):
            local = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
            return [
                await get(port, "/api/snapshot", Authorization=auth, Host=f"evil.example:{port}"),
                await get(port, "/api/snapshot", Authorization=auth, Host="127.0.0.1:1"),
                await get(port, "/api/snapshot", Authorization=auth, Origin="http://evil.example"),
                await get(
                    port, "/api/snapshot", Authorization=auth, **{"Sec-Fetch-Site": "cross-site"}
                ),
                await get(port, "/api/snapshot", Authorization=auth, **local),
            ]

    assert asyncio.run(run()) == [
        (403, "bad_host"),
        (403, "bad_host"),
        (403, "bad_origin"),
        (403, "bad_origin"),
        (200, ""),
    ]


def _stream_request(port: int, token: str) -> bytes:
    return (
        f"GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\r\n"
    ).encode()


def test_event_streams_are_bounded_in_number(tmp_path: Path) -> None:
    token = server.dashboard_token(tmp_path)

    async def run() -> tuple[int, str, int]:
        async with dashboard(tmp_path) as (app, port):
            held = []
            for _ in range(server.MAX_STREAMS):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(_stream_request(port, token))
                assert b"200" in await reader.readline()
                held.append(writer)
            beyond = get(port, "/events", Authorization=f"Bearer {token}")
            refused = await asyncio.wait_for(beyond, 10)  # a stream served would never end
            held.pop().close()
            for _ in range(50):
                if len(app[server.STREAMS]) < server.MAX_STREAMS:
                    break
                await asyncio.sleep(0.05)
            again = await _status_of_stream(port, token)
            for w in held:
                w.close()
            return *refused, again

    assert asyncio.run(run()) == (503, "too_many_streams", 200)


async def _status_of_stream(port: int, token: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_stream_request(port, token))
    line = await reader.readline()
    writer.close()
    return int(line.split()[1])


@pytest.mark.timeout(60)
def test_a_stream_whose_reader_stops_reading_is_closed(tmp_path: Path) -> None:
    """A page that never reads held every snapshot pushed to it: closed once
    ``MAX_STREAM_BUFFER`` bytes wait for it (or a write waits ``WRITE_TIMEOUT_S``)."""
    token = server.dashboard_token(tmp_path)

    async def run() -> float:
        async with dashboard(tmp_path) as (app, port):
            poller = app[server.POLLER]
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(_stream_request(port, token))  # and never reads
            t0 = time.monotonic()
            try:
                while time.monotonic() - t0 < 40:
                    await asyncio.sleep(0.2)
                    if not app[server.STREAMS] and time.monotonic() - t0 > 1:
                        return time.monotonic() - t0
                    poller.snapshot = "x" * 256 * 1024  # a large federation's snapshot
                    async with poller.changed:
                        poller.version += 1
                        poller.changed.notify_all()
                return -1.0
            finally:
                sock.close()

    took = asyncio.run(run())
    assert took > 0, "the stream of a reader that stopped reading was never closed"
