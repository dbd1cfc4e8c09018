"""The dashboard's web server: polls the federation, pushes snapshots to the page.

Every ``interval`` seconds it asks each GM and LM process for ``/v1/state`` (signed as
the operator, with the keys in the federation's ``$MEGHA_HOME``; ``/metrics`` every
fifth time) and opens a TCP connection to the broker; a process that does not answer is shown down.  Pages:
``/`` (the page), ``/static/*``, ``/events`` (server-sent events: a snapshot at most
once a second per view), ``/api/snapshot``, ``/api/task/{user}/{task_id}`` (the GM's
``/v1/tasks/{user}/{task_id}``, or "not available"), ``/health``.

Who may see it (``guard``): every page but ``/health`` needs the dashboard's token
(``$MEGHA_HOME/dashboard.token``, 0600, made once; ``megha dashboard`` prints the URL
with it, ``$MEGHA_HOME/dashboard.url`` keeps it): ``/?token=...`` sets it as a cookie
(HttpOnly, SameSite=Strict) and sends the page on without it in the address bar; API
clients send ``Authorization: Bearer ...``.  A ``Host`` that is not this server's
(``--host``, loopback, ``--allow-host``) is refused, so a DNS name rebound to 127.0.0.1
reaches nothing, and so is a request from another origin.  At most ``MAX_STREAMS``
``/events`` streams at once; one whose reader falls ``MAX_STREAM_BUFFER`` bytes behind,
or takes a snapshot longer than ``WRITE_TIMEOUT_S`` to accept, is closed (the page's
``EventSource`` opens another).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

from common.config import FederationConfig, load_config
from federation.ports import port_free
from megha_cli.arguments import port_number
from megha_cli.dashboard.aggregate import Board, Layout
from security.access import Access, identity_of_process
from security.files import read_private, write_private

log = logging.getLogger("megha.dashboard")

MIN_PUSH_S = 1.0
"""A view gets at most one snapshot per second."""
REQUEST_TIMEOUT_S = 2.0
METRICS_EVERY = 5
"""``/metrics`` is scraped every fifth poll (its rates are over a minute)."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
"""User and task ids the task search passes on (nothing that needs quoting in a path)."""
STATIC = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}
TOKEN_FILE = "dashboard.token"
URL_FILE = "dashboard.url"
MAX_STREAMS = 8
"""``/events`` streams served at once (a page holds one): more are refused (503)."""
MAX_STREAM_BUFFER = 1024 * 1024
"""Bytes a stream may hold unsent for a reader that does not read: past it, closed."""
WRITE_TIMEOUT_S = 10.0
LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def _static(name: str) -> bytes:
    return (resources.files("megha_cli.dashboard") / "static" / name).read_bytes()


