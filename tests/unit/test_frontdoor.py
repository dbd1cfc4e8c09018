"""The GM's front door in process: its routes are exactly those /openapi.json lists, and
each answer validates against the documented schema; a submission goes to the user's
queue and through the real core (cancel, exit code, logs); bad input changes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from common.errors import ConfigError
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.jobspec import JobDef, parse_job
from common.messages import (
    AdmitJob,
    Decide,
    EventKind,
    JobRefusal,
    SubmitJob,
    TaskEvent,
    TaskEvents,
)
from global_master import frontdoor
from global_master.frontdoor import OPENAPI, FrontDoor, NotQueued, add_routes
from security.tokens import TokenStore
from tests.conftest import make_gm, make_lm, sync_views

Call = Callable[..., Awaitable[tuple[int, Any]]]


def door(tmp_path: Path) -> tuple[FrontDoor, dict[str, str], list[SubmitJob]]:
    gm = make_gm("gm0", ("lm0",), (("u0", "gm0", 0.5), ("u1", "gm1", 0.5)))
    sync_views(gm, make_lm("lm0", [(1, 1), (1, 1)]))
    store = TokenStore(tmp_path / "users.json")
    tokens = {u: store.add(u, gm=g, share=0.5, now=0.0) for u, g in (("u0", "gm0"), ("u1", "gm1"))}
    published: list[SubmitJob] = []

    async def publish(job: SubmitJob) -> None:  # the broker, then the GM's consumer
        published.append(job)
        gm.handle(AdmitJob(job=job), 1.0)

    def feed(msg: object) -> None:
        gm.handle(msg, 2.0)

    return FrontDoor(gm, store, publish, feed, lambda g: f"http://{g}"), tokens, published


@contextlib.asynccontextmanager
async def serving(d: FrontDoor) -> AsyncIterator[int]:
    """The front door's routes on a test server: its port."""
    app = web.Application()
    add_routes(app, d)
    async with TestServer(app) as server:
        assert server.port is not None
        yield server.port


