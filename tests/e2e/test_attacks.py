"""Hostile users and a hostile network against a federation made by ``megha up`` with
its default settings (its own secret, a broker vhost with a user per party, tokens).

Each attack is refused with its reason -- by the broker's permissions, the GMs'
checks of seals and tokens, the services' signature checks, or the workers'
sandbox -- and afterwards the services are alive and a good job still runs: nothing
an attacker did lost or stopped anyone's work.  (The modules' own refusals are
tested case by case in tests/security; this is the federation as users meet it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiormq.exceptions
import pytest
from aio_pika.abc import AbstractChannel

from common import broker_names as names
from common import codec
from common.config import FederationConfig
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    EventKind,
    JobKeep,
    KeepEnds,
    LaunchRequest,
    Placement,
    SnapshotRequest,
    StageSpec,
    StateDelta,
    StateUpdated,
    SubmitJob,
    TaskEvent,
    TaskEvents,
    WorkerHeartbeat,
)
from common.model import TaskSpec
from federation import provision
from federation.processes import restart_service
from megha_cli.users import revoke_user
from request_generator.submitter import Submitter
from security import sealing
from security.access import Access, load_tokens
from security.identity import Identity, gm, lm, user, workers
from security.secret import secret_path
from tests import raw_http
from tests.e2e.conftest import incarnation, listen_dead_letters, post, service_state
from workload.jobs import Job

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]
MARK = f"megha-attack-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def fed(make_federation: Callable[..., Federation]) -> Federation:
    """Two GMs (u0 on gm0, u1 on gm1), two LMs; commands on, sandboxed."""
    return make_federation(
        gms=2, lms=2, nodes_per_lm=4, heartbeat_s=0.5, task_commands=True,
        sandbox={"allow": ["/usr/bin/touch", "/usr/bin/sleep"], "timeout_s": 2.0},
    )  # fmt: skip


def as_party(cfg: FederationConfig, home: Path, who: Identity) -> Access:
    return Access.in_home(home, cfg, who)


async def refused_by_broker(url: str, act: Callable[[AbstractChannel], Awaitable[object]]) -> str:
    """Run ``act`` on a channel of a connection to ``url``: the broker's refusal."""
    try:
        conn = await aio_pika.connect(url, timeout=10)
    except (aiormq.exceptions.AMQPError, ConnectionError) as exc:
        return f"login refused: {exc!r}"
    try:
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        try:
            await act(ch)
        except aiormq.exceptions.ChannelAccessRefused as exc:
            return f"ACCESS_REFUSED: {exc}"
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            return f"NOT_FOUND: {exc}"
        except aio_pika.exceptions.DeliveryError as exc:
            return f"not delivered: {exc}"
        return "accepted"
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


def job_body(cfg: FederationConfig, jid: str, who: str, token: str, **spec: Any) -> bytes:
    t = TaskSpec(
        task_id=TaskId(f"{jid}.t0"), job_id=JobId(jid), user=UserId(who), demand=(1,),
        duration=spec.pop("duration", 0.05), **spec,
    )  # fmt: skip
    return codec.encode(
        SubmitJob(
            job_id=JobId(jid), user=UserId(who), token=token, submitted_at=time.time(), tasks=(t,)
        )
    )


def _placement() -> Placement:
    t = TaskSpec(task_id=TaskId("claim.t0"), job_id=JobId("claim"), user=UserId("u0"),
                 demand=(1,), duration=0.05)  # fmt: skip
    return Placement(spec=t, attempt=1, node=NodeIndex(0))


# ------------------------------------------------------------------ the broker
def _publish(exchange: str, key: str, body: bytes = b"x") -> Callable[[AbstractChannel], Any]:
    async def act(ch: AbstractChannel) -> None:
        ex = await ch.get_exchange(exchange, ensure=False)
        await ex.publish(aio_pika.Message(body), routing_key=key, mandatory=True)

    return act


async def _ignore(_: Any) -> None:
    """A consumer that would take whatever it got."""


def _consume(queue: str) -> Callable[[AbstractChannel], Any]:
    async def act(ch: AbstractChannel) -> None:
        q = await ch.get_queue(queue, ensure=False)
        await q.consume(_ignore, no_ack=True)

    return act