class Poller:
    """Polls the services and keeps the latest snapshot for the views."""

    def __init__(self, cfg: FederationConfig, home: Path, interval_s: float = 1.0) -> None:
        self.cfg = cfg
        self.access = Access.in_home(home, cfg)
        self.interval_s = interval_s
        self.board = Board(Layout.of(cfg))
        self.snapshot = json.dumps(self.board.snapshot(time.time()))
        self.version = 0
        self.changed = asyncio.Condition()
        self.http: aiohttp.ClientSession | None = None

    async def get(self, name: str, path: str) -> tuple[int, Any]:
        """``GET path`` on process ``name``, signed; (status, JSON answer or text)."""
        assert self.http is not None
        who = identity_of_process(self.cfg, name)
        headers = self.access.sign(who, "GET", path, b"", time.time())
        async with self.http.get(self.cfg.url(name) + path, headers=headers) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def _page(self, name: str) -> tuple[str, dict[str, Any] | None, str]:
        try:
            status, body = await self.get(name, "/v1/state")
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError)
            return name, None, "connection refused" if refused else f"no connection ({exc})"
        except TimeoutError:
            return name, None, f"no answer in {REQUEST_TIMEOUT_S:.0f} s"
        except (aiohttp.ClientError, OSError) as exc:
            return name, None, str(exc)[:200] or type(exc).__name__
        if status != 200 or not isinstance(body, dict):
            return name, None, f"HTTP {status}"
        return name, body, ""

    async def _broker_up(self) -> bool:
        for url in self.cfg.broker_urls:
            u = urlparse(url)
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(u.hostname or "127.0.0.1", u.port or 5672),
                    REQUEST_TIMEOUT_S,
                )
            except (OSError, TimeoutError):
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        return False

    async def _metrics(self, name: str) -> tuple[str, str | None]:
        try:
            status, body = await self.get(name, "/metrics")
        except (aiohttp.ClientError, TimeoutError, OSError):
            return name, None
        return name, body if status == 200 and isinstance(body, str) else None

    async def poll_once(self, *, metrics: bool = True) -> None:
        """Every process's ``/v1/state`` (and ``/metrics`` if ``metrics``), and the
        broker; then a new snapshot for the views."""
        names = self.board.layout.polled
        pages = asyncio.gather(*(self._page(n) for n in names))
        scrapes = asyncio.gather(*(self._metrics(n) for n in names if metrics))
        broker = await self._broker_up()
        now = time.time()
        for name, page, error in await pages:
            self.board.observe(now, name, page, error)
        for name, text in await scrapes:
            if text is not None:
                self.board.observe_metrics(now, name, text)
        self.board.observe_broker(now, broker)
        self.snapshot = json.dumps(self.board.snapshot(now))
        async with self.changed:
            self.version += 1
            self.changed.notify_all()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for turn in itertools.count():
            started = loop.time()
            try:
                await self.poll_once(metrics=turn % METRICS_EVERY == 0)
            except Exception:  # a malformed page must not stop the dashboard
                log.exception("poll failed")
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))

    async def newer_than(self, version: int) -> int:
        async with self.changed:
            await self.changed.wait_for(lambda: self.version > version)
            return self.version

    async def task(self, user: str, task_id: str) -> dict[str, Any]:
        """A task's timeline from the GM that owns its user's queue."""
        gm = next((g for u, g, _ in self.board.layout.users if u == user), None)
        if gm is None:
            return {"available": False, "detail": f"no user {user!r} in this federation"}
        try:
            status, body = await self.get(gm, f"/v1/tasks/{user}/{task_id}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return {"available": False, "gm": gm, "detail": f"{gm} did not answer ({exc})"}
        if status != 200:
            return {"available": False, "gm": gm, "status": status, "detail": body}
        return {"available": True, "gm": gm, "task": body}


POLLER = web.AppKey("poller", Poller)


async def index(_: web.Request) -> web.Response:
    return web.Response(body=_static("index.html"), content_type="text/html")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    return web.Response(
        body=_static(name), content_type=STATIC[name], headers={"Cache-Control": "no-store"}
    )


async def snapshot(request: web.Request) -> web.Response:
    return web.Response(text=request.app[POLLER].snapshot, content_type="application/json")


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: the latest snapshot whenever there is a newer one, at most
    once per ``MIN_PUSH_S``; at most ``MAX_STREAMS`` streams, each closed when its
    reader falls behind."""
    poller, streams = request.app[POLLER], request.app[STREAMS]
    if len(streams) >= MAX_STREAMS:
        return _refused(503, "too_many_streams", f"{MAX_STREAMS} event streams are open")
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    streams.add(resp)
    try:
        await resp.prepare(request)
        await _push(request, resp, poller)
    except (ConnectionResetError, TimeoutError):
        pass  # the reader went, or stopped reading
    finally:
        streams.discard(resp)
    return resp


async def _push(request: web.Request, resp: web.StreamResponse, poller: Poller) -> None:
    loop = asyncio.get_running_loop()
    version, sent_at = -1, -MIN_PUSH_S
    while True:
        if poller.version <= version:
            with contextlib.suppress(TimeoutError):  # a second at most: is the reader there?
                await asyncio.wait_for(poller.newer_than(version), MIN_PUSH_S)
        await asyncio.sleep(max(0.0, sent_at + MIN_PUSH_S - loop.time()))
        transport = request.transport
        if transport is None or transport.is_closing():
            return  # the reader went
        if transport.get_write_buffer_size() > MAX_STREAM_BUFFER:
            log.info("closing an event stream whose reader fell behind")
            return
        if poller.version <= version:
            continue
        version, sent_at = poller.version, loop.time()
        await asyncio.wait_for(resp.write(f"data: {poller.snapshot}\n\n".encode()), WRITE_TIMEOUT_S)


async def task(request: web.Request) -> web.Response:
    user, task_id = request.match_info["user"], request.match_info["task_id"]
    if not (NAME.fullmatch(user) and NAME.fullmatch(task_id)):
        raise web.HTTPBadRequest(text="user and task ids: letters, digits, _ . : -")
    return web.json_response(await request.app[POLLER].task(user, task_id))


async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


STREAMS = web.AppKey("streams", set)


def _refused(status: int, reason: str, detail: str) -> web.Response:
    return web.json_response({"error": reason, "detail": detail}, status=status)


class Guard:
    """Who may see the dashboard: its token, from its own host and origin."""

    def __init__(self, token: str, port: int, hosts: list[str]) -> None:
        self.token = token
        self.cookie = f"megha_dashboard_{port}"
        names = {*LOOPBACK, *hosts}
        self.hosts = {f"{h}:{port}" for h in names} | ({*names} if port == 80 else set())
        self.origins = {f"http://{h}" for h in self.hosts}

    def refusal(self, request: web.Request) -> web.Response | None:
        """Why ``request`` may not be served (None: it may)."""
        if request.host not in self.hosts:
            return _refused(403, "bad_host", f"Host {request.host[:100]!r} is not this dashboard's")
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self.origins:
            return _refused(403, "bad_origin", f"a request from {origin[:100]!r}")
        if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            return _refused(403, "bad_origin", "a request from another site")
        if not self._holds_token(request):
            return _refused(401, "no_token", "open the URL `megha dashboard` printed "
                            f"(kept in $MEGHA_HOME/{URL_FILE})")  # fmt: skip
        return None

    def _holds_token(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        given = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        given = given or request.cookies.get(self.cookie)
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def login(self, request: web.Request) -> web.Response | None:
        """``/?token=...``: the token as a cookie, and the page without it in the URL."""
        given = request.query.get("token")
        if given is None or request.host not in self.hosts:
            return None
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return _refused(401, "bad_token", "not this dashboard's token")
        resp = web.Response(status=303, headers={"Location": "/"})
        resp.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict", path="/")
        return resp


GUARD = web.AppKey("guard", Guard)


@web.middleware
async def guard(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every page but ``/health`` for the token's holder, at this host, from this origin."""
    if request.path == "/health":
        return await handler(request)
    g = request.app[GUARD]
    login = g.login(request) if request.path == "/" else None
    refused = login or g.refusal(request)
    if refused is not None:
        return refused
    return await handler(request)


def dashboard_token(home: Path) -> str:
    """The dashboard's token for the federation in ``home`` (made once, kept 0600)."""
    path = home / TOKEN_FILE
    if path.exists():
        return read_private(path).decode().strip()
    token = secrets.token_urlsafe(32)
    write_private(path, (token + "\n").encode())
    return token


def dashboard_url(home: Path, host: str, port: int) -> str:
    """The URL that opens the dashboard of ``home``, token included."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{shown}:{port}/?token={dashboard_token(home)}"


def build_app(
    cfg: FederationConfig,
    home: Path,
    interval_s: float = 1.0,
    *,
    port: int = 8099,
    hosts: list[str] | None = None,
) -> web.Application:
    """The dashboard of ``home``, served on ``port`` under ``hosts`` (and loopback)."""
    app = web.Application(middlewares=[guard])
    app[GUARD] = Guard(dashboard_token(home), port, hosts or [])
    app[STREAMS] = set()

    async def polling(app: web.Application) -> AsyncIterator[None]:
        poller = app[POLLER] = Poller(cfg, home, interval_s)
        poller.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        runner = asyncio.create_task(poller.run())
        yield
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await poller.http.close()

    app.cleanup_ctx.append(polling)
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/events", events)
    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_get("/api/task/{user}/{task_id}", task)
    app.router.add_get("/health", health)
    return app


def serve(home: Path, host: str, port: int, interval_s: float, allow: list[str]) -> None:
    cfg = load_config(home / "federation.toml")
    hosts = [h for h in (host, *allow) if h not in ("0.0.0.0", "::", "")]
    app = build_app(cfg, home, interval_s, port=port, hosts=hosts)
    url = dashboard_url(home, host, port)
    write_private(home / URL_FILE, (url + "\n").encode())
    print(f"dashboard of {cfg.name!r} on {url} (state in {home})", flush=True)
    web.run_app(app, host=host, port=port, shutdown_timeout=1.0, print=None)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=port_number, default=8099, help="port of the page (default 8099)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on (default 127.0.0.1: the page shows the federation's "
        "state to whoever reaches it)",
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the page may be reached by, besides --host and loopback (repeat); "
        "any other Host header is refused (DNS rebinding)",
    )


def main(argv: list[str] | None = None) -> int:
    """``python3 -m megha_cli.dashboard --state-dir HOME --port N``."""
    p = argparse.ArgumentParser(prog="megha-dashboard", description=__doc__)
    p.add_argument("--state-dir", help="the federation's $MEGHA_HOME")
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s dashboard %(message)s")
    serve(home_of(args.state_dir), args.host, args.port, args.interval, args.allow_host)
    return 0


def home_of(arg: str | None) -> Path:
    """The federation's state directory: ``arg``, ``$MEGHA_HOME`` or ``./.megha``."""
    return Path(arg or os.environ.get("MEGHA_HOME") or ".megha").resolve()


def cmd_dashboard(args: argparse.Namespace) -> int:
    home = home_of(args.state_dir)
    if not (home / "federation.toml").exists():
        print(f"megha dashboard: no federation recorded in {home} (start one with `megha up`)")
        return 1
    busy = f"megha dashboard: {args.host}:{args.port} is in use; choose another --port"
    if not port_free(args.host, args.port):
        print(busy, file=sys.stderr)
        return 1
    try:
        serve(home, args.host, args.port, args.interval, args.allow_host)
    except OSError as exc:  # taken in the meantime, or not ours to listen on
        why = exc.strerror or str(exc)
        print(f"megha dashboard: cannot listen on {args.host}:{args.port} ({why})", file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dashboard",
        help="a live web page of the running federation",
        description="Serve a page showing the federation recorded in $MEGHA_HOME: GMs, LMs "
        "and their partitions' bit-vectors, queues and shares per user, allocation times "
        "and rates over the last minute, and a task search.  It prints its URL with the "
        "dashboard's token (also in $MEGHA_HOME/dashboard.url); without the token, or "
        "reached under another host name, it shows nothing.  See docs/dashboard.md.",
    )
    p.add_argument("--state-dir", help="the federation's state ($MEGHA_HOME or ./.megha)")
    add_arguments(p)
    p.set_defaults(run=cmd_dashboard)