async def raw_post(port: int, user: str, token: str, head: str, body: bytes) -> bytes:
    """A job POSTed as these bytes (``head``: its last header lines) and the whole answer,
    within 5 s (a stalled body was waited for for ever, before)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"X-Megha-User: {user}\r\nAuthorization: Bearer {token}\r\n"
    writer.write(f"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\n{auth}{head}\r\n".encode())
    writer.write(body)
    await writer.drain()
    try:
        async with asyncio.timeout(5.0):
            got = await reader.readuntil(b"\r\n\r\n")
            n = int(got.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            return got + await reader.readexactly(n)
    finally:
        writer.close()


def run(tmp_path: Path, body: Callable[[Call, FrontDoor, dict[str, str]], Awaitable[None]]) -> None:
    d, tokens, _ = door(tmp_path)
    run_with(d, tokens, body)


def run_with(
    d: FrontDoor,
    tokens: dict[str, str],
    body: Callable[[Call, FrontDoor, dict[str, str]], Awaitable[None]],
) -> None:

    async def go() -> None:
        app = web.Application()
        add_routes(app, d)
        async with TestClient(TestServer(app)) as client:

            async def call(method: str, path: str, user: str = "u0", **kw: Any) -> tuple[int, Any]:
                h = {"X-Megha-User": user, "Authorization": f"Bearer {tokens.get(user, 'x')}"}
                resp = await client.request(method, path, headers=kw.pop("headers", h), **kw)
                text = await resp.text()
                ok = "json" in resp.headers.get("Content-Type", "")
                return resp.status, json.loads(text) if ok else text

            await body(call, d, tokens)

    asyncio.run(go())


def check(path: str, method: str, status: int, body: Any) -> None:
    spec = OPENAPI["paths"][path][method]["responses"][str(status)]
    schema = spec["content"]["application/json"]["schema"]
    jsonschema.validate(body, {**schema, "components": OPENAPI["components"]})


def test_the_routes_are_the_documented_ones() -> None:
    app = web.Application()
    d = FrontDoor.__new__(FrontDoor)  # handlers are only listed, never called here
    add_routes(app, d)
    served = {
        (r.resource.canonical, r.method.lower())
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    documented = {(p, m) for p, ops in OPENAPI["paths"].items() for m in ops}
    assert served == documented


def test_submit_follow_cancel_and_read_a_job(tmp_path: Path) -> None:
    job = {"format": "megha-job/1", "name": "w", "count": 3, "demand": [1, 1], "duration": 5}

    async def body(call: Call, d: FrontDoor, tokens: dict[str, str]) -> None:
        st, sub = await call("POST", "/api/v1/jobs?id=w-1", data=json.dumps(job))
        check("/api/v1/jobs", "post", st, sub)
        assert st == 202
        assert sub["tasks"] == ["w-1.s0.t0", "w-1.s0.t1", "w-1.s0.t2"]
        d.core.handle(Decide(max_tasks=1), 3.0)
        st, got = await call("GET", "/api/v1/jobs/w-1")
        check("/api/v1/jobs/{job_id}", "get", st, got)
        assert got["state"] == "queued"
        # the first task ends with an exit code and output (commands on, say)
        ev = TaskEvent(kind=EventKind.STARTED, lm=LmId("lm0"), gm=GmId("gm0"), user="u0",
                       task_id="w-1.s0.t0", attempt=1, node=NodeIndex(0), node_free=(0, 0),
                       node_version=1, at=3.0)  # fmt: skip
        d.core.handle(TaskEvents(lm=LmId("lm0"), events=(ev,)), 3.0)
        st, got = await call("GET", "/api/v1/jobs/w-1")
        assert got["state"] == "running"
        end = ev.__class__(**{**{f: getattr(ev, f) for f in ev.__struct_fields__},
                              "kind": EventKind.FAILED, "exit_code": 3, "stdout": b"hello\n",
                              "stderr": b"oops\n", "at": 4.0})  # fmt: skip
        d.core.handle(TaskEvents(lm=LmId("lm0"), events=(end,)), 4.0)
        st, logs = await call("GET", "/api/v1/tasks/w-1.s0.t0/logs")
        assert (st, logs) == (200, "hello\n")
        st, logs = await call("GET", "/api/v1/tasks/w-1.s0.t0/logs?stream=stderr")
        assert logs == "oops\n"
        st, task = await call("GET", "/api/v1/tasks/w-1.s0.t0")
        check("/api/v1/tasks/{task_id}", "get", st, task)
        assert (task["state"], task["exit_code"], task["attempts"]) == ("failed", 3, 1)
        st, c = await call("POST", "/api/v1/jobs/w-1/cancel")
        check("/api/v1/jobs/{job_id}/cancel", "post", st, c)
        st, got = await call("GET", "/api/v1/jobs/w-1")
        assert got["state"] == "cancelled"
        assert got["tasks_by_state"] == {"failed": 1, "cancelled": 2}
        st, lst = await call("GET", "/api/v1/jobs?state=cancelled")
        check("/api/v1/jobs", "get", st, lst)
        assert [j["job_id"] for j in lst["jobs"]] == ["w-1"]

    run(tmp_path, body)


def test_bad_input_is_refused_in_one_line_and_changes_nothing(tmp_path: Path) -> None:
    async def body(call: Call, d: FrontDoor, tokens: dict[str, str]) -> None:
        ok = {"format": "megha-job/1", "count": 1, "demand": [1, 1], "duration": 1}
        await call("POST", "/api/v1/jobs?id=a", data=json.dumps(ok))
        cases = [
            ("POST", "/api/v1/jobs", {"data": "{not json"}, "u0", 422, "bad_job_file"),
            # a parser that keeps the first of a key twice would see another job
            ("POST", "/api/v1/jobs", {"data": '{"format": "megha-job/1", "count": 1, '
             '"count": 2, "demand": [1, 1], "duration": 1}'}, "u0", 422, "bad_job_file"),
            # nested past the decoder's depth (it was a 500)
            ("POST", "/api/v1/jobs", {"data": "[" * 100_000 + "]" * 100_000}, "u0", 422,
             "bad_job_file"),
            ("POST", "/api/v1/jobs", {"data": b'{"format": "\xff"}'}, "u0", 422,
             "bad_job_file"),
            ("POST", "/api/v1/jobs", {"data": json.dumps({**ok, "demand": [0]})}, "u0", 422,
             "bad_job_file"),
            ("POST", "/api/v1/jobs?id=a", {"data": json.dumps(ok)}, "u0", 409,
             "duplicate_job_id"),
            ("POST", "/api/v1/jobs?id=bad%20id", {"data": json.dumps(ok)}, "u0", 422,
             "bad_job_id"),
            ("POST", "/api/v1/jobs", {"data": json.dumps({**ok, "name": "x" * 100_000})}, "u0",
             422, "bad_job_id"),  # (the id is the name's)
            ("GET", "/api/v1/jobs/nope", {}, "u0", 404, "unknown_job"),
            ("GET", "/api/v1/tasks/nope", {}, "u0", 404, "unknown_task"),
            ("GET", "/api/v1/jobs/" + "j" * 6000, {}, "u0", 404, "unknown_job"),  # (quoted
            ("GET", "/api/v1/tasks/" + "t" * 6000, {}, "u0", 404, "unknown_task"),  # whole)
            ("GET", "/api/v1/jobs/a", {}, "u1", 421, "wrong_gm"),  # u1 is gm1's
            ("GET", "/api/v1/jobs/a", {}, "u9", 401, "unknown_user"),
            ("GET", "/api/v1/tasks/a.s0.t0/logs?stream=stdin", {}, "u0", 400, "bad_stream"),
            # what the core's admission refuses, said before the job is sent (the same
            # as `megha simulate` says of the file: tests/sim/test_job_file_units.py)
            ("POST", "/api/v1/jobs", {"data": json.dumps({**ok, "demand": [1]})}, "u0", 422,
             "wrong_resources"),
            ("POST", "/api/v1/jobs", {"data": json.dumps({**ok, "demand": [2, 1]})}, "u0", 422,
             "impossible_resources"),
            ("POST", "/api/v1/jobs", {"data": json.dumps({**ok, "duration": 10**7})}, "u0", 422,
             "duration_too_long"),
            # a DAG's stage ids past the wire's integers (a 500 in plain text, from the
            # encoder)
            ("POST", "/api/v1/jobs", {"data": json.dumps({"format": "megha-job/1", "stages": [
                {"id": 2**64, "count": 1, "demand": [1, 1], "duration": 1},
                {"id": 2**64 + 1, "parents": [2**64], "count": 1, "demand": [1, 1],
                 "duration": 1}]})}, "u0", 422, "bad_job_file"),
            # what its GM refuses before its core sees it: it was a 202, then "submitted"
            # for PENDING_S, then an unknown job (its dead letter said why)
            ("POST", "/api/v1/jobs", {"data": json.dumps({"format": "megha-job/1", "stages": [
                {"id": i, "parents": list(range(i)), "count": 1, "demand": [1, 1],
                 "duration": 1} for i in range(500)]})}, "u0", 422, "too_many_edges"),
        ]  # fmt: skip
        for method, path, kw, user, status, reason in cases:
            st, err = await call(method, path, user, **kw)
            assert (st, err.get("error")) == (status, reason), (path, err)
            assert "\n" not in err["detail"]
            assert len(err["detail"]) < 300, err["detail"]  # whatever the request held
        # a credential header twice: which one counts would be each reader's choice
        for extra in ({"X-Megha-User": "u1"}, {"Authorization": f"Bearer {tokens['u1']}"}):
            h = {"X-Megha-User": "u0", "Authorization": f"Bearer {tokens['u0']}"}
            st, err = await call("GET", "/api/v1/jobs", "u0",
                                 headers=[*h.items(), *extra.items()])  # fmt: skip
            assert (st, err["error"]) == (401, "malformed_credentials")
        d.tokens.revoke("u0", now=5.0)
        st, err = await call("GET", "/api/v1/jobs")
        assert (st, err["error"]) == (401, "revoked_token")
        assert list(d.core.jobs) == [("u0", "a")]  # nothing else was admitted
        assert set(d.pending) <= {("u0", "a")}  # nor sent

    run(tmp_path, body)


def test_job_files_parse_strictly() -> None:
    job = parse_job({"format": "megha-job/1", "name": "wc", "stages": [
        {"id": 1, "parents": [0], "count": 1, "demand": [1], "duration": 1,
         "command": ["/bin/r", "{i}", "{n}"]},
        {"id": 0, "count": 2, "demand": [1], "duration": 1, "command": ["/bin/m", "{i}"]}]})  # fmt: skip
    assert [s.stage_id for s in job.stages] == [0, 1]
    assert [t.command for t in job.stages[0].tasks] == [("/bin/m", "0"), ("/bin/m", "1")]
    sub = job.submission("wc-1", "u0", "tok", 0.0)
    assert [t.task_id for t in sub.tasks] == ["wc-1.s0.t0", "wc-1.s0.t1", "wc-1.s1.t0"]
    assert sub.stages is not None
    assert JobDef.single(2, [1], 1.0).submission("j", "u0", "t", 0.0).stages is None
    for bad in (
        {"format": "megha-job/2", "count": 1, "demand": [1], "duration": 1},
        {"format": "megha-job/1", "count": 1, "demand": [1], "duration": -1},
        {"format": "megha-job/1", "count": 1, "demand": [1], "duration": 1, "evil": 1},
        {"format": "megha-job/1", "count": 1, "demand": [1], "duration": 1, "command": "ls"},
        {"format": "megha-job/1", "stages": [{"id": 0, "parents": [0], "count": 1,
                                              "demand": [1], "duration": 1}]},
        {"format": "megha-job/1", "stages": [{"id": 0, "parents": [7], "count": 1,
                                              "demand": [1], "duration": 1}]},
        # integers past what the wire carries (they failed in its encoder: a 500)
        {"format": "megha-job/1", "stages": [
            {"id": 2**64, "count": 1, "demand": [1], "duration": 1},
            {"id": 1, "parents": [2**64], "count": 1, "demand": [1], "duration": 1}]},
        {"format": "megha-job/1", "count": 1, "demand": [2**63], "duration": 1},
        {"format": "megha-job/1", "stages": [{"id": 10**40, "count": 1, "demand": [1],
                                              "duration": 1}]},
    ):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            parse_job(bad)
        assert err.value.reason == "bad_job_file"


def test_a_stage_id_given_twice_is_named() -> None:
    stage = {"count": 1, "demand": [1], "duration": 1}
    doc = {"format": "megha-job/1", "stages": [{"id": 0, **stage}, {"id": 3, **stage},
                                               {"id": 3, "parents": [0], **stage}]}  # fmt: skip
    with pytest.raises(ConfigError, match=r"^job: stage 3: stage ids must be distinct"):
        parse_job(doc)


def test_one_id_sent_twice_at_once_is_taken_once(tmp_path: Path) -> None:
    """Two submissions of one id while the first waits for the broker: one 202, one
    409 (both were 202, and the GM dropped the second job as a duplicate, unsaid)."""
    d, tokens, published = door(tmp_path)
    sent = d.publish
    gate, started = asyncio.Event(), asyncio.Event()

    async def slow(job: SubmitJob) -> None:  # the broker's confirm takes a while
        started.set()
        await gate.wait()
        await sent(job)

    d.publish = slow
    job = {"format": "megha-job/1", "count": 1, "demand": [1, 1], "duration": 1}

    async def go() -> list[tuple[int, Any]]:
        app = web.Application()
        add_routes(app, d)
        async with TestClient(TestServer(app)) as client:
            h = {"X-Megha-User": "u0", "Authorization": f"Bearer {tokens['u0']}"}

            async def submit(count: int) -> tuple[int, Any]:
                data = json.dumps({**job, "count": count})
                resp = await client.post("/api/v1/jobs?id=same", headers=h, data=data)
                return resp.status, await resp.json()

            first = asyncio.create_task(submit(1))
            await started.wait()
            second = asyncio.create_task(submit(2))
            await asyncio.sleep(0.2)  # answered while the first still waits, or waiting too
            gate.set()
            return [await first, await second]

    (st1, a), (st2, b) = asyncio.run(go())
    assert (st1, a["tasks"]) == (202, ["same.s0.t0"])
    assert (st2, b["error"]) == (409, "duplicate_job_id")
    assert [j.job_id for j in published] == ["same"]
    assert [len(j.tasks) for j in published] == [1]


@pytest.mark.parametrize(("reason", "status"), [("queue_full", 429),
                                                ("broker_unavailable", 503)])  # fmt: skip
def test_a_job_the_broker_did_not_take_is_refused_and_its_id_freed(
    tmp_path: Path, reason: str, status: int
) -> None:
    d, tokens, published = door(tmp_path)
    sent = d.publish
    refuse = [True]

    async def broker(job: SubmitJob) -> None:
        if refuse[0]:
            raise NotQueued(reason, "not taken")
        await sent(job)

    d.publish = broker

    async def body(call: Call, d: FrontDoor, tokens: dict[str, str]) -> None:
        ok = json.dumps({"format": "megha-job/1", "count": 1, "demand": [1, 1], "duration": 1})
        st, err = await call("POST", "/api/v1/jobs?id=j", data=ok)
        check("/api/v1/jobs", "post", st, err)
        assert (st, err["error"]) == (status, reason)
        assert not d.pending
        assert not published
        st, err = await call("GET", "/api/v1/jobs/j")
        assert (st, err["error"]) == (404, "unknown_job")
        refuse[0] = False
        st, got = await call("POST", "/api/v1/jobs?id=j", data=ok)  # the same id, again
        assert (st, got["job_id"]) == (202, "j")

    async def go() -> None:
        app = web.Application()
        add_routes(app, d)
        async with TestClient(TestServer(app)) as client:

            async def call(method: str, path: str, **kw: Any) -> tuple[int, Any]:
                h = {"X-Megha-User": "u0", "Authorization": f"Bearer {tokens['u0']}"}
                resp = await client.request(method, path, headers=h, **kw)
                return resp.status, await resp.json()

            await body(call, d, tokens)

    asyncio.run(go())


def test_a_job_body_too_large_or_too_slow_is_refused_as_it_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunked body past ``MAX_JOB_BODY`` is 413 (it was read up to the app's limit
    and admitted); a body that stops coming is 408 (it was waited for, for ever)."""
    monkeypatch.setattr(frontdoor, "MAX_JOB_BODY", 1000)
    monkeypatch.setattr(frontdoor, "BODY_S", 0.3)
    d, tokens, published = door(tmp_path)
    ok = {"format": "megha-job/1", "count": 1, "demand": [1, 1], "duration": 1}

    async def post(port: int, head: str, body: bytes) -> bytes:
        return await raw_post(port, "u0", tokens["u0"], head, body)

    def chunked(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)

    async def go() -> list[bytes]:
        async with serving(d) as port:
            big = json.dumps({**ok, "name": "x" * 2000}).encode()
            small = json.dumps(ok).encode()
            return [
                await post(port, "Transfer-Encoding: chunked\r\n", chunked(big)),
                await post(port, f"Content-Length: {len(small)}\r\n", small[:10]),
                await post(port, "Transfer-Encoding: chunked\r\n", b'5\r\n{"a":\r\n'),
                await post(port, "Transfer-Encoding: chunked\r\n", chunked(small)),
            ]

    too_big, stopped, chunk_stopped, fine = asyncio.run(go())
    assert too_big.startswith(b"HTTP/1.1 413")
    assert b'"too_large"' in too_big
    for answer in (stopped, chunk_stopped):
        assert answer.startswith(b"HTTP/1.1 408")
        assert b'"request_timeout"' in answer
    assert fine.startswith(b"HTTP/1.1 202")
    assert len(published) == 1


