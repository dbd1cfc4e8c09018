"""The dashboard's web server: polls the federation, pushes snapshots to the page.

Every ``interval`` seconds it asks each GM and LM process for ``/v1/state`` (signed as
the operator, with the keys in the federation's ``$MEGHA_HOME``; ``/metrics`` every
fifth time) and opens a TCP connection to the broker; a process that does not answer is shown down.  Pages:
``/`` (the page), ``/static/*``, ``/events`` (server-sent events: a snapshot at most
once a second per view), ``/api/snapshot``, ``/api/task/{user}/{task_id}`` (the GM's
``/v1/tasks/{user}/{task_id}``, or "not available"), ``/health``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import AsyncIterator
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
    once per ``MIN_PUSH_S``."""
    poller = request.app[POLLER]
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    loop = asyncio.get_running_loop()
    version, sent_at = -1, -MIN_PUSH_S
    with contextlib.suppress(ConnectionResetError):
        while True:
            if poller.version <= version:
                await poller.newer_than(version)
            await asyncio.sleep(max(0.0, sent_at + MIN_PUSH_S - loop.time()))
            version, sent_at = poller.version, loop.time()
            await resp.write(f"data: {poller.snapshot}\n\n".encode())
    return resp


async def task(request: web.Request) -> web.Response:
    user, task_id = request.match_info["user"], request.match_info["task_id"]
    if not (NAME.fullmatch(user) and NAME.fullmatch(task_id)):
        raise web.HTTPBadRequest(text="user and task ids: letters, digits, _ . : -")
    return web.json_response(await request.app[POLLER].task(user, task_id))


async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def build_app(cfg: FederationConfig, home: Path, interval_s: float = 1.0) -> web.Application:
    app = web.Application()

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


def serve(home: Path, host: str, port: int, interval_s: float) -> None:
    cfg = load_config(home / "federation.toml")
    app = build_app(cfg, home, interval_s)
    print(f"dashboard of {cfg.name!r} on http://{host}:{port}/ (state in {home})", flush=True)
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


def main(argv: list[str] | None = None) -> int:
    """``python3 -m megha_cli.dashboard --state-dir HOME --port N``."""
    p = argparse.ArgumentParser(prog="megha-dashboard", description=__doc__)
    p.add_argument("--state-dir", help="the federation's $MEGHA_HOME")
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s dashboard %(message)s")
    serve(home_of(args.state_dir), args.host, args.port, args.interval)
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
        serve(home, args.host, args.port, args.interval)
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
        "and rates over the last minute, and a task search.  See docs/dashboard.md.",
    )
    p.add_argument("--state-dir", help="the federation's state ($MEGHA_HOME or ./.megha)")
    add_arguments(p)
    p.set_defaults(run=cmd_dashboard)