def _bind_private(exchange: str, key: str) -> Callable[[AbstractChannel], Any]:
    async def act(ch: AbstractChannel) -> None:
        q = await ch.declare_queue(exclusive=True, auto_delete=True)
        await q.bind(exchange, routing_key=key)

    return act


def _declare_queue() -> Callable[[AbstractChannel], Any]:
    async def act(ch: AbstractChannel) -> None:
        await ch.declare_queue(exclusive=True, auto_delete=True)

    return act


def _purge(queue: str) -> Callable[[AbstractChannel], Any]:
    async def act(ch: AbstractChannel) -> None:
        q = await ch.get_queue(queue, ensure=False)
        await q.purge()

    return act


def _delete(queue: str) -> Callable[[AbstractChannel], Any]:
    async def act(ch: AbstractChannel) -> None:
        await ch.queue_delete(queue)

    return act


def _declare_exchange(name: str) -> Callable[[AbstractChannel], Any]:
    async def act(ch: AbstractChannel) -> None:
        await ch.declare_exchange(name, aio_pika.ExchangeType.FANOUT)

    return act


def broker_attacks(f: str) -> list[tuple[str, Identity, Callable[[AbstractChannel], Any]]]:
    """(what, as whom, the act) -- every one must be refused by the broker."""
    u0, u1 = user("u0"), user("u1")
    return [
        ("submit as another user", u0, _publish(f"{f}.submit", "u1")),
        ("forge a state update", u0, _publish(f"{f}.state", names.state_key("lm0"))),
        ("forge a task event", u0, _publish(f"{f}.events", names.gm_event_key("gm0", "lm0"))),
        ("forge another user's outcome", u0, _publish(f"{f}.events", "user.u1.gm1")),
        ("forge its own outcome", u0, _publish(f"{f}.events", "user.u0.gm0")),
        ("publish through the default exchange", u0, _publish("", f"{f}.user.u1")),
        ("forge an LM epoch", u0, _publish(f"{f}.state", names.epoch_key("lm0"))),
        ("dead-letter things", u0, _publish(f"{f}.dlx", "")),
        ("take jobs from its own queue", u0, _consume(f"{f}.user.u0")),
        ("take another user's jobs", u0, _consume(f"{f}.user.u1")),
        ("read another user's outcomes", u0, _consume(f"{f}.user.u1.events")),
        ("read a GM's events", u0, _consume(f"{f}.gm.gm0.events")),
        ("read a GM's state updates", u0, _consume(f"{f}.gm.gm0.state")),
        ("read the dead letters", u0, _consume(f"{f}.dead")),
        ("bind to another user's events", u0, _bind_private(f"{f}.events", "user.u1.#")),
        ("bind to every event", u0, _bind_private(f"{f}.events", "#")),
        ("bind to the GMs' events", u0, _bind_private(f"{f}.events", "gm.gm0.#")),
        ("bind to state updates", u0, _bind_private(f"{f}.state", "#")),
        ("bind to submissions", u0, _bind_private(f"{f}.submit", "u1")),
        ("declare a queue (to fill the vhost's max-queues)", u0, _declare_queue()),
        ("purge another user's queue", u0, _purge(f"{f}.user.u1")),
        ("delete another user's queue", u0, _delete(f"{f}.user.u1")),
        ("delete a GM's queue", u0, _delete(f"{f}.gm.gm0.events")),
        ("declare an exchange", u0, _declare_exchange(f"{f}.evil")),
        ("u1 submitting as u0", u1, _publish(f"{f}.submit", "u0")),
        ("a worker pool publishing state", workers("lm0"), _publish(f"{f}.state", "lm.lm0")),
        ("a worker pool publishing events", workers("lm0"), _publish(f"{f}.events", "gm.gm0.lm0")),
        ("a worker pool reading jobs", workers("lm0"), _consume(f"{f}.user.u0")),
        ("an LM publishing state as another", lm("lm0"), _publish(f"{f}.state", "lm.lm1")),
        ("an LM publishing events as another", lm("lm0"), _publish(f"{f}.events", "gm.gm0.lm1")),
        ("an LM reading jobs", lm("lm0"), _consume(f"{f}.user.u0")),
        ("an LM taking another's epoch", lm("lm0"), _consume(f"{f}.lm.lm1.epoch")),
        ("a GM reading a user it does not serve", gm("gm0"), _consume(f"{f}.user.u1")),
        ("a GM reading another GM's events", gm("gm0"), _consume(f"{f}.gm.gm1.events")),
        ("a GM forging state", gm("gm0"), _publish(f"{f}.state", "lm.lm0")),
        ("a GM answering for another GM", gm("gm0"), _publish(f"{f}.events", "user.u1.gm1")),
        ("a GM returning tasks to another's user", gm("gm0"), _publish(f"{f}.submit", "u1")),
    ]