def test_pending_jobs_are_forgotten_once_admitted_behind_one_that_never_was(
    tmp_path: Path,
) -> None:
    """A job its GM refused before its core saw it stays pending for ``PENDING_S``; the
    jobs sent after it are forgotten as soon as they are admitted (they were kept, whole,
    as long as it was)."""
    d, tokens, _ = door(tmp_path)
    lost = parse_job({"format": "megha-job/1", "count": 1, "demand": [1, 1], "duration": 1})
    stuck = lost.submission("stuck", "u1", tokens["u1"], time.time())
    d.pending[(stuck.user, stuck.job_id)] = stuck  # published, then dead-lettered unread

    async def body(call: Call, d: FrontDoor, tokens: dict[str, str]) -> None:
        big = {"format": "megha-job/1", "count": 500, "demand": [1, 1], "duration": 1}
        st, _ = await call("POST", "/api/v1/jobs?id=big", data=json.dumps(big))
        assert st == 202
        assert ("u0", "big") in d.core.jobs  # admitted at once (the test's broker)

    run_with(d, tokens, body)
    now = time.time()
    d._swept_at = float("-inf")
    d._forget_pending(now)
    assert list(d.pending) == [("u1", "stuck")]
    d._swept_at = float("-inf")
    d._forget_pending(stuck.submitted_at + frontdoor.PENDING_S + 1.0)
    assert not d.pending


