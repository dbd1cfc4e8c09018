"""What one hop's CPU cuts must not change (``runtime.http``, ``runtime.h1``,
``runtime.fastpath``, ``security.signing``): headers read once by lower-case name get
the verdicts a multidict gets, the MACs are HMAC-SHA256's, a response's headers read at
once are those read line by line, the lean path answers a call that waits for nothing
inside the read that brought it (no task, no turn of the loop) and one that waits once
its wait is over, and the client's usual hop still times out."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from common.errors import Unauthorized
from runtime import fastpath, h1, http
from security import signing
from security.identity import gm, lm
from security.secret import Secret
from tests.lean_service import Pool, call, pool_app, stop

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
GM0, LM0 = gm("gm0"), lm("lm0")
NOW = 1_700_000_000.0
BODY = b"\x82\xa4kind\xa6launch"


# ------------------------------------------------------------------ signing
def _signed(incarnation: str = "ab" * 8) -> list[tuple[str, str]]:
    key = signing.signing_key(SECRET, GM0, LM0)
    return list(
        signing.sign("POST", "/v1/launch", BODY, GM0, key, NOW, incarnation=incarnation).items()
    )


def _verdict(headers: Mapping[str, str]) -> str:
    keyring = {GM0: signing.signing_key(SECRET, GM0, LM0)}
    try:
        signing.verify_headers(headers, "POST", "/v1/launch", keyring, NOW, signing.ReplayCache())
    except Unauthorized as exc:
        return exc.reason
    return "ok"


@pytest.mark.parametrize("change", ["none", "missing", "no_incarnation", "bad_value", "bad_mac"])
def test_fields_by_lower_case_name_get_the_multidicts_verdict(change: str) -> None:
    pairs = _signed("" if change == "no_incarnation" else "ab" * 8)
    if change == "missing":
        pairs = [(k, v) for k, v in pairs if k != signing.HEADER_TIMESTAMP]
    elif change == "bad_value":
        pairs = [(k, "short" if k == signing.HEADER_NONCE else v) for k, v in pairs]
    elif change == "bad_mac":
        pairs = [(k, "0" * 64 if k == signing.HEADER_SIGNATURE else v) for k, v in pairs]
    pairs += [("Host", "127.0.0.1"), ("Content-Type", "application/x-msgpack")]
    fields = signing.Fields({k.lower(): v for k, v in pairs})
    expected = {"none": "ok", "no_incarnation": "ok", "missing": signing.Refusal.MISSING,
                "bad_value": signing.Refusal.MALFORMED,
                "bad_mac": signing.Refusal.BAD_SIGNATURE}[change]  # fmt: skip
    assert _verdict(CIMultiDict(pairs)) == _verdict(fields) == expected


def test_a_signature_is_hmac_sha256_of_the_canonical_request_under_any_key() -> None:
    """The keyed HMACs kept per key give what ``hmac.new`` gives, for every key met,
    more keys than are kept too (each made afresh then)."""
    for n in range(signing.KEYED_MAX + 5):
        key = hashlib.sha256(b"key %d" % n).digest()
        message = b"megha-http-v2\nrequest %d" % n
        assert signing._mac(key, message) == hmac.new(key, message, hashlib.sha256).hexdigest()
        assert signing._mac(key, message) == signing._mac(key, message)  # a copy each time
    assert len(signing._KEYED) <= signing.KEYED_MAX


def test_a_request_signed_with_its_own_nonce_still_checks_a_nonce_given() -> None:
    key = signing.signing_key(SECRET, GM0, LM0)
    with pytest.raises(ValueError, match="nonce"):
        signing.sign("POST", "/v1/launch", BODY, GM0, key, NOW, nonce="bad nonce!")
    made = signing.sign("POST", "/v1/launch", BODY, GM0, key, NOW)
    assert signing._NONCE.fullmatch(made[signing.HEADER_NONCE])


def test_the_policy_verdict_kept_is_the_policys() -> None:
    """``may_call`` keeps its verdicts: asked again, the same, whatever the case of the
    method or a query."""
    for _ in range(2):
        assert signing.may_call(GM0, LM0, "post", "/v1/launch?x=1")
        assert not signing.may_call(GM0, LM0, "GET", "/v1/launch")
        assert not signing.may_call(LM0, GM0, "POST", "/v1/launch")


# ------------------------------------------------------------------ fastpath
ROUTES = frozenset({b"/v1/stop", b"/v1/start"})


def test_a_head_gives_its_fields_by_lower_case_name() -> None:
    head = fastpath.parse_head(call(stop("echo")), ROUTES)
    assert isinstance(head, fastpath.Head)
    assert type(head.low) is signing.Fields
    assert dict(head.low) == {name.lower(): value for name, value in head.fields}


def test_a_header_value_ending_in_whitespace_is_handed_over() -> None:
    """aiohttp reads it (and drops the whitespace): the quick reading here does not."""
    for end in (b" ", b"\t", b" \t "):
        data = call(stop("echo")).replace(b"Host: 127.0.0.1", b"Host: 127.0.0.1" + end, 1)
        assert fastpath.parse_head(data, ROUTES) is fastpath.HANDOVER


# ------------------------------------------------------------------ h1
HEADS = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Megha-Nonce: abc\r\nX-A:  spaced  \r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX\xe9: \xe9\r\nConnection: close\r\n\r\nok",
    b"HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length:2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Tab:\tv\tw\r\n\r\nok",
]


@pytest.mark.parametrize("data", HEADS)
def test_headers_read_at_once_are_those_read_line_by_line(data: bytes) -> None:
    quick = h1.ResponseParser(1 << 20)
    quick.feed(data)
    slow = h1.ResponseParser(1 << 20)
    with mock.patch.object(h1, "_fields", return_value=None):  # every head line by line
        slow.feed(data)
    assert quick.answer is not None
    assert slow.answer is not None
    assert list(quick.answer.headers.items()) == list(slow.answer.headers.items())
    assert (quick.answer.status, quick.answer.body, quick.keep_alive) == (
        slow.answer.status, slow.answer.body, slow.keep_alive,
    )  # fmt: skip
    assert slow.answer.fields is None
    names = [name.lower() for name in quick.answer.headers]
    if len(set(names)) < len(names):
        assert quick.answer.fields is None  # a name twice: the multidict only
    elif quick.answer.fields is not None:
        assert dict(quick.answer.fields) == {k.lower(): v for k, v in quick.answer.headers.items()}


def _read(data: bytes, *, quick: bool) -> tuple[object, ...]:
    p = h1.ResponseParser(1 << 20)
    try:
        if quick:
            p.feed(data)
        else:
            with mock.patch.object(h1, "_fields", return_value=None):
                p.feed(data)
    except (h1.BrokenHop, h1.AnswerTooLarge) as exc:
        return (type(exc).__name__,)
    a = p.answer
    if a is None:
        return ("incomplete",)
    return a.status, list(a.headers.items()), a.body, p.keep_alive


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([b"X-A", b"x-a", b":", b" ", b"\t", b"\r", b"\n", b"1", b"v",
                                  b"\xe9", b"\x85", b"\xa0", b"Content-Length", b"Connection",
                                  b"close", b"0", b"\x00"]), max_size=6).map(b"".join),
        max_size=5,
    )
)  # fmt: skip
def test_any_header_lines_are_read_at_once_as_line_by_line(lines: list[bytes]) -> None:
    data = b"HTTP/1.1 200 OK\r\n" + b"".join(line + b"\r\n" for line in lines)
    data += b"Content-Length: 0\r\n\r\n"
    assert _read(data, quick=True) == _read(data, quick=False)


def test_a_bad_header_line_breaks_the_hop_either_way() -> None:
    for line in (b": 1", b"no colon", b" X-A: 1", b"X-A : 1"):
        p = h1.ResponseParser(1 << 20)
        with pytest.raises(h1.BrokenHop):
            p.feed(b"HTTP/1.1 200 OK\r\n" + line + b"\r\nContent-Length: 0\r\n\r\n")


def test_a_header_name_checked_once_still_refuses_a_bad_value() -> None:
    h1._request_bytes("POST", "/", b"h:1", b"", {"X-Fine": "1"})
    assert "X-Fine" in h1._NAMES_CHECKED
    with pytest.raises(ValueError, match="line break"):
        h1._request_bytes("POST", "/", b"h:1", b"", {"X-Fine": "1\r\nX-Smuggled: 1"})
    with pytest.raises(ValueError, match="client's own"):
        h1._request_bytes("POST", "/", b"h:1", b"", {"content-length": "1"})
    assert h1._request_bytes("POST", "/p", b"h:1", b"ab", {"X-Fine": "1"}) == (
        b"POST /p HTTP/1.1\r\nHost: h:1\r\nX-Fine: 1\r\nContent-Length: 2\r\n\r\nab"
    )
    assert (
        h1._request_bytes("GET", "/p", b"h:1", b"", {}) == b"GET /p HTTP/1.1\r\nHost: h:1\r\n\r\n"
    )


def test_a_reused_connection_that_never_answers_times_out_and_is_closed() -> None:
    """The usual hop (an idle connection, a free slot) is timed by a timer of its own,
    not ``asyncio.timeout``: the same ``TimeoutError``, the connection closed."""
    answered = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        if answered.is_set():
            await asyncio.sleep(30)
        answered.set()
        return web.Response(body=b"ok")

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/x", handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/x"
        client = h1.Client(timeout_s=0.3)
        try:
            assert (await client.post(url, b"", {})).body == b"ok"
            (conn,) = client._open
            with pytest.raises(TimeoutError):
                await client.post(url, b"", {})
            assert conn.closed
            assert not client._open
            assert not client._slots[next(iter(client._slots))].locked()
        finally:
            await client.close()
            await runner.cleanup()

    asyncio.run(run())


# ------------------------------------------------------------------ lean path
class _Quick(Pool):
    async def durable(self, msg: object) -> None:
        """Nothing to wait for (a pool's journal written, a GM's nothing)."""


async def _connection(app: web.Application) -> tuple[Any, list[bytes], web.AppRunner]:
    runner = http.ServiceRunner(app)
    await runner.setup()
    server = runner.server
    assert server is not None
    conn = server()
    written: list[bytes] = []
    transport = mock.Mock()
    transport.is_closing.return_value = False
    transport.write.side_effect = written.append
    transport.get_extra_info.return_value = None
    conn.connection_made(transport)
    return conn, written, runner


def test_a_call_that_waits_for_nothing_is_answered_within_the_read() -> None:
    async def run() -> list[bytes]:
        conn, written, runner = await _connection(pool_app(_Quick()))
        try:
            loop = asyncio.get_running_loop()
            with mock.patch.object(loop, "create_task", wraps=loop.create_task) as tasks:
                conn.data_received(call(stop("echo")) + call(stop("none")))
                assert tasks.call_count == 0  # both answered before data_received returned
            assert not conn._busy
            return written
        finally:
            conn.connection_lost(None)
            await runner.cleanup()

    written = asyncio.run(run())
    assert [w.split(b" ", 2)[1] for w in written] == [b"200", b"204"]


def test_a_call_that_waits_is_answered_once_its_wait_is_over_then_the_next() -> None:
    async def run() -> None:
        pool = Pool()
        pool.hold.clear()
        conn, written, runner = await _connection(pool_app(pool))
        try:
            conn.data_received(call(stop("echo")) + call(stop("none")))
            for _ in range(5):
                await asyncio.sleep(0)
            assert written == []
            assert conn._busy
            pool.hold.set()
            for _ in range(20):
                await asyncio.sleep(0)
                if len(written) == 2:
                    break
            assert [w.split(b" ", 2)[1] for w in written] == [b"200", b"204"]
            assert not conn._busy
        finally:
            conn.connection_lost(None)
            await runner.cleanup()

    asyncio.run(run())


def test_a_waiting_call_cancelled_frees_its_connection() -> None:
    async def run() -> None:
        pool = Pool()
        pool.hold.clear()
        conn, written, runner = await _connection(pool_app(pool))
        try:
            loop = asyncio.get_running_loop()
            made: list[asyncio.Task[Any]] = []
            real = loop.create_task

            def keep(coro: Any, **kw: Any) -> asyncio.Task[Any]:
                made.append(real(coro, **kw))
                return made[-1]

            with mock.patch.object(loop, "create_task", side_effect=keep):
                conn.data_received(call(stop("echo")))
            (task,) = made
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not conn._busy
            assert written == []
        finally:
            conn.connection_lost(None)
            await runner.cleanup()

    asyncio.run(run())


# ------------------------------------------------------------------ batcher
def test_a_flush_nobody_waits_for_takes_no_lock_and_a_waiter_is_still_woken() -> None:
    """``Batcher.sent``'s waiters are woken after each flush; with none, a flush wakes
    nobody (a lock and notify were once per flush)."""
    from runtime.driver import Batcher
    from runtime.supervisor import Supervisor

    async def run() -> list[list[int]]:
        flushed: list[list[int]] = []

        async def flush(_: str, items: list[int]) -> None:
            flushed.append(list(items))

        async with Supervisor("test") as sup:
            b: Batcher[str, int] = Batcher(sup, flush, "test")
            with mock.patch.object(b, "_wake_sent", mock.Mock(side_effect=AssertionError)):
                b.add("k", 1)
                for _ in range(5):
                    await asyncio.sleep(0)
            assert flushed == [[1]]
            ticket = b.add("k", 2)
            await asyncio.wait_for(b.sent({"k": ticket}), 5.0)  # woken by the flush
            assert b._waiters == []
        return flushed

    assert asyncio.run(run()) == [[1], [2]]


# ------------------------------------------------------------------ retry
def test_a_retry_after_a_first_try_made_by_the_caller_keeps_its_schedule() -> None:
    """``retry(failed=...)`` goes on from a first try its caller made: the next try
    after the first delay, the attempts counted from that first one, one deadline."""
    import random
    import time

    from runtime.retry import Backoff, GiveUp, retry

    async def run() -> tuple[list[str], int, int]:
        tries: list[str] = []

        async def call() -> str:
            tries.append("try")
            return "ok"

        policy = Backoff(first_s=0.001, factor=1.0, cap_s=0.001, jitter=0.0, deadline_s=None)
        with mock.patch("runtime.retry.asyncio.sleep", wraps=asyncio.sleep) as slept:
            got = await retry(call, policy, what="x", retry_on=(ValueError,),
                              rng=random.Random(1), failed=ValueError("first"))  # fmt: skip
        assert got == "ok"
        none_left = Backoff(first_s=0.001, jitter=0.0, deadline_s=0.0)
        with pytest.raises(GiveUp) as gave_up:
            await retry(call, none_left, what="x", retry_on=(ValueError,),
                        failed=ValueError("first"), start=time.monotonic())  # fmt: skip
        return tries, slept.call_count, gave_up.value.attempts

    tries, slept, attempts = asyncio.run(run())
    assert tries == ["try"]  # once, after one delay: the caller's try is not made again
    assert slept == 1
    assert attempts == 1  # the caller's try counts: its deadline passed, none more


@pytest.mark.parametrize("split", [0, 1, 30, 60])
def test_an_answer_read_whole_or_in_pieces_keeps_what_follows_it(split: int) -> None:
    """Read from the read that brought it whole (no copies) or from pieces, an answer
    is the same, and bytes after it stay in ``buf`` (its connection is not reused)."""
    one = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello"
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + one + b"HTTP/1.1 204 No Content\r\n\r\n"
    p = h1.ResponseParser(1 << 20)
    if split:
        p.feed(data[:split])
        p.feed(data[split:])
    else:
        p.feed(data)
    assert p.answer is not None
    assert (p.answer.status, p.answer.body, p.answer.pairs) == (
        200, b"hello", (("Content-Length", "5"), ("X-A", "1")),
    )  # fmt: skip
    assert p.answer.headers["x-a"] == "1"
    assert bytes(p.buf) == b"HTTP/1.1 204 No Content\r\n\r\n"


def test_an_incarnation_signed_for_before_is_not_matched_again_and_a_bad_one_still_refused() -> (
    None
):
    key = signing.signing_key(SECRET, GM0, LM0)
    good = "ab" * 8
    signing.sign("POST", "/v1/launch", BODY, GM0, key, NOW, incarnation=good)
    assert good in signing._INCARNATIONS_SEEN
    for bad in ("AB" * 8, "ab" * 7, "xy" * 8, good + "\n"):
        with pytest.raises(ValueError, match="incarnation"):
            signing.sign("POST", "/v1/launch", BODY, GM0, key, NOW, incarnation=bad)
        assert bad not in signing._INCARNATIONS_SEEN
    assert len(signing._INCARNATIONS_SEEN) <= signing.INCARNATIONS_SEEN_MAX
