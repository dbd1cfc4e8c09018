"""The HTTP service boundary shared by the GM, LM and worker apps.

Protocol errors become HTTP statuses here and only here: ``DecodeError`` 400
(413 when too large), ``ValidationError`` 422, ``Unauthorized`` 401.  Error bodies
are JSON ``{"error": reason, "detail": ...}``; success bodies are msgpack.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

from aiohttp import web

from common.auth import HEADER, check_internal
from common.config import ID_ENV, FederationConfig, load_config
from common.errors import DecodeError, MeghaError, Unauthorized, ValidationError
from common.metrics import CONTENT_TYPE, ServiceMetrics

MSGPACK = "application/x-msgpack"
log = logging.getLogger("megha.service")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CONFIG_KEY = web.AppKey("config", FederationConfig)
METRICS_KEY = web.AppKey("metrics", ServiceMetrics)


def status_of(exc: MeghaError) -> int:
    if isinstance(exc, Unauthorized):
        return 401
    if isinstance(exc, DecodeError):
        return 413 if exc.reason == "too_large" else 400
    if isinstance(exc, ValidationError):
        return 422
    return 400


def error_response(exc: MeghaError) -> web.Response:
    return web.json_response(exc.to_dict(), status=status_of(exc))


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refused input: a precise status and reason, logged and counted."""
    try:
        return await handler(request)
    except MeghaError as exc:
        metrics = request.app.get(METRICS_KEY)
        if metrics is not None:
            metrics.errors.labels(exc.reason).inc()
        log.info("refused %s %s: %s (%s)", request.method, request.path, exc, exc.reason)
        return error_response(exc)


async def read_body(request: web.Request) -> bytes:
    """The authenticated body, refused before reading if it is too large."""
    cfg = request.app[CONFIG_KEY]
    check_internal(request.headers.get(HEADER), cfg.secret)
    limit = cfg.max_body
    if request.content_length is not None and request.content_length > limit:
        raise DecodeError(
            f"body of {request.content_length} bytes exceeds {limit}", reason="too_large"
        )
    try:
        body = await request.content.read(limit + 1)
    except ValueError as exc:
        raise DecodeError(str(exc)) from None
    if len(body) > limit:
        raise DecodeError(f"body exceeds {limit} bytes", reason="too_large")
    metrics = request.app.get(METRICS_KEY)
    if metrics is not None:
        metrics.requests.labels(request.path).inc()
    return body


def msgpack_response(body: bytes) -> web.Response:
    return web.Response(body=body, content_type=MSGPACK)


def require_internal(request: web.Request) -> None:
    check_internal(request.headers.get(HEADER), request.app[CONFIG_KEY].secret)


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def ping_handler(request: web.Request) -> web.Response:
    """The floor: an authenticated empty request, answered at once."""
    await read_body(request)
    return web.Response(body=b"", content_type=MSGPACK)


def base_app(cfg: FederationConfig) -> web.Application:
    app = web.Application(middlewares=[errors_middleware], client_max_size=cfg.max_body + 1)
    app[CONFIG_KEY] = cfg
    app.router.add_post("/v1/ping", ping_handler)
    return app


class Component(Protocol):
    """What a service runs beside its HTTP routes (brokers, sessions, loops)."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...


def serve(
    app: web.Application, component: Component, *, health: Handler, state: Handler
) -> web.Application:
    """Open ``component`` with the app and close it after; add the routes every
    service has: ``/health``, ``/v1/state`` and ``/metrics``."""

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        await component.open()
        yield
        with contextlib.suppress(Exception):
            await component.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/state", state)
    app.router.add_get("/metrics", metrics_handler)
    return app


def service_identity(role: str) -> tuple[FederationConfig, str]:
    """The config and this process's id, from the environment ``megha up`` sets."""
    logging.basicConfig(
        level=os.environ.get("MEGHA_LOG", "INFO"),
        format=f"%(asctime)s {role} %(name)s %(levelname)s %(message)s",
    )
    cfg = load_config()
    ident = os.environ.get(ID_ENV, "")
    if not ident:
        raise MeghaError(f"{ID_ENV} is not set: which {role} is this?")
    return cfg, ident