def test_a_refused_job_reads_failed_and_its_id_may_be_sent_again(tmp_path: Path) -> None:
    """A job its GM refused before its core took it (``user_backlog``) reads failed, with
    why; the same id sent again (the refusal may pass: a backlog drains) is a new job,
    not a 409 for an hour, and reads as that job from its submission on."""
    d, tokens, published = door(tmp_path)
    sent = d.publish
    gate = asyncio.Event()

    async def slow(job: SubmitJob) -> None:  # the GM admits it a while after the 202
        async def later() -> None:
            await gate.wait()
            await sent(job)

        asyncio.get_running_loop().create_task(later())

    d.publish = slow
    ok = {"format": "megha-job/1", "count": 2, "demand": [1, 1], "duration": 1}

    async def body(call: Call, door_: FrontDoor, _: dict[str, str]) -> None:
        door_.core.handle(JobRefusal(gm=GmId("gm0"), user=UserId("u0"), job_id=JobId("b"),
                                     submitted_at=-1.0, reason="user_backlog",
                                     detail="u0 has 33 MiB unread"), 1.5)  # fmt: skip
        st, got = await call("GET", "/api/v1/jobs/b")
        assert (st, got["state"], got["reason"]) == (
            200,
            "failed",
            "user_backlog: u0 has 33 MiB unread",
        )
        st, _ = await call("POST", "/api/v1/jobs?id=b", data=json.dumps(ok))
        assert st == 202
        st, got = await call("GET", "/api/v1/jobs/b")  # published, not admitted yet
        assert got["state"] == "submitted"
        st, lst = await call("GET", "/api/v1/jobs")
        assert [(j["job_id"], j["state"]) for j in lst["jobs"]] == [("b", "submitted")]
        st, again = await call("POST", "/api/v1/jobs?id=b", data=json.dumps(ok))
        assert (st, again["error"]) == (409, "duplicate_job_id")  # it is waiting now
        gate.set()
        for _ in range(20):
            await asyncio.sleep(0)
        st, got = await call("GET", "/api/v1/jobs/b")
        assert (got["state"], got["tasks"]) == ("queued", 2)
        assert [j.job_id for j in published] == ["b"]

    run_with(d, tokens, body)


