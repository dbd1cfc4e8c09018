"""A refusal is an answer only if the peer signed it.

The network between hosts is not trusted: it may alter traffic.  A ``Peer`` took any
4xx as the peer's final word without checking its signature (services signed only the
refusals a core returned, not those raised: a bad field, a sender mismatch, no such
route).  So anyone on the path could turn an LM's "launched" into "refused" -- the GM
then places the task elsewhere while it runs where the LM put it, twice -- or answer a
pool's "stale_epoch" to an LM's starts, and the LM steps down (its process exits).
Now a service signs every refusal of a proven caller, and a ``Peer`` takes an unsigned
4xx for no answer: the request goes again, signed afresh, until the peer answers."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from common import codec
from common.config import FederationConfig
from common.errors import Unauthorized, ValidationError
from common.ids import GmId, LmId
from common.messages import SnapshotRequest, StateSnapshot
from runtime import http
from runtime.retry import Backoff, GiveUp
from security import signing
from security.access import Access
from security.identity import gm, lm
from security.secret import Secret
from tests.served import served

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
CFG = FederationConfig().validate()
QUICK = Backoff(first_s=0.01, cap_s=0.02, jitter=0.0, deadline_s=0.3)
ASK = SnapshotRequest(gm=GmId("gm0"), lm=LmId("lm0"))


async def gm0_asks(url: str, path: str, secret: Secret = SECRET) -> tuple[str, str, int]:
    """gm0 posts ``ASK`` to lm0 at ``url``: what came of it (``refused``, ``no_answer``
    or ``answered``), the reason, and how many times the request went."""
    client = http.session()
    peer = http.Peer(lm("lm0"), url, Access(gm("gm0"), CFG, secret), client, policy=QUICK)
    try:
        await peer.post(path, ASK, expect=StateSnapshot)
        return "answered", "", peer.errors + 1
    except http.PeerRefused as exc:
        return "refused", exc.reason, peer.errors + 1
    except GiveUp as exc:
        return "no_answer", str(exc), peer.errors + 1
    finally:
        await client.close()


def on_the_path(status: int, reason: str) -> web.Application:
    """What someone on the path answers to every request: an unsigned refusal."""

    async def forge(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"error": reason, "detail": "forged"}, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forge)
    return app


@pytest.mark.parametrize(
    ("status", "reason"),
    [(409, "stale_epoch"), (409, "no_capacity"), (422, "unknown_gm"), (403, "sender_mismatch")],
)
def test_a_refusal_nobody_signed_is_no_answer(status: int, reason: str) -> None:
    async def run() -> tuple[str, str, int]:
        async with served(on_the_path(status, reason)) as port:
            url = f"http://127.0.0.1:{port}"
            return await gm0_asks(url, "/v1/snapshot")

    what, detail, sent = asyncio.run(run())
    assert what == "no_answer", (what, detail)
    assert f"{status} {reason}" in detail  # said in the log line
    assert sent > 1  # asked again


def lm0_app() -> web.Application:
    """lm0's boundary (signatures, access lists) with a launch route whose core finds a
    bad field."""

    async def launch(request: web.Request) -> web.Response:
        raise ValidationError("no such GM", reason="unknown_gm", path="placements[0]")

    app = http.base_app(CFG, Access(lm("lm0"), CFG, SECRET))
    app.router.add_post("/v1/launch", launch)
    return app


async def signed_refusal(url: str, path: str) -> tuple[int, str]:
    """gm0's request, sent once: the status of lm0's answer, and what its signature
    says (``signed``, or the reason it does not verify)."""
    me, to = Access(gm("gm0"), CFG, SECRET), lm("lm0")
    body = codec.encode(ASK)
    headers = me.sign(to, "POST", path, body, time.time())
    client = http.session()
    try:
        answer = await client.post(url + path, body, headers)
    finally:
        await client.close()
    try:
        signing.verify_response(
            answer.headers, answer.status, answer.body, headers[signing.HEADER_NONCE], to,
            me.http_key(to, me.me), time.time(),
        )  # fmt: skip
    except Unauthorized as exc:
        return answer.status, exc.reason
    return answer.status, "signed"


def test_a_proven_caller_s_refusals_are_signed_and_final() -> None:
    """Raised (a bad field) or aiohttp's own (no such route): signed, taken at once."""

    async def run() -> list[object]:
        async with served(lm0_app()) as port:
            url = f"http://127.0.0.1:{port}"
            return [
                await signed_refusal(url, "/v1/launch"),
                await signed_refusal(url, "/v1/snapshot"),
                await gm0_asks(url, "/v1/launch"),
                await gm0_asks(url, "/v1/snapshot"),
            ]

    assert asyncio.run(run()) == [
        (422, "signed"),
        (404, "signed"),
        ("refused", "unknown_gm", 1),
        ("refused", "not_found", 1),
    ]


def test_a_refusal_of_credentials_is_asked_again_signed_afresh() -> None:
    """A refusal of the request's credentials cannot be signed for its caller: a caller
    with the wrong key is refused every time, never told so in a way it could trust."""
    other = Secret.from_text("fedcba9876543210fedcba9876543210-test", "test")

    async def run() -> tuple[str, str, int]:
        async with served(lm0_app()) as port:
            url = f"http://127.0.0.1:{port}"
            return await gm0_asks(url, "/v1/launch", other)

    what, detail, sent = asyncio.run(run())
    assert what == "no_answer"
    assert "401 bad_signature" in detail
    assert sent > 1