@pytest.mark.parametrize("case", range(len(broker_attacks("f"))))
def test_the_broker_refuses(fed: Federation, case: int) -> None:
    """Refused by permission: ``ACCESS_REFUSED``, nothing else.  (The broker checks
    permission before existence: a ``NOT_FOUND`` means the act was allowed.)"""
    cfg, home = fed
    what, who, act = broker_attacks(cfg.name)[case]
    url = as_party(cfg, home, who).broker_urls()[0]
    got = asyncio.run(refused_by_broker(url, act))
    assert got.startswith("ACCESS_REFUSED"), f"{what} as {who}: {got}"


def test_the_broker_lets_a_user_do_its_own_work(fed: Federation) -> None:
    """The same acts on what is the user's own are accepted: the refusals above are the
    broker's permissions at work, not a harness that refuses everything."""
    cfg, home = fed
    url = as_party(cfg, home, user("u0")).broker_urls()[0]
    f = cfg.name
    own = [
        _publish(f"{f}.submit", "u0", b"\xc1"),  # its own queue (the GM dead-letters it)
        _consume(f"{f}.user.u0.events"),  # its own outcomes
    ]
    assert [asyncio.run(refused_by_broker(url, act)) for act in own] == ["accepted"] * 2


def test_guest_has_no_access_to_the_federation(fed: Federation) -> None:
    cfg, home = fed
    guest = f"amqp://guest:guest@127.0.0.1:5672/{cfg.name}"
    got = asyncio.run(refused_by_broker(guest, _consume(f"{cfg.name}.user.u0")))
    assert got.startswith(("login refused", "ACCESS_REFUSED")), got
    # and a made-up password for a real broker user is refused at login
    url = as_party(cfg, home, user("u0")).broker_urls()[0]
    u = url.split("@")[0].rsplit(":", 1)[0]
    forged = f"{u}:not-the-password@{url.split('@')[1]}"
    assert asyncio.run(refused_by_broker(forged, _consume("x"))).startswith("login refused")


# ------------------------------------------------------------ forged messages
def _operator_publish(cfg: FederationConfig, home: Path, exchange: str, key: str,
                      body: bytes, headers: dict[str, Any] | None = None) -> None:  # fmt: skip
    """What a network attacker who got into the broker could inject (the operator's
    login stands for that: its permissions are not what stops these)."""

    async def go() -> None:
        conn = await aio_pika.connect(Access.in_home(home, cfg).broker_urls()[0])
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.get_exchange(exchange)
            await ex.publish(aio_pika.Message(body, headers=headers or {}), routing_key=key)

    asyncio.run(go())


def _forged_update(lm_name: str) -> bytes:
    delta = StateDelta(
        lm=LmId(lm_name), epoch=2**62, version=2**62, base_version=0, nodes=(), free=(),
        node_versions=(),
    )  # fmt: skip
    return codec.encode(StateUpdated(delta=delta))