def test_a_job_past_its_users_task_limit_is_a_429_up_front(tmp_path: Path) -> None:
    """A job that would take its user past ``max_user_tasks`` was a 202, then failed
    "refused: user_task_limit" in its record: now a 429 at once (send it later), and
    nothing is published."""
    from dataclasses import replace

    d, tokens, published = door(tmp_path)
    d.core.admission.limits = replace(d.core.admission.limits, max_user_tasks=4)
    job = {"format": "megha-job/1", "name": "w", "count": 3, "demand": [1, 1], "duration": 5}

    async def body(call: Call, d: FrontDoor, tokens: dict[str, str]) -> None:
        st, _ = await call("POST", "/api/v1/jobs?id=a", data=json.dumps(job))
        assert st == 202
        st, got = await call("POST", "/api/v1/jobs?id=b", data=json.dumps(job))
        check("/api/v1/jobs", "post", st, got)
        assert (st, got["error"]) == (429, "user_task_limit")
        assert "has 3 tasks on gm0; 3 more would pass its limit of 4" in got["detail"]
        st, _ = await call("GET", "/api/v1/jobs/b")
        assert st == 404  # never taken: its id is free
        assert [j.job_id for j in published] == ["a"]

    run_with(d, tokens, body)


def test_bodies_coming_in_are_held_within_a_budget_per_user_and_in_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token holder's stalled bodies could hold ``MAX_JOB_BODY`` each for ``BODY_S``
    on up to 256 connections (2 GiB): now one user's bodies coming in hold at most
    ``USER_BODIES`` of them (429 ``too_many_bodies``) and all users' ``BODIES_BYTES``
    (503 ``busy``), given back once a body is read or refused."""
    monkeypatch.setattr(frontdoor, "MAX_JOB_BODY", 1000)
    monkeypatch.setattr(frontdoor, "USER_BODIES", 2)
    monkeypatch.setattr(frontdoor, "BODIES_BYTES", 3000)
    monkeypatch.setattr(frontdoor, "BODY_S", 1.0)
    d, tokens, published = door(tmp_path)
    d.tokens.revoke("u1", now=0.0)  # (its share, for u2 on this GM)
    tokens["u2"] = d.tokens.add("u2", gm="gm0", share=0.5, now=0.0)
    ok = json.dumps({"format": "megha-job/1", "count": 1, "demand": [1, 1], "duration": 1})

    async def post(port: int, user: str, length: int, body: bytes) -> bytes:
        return await raw_post(port, user, tokens[user], f"Content-Length: {length}\r\n", body)

    async def go() -> list[bytes]:
        async with serving(d) as port:
            stalled = [asyncio.create_task(post(port, u, 900, b"{")) for u in ("u0", "u0", "u2")]
            await asyncio.sleep(0.3)  # (their heads are in)
            third_of_u0 = await post(port, "u0", 900, b"{")
            past_all = await post(port, "u2", 900, b"{")
            held = d.bodies.total
            answers = [await t for t in stalled]  # 408 each, after BODY_S
            after = await post(port, "u0", len(ok), ok.encode())
            return [third_of_u0, past_all, *answers, after, str(held).encode()]

    third, past_all, *stalled, after, held = asyncio.run(go())
    assert third.startswith(b"HTTP/1.1 429")
    assert b'"too_many_bodies"' in third
    assert past_all.startswith(b"HTTP/1.1 503")
    assert b'"busy"' in past_all
    assert held == b"2700"
    assert all(a.startswith(b"HTTP/1.1 408") for a in stalled)
    assert after.startswith(b"HTTP/1.1 202")  # every byte given back
    assert (d.bodies.total, d.bodies.held) == (0, {})
    assert len(published) == 1
