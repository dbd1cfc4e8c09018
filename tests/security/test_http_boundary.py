"""The HTTP boundary against hostile clients: what it logs of them."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from common.config import FederationConfig
from common.errors import DecodeError
from runtime import http
from security.access import Access
from security.identity import lm
from security.secret import Secret

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
