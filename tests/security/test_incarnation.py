"""A service's call is bound to the incarnation of the process it is meant for (issue 32,
item 8).  The replay cache is per process: a launch or start captured in the last 30 s
was taken again by the restarted process, or by a standby that took over.  Now a call
names the receiver's incarnation (learnt from its signed answers), a process refuses a
call meant for another (``wrong_incarnation``, signed, naming its own), and a ``Peer``
learns the new one and asks again.  Services served in-process, as gunicorn serves them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp import web

from common import codec
from common.config import FederationConfig
from common.errors import Unauthorized
from common.ids import GmId, JobId, LmId, UserId
from common.messages import JobKeep, KeepEnds
from runtime import h1, http
from security import signing
from security.access import Access
from security.identity import OPERATOR, gm, lm
from security.secret import Secret
from tests.served import served

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
CFG = FederationConfig().validate()
ASK = KeepEnds(
    gm=GmId("gm0"), lm=LmId("lm0"), jobs=(JobKeep(user=UserId("u0"), job_id=JobId("j"), keep=True),)
)
PATH = "/v1/keep-ends"


class Lm:
    """An LM's boundary with a core that records what it is fed."""

    role = "lm"

    def __init__(self) -> None:
        self.fed: list[object] = []
        self.driver: Any = self

    def feed(self, msg: object) -> None:
        self.fed.append(msg)

    def refusal(self) -> None:
        return None

    async def durable(self, msg: object) -> None:
        return None


def lm_process(core: Lm) -> web.Application:
    """One incarnation of lm0: a process of its own (its incarnation, its replay cache)."""
    app = http.base_app(CFG, Access(lm("lm0"), CFG, SECRET))
    app[http.SERVICE_KEY] = core  # type: ignore[assignment]
    app.router.add_post(PATH, http.message_route(KeepEnds))
    return app


class Recording(h1.Client):
    """The hop's client, keeping every request it sent (what a network observer keeps)."""

    def __init__(self) -> None:
        super().__init__(timeout_s=5.0)
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def post(self, url: str, body: bytes, headers: Any, **kw: Any) -> h1.Answer:
        self.sent.append((url, body, dict(headers)))
        return await super().post(url, body, headers, **kw)


async def replay(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    client = h1.Client(timeout_s=5.0)
    try:
        answer = await client.post(url, body, headers)
    finally:
        await client.close()
    reason = http._error_of(answer.body)[0] if answer.status >= 400 else ""
    return answer.status, reason


def test_a_call_captured_before_a_restart_is_refused_by_the_new_process() -> None:
    first, second = Lm(), Lm()

    async def run() -> tuple[tuple[int, str], tuple[int, str]]:
        client = Recording()
        peer = http.Peer(lm("lm0"), "", Access(gm("gm0"), CFG, SECRET), client)
        try:
            async with served(lm_process(first)) as port:
                peer.urls = [f"http://127.0.0.1:{port}"]
                await peer.post(PATH, ASK, expect=(), key="k1")
                url, body, headers = client.sent[-1]  # the call lm0 took
                again = await replay(url, body, headers)  # the same process: its cache
            async with served(lm_process(second)) as port:  # restarted, or its standby
                moved = url.rsplit(":", 1)[0] + f":{port}{PATH}"
                after = await replay(moved, body, headers)
        finally:
            await client.close()
        return again, after

    again, after = asyncio.run(run())
    assert first.fed == [ASK]
    assert again == (401, "replayed_nonce")
    assert after == (401, "wrong_incarnation")
    assert second.fed == []  # the launch a replay would have made again


def test_a_peer_learns_a_new_incarnation_and_asks_again() -> None:
    """First contact, a restart, a fail-over to a standby: one refusal, signed, then the
    call goes bound to the incarnation it named."""
    a, b = Lm(), Lm()

    async def run() -> tuple[int, int]:
        client = h1.Client(timeout_s=5.0)
        peer = http.Peer(lm("lm0"), "", Access(gm("gm0"), CFG, SECRET), client)
        try:
            async with served(lm_process(a)) as port:
                peer.urls = [f"http://127.0.0.1:{port}"]
                await peer.post(PATH, ASK, expect=())  # first contact: learnt
                await peer.post(PATH, ASK, expect=())  # bound from the start
                first = peer.relearned
            async with served(lm_process(b)) as port:  # another process now answers
                peer.urls = [f"http://127.0.0.1:{port}"]
                await peer.post(PATH, ASK, expect=())
            return first, peer.relearned
        finally:
            await client.close()

    first, total = asyncio.run(run())
    assert (first, total) == (1, 2)
    assert a.fed == [ASK, ASK]
    assert b.fed == [ASK]


def test_a_call_bound_to_no_incarnation_or_a_forged_one_is_refused() -> None:
    core = Lm()
    me = Access(gm("gm0"), CFG, SECRET)
    body = codec.encode(ASK)

    async def run() -> list[tuple[int, str]]:
        app = lm_process(core)
        async with served(app) as port:
            url = f"http://127.0.0.1:{port}{PATH}"
            mine = app[http.INCARNATION_KEY]
            unbound = me.sign(lm("lm0"), "POST", PATH, body, time.time())
            other = me.sign(lm("lm0"), "POST", PATH, body, time.time(), "0" * 16)
            moved = {**me.sign(lm("lm0"), "POST", PATH, body, time.time(), "0" * 16),
                     signing.HEADER_INCARNATION: mine}  # fmt: skip
            bound = me.sign(lm("lm0"), "POST", PATH, body, time.time(), mine)
            return [await replay(url, body, h) for h in (unbound, other, moved, bound)]

    got = asyncio.run(run())
    assert got == [
        (401, "wrong_incarnation"),
        (401, "wrong_incarnation"),
        (401, "bad_signature"),  # the incarnation is under the MAC
        (204, ""),
    ]
    assert core.fed == [ASK]


def test_the_operator_s_reads_are_not_bound() -> None:
    key = signing.signing_key(SECRET, OPERATOR, lm("lm0"))

    async def run() -> int:
        async with served(lm_process(Lm())) as port:
            headers = signing.sign("POST", "/v1/ping", b"", OPERATOR, key, time.time())
            return (await replay(f"http://127.0.0.1:{port}/v1/ping", b"", headers))[0]

    assert asyncio.run(run()) == 200


def test_answers_carry_the_answering_incarnation_under_their_signature() -> None:
    key = b"k" * 32
    inc = signing.new_incarnation()
    headers = signing.sign_response(200, b"x", "n" * 16, lm("lm0"), key, time.time(), inc)
    assert signing.verify_response(headers, 200, b"x", "n" * 16, lm("lm0"), key, time.time()) == inc
    forged = {**headers, signing.HEADER_INCARNATION: signing.new_incarnation()}
    with pytest.raises(Unauthorized) as refused:
        signing.verify_response(forged, 200, b"x", "n" * 16, lm("lm0"), key, time.time())
    assert refused.value.reason == "bad_signature"
