"""The HTTP side of every service: the server boundary and keep-alive peers.

Server: protocol errors become HTTP statuses here and only here — ``DecodeError`` 400
(413 when too large), ``ValidationError`` 422, ``Unauthorized`` 401 (403 for an
endpoint the caller may not use), and a core's ``Refused`` answer 409 (or 422 for
bad input, 503 when not ready), and a path or method no route takes 404 / 405
(``not_found``, ``method_not_allowed``).  A request aiohttp's parser cannot read (not
HTTP at all, a bad request line or header, a line too long, a bad chunk) never reaches
a middleware: ``ServiceRunner``'s connections answer it 400 ``bad_http_method``,
``line_too_long`` or ``bad_http_request``, and a body aiohttp cannot decode is 400
``bad_http_body``.  Error bodies are JSON ``{"error": reason, "detail": ..., "field":
...}``; success bodies are msgpack.  A body is read whole, up to the configured limit.

Every call but ``GET /health`` is signed (``security.signing``): the caller's
identity, a timestamp, a nonce and the body's digest under the key of the channel
caller -> service.  The server checks it (freshness, replays, who may call which
endpoint) before any handler runs -- all but the body's digest before it reads any of
the body -- and signs its answer, bound to the request's nonce, a refusal as any other;
a ``Peer`` checks that signature, and takes an answer without it (a 4xx too: anyone on
the path may have written it) for no answer.

The usual call of a peer -- a signed keep-alive ``POST`` to a message route -- takes a
lean path (``runtime.fastpath``, ``_Lane``): the same checks, counters and answers as
the middlewares and ``message_route``, without aiohttp's request, middleware and
response objects; anything else is aiohttp's, as before.

Client: a ``Peer`` posts one message to one service over a keep-alive connection and
decodes one answer, retrying transient failures with the runtime's backoff; every
request it retries is idempotent (an ``Idempotency-Key`` header names it) and signed
afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import types
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Protocol, TypeVar

from aiohttp import web
from aiohttp.http import HttpProcessingError
from aiohttp.http_exceptions import BadHttpMethod, LineTooLong

from common import codec
from common.config import ID_ENV, FederationConfig, load_config
from common.errors import DecodeError, MeghaError, Unauthorized, ValidationError
from common.messages import Refused
from common.reasons import RequestReason
from runtime import fastpath, h1
from runtime.clock import steady
from runtime.driver import CoreDriver
from runtime.gcwatch import GcWatch
from runtime.prometheus import CONTENT_TYPE, ServiceMetrics
from runtime.retry import Backoff, retry
from security import signing
from security.access import Access
from security.access import service_identity as access_identity
from security.identity import Identity, Role

MSGPACK = "application/x-msgpack"
log = logging.getLogger("megha.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CONFIG_KEY = web.AppKey("config", FederationConfig)
METRICS_KEY = web.AppKey("metrics", ServiceMetrics)
GC_KEY = web.AppKey("gc", GcWatch)

M = TypeVar("M")

# Reasons a core refuses a request because the request itself is wrong (422); any
# other refusal is a conflict with the service's state (409).
UNAVAILABLE_REASONS = frozenset({RequestReason.NOT_READY})
BAD_REQUEST_REASONS = frozenset(
    {
        RequestReason.WRONG_LM,
        RequestReason.UNKNOWN_GM,
        RequestReason.WRONG_RESOURCES,
        RequestReason.DUPLICATE_TASK_ID,
        RequestReason.UNKNOWN_NODE,
    }
)


ROUTING_REASONS = {404: "not_found", 405: "method_not_allowed"}
"""The reasons of aiohttp's own refusals (no route for the path, or not that method)."""

FORBIDDEN_REASONS = frozenset({signing.Refusal.FORBIDDEN.value, "sender_mismatch"})
"""Refusals of a caller whose identity was proven (403, not 401)."""


def status_of(exc: MeghaError) -> int:
    if isinstance(exc, Unauthorized):
        return 403 if exc.reason in FORBIDDEN_REASONS else 401
    if isinstance(exc, DecodeError):
        return 413 if exc.reason == "too_large" else 400
    if isinstance(exc, ValidationError):
        return 422
    return 400


def error_response(exc: MeghaError) -> web.Response:
    return web.json_response(exc.to_dict(), status=status_of(exc))


def _count_refusal(request: web.Request, reason: str) -> None:
    _count(request.app.get(METRICS_KEY), reason)