def _wait(pred: Callable[[], bool], timeout: float = 15.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


def test_a_forged_state_update_moves_no_gm_view(fed: Federation) -> None:
    """Version 2**62 once froze every GM's view of an LM; unsealed, badly sealed, or
    sealed by another LM, it is dropped, counted, and the views go on."""
    cfg, home = fed
    secret = Access.in_home(home, cfg).secret
    body = _forged_update("lm0")
    gm0 = gm("gm0")
    wrong_key = sealing.seal(body, lm("lm0"), 2**62, 1, {gm0: b"k" * 32}, stream="state")
    other_lm = sealing.seal(_forged_update("lm0"), lm("lm1"), 2**62, 1,
                            {gm0: sealing.sealing_key(secret, lm("lm1"), gm0)}, stream="state")  # fmt: skip
    wrong_stream = sealing.seal(body, lm("lm0"), 2**62, 1,
                                {gm0: sealing.sealing_key(secret, lm("lm0"), gm0)}, stream="events.gm0")  # fmt: skip
    for headers in (None, wrong_key, other_lm, wrong_stream):
        _operator_publish(cfg, home, f"{cfg.name}.state", "lm.lm0", body, headers)
    drops = lambda: service_state(cfg, home, "gm0")["dropped"]  # noqa: E731
    assert _wait(lambda: sum(drops()["state"].values()) + drops()["forged"] >= 4), drops()
    d = drops()
    assert d["state"].get("missing_header", 0) >= 1
    assert d["state"].get("bad_mac", 0) >= 1
    assert d["state"].get("wrong_stream", 0) >= 1
    assert d["forged"] >= 1  # sealed by lm1, about lm0
    views = service_state(cfg, home, "gm0")["views"]
    assert all(v < 2**40 for v in views.values()), views


def _event(kind: EventKind, task: str, u: str, lm_name: str = "lm0") -> bytes:
    ev = TaskEvent(
        kind=kind, lm=LmId(lm_name), gm=GmId("gm0"), user=UserId(u), task_id=TaskId(task),
        attempt=1, node=NodeIndex(0), node_free=(1,), node_version=1, at=time.time(),
    )  # fmt: skip
    return codec.encode(TaskEvents(lm=LmId(lm_name), epoch=1, events=(ev,)))


def test_forged_task_events_are_dead_lettered_with_their_reason(fed: Federation) -> None:
    """Each forged batch is dead-lettered with its own reason (told apart by a header of
    the test's, which the dead letter copies): unsealed, sealed under a key that is not
    lm0's, and sealed by lm1 (a newer epoch than its own) about lm0.  The last moves
    nothing of lm1's stream: gm0 still takes lm1's events (the good job at the end)."""
    cfg, home = fed
    assert asyncio.run(_forged_events(cfg, home)) == {
        "unsealed": "missing_header",
        "wrong-key": "bad_mac",
        "lm1-as-lm0": "sender_mismatch",
    }


async def _forged_events(cfg: FederationConfig, home: Path) -> dict[str, str]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    dead: dict[str, str] = {}

    async def on_dead(msg: Any) -> None:
        tag = (msg.headers or {}).get("x-attack")
        if tag:
            dead[str(tag)] = str(msg.headers["x-megha-reason"])

    await listen_dead_letters(sub, cfg, on_dead)
    body = _event(EventKind.FINISHED, "victim.t0", "u0")
    secret = Access.in_home(home, cfg).secret
    gm0 = gm("gm0")
    lm1_key, stream = {gm0: sealing.sealing_key(secret, lm("lm1"), gm0)}, "events.gm0"
    forged: dict[str, dict[str, Any]] = {
        "unsealed": {},
        "wrong-key": dict(sealing.seal(body, lm("lm0"), 1, 1, {gm0: b"x" * 32}, stream=stream)),
        "lm1-as-lm0": dict(sealing.seal(body, lm("lm1"), 2**62, 1, lm1_key, stream=stream)),
    }
    conn = await aio_pika.connect(Access.in_home(home, cfg).broker_urls()[0])
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(f"{cfg.name}.events")
        for tag, headers in forged.items():
            msg = aio_pika.Message(body, headers={**headers, "x-attack": tag})
            await ex.publish(msg, routing_key="gm.gm0.lm0")
    for _ in range(150):
        if len(dead) >= len(forged):
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return dead


# ------------------------------------------------------------------- tokens
def test_tokens_are_per_user_and_revocable(fed: Federation) -> None:
    cfg, home = fed
    tokens = load_tokens(home)
    assert tokens["u0"] != tokens["u1"]
    refused = asyncio.run(_submissions(cfg, home, tokens))
    assert refused == {
        "made-up": "bad_token",
        "other-users-token": "bad_token",
        "no-token": "bad_token",
        "in-another-queue": "wrong_queue",
        "unsealed-resume": "missing_header",
        "revoked": "revoked_token",
    }


async def _submissions(cfg: FederationConfig, home: Path, tokens: dict[str, str]) -> dict[str, str]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    dead: dict[str, str] = {}

    async def on_dead(msg: Any) -> None:
        tag = (msg.headers or {}).get("x-attack")
        if tag:
            dead[str(tag)] = str(msg.headers["x-megha-reason"])

    await listen_dead_letters(sub, cfg, on_dead)

    async def send(tag: str, key: str, body: bytes) -> None:
        msg = aio_pika.Message(body, delivery_mode=2, headers={"x-attack": tag})
        await sub.broker.publish("submit", key, msg)

    resume = SubmitJob(
        job_id=JobId("resumed+r1"), user=UserId("u0"), token="", submitted_at=time.time(),
        tasks=(TaskSpec(task_id=TaskId("resumed.t0"), job_id=JobId("resumed"), user=UserId("u0"),
                        demand=(1,), duration=0.05),),
        resumes=JobId("resumed"),
    )  # fmt: skip
    await send("made-up", "u0", job_body(cfg, "a1", "u0", "mgu_" + "A" * 43))
    await send("other-users-token", "u0", job_body(cfg, "a2", "u0", tokens["u1"]))
    await send("no-token", "u0", job_body(cfg, "a3", "u0", ""))
    await send("in-another-queue", "u0", job_body(cfg, "a4", "u1", tokens["u1"]))
    await send("unsealed-resume", "u0", codec.encode(resume))
    revoke_user(home, "u1")
    await asyncio.sleep(1.5)  # services re-read the users file within a second
    await send("revoked", "u1", job_body(cfg, "a5", "u1", tokens["u1"]))
    for _ in range(150):
        if len(dead) >= 6:
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return dead


def test_a_dag_of_more_edges_than_a_gm_holds_is_refused(fed: Federation) -> None:
    """Stages and parents per stage are bounded, not their product: 2,000 stages each
    after all before it (5.5 MB, 2,000 tasks) took ~90 MB of a GM's memory until the
    job ended; ten grew a GM from 57 to 951 MB.  Refused before the core holds it."""
    cfg, home = fed
    assert asyncio.run(_dense_dag(cfg, home, load_tokens(home)["u0"])) == "too_many_edges"


async def _dense_dag(cfg: FederationConfig, home: Path, token: str) -> str:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    dead: list[str] = []

    async def on_dead(msg: Any) -> None:
        if (msg.headers or {}).get("x-attack") == "dense":
            dead.append(str(msg.headers["x-megha-reason"]))

    await listen_dead_letters(sub, cfg, on_dead)
    n = 450  # 101,025 parents in all
    jid = JobId(f"dense-{MARK}")
    job = SubmitJob(
        job_id=jid, user=UserId("u0"), token=token, submitted_at=time.time(),
        tasks=tuple(TaskSpec(task_id=TaskId(f"{jid}.t{i}"), job_id=jid, user=UserId("u0"),
                             demand=(1,), duration=0.05) for i in range(n)),
        stages=tuple(StageSpec(stage_id=i, parents=tuple(range(i)), count=1) for i in range(n)),
    )  # fmt: skip
    msg = aio_pika.Message(codec.encode(job), delivery_mode=2, headers={"x-attack": "dense"})
    await sub.broker.publish("submit", names.submit_key("u0"), msg)
    for _ in range(150):
        if dead:
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return dead[0] if dead else "not refused"


def test_a_job_with_properties_the_gm_cannot_read_is_dead_lettered(fed: Federation) -> None:
    """A header of arrays nested 2,000 deep is sent by any AMQP client and passed on by
    the broker; reading it raised in the GM's AMQP client, which closed the GM's
    connection, and the job, requeued, closed the next one.  It is dead-lettered with
    its reason, and the user's next job runs."""
    cfg, home = fed
    reasons, done = asyncio.run(_unreadable_then_good(cfg, home))
    assert reasons == ["unreadable_properties"]
    assert done


async def _unreadable_then_good(cfg: FederationConfig, home: Path) -> tuple[list[str], bool]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    reasons: list[str] = []
    body = job_body(cfg, "deep", "u0", load_tokens(home)["u0"])

    async def on_dead(msg: Any) -> None:
        if msg.body == body:
            reasons.append(str((msg.headers or {}).get("x-megha-reason")))

    await listen_dead_letters(sub, cfg, on_dead)
    deep: list[Any] = []
    for _ in range(2000):
        deep = [deep]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # this client writes it; the GM's reads it with 1,000
    try:
        msg = aio_pika.Message(body, delivery_mode=2, headers={"x-deep": deep})
        await sub.broker.publish("submit", "u0", msg)
    finally:
        sys.setrecursionlimit(limit)
    t = TaskSpec(task_id=TaskId("after-deep.t0"), job_id=JobId("after-deep"), user=UserId("u0"),
                 demand=(1,), duration=0.05)  # fmt: skip
    await sub.submit(Job(JobId("after-deep"), UserId("u0"), 0.0, [t]))
    key = (UserId("u0"), t.task_id)
    for _ in range(300):
        if reasons and key in sub.outcomes.finished:
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return reasons, key in sub.outcomes.finished


# --------------------------------------------------------------------- HTTP
def test_internal_calls_must_be_signed_fresh_and_allowed(fed: Federation) -> None:
    cfg, home = fed
    path, body = "/v1/snapshot", b"\x93"
    url = cfg.lm_url("lm0") + path
    me = as_party(cfg, home, gm("gm0"))
    now = time.time()
    cases = [
        ({}, 401, "missing_credentials"),
        (me.sign(lm("lm0"), "POST", path, body, now - 120), 401, "stale_timestamp"),
        (me.sign(lm("lm0"), "POST", path, body, now + 60), 401, "future_timestamp"),
        (me.sign(lm("lm1"), "POST", path, body, now), 401, "bad_signature"),  # key of another LM
        (me.sign(lm("lm0"), "POST", "/v1/preempt", body, now), 401, "bad_signature"),
        (Access(user("u0"), cfg, me.secret).sign(lm("lm0"), "POST", path, body, now), 401,
         "unknown_identity"),
        (as_party(cfg, home, lm("lm1")).sign(lm("lm0"), "POST", path, body, now), 401,
         "unknown_identity"),
        (as_party(cfg, home, workers("lm1")).sign(lm("lm0"), "POST", "/v1/register", body, now),
         401, "unknown_identity"),
    ]  # fmt: skip
    for headers, status, reason in cases:
        assert post(url, body, headers) == (status, reason), reason
    # another LM's pool may not report to lm0; a GM may not start tasks on a pool
    pool = as_party(cfg, home, workers("lm0")).sign(lm("lm0"), "POST", "/v1/launch", body, now)
    assert post(url.replace(path, "/v1/launch"), body, pool) == (403, "forbidden_endpoint")
    start = me.sign(workers("lm0"), "POST", "/v1/start", body, now)
    assert post(cfg.worker_url("lm0") + "/v1/start", body, start) == (401, "unknown_identity")
    # a GM that speaks in another GM's name (its launches, its snapshots)
    for msg, where in (
        (SnapshotRequest(gm=GmId("gm1"), lm=LmId("lm0")), "/v1/snapshot"),
        (KeepEnds(gm=GmId("gm1"), lm=LmId("lm0"),
                  jobs=(JobKeep(user=UserId("u0"), job_id=JobId("j"), keep=True),)),
         "/v1/keep-ends"),
        (LaunchRequest(gm=GmId("gm1"), lm=LmId("lm0"), request_id=1, known_version=-1,
                       placements=(_placement(),)), "/v1/launch"),
    ):  # fmt: skip
        raw = codec.encode(msg)
        signed = me.sign(lm("lm0"), "POST", where, raw, time.time())
        assert post(cfg.lm_url("lm0") + where, raw, signed) == (403, "sender_mismatch")
    # ... while in its own name, bound to lm0's incarnation, it may (a job of its held
    # long: 204, nothing to answer); unbound, or bound to another, it may not
    kept = (JobKeep(user=UserId("u0"), job_id=JobId("j"), keep=False),)
    raw = codec.encode(KeepEnds(gm=GmId("gm0"), lm=LmId("lm0"), jobs=kept))
    url, bound = cfg.lm_url("lm0") + "/v1/keep-ends", incarnation(cfg.lm_url("lm0"))
    for to, status in ((bound, 204), ("", 401), ("0" * 16, 401)):
        signed = me.sign(lm("lm0"), "POST", "/v1/keep-ends", raw, time.time(), to)
        assert post(url, raw, signed)[0] == status, to
    # a pool that reports in another LM's name
    rep = codec.encode(WorkerHeartbeat(lm=LmId("lm1"), nodes=(NodeIndex(0),), at=time.time()))
    signed = as_party(cfg, home, workers("lm0")).sign(
        lm("lm0"), "POST", "/v1/worker-heartbeat", rep, time.time()
    )
    got = post(cfg.lm_url("lm0") + "/v1/worker-heartbeat", rep, signed)
    assert got == (403, "sender_mismatch")
    for name in ("gm0", "lm0", "lm0-workers"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(cfg.url(name) + "/v1/state", timeout=10)
        err.value.close()
        assert err.value.code == 401


def test_a_call_replayed_to_a_restarted_service_is_refused(fed: Federation) -> None:
    """The replay cache is per process: a launch or a start captured in the last 30 s
    was taken again by the process that replaced the one it was sent to.  A call names
    the incarnation it is meant for."""
    cfg, home = fed
    me = as_party(cfg, home, gm("gm0"))
    kept = (JobKeep(user=UserId("u0"), job_id=JobId("replayed"), keep=False),)
    raw = codec.encode(KeepEnds(gm=GmId("gm0"), lm=LmId("lm1"), jobs=kept))
    url = cfg.lm_url("lm1") + "/v1/keep-ends"
    signed = me.sign(lm("lm1"), "POST", "/v1/keep-ends", raw, time.time(),
                     incarnation(cfg.lm_url("lm1")))  # fmt: skip
    assert post(url, raw, signed) == (204, "")  # taken
    assert post(url, raw, signed) == (401, "replayed_nonce")  # by the same process
    restart_service(home, cfg, "lm1")
    assert post(url, raw, signed) == (401, "wrong_incarnation")  # by the next one


def _refusals(cfg: FederationConfig, name: str) -> dict[str, float]:
    """A service's ``*_refused_total`` by reason, from its ``/metrics``."""
    with urllib.request.urlopen(cfg.url(name) + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(r'^megha_\w+_refused_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    return {reason: float(n) for reason, n in found}


@pytest.mark.parametrize("name", ["gm0", "lm0", "lm0-workers"])
def test_bytes_the_http_parser_cannot_read_are_refused_with_a_reason(
    fed: Federation, name: str
) -> None:
    """Not HTTP, TLS, a bad request line, header, Content-Length or chunk, lines too
    long: aiohttp's parser refused them before any middleware, as plain text, with a
    traceback at ERROR in the service's log for each.  Under gunicorn as ``megha up``
    starts each service: a JSON 400 with its reason, the connection closed, counted,
    one line at most in the log; and the service serves the next caller."""
    cfg, home = fed
    host, port = cfg.address(name)
    log = home / "logs" / f"{name}.log"
    logged, before = log.stat().st_size, _refusals(cfg, name)
    for what, data, reason in raw_http.MALFORMED:
        got = raw_http.exchange(port, data, host)  # returns once the service closes
        assert (got.status, got.content_type) == (400, "application/json"), (what, got.body)
        assert got.json()["error"] == reason, what
    with urllib.request.urlopen(cfg.url(name) + "/health", timeout=10) as resp:
        assert resp.status == 200
    after = _refusals(cfg, name)
    reasons = [reason for _, _, reason in raw_http.MALFORMED]
    assert {r: after.get(r, 0) - before.get(r, 0) for r in reasons} == {
        r: reasons.count(r) for r in reasons
    }
    written = log.read_bytes()[logged:]
    assert b"Traceback" not in written
    assert b"Error handling request" not in written


# ----------------------------------------------------------------- commands
def test_task_commands_run_sandboxed_or_not_at_all(fed: Federation) -> None:
    cfg, home = fed
    mark = Path("/tmp") / f"{MARK}-{uuid.uuid4().hex[:6]}"
    outcomes = asyncio.run(_commands(cfg, home, mark))
    assert outcomes["allowed"] == (True, "")
    assert not mark.exists()  # touched in the task's own /tmp, gone with it
    ok, why = outcomes["not-root"]  # root would have met the read-only file system
    assert not ok
    assert "Permission denied" in why
    pools = [service_state(cfg, home, f"{lm}-workers") for lm in cfg.lm_ids]
    assert sum(p["counters"]["sandbox_uid_leases"] for p in pools) == 3  # a uid each
    assert all(p["sandbox"]["sandbox_uids_leased"] == 0 for p in pools)  # all given back
    ok, why = outcomes["shell"]
    assert not ok
    assert "not_allowed" in why
    ok, why = outcomes["escape"]
    assert not ok
    assert "not_allowed" in why
    ok, why = outcomes["too-long"]
    assert not ok
    assert "timeout" in why


async def _commands(cfg: FederationConfig, home: Path, mark: Path) -> dict[str, tuple[bool, str]]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    cmds = {
        "allowed": ("/usr/bin/touch", str(mark)),
        "not-root": ("/usr/bin/touch", f"/root/{mark.name}"),
        "shell": ("/bin/sh", "-c", f"id > {mark}.sh"),
        "escape": ("../../usr/bin/touch", f"{mark}.rel"),
        "too-long": ("/usr/bin/sleep", "60"),
    }
    keys = {}
    for tag, cmd in cmds.items():
        t = TaskSpec(task_id=TaskId(f"cmd-{tag}.t0"), job_id=JobId(f"cmd-{tag}"),
                     user=UserId("u0"), demand=(1,), duration=0.05, command=cmd)  # fmt: skip
        await sub.submit(Job(JobId(f"cmd-{tag}"), UserId("u0"), 0.0, [t]))
        keys[tag] = (UserId("u0"), t.task_id)
    out = sub.outcomes
    for _ in range(300):
        if all(out.done(k) for k in keys.values()):
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return {tag: (k in out.finished, out.failed.get(k, "")) for tag, k in keys.items()}


# ---------------------------------------------------------- secrets on disk
def test_the_federation_secret_is_private_and_never_in_the_config(fed: Federation) -> None:
    _cfg, home = fed
    st = secret_path(home).stat()
    assert st.st_mode & 0o077 == 0
    secret = secret_path(home).read_text().strip()
    assert len(secret) >= 64
    assert secret not in (home / "federation.toml").read_text()
    for name in ("broker.json", "users.json"):
        assert (home / name).stat().st_mode & 0o077 == 0
    assert all(p.stat().st_mode & 0o077 == 0 for p in (home / "tokens").iterdir())


def test_megha_up_refuses_a_published_secret(tmp_path: Path) -> None:
    from dataclasses import replace

    from common.errors import ConfigError

    cfg = replace(FederationConfig(), secret="change-me-before-sharing-this-machine")
    with pytest.raises(ConfigError) as err:
        provision.make_secret(cfg, tmp_path, insecure_dev=False)
    assert err.value.reason == "weak_secret"
    assert not secret_path(tmp_path).exists()
    path = provision.make_secret(cfg, tmp_path, insecure_dev=True)  # warned, allowed
    assert path.stat().st_mode & 0o077 == 0


# ------------------------------------------------------------ still serving
def test_after_all_that_the_federation_still_serves(fed: Federation) -> None:
    cfg, home = fed
    for name in ("gm0", "gm1", "lm0", "lm1", "lm0-workers", "lm1-workers"):
        with urllib.request.urlopen(cfg.url(name) + "/health", timeout=10) as resp:
            assert resp.status == 200
    done = asyncio.run(_good_job(cfg, home))
    assert done


async def _good_job(cfg: FederationConfig, home: Path) -> bool:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    tasks = [TaskSpec(task_id=TaskId(f"good.t{i}"), job_id=JobId("good"), user=UserId("u0"),
                      demand=(1,), duration=0.05) for i in range(6)]  # fmt: skip
    await sub.submit(Job(JobId("good"), UserId("u0"), 0.0, tasks))
    for _ in range(300):
        if all((UserId("u0"), t.task_id) in sub.outcomes.finished for t in tasks):
            break
        await asyncio.sleep(0.1)
    await sub.close()
    return all((UserId("u0"), t.task_id) in sub.outcomes.finished for t in tasks)


@pytest.fixture(autouse=True, scope="module")
def _clean_marks() -> Iterator[None]:
    yield
    for p in Path("/tmp").glob(f"{MARK}*"):
        with contextlib.suppress(OSError):
            os.unlink(p)
