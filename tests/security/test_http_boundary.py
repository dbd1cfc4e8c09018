"""The HTTP boundary against hostile clients: what it logs of them, what it reads of a
request before the request proves its caller, and what it answers to bytes aiohttp's
parser cannot read."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from unittest import mock

import pytest
from aiohttp import StreamReader, web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from common.config import FederationConfig
from common.errors import DecodeError
from common.ids import LmId
from runtime import http
from runtime.prometheus import ServiceMetrics
from security import signing
from security.access import Access
from security.identity import OPERATOR, Identity, gm, lm, workers
from security.secret import Secret
from tests import raw_http
from tests.served import refused, served
from worker.app import WorkerService, launches_handler

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
CFG = FederationConfig().validate()
FORGED_PATH = "/x%0a2026-11-26%2007:30:00,000%20gm%20megha.gm%20INFO%20FORGED-LINE"


def lm0_app() -> web.Application:
    return http.base_app(CFG, Access(lm("lm0"), CFG, SECRET))


async def _get(app: web.Application, path: str) -> tuple[int, str]:
    async with TestClient(TestServer(app)) as client:
        resp = await client.get(path)
        return resp.status, str((await resp.json())["error"])


def _one_line(text: str) -> bool:
    return text.isprintable()


def test_a_refused_path_cannot_forge_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="megha.http")
    assert asyncio.run(_get(lm0_app(), FORGED_PATH)) == (401, "missing_credentials")
    refusals = [r.getMessage() for r in caplog.records if r.name == "megha.http"]
    assert refusals, "the refusal is logged"
    assert all(_one_line(m) for m in refusals), refusals
    assert any("FORGED-LINE" in m and "\\n" in m for m in refusals)  # escaped, still there


def test_refusal_details_from_the_client_are_escaped(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(_: web.Request) -> web.StreamResponse:
        raise DecodeError("unknown tag 'a\r\nb\x1b[2J'", reason="unknown_tag")

    caplog.set_level(logging.INFO, logger="megha.http")
    request = make_mocked_request("POST", "/v1/ping", app=web.Application())
    resp = asyncio.run(http.errors_middleware(request, handler))
    assert resp.status == 400
    (message,) = [r.getMessage() for r in caplog.records if r.name == "megha.http"]
    assert _one_line(message), message


def test_a_peers_unsigned_refusal_is_escaped() -> None:
    reason, detail = http._error_of(b'{"error": "x\\nFORGED", "detail": "a\\u2028b\\rc"}')
    assert _one_line(reason)
    assert _one_line(detail)
    assert http._error_of(b'{"error": "not_ready", "detail": "later"}') == ("not_ready", "later")
    assert _one_line(http._error_of(b"\n\x00plain text")[1])


# ------------------------------------------------ credentials before the body
LAUNCH = "/v1/launch"


def signed_by(
    who: Identity, body: bytes, *, path: str = LAUNCH, age_s: float = 0.0
) -> dict[str, str]:
    key = signing.signing_key(SECRET, who, lm("lm0"))
    return signing.sign("POST", path, body, who, key, time.time() - age_s)


async def _through_the_middlewares(
    app: web.Application, headers: dict[str, str], body: bytes
) -> tuple[int, str, int]:
    """POST ``body`` to ``app``'s middlewares (the handler answers 200): the status, the
    reason, and how many bytes of the body were left unread."""
    payload = StreamReader(mock.Mock(), 2**16, loop=asyncio.get_running_loop())
    payload.feed_data(body)
    payload.feed_eof()
    request = make_mocked_request(
        "POST", LAUNCH, headers={**headers, "Content-Length": str(len(body))}, app=app,
        payload=payload, client_max_size=CFG.max_body,
    )  # fmt: skip

    async def handler(req: web.Request) -> web.StreamResponse:
        await http.read_body(req)
        return web.Response(body=b"", content_type=http.MSGPACK)

    async def authenticated(req: web.Request) -> web.StreamResponse:
        return await http.auth_middleware(req, handler)

    resp = await http.errors_middleware(request, authenticated)
    assert isinstance(resp, web.Response)
    reason = json.loads(resp.body)["error"] if resp.status >= 400 else ""  # type: ignore[arg-type]
    return resp.status, reason, len(await payload.read())


BIG = b"\x00" * (15 * 1024 * 1024)


def _credentials(case: str) -> dict[str, str]:
    """Headers of each kind of caller not allowed to launch, signed now."""
    gm0 = signed_by(gm("gm0"), BIG)
    return {
        "none": {},
        "malformed": {**gm0, signing.HEADER_NONCE: "?"},
        "unknown": signed_by(gm("evil"), BIG),
        "forged": {**gm0, signing.HEADER_SIGNATURE: "0" * 64},
        "stale": signed_by(gm("gm0"), BIG, age_s=600),
        "forbidden": signed_by(workers("lm0"), BIG),
    }[case]


@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("none", 401, "missing_credentials"),
        ("malformed", 401, "malformed_credentials"),
        ("unknown", 401, "unknown_identity"),
        ("forged", 401, "bad_signature"),
        ("stale", 401, "stale_timestamp"),
        ("forbidden", 403, "forbidden_endpoint"),
    ],
)
def test_a_request_not_proven_allowed_is_refused_before_its_body_is_read(
    case: str, status: int, reason: str
) -> None:
    got = asyncio.run(_through_the_middlewares(lm0_app(), _credentials(case), BIG))
    assert got == (status, reason, len(BIG))


def test_the_body_of_an_allowed_caller_is_read_and_checked() -> None:
    async def run() -> list[tuple[int, str, int]]:
        app = lm0_app()
        body = b"\x81\xa1k\x01"
        good = signed_by(gm("gm0"), body)
        return [
            await _through_the_middlewares(app, good, b"another body"),
            await _through_the_middlewares(app, good, body),  # the nonce was not used up
            await _through_the_middlewares(app, good, body),
        ]

    assert asyncio.run(run()) == [
        (401, "body_digest_mismatch", 0),
        (200, "", 0),
        (401, "replayed_nonce", 4),  # refused on its headers: the body stays unread
    ]


async def _chunks(total: int) -> AsyncIterator[bytes]:
    chunk = b"\x00" * 65_536
    for _ in range(total // len(chunk)):
        yield chunk


async def _post(
    app: web.Application, path: str, headers: dict[str, str], body: object
) -> tuple[int, str]:
    async with TestClient(TestServer(app)) as client:
        resp = await client.post(path, data=body, headers=headers)
        return resp.status, str((await resp.json())["error"]) if resp.status >= 400 else ""


def test_an_unsigned_chunked_body_beyond_the_limit_is_refused_for_its_credentials() -> None:
    """Not 413 after reading up to the limit: 401 before reading any of it."""
    small = FederationConfig(max_body=64 * 1024).validate()
    app = http.base_app(small, Access(lm("lm0"), small, SECRET))
    assert asyncio.run(_post(app, "/v1/ping", {}, _chunks(1024 * 1024))) == (
        401,
        "missing_credentials",
    )


def test_a_signed_call_still_gets_its_signed_answer() -> None:
    headers = signing.sign(
        "POST", "/v1/ping", b"", OPERATOR, signing.signing_key(SECRET, OPERATOR, lm("lm0")),
        time.time(),
    )  # fmt: skip
    assert asyncio.run(_post(lm0_app(), "/v1/ping", headers, b"")) == (200, "")


async def _operator_calls(calls: list[tuple[str, str]]) -> list[tuple[int, str, str, str]]:
    """Signed calls of the operator to lm0: status, content type, reason, Allow header."""
    key = signing.signing_key(SECRET, OPERATOR, lm("lm0"))
    out = []
    async with TestClient(TestServer(lm0_app())) as client:
        for method, path in calls:
            headers = signing.sign(method, path, b"", OPERATOR, key, time.time())
            resp = await client.request(method, path, headers=headers)
            reason = str((await resp.json())["error"]) if resp.status >= 400 else ""
            out.append((resp.status, resp.content_type, reason, resp.headers.get("Allow", "")))
    return out


def test_a_route_or_method_the_service_lacks_is_refused_with_a_reason() -> None:
    """The access table lets the operator call paths a service may not route (a pool's
    launch log on an LM, ``GET /v1/ping``): a JSON refusal with its reason, not aiohttp's
    plain-text page, and the service answers afterwards."""
    got = asyncio.run(
        _operator_calls([("GET", "/v1/ping"), ("POST", "/v1/launches"), ("POST", "/v1/ping")])
    )
    assert got == [
        (405, "application/json", "method_not_allowed", "POST"),
        (404, "application/json", "not_found", ""),
        (200, http.MSGPACK, "", ""),
    ]


def test_a_launch_log_cursor_below_zero_is_refused_not_a_500() -> None:
    """``?after=`` far below zero made ``missed`` a number msgpack cannot hold (500)."""

    async def ask(after: str) -> tuple[int, str]:
        app = web.Application()
        app[http.SERVICE_KEY] = WorkerService(CFG, LmId("lm0"), Access(workers("lm0"), CFG, SECRET))
        request = make_mocked_request(
            "GET", f"/v1/launches?after={after}", headers={"Accept": http.MSGPACK}, app=app
        )
        resp = await launches_handler(request)
        assert isinstance(resp, web.Response)
        reason = json.loads(resp.body)["error"] if resp.status >= 400 else ""  # type: ignore[arg-type]
        return resp.status, reason

    assert asyncio.run(ask(str(-(2**70)))) == (400, "bad_query")
    assert asyncio.run(ask("x")) == (400, "bad_query")
    assert asyncio.run(ask("0")) == (200, "")


# ------------------------------------------ bytes aiohttp's parser cannot read
def metered_lm0_app() -> web.Application:
    app = lm0_app()
    app[http.METRICS_KEY] = ServiceMetrics("megha_lm", dict, dict)
    return app


def _ping(headers: dict[str, str], body: bytes = b"") -> bytes:
    """A ``POST /v1/ping`` as bytes on the wire (the last on its connection)."""
    lines = [f"{k}: {v}" for k, v in {"Content-Length": str(len(body)), **headers}.items()]
    return (
        "\r\n".join(["POST /v1/ping HTTP/1.1", "Host: x", "Connection: close", *lines]) + "\r\n\r\n"
    ).encode() + body


def operator_ping(body: bytes = b"") -> dict[str, str]:
    key = signing.signing_key(SECRET, OPERATOR, lm("lm0"))
    return signing.sign("POST", "/v1/ping", body, OPERATOR, key, time.time())


def _trouble(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What was logged as a server's trouble: a warning or worse, or a traceback."""
    return [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def test_bytes_the_parser_cannot_read_are_refused_with_a_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiohttp answered them in plain text before any middleware ran, with a traceback at
    ERROR in the log for each: a JSON refusal with its reason now, counted, one line."""
    caplog.set_level(logging.DEBUG)
    app = metered_lm0_app()

    async def run() -> tuple[list[raw_http.Answer], raw_http.Answer]:
        async with served(app) as port:
            answers = [
                await asyncio.to_thread(raw_http.exchange, port, data)
                for _, data, _ in raw_http.MALFORMED
            ]
            ping = _ping(operator_ping())
            return answers, await asyncio.to_thread(raw_http.exchange, port, ping)

    answers, after = asyncio.run(run())  # each connection closed by the service
    for (what, _, reason), got in zip(raw_http.MALFORMED, answers, strict=True):
        assert (got.status, got.content_type) == (400, "application/json"), (what, got.body)
        assert got.json()["error"] == reason, what
        assert got.json()["detail"], what
    assert after.status == 200  # and it serves the next caller
    reasons = [reason for _, _, reason in raw_http.MALFORMED]
    assert {r: refused(app, r) for r in reasons} == {r: reasons.count(r) for r in reasons}
    assert _trouble(caplog) == []
    lines = [r for r in caplog.records if r.name == "megha.http"]
    assert len(lines) == len(raw_http.MALFORMED)
    assert all(_one_line(r.getMessage()) for r in lines)  # the client's bytes escaped
    levels = {r.levelno for r in lines if "bad_http_method" in r.getMessage()}
    assert levels == {logging.DEBUG}  # as aiohttp: what any open port gets from the internet


def test_a_body_aiohttp_cannot_decode_is_refused_not_a_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Content-Encoding: gzip`` on a body that is not: aiohttp raises reading it (500
    and a traceback) or, unread, while draining the connection after the answer (a
    traceback): 400 ``bad_http_body``, or the refusal of the headers, and one line."""
    caplog.set_level(logging.DEBUG)
    app = metered_lm0_app()
    body = b"not gzip at all"
    gzip = {"Content-Encoding": "gzip"}

    async def run() -> list[raw_http.Answer]:
        async with served(app) as port:
            return [
                await asyncio.to_thread(raw_http.exchange, port, _ping({**signed, **gzip}, body))
                for signed in (operator_ping(body), {})
            ]

    allowed, unsigned = asyncio.run(run())
    assert (allowed.status, allowed.json()["error"]) == (400, "bad_http_body")
    assert (unsigned.status, unsigned.json()["error"]) == (401, "missing_credentials")
    assert refused(app, "bad_http_body") == 1
    assert _trouble(caplog) == []


def test_a_server_bug_is_still_aiohttps_500(caplog: pytest.LogCaptureFixture) -> None:
    """Only a client's refusals are the boundary's: a handler that raises is a 500, with
    its traceback, as aiohttp answers it."""

    async def bug(_: web.Request) -> web.StreamResponse:
        raise RuntimeError("a bug")

    app = web.Application(middlewares=[http.errors_middleware])
    app.router.add_get("/bug", bug)

    async def run() -> raw_http.Answer:
        async with served(app) as port:
            get = b"GET /bug HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            return await asyncio.to_thread(raw_http.exchange, port, get)

    got = asyncio.run(run())
    assert (got.status, got.content_type) == (500, "text/plain")
    assert [r.exc_info is not None for r in _trouble(caplog)] == [True]