def _count(metrics: ServiceMetrics | None, reason: str) -> None:
    if metrics is not None:
        metrics.errors.labels(reason).inc()


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refused input: a precise status and reason, logged and counted."""
    try:
        return await handler(request)
    except (MeghaError, web.HTTPClientError, web.RequestPayloadError) as exc:
        return refusal_response(request, exc)


def refusal_response(
    request: web.Request, exc: MeghaError | web.HTTPClientError | web.RequestPayloadError
) -> web.Response:
    """The JSON answer to a refused request, logged and counted."""
    if isinstance(exc, MeghaError):
        return refusal_of(request.app.get(METRICS_KEY), request.method, request.path, exc)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        _count_refusal(request, "too_large")
        return web.json_response(
            {"error": "too_large", "detail": exc.text or "body too large"}, status=413
        )
    if isinstance(exc, web.HTTPClientError):  # a path or method no route of this service takes
        reason = ROUTING_REASONS.get(exc.status, "bad_request")
        _count_refusal(request, reason)
        log.info("refused %r %r: %r", request.method, request.path, reason)
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response(
            {"error": reason, "detail": f"{request.method} {request.path}: {exc.reason}"},
            status=exc.status,
            headers=allow,
        )
    # a body aiohttp cannot decode (its Content-Encoding)
    _count_refusal(request, "bad_http_body")
    log.info("refused %r %r: %r (%r)", request.method, request.path, str(exc), "bad_http_body")
    return web.json_response({"error": "bad_http_body", "detail": str(exc)[:300]}, status=400)


def refusal_of(
    metrics: ServiceMetrics | None, method: str, path: str, exc: MeghaError
) -> web.Response:
    """The JSON answer to a request refused with ``exc``, logged and counted."""
    _count(metrics, exc.reason)
    # every part may come from the client: %r escapes newlines and control
    # characters, so no refusal can forge a line of the log
    log.info("refused %r %r: %r (%r)", method, path, str(exc), exc.reason)
    return error_response(exc)


# ------------------------------------------------- requests no middleware sees
PARSER_REASONS: dict[type[HttpProcessingError], str] = {
    BadHttpMethod: "bad_http_method",  # not HTTP at all: TLS on the plain port, a scanner
    LineTooLong: "line_too_long",  # the request line or a header line beyond 8190 bytes
}
"""The reasons of requests aiohttp's parser cannot read; any other is ``bad_http_request``
(a bad request line, header name or value, Content-Length, Transfer-Encoding or chunk
size, too many headers)."""


def parser_reason(exc: HttpProcessingError) -> str:
    return next(
        (r for kind, r in PARSER_REASONS.items() if isinstance(exc, kind)), "bad_http_request"
    )


HEAD_TIMEOUT_S = 10.0
"""A new connection's first request must have come whole (its request line and headers)
within this: one that has not is answered 408 ``request_timeout`` and closed.  aiohttp
holds it, idle or trickling a header a byte at a time, for the whole keep-alive (300 s,
for the peers' connections)."""
MAX_HEADERS = 32
"""Header lines a request may have (a signed call has about ten).  aiohttp takes 128 of
up to 8 KiB each, and held ~1.6 MiB per connection of them, before any credentials
were checked: 300 connections grew an LM by 480 MiB, which it kept."""
MAX_UNPROVEN = 256
"""Connections a service holds at once that have not yet carried a call whose signature
checked out: a new one beyond it closes the oldest of them (503 ``too_many_connections``).
Without it, one client opening connections faster than ``HEAD_TIMEOUT_S`` closes them
held every file descriptor the service may open, and with them its peers' calls and its
broker connection.  A proven caller's connection never counts: a peer's calls go on."""


class _Connection(web.RequestHandler):
    """aiohttp's handler of one connection, except that a request its parser cannot read
    is refused as every other refusal is (JSON, its reason, counted, one log line):
    aiohttp answers it before any middleware runs, in plain text, and logs a traceback
    at ERROR for each.  A 5xx (a server bug) stays aiohttp's.  A connection whose first
    request does not come whole within ``HEAD_TIMEOUT_S`` is closed (408).

    A peer's usual call to a message route is served by the app's lean path (``_Lane``)
    without aiohttp's request objects; the first request that path does not read hands
    the connection, and every byte of it not yet served, to aiohttp for good."""

    __slots__ = ("_busy", "_head", "_head_timer", "_held", "_lane", "_metrics", "_paused",
                 "_unproven")  # fmt: skip

    def __init__(self, manager: _Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._metrics = manager.metrics
        self._unproven = manager.unproven
        self._head_timer: asyncio.TimerHandle | None = None
        self._lane = manager.lane
        """The lean path of the app's message routes, until a request it does not read
        hands the connection over to aiohttp (``_hand_over``), for good."""
        self._held = bytearray()
        """What came and the lean path has not served yet."""
        self._head: tuple[fastpath.Head, signing.Claim] | None = None
        """The head of the request whose body is coming, its headers' checks passed."""
        self._busy = False
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._logging_enabled:
            self._lane = None  # the access log is aiohttp's: it reads every request
        self._head_timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, self._head_overdue)
        unproven = self._unproven
        while len(unproven) >= MAX_UNPROVEN:
            oldest = next(iter(unproven))
            del unproven[oldest]
            oldest._refuse(
                503, "Service Unavailable", "too_many_connections",
                f"more than {MAX_UNPROVEN} connections without a proven caller",
            )  # fmt: skip
        unproven[self] = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._unproven.pop(self, None)
        self._lane, self._held, self._head = None, bytearray(), None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def proven(self) -> None:
        """A call on this connection came from a caller whose signature checked out."""
        self._unproven.pop(self, None)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self._request_count:
            return  # a request came: its caller was answered as any
        self._refuse(
            408, "Request Timeout", "request_timeout", f"no whole request in {HEAD_TIMEOUT_S:g} s"
        )

    def _refuse(self, status: int, phrase: str, reason: str, detail: str) -> None:
        """Answer ``reason`` and close, outside any request (none came whole, or one is
        being read: its answer would never be read after this one)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # the client went
        _count(self._metrics, reason)
        # a flood closes thousands a second: counted, and in the log only at debug
        level = logging.DEBUG if reason == "too_many_connections" else logging.INFO
        log.log(level, "refused a connection from %r: %r", self.peername, reason)
        body = json.dumps({"error": reason, "detail": detail}).encode()
        transport.write(  # no request to answer through aiohttp: the answer as it writes one
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status, phrase.encode(), len(body), body)
        )
        self.force_close()

    def data_received(self, data: bytes) -> None:
        if self._lane is None:
            super().data_received(data)
            return
        if self._force_close or self._close:
            return
        self._held += data
        if self._busy:  # a request is being served: the next waits, reading paused
            if not self._paused and self.transport is not None:
                self.transport.pause_reading()
                self._paused = True
            return
        self._advance()

    def _advance(self) -> None:
        """Serve what is held while it is a request the lean path reads; hand the
        connection over to aiohttp at the first that is not."""
        while (lane := self._lane) is not None and not self._busy and not self._force_close:
            held = self._held
            if self._head is None:
                if not held:
                    return
                head = fastpath.parse_head(bytes(held[: fastpath.MAX_HEAD + 4]), lane.paths)
                if not isinstance(head, fastpath.Head):
                    self._hand_over()
                    return
                try:
                    checked = lane.check_head(head)
                except Exception:  # a server bug: aiohttp's path meets it too, and 500s
                    self._hand_over()
                    return
                if isinstance(checked, MeghaError):
                    if len(held) < head.size + head.length:
                        # aiohttp refuses it as well, and drains the body it will not
                        # read before it closes (a close now could lose the answer)
                        self._hand_over()
                    else:
                        self._request_count += 1
                        self._write(lane.refused(head.path, checked), close=True)
                    return
                self._request_count += 1
                self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout
                self._head = (head, checked)
            head, claim = self._head
            end = head.size + head.length
            if len(held) < end:
                return  # the body is coming (at most the app's limit: checked)
            body = bytes(held[head.size : end])
            del held[:end]
            self._head = None
            self._busy = self._request_in_progress = True
            if self._manager is not None:
                self._manager.requests_count += 1
            # served at once, up to its first wait if any (a task then goes on with it):
            # a pool's start, a GM's answer never waits, and a task per request cost
            # its creation and a turn of the loop
            answering = self._answer(lane, head, claim, body)
            try:
                waits_on = answering.send(None)
            except StopIteration:
                self._served()
                continue  # the next request held, if any
            except BaseException:
                self._served()
                raise
            self._loop.create_task(self._finish(answering, waits_on))
            return

    async def _answer(
        self, lane: _Lane, head: fastpath.Head, claim: signing.Claim, body: bytes
    ) -> None:
        """Answer one request of the lean path, in one write."""
        try:
            out, close = await lane.answer(head.path, claim, body, self)
        except Exception as exc:  # a server bug: aiohttp's 500, logged as aiohttp does
            self.log_exception("Error handling request from %s", self.peername, exc_info=exc)
            out, close = fastpath.answer_bytes(500, INTERNAL_ERROR, _TEXT, close=True), True
        self._write(out, close)

    async def _finish(self, answering: Coroutine[Any, Any, None], waits_on: Any) -> None:
        """Go on with an answer that waited (``_answer``, its first step taken: it
        yielded ``waits_on``); then the next request held."""
        try:
            await _resume(answering, waits_on)
        finally:
            self._served()
        if self._force_close or self.transport is None:
            return
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        self._advance()

    def _served(self) -> None:
        """A request of the lean path is answered: the connection is free again."""
        self._busy = self._request_in_progress = False
        if self._handler_waiter is not None:  # a graceful shutdown waits for it
            self._handler_waiter.set_result(None)
        if self._force_close or self.transport is None:
            return
        self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout
        if self._keepalive_handle is None:
            self._keepalive_handle = self._loop.call_at(
                self._next_keepalive_close_time, self._process_keepalive
            )

    def _write(self, out: bytes, close: bool) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return  # the client went
        transport.write(out)
        if close:
            self.force_close()

    def _hand_over(self) -> None:
        """aiohttp reads this connection from here on, starting with every byte held
        (its parser has seen none of them: it reads them as it would have)."""
        held = bytes(self._held)
        self._lane, self._held = None, bytearray()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        super().data_received(held)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not (400 <= status < 500 and isinstance(exc, HttpProcessingError)):
            return super().handle_error(request, status, exc, message)
        reason = parser_reason(exc)
        _count(self._metrics, reason)
        detail = (message or exc.message)[:300]  # the parser quotes the client's bytes
        # as aiohttp does: not HTTP at all is what the internet sends any open port
        level = logging.DEBUG if reason == "bad_http_method" else logging.INFO
        log.log(level, "refused a request from %r: %r (%r)", request.remote, detail, reason)
        resp = web.json_response({"error": reason, "detail": detail}, status=status)
        resp.force_close()  # as aiohttp: the parser cannot find where the next request starts
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        if isinstance(kw.get("exc_info"), web.RequestPayloadError):
            # a body aiohttp cannot decode (its Content-Encoding) that no handler read, the
            # request refused on its headers: aiohttp meets it draining the connection
            # after the answer, and closes the connection.  The client's error, not a
            # traceback of the server's
            log.info("undecodable body from %r: %r", self.peername, str(kw["exc_info"]))
            return
        super().log_exception(*args, **kw)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], waits_on: Any) -> Generator[Any, None, None]:
    """Drive ``coro`` on from where its first step left it, having yielded ``waits_on``
    (a future it awaits, or None: a bare turn of the loop), as the task awaiting this
    would have driven it from the start: what the task is sent or thrown (its
    cancellation) goes to ``coro``."""
    while True:
        try:
            sent = yield waits_on
        except BaseException as exc:
            try:
                waits_on = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                waits_on = coro.send(sent)
            except StopIteration:
                return


class _Server(web.Server):
    """The server an ``AppRunner`` made for its app (the same handler, request factory
    and connection settings: keep-alive, logger, access log), making ``_Connection``s:
    aiohttp's ``Server`` names its connection class, there is no argument for it."""

    def __init__(
        self, made: web.Server, metrics: ServiceMetrics | None, lane: _Lane | None = None
    ) -> None:
        super().__init__(
            made.request_handler, request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation, **made._kwargs,
        )  # fmt: skip
        self.metrics = metrics
        self.lane = lane
        self.unproven: dict[_Connection, None] = {}
        """Open connections without a proven caller yet, oldest first."""

    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class ServiceRunner(web.AppRunner):
    """A ``web.AppRunner`` whose connections refuse requests aiohttp's parser cannot read
    with a JSON reason, counted in the app's metrics, and serve a peer's usual call to a
    message route by the lean path (``runtime.fastpath``; ``runtime.gunicorn_worker``
    serves every service with it)."""

    __slots__ = ("lean",)

    def __init__(self, app: web.Application, *, lean: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("max_headers", MAX_HEADERS)
        super().__init__(app, **kwargs)
        self.lean = lean
        """Serve the app's message routes' usual requests by the lean path (``_Lane``)."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # the app started and frozen
        lane = _Lane.of(self.app) if self.lean else None
        return _Server(made, self.app.get(METRICS_KEY), lane)


CALLER_KEY = web.RequestKey("caller", Identity)
CLAIM_KEY = web.RequestKey("claim", signing.Claim)
ACCESS_KEY = web.AppKey("access", Access)
REPLAYS_KEY = web.AppKey("replays", signing.ReplayCache)
INCARNATION_KEY = web.AppKey("incarnation", str)
"""This process's incarnation id: a service's calls name it, its answers carry it."""


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Who calls, checked before any handler runs; the answer signed for the caller.
    Only a proven caller keeps its connection: anyone else's (a public page, a refusal)
    is closed with the answer, so that no one holds a service's connections -- its file
    descriptors -- for the peers' keep-alive without credentials."""
    if signing.is_public(request.method, request.path) or signing.is_user_api(
        request.method, request.path
    ):  # a user's call proves its token in its handler (``global_master.frontdoor``)
        public = await handler(request)
        public.force_close()
        return public
    access = request.app[ACCESS_KEY]
    replays = request.app[REPLAYS_KEY]
    try:
        # Nothing of the body is read until the headers prove a caller allowed here: an
        # unsigned 15 MiB POST costs its headers, not 15 MiB of memory.
        _check_length(request.content_length, request.app[CONFIG_KEY].max_body)
        claim = signing.verify_headers(
            request.headers, request.method, request.raw_path, access.keyring, time.time(),
            replays,
        )  # fmt: skip
        signing.authorize(claim.identity, access.me, request.method, request.path)
        body = await request.read()  # whole, up to client_max_size (413 beyond it)
        now = time.time()
        caller = signing.verify_body(claim, body, now, replays)
    except (MeghaError, web.HTTPClientError, web.RequestPayloadError) as exc:
        refused = refusal_response(request, exc)
        refused.force_close()
        return refused
    request[CALLER_KEY] = caller
    request[CLAIM_KEY] = claim
    if isinstance(request.protocol, _Connection):
        request.protocol.proven()
    try:
        resp = await handler(request)
    except (MeghaError, web.HTTPClientError) as exc:
        # a refusal of a proven caller is signed as any answer: unsigned, anyone on the
        # path could have written it, and its caller takes it for a guess (``Peer.post``)
        resp = refusal_response(request, exc)
    if isinstance(resp, web.Response):
        out = resp.body if isinstance(resp.body, bytes) else b""
        nonce = request.headers[signing.HEADER_NONCE]
        key = access.http_key(access.me, caller)
        mine = request.app[INCARNATION_KEY]
        resp.headers.update(
            signing.sign_response(resp.status, out, nonce, access.me, key, now, mine)
        )
    return resp


def _check_length(length: int | None, limit: int) -> None:
    """413 for a body declared larger than the app's limit, before any of it is read."""
    if length is not None and length > limit:
        raise DecodeError(f"body of {length} bytes exceeds {limit}", reason="too_large")


async def read_body(request: web.Request) -> bytes:
    """The (authenticated) body, read whole (up to the app's limit; 413 beyond it)."""
    _check_length(request.content_length, request.app[CONFIG_KEY].max_body)
    body = await request.read()
    metrics = request.app.get(METRICS_KEY)
    if metrics is not None:
        metrics.requests.labels(request.path).inc()
    return body


async def read_message(request: web.Request, expect: type[M] | tuple[type, ...]) -> M:
    """The request's one message, decoded and checked against ``expect``."""
    body = await read_body(request)
    msg: M = codec.decode(body, expect=expect, max_size=request.app[CONFIG_KEY].max_body)
    return msg


def reply_response(msg: object | None) -> web.Response:
    """A core's answer: msgpack, or the refusal as a JSON 4xx with its reason."""
    if msg is None:
        return web.Response(status=204)
    if isinstance(msg, Refused):
        if msg.reason in UNAVAILABLE_REASONS:
            status = 503  # a peer retries: the service will take it shortly
        elif msg.reason in BAD_REQUEST_REASONS:
            status = 422
        else:
            status = 409
        return web.json_response({"error": msg.reason, "detail": msg.detail}, status=status)
    return web.Response(body=codec.encode(msg), content_type=MSGPACK)


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


PING = "/v1/ping"


async def ping_handler(request: web.Request) -> web.Response:
    """The floor: an authenticated empty request, answered at once (on the lean path
    too, as a peer's message is: ``_Lane``)."""
    await read_body(request)
    return web.Response(body=b"", content_type=MSGPACK)


def _pings_as_base_app(app: web.Application) -> bool:
    """``app`` answers ``POST /v1/ping`` with ``ping_handler`` (``base_app``'s route)."""
    return any(
        r.method == "POST" and r.resource is not None and r.resource.canonical == PING
        and r.handler is ping_handler
        for r in app.router.routes()
    )  # fmt: skip


def base_app(cfg: FederationConfig, access: Access) -> web.Application:
    app = web.Application(
        middlewares=[errors_middleware, auth_middleware], client_max_size=cfg.max_body
    )
    app[CONFIG_KEY] = cfg
    app[ACCESS_KEY] = access
    app[REPLAYS_KEY] = signing.ReplayCache()
    app[INCARNATION_KEY] = signing.new_incarnation()
    app.router.add_post(PING, ping_handler)
    return app


class Service(Protocol):
    """What a service process runs beside its HTTP routes: a core behind a driver,
    opened with the app and closed after it."""

    role: str
    driver: CoreDriver

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    def ident(self) -> str: ...

    def status(self) -> str:
        """``ok``; ``starting`` (not serving yet: /health answers 503); or another
        serving state such as ``standby``."""
        ...

    def refusal(self) -> Refused | None:
        """Why the service takes no message now (None: it does)."""
        ...

    async def durable(self, msg: object) -> None:
        """Return once what the core did with ``msg`` is safe (published, confirmed):
        its sender may then forget it."""
        ...

    def state_page(self) -> dict[str, Any]: ...


SERVICE_KEY = web.AppKey("service", Service)


CLAIMS = {Role.GM: "gm", Role.LM: "lm", Role.WORKERS: "lm"}
"""The field of a message that names who sends it, by the signed caller's role (a
worker pool speaks for its LM's nodes, as ``lm``)."""


def check_claim(caller: Identity, msg: object) -> None:
    """A signed caller speaks only for itself: a launch from ``gm:gm0`` names ``gm0``,
    a report from ``workers:lm0`` names ``lm0`` (403 ``sender_mismatch`` otherwise)."""
    field = CLAIMS.get(caller.role)
    if field is None:
        return
    claimed = getattr(msg, field, None)
    if claimed is not None and claimed != caller.name:
        raise Unauthorized(
            f"{caller} sent a message in the name of {field} {claimed!r}", reason="sender_mismatch"
        )


def message_route(kind: type | tuple[type, ...]) -> Handler:
    """A POST route whose body is one message of ``kind`` for the service's core; the
    answer is the core's reply."""

    async def handle(request: web.Request) -> web.Response:
        msg: object = await read_message(request, kind)
        caller = request[CALLER_KEY]
        check_claim(caller, msg)
        signing.check_incarnation(caller, request[CLAIM_KEY], request.app[INCARNATION_KEY])
        svc = request.app[SERVICE_KEY]
        refused = svc.refusal()
        if refused is not None:
            return reply_response(refused)
        answer = svc.driver.feed(msg)
        await svc.durable(msg)
        return reply_response(answer)

    return handle


ROUTES_KEY: web.AppKey[dict[str, Any]] = web.AppKey("routes", dict)
"""An app's message routes (``service_app``): path -> the kind of message it takes."""
INTERNAL_ERROR = b"500 Internal Server Error\n\nServer got itself in trouble"
"""aiohttp's answer to a handler's exception (``RequestHandler.handle_error``)."""
_TEXT = {"Content-Type": "text/plain; charset=utf-8"}


class _Lane:
    """The lean path of an app's message routes (``runtime.fastpath``): the checks,
    counters and answers of ``auth_middleware`` and ``message_route``, in their order,
    without aiohttp's request, middleware and response objects."""

    __slots__ = ("access", "allowed", "counted", "keys", "kinds", "max_body", "metrics", "mine",
                 "paths", "replays", "svc")  # fmt: skip

    def __init__(self, app: web.Application) -> None:
        routes: dict[str, type | tuple[type, ...]] = app[ROUTES_KEY]
        self.kinds = dict(routes)
        pings = [PING] if _pings_as_base_app(app) and PING not in routes else []
        self.paths = frozenset(path.encode("ascii") for path in [*self.kinds, *pings])
        self.max_body = app[CONFIG_KEY].max_body
        self.access = app[ACCESS_KEY]
        self.replays = app[REPLAYS_KEY]
        self.mine = app[INCARNATION_KEY]
        self.svc = app[SERVICE_KEY]
        self.metrics = app.get(METRICS_KEY)
        self.counted: dict[str, Any] = {}
        """Each route's child of ``metrics.requests`` (``labels`` asked once per route)."""
        self.allowed: set[tuple[str, str]] = set()
        """(caller, route) that ``signing.authorize`` let through (``ACCESS_POLICY`` is a
        constant): a caller of the keyring's, proven, on a route of ``paths``."""
        self.keys: dict[str, bytes] = {}
        """The key of each proven caller's answers (the keyring's callers at most)."""

    @classmethod
    def of(cls, app: web.Application) -> _Lane | None:
        """The lane of ``app`` if it has message routes served as ``service_app``
        serves them (its two middlewares, nothing changing the answers on the way)."""
        routes = app.get(ROUTES_KEY)
        if not routes or SERVICE_KEY not in app or len(app.on_response_prepare):
            return None
        if tuple(app.middlewares) != (errors_middleware, auth_middleware):
            return None
        if not all(path.isascii() and path.isprintable() for path in routes):
            return None
        return cls(app)

    def check_head(self, head: fastpath.Head) -> signing.Claim | MeghaError:
        """``auth_middleware``'s checks before any of the body (they record nothing):
        the claim, or why the request is refused (``refused``: the answer)."""
        try:
            _check_length(head.length, self.max_body)
            claim = signing.verify_headers(
                head.low, "POST", head.path, self.access.keyring, time.time(), self.replays
            )
            if (claim.who, head.path) not in self.allowed:
                signing.authorize(claim.identity, self.access.me, "POST", head.path)
                self.allowed.add((claim.who, head.path))
        except MeghaError as exc:
            return exc
        return claim

    def refused(self, path: str, exc: MeghaError) -> bytes:
        """The refusal, counted and logged, of a request whose caller is not proven:
        the connection closes after it."""
        resp = refusal_of(self.metrics, "POST", path, exc)
        body = resp.body if isinstance(resp.body, bytes) else b""
        return fastpath.answer_bytes(resp.status, body, dict(resp.headers), close=True)

    async def answer(
        self, path: str, claim: signing.Claim, body: bytes, conn: _Connection
    ) -> tuple[bytes, bool]:
        """The answer to a request whose head passed ``check_head``, and whether the
        connection closes after it: as ``auth_middleware`` around ``message_route``."""
        now = time.time()
        try:
            caller = signing.verify_body(claim, body, now, self.replays)
        except MeghaError as exc:
            return self.refused(path, exc), True
        conn.proven()
        try:
            status, out, headers = await self._handle(path, caller, claim, body)
        except MeghaError as exc:  # a proven caller's refusal: signed, as any answer
            resp = refusal_of(self.metrics, "POST", path, exc)
            status, headers = resp.status, dict(resp.headers)
            out = resp.body if isinstance(resp.body, bytes) else b""
        key = self.keys.get(claim.who)
        if key is None:
            key = self.keys[claim.who] = self.access.http_key(self.access.me, caller)
        headers.update(
            signing.sign_response(status, out, claim.nonce, self.access.me, key, now, self.mine)
        )
        return fastpath.answer_bytes(status, out, headers, close=False), False

    async def _handle(
        self, path: str, caller: Identity, claim: signing.Claim, body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        """``message_route``'s handler (or ``ping_handler``'s): status, body and headers
        of the answer."""
        if self.metrics is not None:
            counter = self.counted.get(path)
            if counter is None:
                counter = self.counted[path] = self.metrics.requests.labels(path)
            counter.inc()
        if path == PING and path not in self.kinds:  # the floor: answered at once
            return 200, b"", {"Content-Type": MSGPACK}
        msg: object = codec.decode(body, expect=self.kinds[path], max_size=self.max_body)
        check_claim(caller, msg)
        signing.check_incarnation(caller, claim, self.mine)
        svc = self.svc
        refused = svc.refusal()
        if refused is None:
            answer = svc.driver.feed(msg)
            await svc.durable(msg)
            if answer is None:
                return 204, b"", {}
            if not isinstance(answer, Refused):
                return 200, codec.encode(answer), {"Content-Type": MSGPACK}
            refused = answer
        resp = reply_response(refused)
        return resp.status, resp.body if isinstance(resp.body, bytes) else b"", dict(resp.headers)


async def health_handler(request: web.Request) -> web.Response:
    svc = request.app[SERVICE_KEY]
    status = svc.status()
    body = {"status": status, "role": svc.role, "id": svc.ident(),
            "incarnation": request.app[INCARNATION_KEY]}  # fmt: skip
    return web.json_response(body, status=503 if status == "starting" else 200)


async def state_handler(request: web.Request) -> web.Response:
    page = request.app[SERVICE_KEY].state_page()
    page["clock"] = steady.page()  # its wall clock's steps, if any (runtime.clock)
    watch = request.app.get(GC_KEY)
    if watch is not None:
        page["gc"] = watch.page()
    return web.json_response(page)


def service_app(
    cfg: FederationConfig,
    svc: Service,
    metrics: ServiceMetrics,
    access: Access,
    routes: dict[str, type | tuple[type, ...]] | None = None,
) -> web.Application:
    """The app of a service: its message routes, and what every service has —
    ``/health``, ``/v1/state``, ``/metrics``, ``/v1/ping`` — with the service opened
    with the app and closed after it."""
    app = base_app(cfg, access)
    app[SERVICE_KEY] = svc
    app[METRICS_KEY] = metrics
    watch = app[GC_KEY] = GcWatch()
    for path, kind in (routes or {}).items():
        app.router.add_post(path, message_route(kind))
    app[ROUTES_KEY] = dict(routes or {})  # served by the lean path too (``_Lane``)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        codec.compile_all()  # before the first task, not during it
        await svc.open()
        watch.start()  # after open: the core's tables and the connections are made
        yield
        watch.stop()
        with contextlib.suppress(Exception):
            await svc.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_get("/health", health_handler)
    app.router.add_get("/v1/state", state_handler)
    app.router.add_get("/metrics", metrics_handler)
    return app


def service_identity(role: str) -> tuple[FederationConfig, str, Access]:
    """The config, this process's id and its keys, from the environment ``megha up``
    sets."""
    logging.basicConfig(
        level=os.environ.get("MEGHA_LOG", "INFO"),
        format=f"%(asctime)s {role} %(name)s %(levelname)s %(message)s",
    )
    cfg = load_config()
    ident = os.environ.get(ID_ENV, "")
    if not ident:
        raise MeghaError(f"{ID_ENV} is not set: which {role} is this?")
    return cfg, ident, Access.from_env(cfg, access_identity(role, ident))


# ---------------------------------------------------------------------- peers
class PeerRefused(MeghaError):
    """The peer answered 4xx, signed: it will not take this request, however often it
    is sent."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(f"{status} {reason}: {detail}", reason=reason)
        self.status = status


_MSGPACK_ONLY = {"Content-Type": MSGPACK}
"""The extra header of a call without an idempotency key (read, never changed)."""


class _Transient(Exception):
    """A 5xx or a broken connection: worth another try."""


def session() -> h1.Client:
    """Keep-alive connections to a service's peers (``runtime.h1``: a lone hop costs
    half what aiohttp's client costs)."""
    # idle connections stay open 240 s, less than the services keep theirs (gunicorn
    # --keep-alive 300): a short keep-alive made the first launch after a quiet spell
    # pay a new connection
    return h1.Client(limit_per_host=16, keepalive_s=240.0, timeout_s=10.0)


class Peer:
    """One service this process talks to: ``post`` a message, get its answer.

    A service may answer at several addresses (an LM and its standby): a broken
    connection or a 5xx (a standby answers 503) moves the peer on to the next address,
    where the same request is retried."""

    def __init__(
        self,
        to: Identity,
        url: str | Sequence[str],
        access: Access,
        http: h1.Client,
        *,
        policy: Backoff | None = None,
        max_answer: int = codec.MAX_BODY,
    ) -> None:
        self.to = to
        self.name = str(to)
        self.urls = [url] if isinstance(url, str) else list(url)
        self._at = 0
        self.http = http
        self.access = access
        self.policy = policy or Backoff()
        self.max_answer = max_answer
        self.errors = 0
        self.relearned = 0
        """Calls refused as meant for another incarnation, and asked again."""
        self._incarnations: dict[int, str] = {}
        """By address: the incarnation of the process that last answered there."""
        self.rtts: deque[float] = deque(maxlen=4096)
        self._keys: tuple[Access, bytes, bytes] | None = None

    async def post(
        self,
        path: str,
        msg: object,
        *,
        expect: type[M] | tuple[type, ...],
        key: str = "",
        policy: Backoff | None = None,
    ) -> M | None:
        """Post ``msg`` (encoded once) and decode the answer (None for 204).

        Retries transient failures (an answer not signed by the peer is one, a 4xx
        too); a signed ``wrong_incarnation`` (the peer restarted, or another process
        answers there) is asked again at once, bound to the incarnation it names.
        Raises ``PeerRefused`` on a signed 4xx and ``runtime.retry.GiveUp`` when the
        policy's deadline passes.
        """
        body = codec.encode(msg)
        extra = {"Content-Type": MSGPACK, "Idempotency-Key": key} if key else _MSGPACK_ONLY
        start = time.monotonic()
        try:  # the first try as such: ``retry`` only once it failed
            return await self._once(path, body, extra, expect)
        except _Transient as exc:
            self.errors += 1
            failed = exc
        return await retry(
            lambda: self._once(path, body, extra, expect), policy or self.policy,
            what=f"{self.name}{path}", retry_on=(_Transient,), on_retry=self._count,
            failed=failed, start=start,
        )  # fmt: skip

    def _count(self, _: BaseException) -> None:
        self.errors += 1

    async def _once(
        self, path: str, body: bytes, extra: dict[str, str], expect: type[M] | tuple[type, ...]
    ) -> M | None:
        """One try of ``post``: the answer decoded, or ``PeerRefused``, or ``_Transient``."""
        for _ in range(2):
            t0 = time.perf_counter()
            answer = await self._exchange(path, body, extra)
            status, data = answer.status, answer.body
            if status >= 400:
                reason, detail = _error_of(data)
                if status == 401 and reason == signing.Refusal.WRONG_INCARNATION:
                    self.relearned += 1
                    continue  # bound again to the incarnation the answer named
                raise PeerRefused(status, reason, detail)
            self.rtts.append(time.perf_counter() - t0)
            if status == 204 or not data:
                return None
            decoded: M = codec.decode(data, expect=expect, max_size=self.max_answer)
            return decoded
        raise _Transient(f"{self.name}{path}: its incarnation changed twice in a row")

    async def _exchange(self, path: str, body: bytes, extra: dict[str, str]) -> h1.Answer:
        """One signed request (bound to the incarnation last learnt at its address) and
        its answer, whose signature is checked (the incarnation it carries learnt);
        ``_Transient`` if there is none, a 5xx, or one not signed by the peer."""
        access, to, at = self.access, self.to, self._at
        key_out, key_in = self._keys_of(access)
        now = time.time()
        headers = signing.sign(
            "POST", path, body, access.me, key_out, now, incarnation=self._incarnations.get(at, "")
        )  # ``access.sign``, with the key looked up once
        headers.update(extra)
        try:
            answer = await self.http.post(
                self.urls[at] + path, body, headers, max_body=self.max_answer
            )
        except h1.AnswerTooLarge as exc:
            raise DecodeError(f"{self.name}{path}: {exc}", reason="too_large") from exc
        except (h1.BrokenHop, TimeoutError) as exc:
            self._next(at)
            raise _Transient(f"{self.name}{path}: {exc!r}") from exc
        status, data = answer.status, answer.body
        if status >= 500:
            self._next(at)
            raise _Transient(f"{self.name}{path}: {status} {data[:200]!r}")
        try:
            incarnation = signing.verify_response(
                answer.headers if answer.fields is None else answer.fields,
                status, data, headers[signing.HEADER_NONCE], to, key_in, time.time(),
            )  # fmt: skip
        except Unauthorized as exc:  # altered on the way, or not from the peer
            # a refusal too: a peer signs its refusals of a proven caller, and one
            # anyone on the path could have written (a launch "refused" that the LM
            # took, a pool's "stale_epoch" that makes its LM step down) is no answer.
            # Unsigned are only refusals of the request's credentials (a clock out
            # of step, a misconfigured access list): asked again, signed afresh.
            self._next(at)
            got = f"{status} {_error_of(data)[0]}" if status >= 400 else str(status)
            raise _Transient(f"{self.name}{path}: answer {got} refused ({exc.reason})") from exc
        if incarnation:
            self._incarnations[at] = incarnation
        return answer

    def _keys_of(self, access: Access) -> tuple[bytes, bytes]:
        """The keys of this peer's channels with ``access``'s party: its calls', its
        answers' (looked up once per ``access``)."""
        keys = self._keys
        if keys is None or keys[0] is not access:
            keys = self._keys = (access, access.http_key(access.me, self.to),
                                 access.http_key(self.to, access.me))  # fmt: skip
        return keys[1], keys[2]

    @property
    def url(self) -> str:
        """The address the next request goes to."""
        return self.urls[self._at]

    def _next(self, failed: int) -> None:
        """The address ``failed`` did not serve: the next one gets the next try (unless
        a concurrent request moved on already)."""
        if self._at == failed:
            self._at = (failed + 1) % len(self.urls)


def _error_of(data: bytes) -> tuple[str, str]:
    """The reason and detail of a 4xx answer (signed, or quoted in a log line only),
    escaped so that logging them cannot forge a log line."""
    try:
        doc: Any = json.loads(data)
        reason, detail = str(doc.get("error", "refused")), str(doc.get("detail", ""))[:300]
    except (ValueError, AttributeError, RecursionError):  # (nested past the decoder's depth)
        reason, detail = "refused", data[:300].decode("utf-8", "replace")
    return _printable(reason), _printable(detail)


def _printable(text: str) -> str:
    """``text`` unchanged if printable, else its repr (newlines, control characters and
    line separators escaped)."""
    return text if text.isprintable() else repr(text)
