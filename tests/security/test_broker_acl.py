"""Broker isolation: the permission table as data, and the real RabbitMQ enforcing it.

The integration tests (marker ``broker_acl``) provision a federation with a unique
vhost and unique users on the shared broker, try each attack as the party that
would make it, check the broker refuses it (ACCESS_REFUSED) while the legitimate
operations work, and remove everything they created.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from common.broker_names import (
    gm_event_key,
    state_key,
    submit_key,
    user_event_key,
    user_events_binding,
)
from common.config import FederationConfig
from common.errors import ConfigError
from runtime.broker import declare_topology
from security.broker_acl import (
    CREDENTIALS_ENV,
    NOTHING,
    USER_QUEUE_JOBS_OF_MAX_SIZE,
    BrokerCredentials,
    BrokerLayout,
    Rabbitmqctl,
    definitions,
    grants,
    load_broker_url,
    make_credentials,
    provision,
    rabbit_password_hash,
    teardown,
    topology,
)
from security.identity import OPERATOR, Identity, gm, lm, user, workers
from security.sealing import Opened, Opener, keyring_for, seal, sealing_key
from security.secret import Secret

ADMIN_URL = "amqp://guest:guest@127.0.0.1:5672/"


def layout(name: str = "fed") -> BrokerLayout:
    return BrokerLayout(
        federation=name,
        gms=("gm0", "gm1"),
        lms=("lm0", "lm1"),
        users=(("alice", "gm0"), ("bob", "gm1")),
    )


def matches(pattern: str, name: str) -> bool:
    """RabbitMQ applies a permission pattern with an unanchored regex search."""
    return re.search(pattern, name) is not None


# ---------------------------------------------------------- the tables
def test_topology_makes_topic_permissions_applicable() -> None:
    topo = topology(layout())
    types = {e.name: e.type for e in topo.exchanges}
    assert types == {
        "fed.submit": "topic",
        "fed.state": "topic",
        "fed.events": "topic",
        "fed.dlx": "fanout",
    }
    queues = {q.name: dict(q.arguments) for q in topo.queues}
    assert set(queues) == {
        "fed.dead",
        "fed.user.alice",
        "fed.user.bob",
        "fed.user.alice.events",
        "fed.user.bob.events",
        "fed.gm.gm0.events",
        "fed.gm.gm1.events",
        "fed.gm.gm0.state",
        "fed.gm.gm1.state",
        "fed.lm.lm0.epoch",
        "fed.lm.lm1.epoch",
    }
    assert queues["fed.user.alice"]["x-dead-letter-exchange"] == "fed.dlx"
    assert queues["fed.user.alice"]["x-overflow"] == "reject-publish"
    assert queues["fed.gm.gm0.state"]["x-message-ttl"] == 60_000
    bindings = {(b.exchange, b.queue, b.routing_key) for b in topo.bindings}
    assert ("fed.submit", "fed.user.alice", "alice") in bindings
    assert ("fed.events", "fed.user.bob.events", "user.bob.#") in bindings
    assert ("fed.events", "fed.gm.gm1.events", "gm.gm1.#") in bindings
    assert ("fed.state", "fed.gm.gm0.state", "lm.*") in bindings
    assert ("fed.state", "fed.lm.lm1.epoch", "epoch.lm1") in bindings
    assert "x-max-length" not in queues["fed.user.bob.events"]  # outcomes are never dropped
    quorum = BrokerLayout("fed", ("gm0",), ("lm0",), (("u", "gm0"),), queue_type="quorum")
    user_q = next(q for q in topology(quorum).queues if q.name == "fed.user.u")
    assert dict(user_q.arguments)["x-delivery-limit"] == 5


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_dead_letters_and_user_queues_are_bounded(queue_type: str) -> None:
    lay = BrokerLayout(
        "fed", ("gm0",), ("lm0",), (("u", "gm0"),), queue_type=queue_type,
        max_user_queue_bytes=1 << 20, max_dead_letters=7, max_dead_letter_bytes=1 << 16,
    )  # fmt: skip
    queues = {q.name: dict(q.arguments) for q in topology(lay).queues}
    assert queues["fed.dead"] == {
        "x-queue-type": queue_type,
        "x-max-length": 7,
        "x-max-length-bytes": 1 << 16,
        "x-overflow": "drop-head",  # the newest reasons survive
    }
    assert queues["fed.user.u"]["x-max-length-bytes"] == 1 << 20
    assert queues["fed.user.u"]["x-overflow"] == "reject-publish"
    assert (
        definitions(lay, make_credentials(lay, ADMIN_URL))["queues"][0]["arguments"]
        == (queues["fed.dead"])
    )


def test_a_user_queue_holds_a_few_of_the_largest_jobs_a_gm_reads() -> None:
    cfg = FederationConfig(max_body=1 << 20).validate()
    lay = BrokerLayout.from_config(cfg)
    assert lay.max_user_queue_bytes == USER_QUEUE_JOBS_OF_MAX_SIZE * cfg.max_body
    assert BrokerLayout.from_config(FederationConfig().validate()).max_dead_letters == 10_000
    with pytest.raises(ConfigError):
        BrokerLayout("fed", ("gm0",), (), (), max_dead_letter_bytes=0)


def test_routing_keys_fall_under_the_bindings() -> None:
    assert submit_key("alice") == "alice"
    assert state_key("lm1") == "lm.lm1"
    assert gm_event_key("gm0", "lm1") == "gm.gm0.lm1"
    assert user_event_key("alice", "lm1") == "user.alice.lm1"
    assert user_events_binding("alice") == "user.alice.#"


def test_permission_table() -> None:
    table = grants(layout())
    assert set(table) == {
        OPERATOR,
        gm("gm0"),
        gm("gm1"),
        lm("lm0"),
        lm("lm1"),
        workers("lm0"),
        workers("lm1"),
        user("alice"),
        user("bob"),
    }
    resources = [
        "fed.submit",
        "fed.state",
        "fed.events",
        "fed.dlx",
        "fed.dead",
        "fed.user.alice",
        "fed.user.bob",
        "fed.user.alice.events",
        "fed.user.bob.events",
        "fed.gm.gm0.events",
        "fed.gm.gm0.state",
        "fed.gm.gm1.events",
        "fed.lm.lm1.epoch",
        "fed.lm.lm1.leader",
        "fed.lm.lm0.leader",
        "amq.default",
        "amq.topic",
        "amq.gen-Xyz",
        "fed.user.alice.x",
    ]
    expected = {
        user("alice"): (
            set(),  # no queue of its own: one user could fill the vhost's max-queues
            {"fed.submit"},
            {"fed.user.alice.events"},
        ),
        gm("gm0"): (
            set(),
            {"fed.submit", "fed.events", "fed.dlx"},  # it returns tasks to its users' queues
            {"fed.user.alice", "fed.gm.gm0.events", "fed.gm.gm0.state"},
        ),
        lm("lm1"): (
            {"fed.lm.lm1.leader"},
            {"fed.state", "fed.events"},
            {"fed.lm.lm1.epoch", "fed.lm.lm1.leader"},
        ),
        workers("lm0"): (set(), set(), set()),
        OPERATOR: (set(resources), set(resources), set(resources)),
    }
    for who, (configure, write, read) in expected.items():
        g = table[who]
        assert {r for r in resources if matches(g.configure, r)} == configure, who
        assert {r for r in resources if matches(g.write, r)} == write, who
        assert {r for r in resources if matches(g.read, r)} == read, who


def test_topic_grants() -> None:
    table = grants(layout())

    def topic(who: Identity, exchange: str) -> tuple[str, str]:
        (t,) = [t for t in table[who].topics if t.exchange == exchange]
        return t.write, t.read

    w, r = topic(user("alice"), "fed.submit")
    assert [k for k in ("alice", "bob", "alice.x", "alicex", "xalice", "") if matches(w, k)] == [
        "alice"
    ]
    assert r == NOTHING
    w, r = topic(user("alice"), "fed.events")
    assert w == NOTHING
    binds = [
        "user.alice.#",
        "user.alice.lm0",
        "user.bob.#",
        "#",
        "user.*.#",
        "*.alice.#",
        "user.alicex.#",
    ]
    assert [k for k in binds if matches(r, k)] == ["user.alice.#", "user.alice.lm0"]
    w, _ = topic(lm("lm0"), "fed.state")
    keys = ["lm.lm0", "lm.lm1", "lm.lm0.x", "epoch.lm0", "epoch.lm1", "lm0", "#"]
    assert [k for k in keys if matches(w, k)] == ["lm.lm0", "epoch.lm0"]
    w, _ = topic(lm("lm0"), "fed.events")
    keys = [
        "gm.gm0.lm0",
        "gm.gm1.lm0",
        "user.bob.lm0",
        "gm.gm0.lm1",
        "gm.evil.lm0",
        "user.bob.gm0",
        "x",
    ]
    # an LM speaks to GMs only: a user's outcomes are its GM's word (issue 32 item 7)
    assert [k for k in keys if matches(w, k)] == ["gm.gm0.lm0", "gm.gm1.lm0"]
    w, _ = topic(gm("gm0"), "fed.events")
    keys = ["user.alice.gm0", "user.bob.gm0", "user.alice.gm1", "gm.gm0.lm0"]
    assert [k for k in keys if matches(w, k)] == ["user.alice.gm0"]
    w, _ = topic(gm("gm0"), "fed.submit")  # returned tasks, to its own users' queues only
    assert [k for k in ("alice", "bob", "alice.x") if matches(w, k)] == ["alice"]
    # every topic exchange a party may publish to or read from has a topic grant
    topo_topics = {e.name for e in topology(layout()).exchanges if e.type == "topic"}
    for who, g in table.items():
        if who == OPERATOR:
            continue
        touched = {x for x in topo_topics if matches(g.write, x) or matches(g.read, x)}
        assert touched <= {t.exchange for t in g.topics}, who


def test_a_gm_without_users_may_publish_no_user_events() -> None:
    lay = BrokerLayout("fed", ("gm0", "gm1"), ("lm0",), (("alice", "gm0"),))
    topics = grants(lay)[gm("gm1")].topics
    assert [t.write for t in topics] == [NOTHING, NOTHING]  # no outcome, no returned task


def test_layout_refuses_bad_names_and_unknown_gms() -> None:
    bad: list[dict[str, object]] = [
        {"federation": "a.b"},
        {"gms": ("gm.0",)},
        {"lms": ("lm0", "lm0")},
        {"users": (("al ice", "gm0"),)},
        {"users": (("alice", "gm9"),)},
        {"queue_type": "stream"},
    ]
    for change in bad:
        kwargs: dict[str, object] = {
            "federation": "fed",
            "gms": ("gm0",),
            "lms": ("lm0",),
            "users": (),
        }
        kwargs.update(change)
        with pytest.raises(ConfigError):
            BrokerLayout(**kwargs)  # type: ignore[arg-type]


def test_layout_from_the_federation_config() -> None:
    cfg = FederationConfig(name="prod", gms=2, lms=3, users="a:0.5@gm0,b:0.5@gm1")
    lay = BrokerLayout.from_config(cfg)
    assert (lay.vhost, lay.gms, lay.lms, lay.users) == (
        "prod",
        ("gm0", "gm1"),
        ("lm0", "lm1", "lm2"),
        (("a", "gm0"), ("b", "gm1")),
    )
    assert lay.broker_user(user("a")) == "prod.user.a"
    assert len(lay.identities()) == 1 + 2 + 3 + 3 + 2


def test_rabbit_password_hash_matches_rabbitmq() -> None:
    # worked example of RabbitMQ's password guide: salt 908DC60A, password "test12"
    assert rabbit_password_hash("test12", bytes.fromhex("908DC60A")) == (
        "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
    )
    assert rabbit_password_hash("x") != rabbit_password_hash("x")  # salted
    with pytest.raises(ValueError, match="4 bytes"):
        rabbit_password_hash("x", b"12")


def test_definitions_document() -> None:
    lay = layout()
    creds = make_credentials(lay, ADMIN_URL)
    doc = definitions(lay, creds)
    assert doc["vhosts"] == [{"name": "fed"}]
    assert {u["name"] for u in doc["users"]} == {lay.broker_user(i) for i in lay.identities()}
    assert "guest" not in json.dumps(doc)
    for u in doc["users"]:
        assert u["tags"] == ""
        assert u["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    text = json.dumps(doc)
    assert not [p for p in creds.passwords.values() if p in text]  # only salted hashes
    assert len(doc["permissions"]) == len(lay.identities())
    assert all(q["durable"] and not q["auto_delete"] for q in doc["queues"])
    (limit,) = doc["parameters"]
    assert limit["value"]["max-queues"] == len(doc["queues"]) + lay.extra_queues


def test_credentials_urls_reuse_and_file(tmp_path: Path) -> None:
    lay = layout("my-fed")
    creds = make_credentials(lay, "amqps://admin:pw@broker.example:5999/ignored")
    url = creds.url(gm("gm0"))
    assert url.startswith("amqps://my-fed.gm.gm0:")
    assert url.endswith("@broker.example:5999/my-fed")
    assert len({creds.passwords[str(i)] for i in lay.identities()}) == len(lay.identities())
    again = make_credentials(lay, ADMIN_URL, creds)
    assert again.passwords == creds.passwords
    assert again.url(user("bob")).startswith("amqp://my-fed.user.bob:")
    assert again.port == 5672
    grown = make_credentials(
        BrokerLayout("my-fed", ("gm0",), ("lm0",), (("carol", "gm0"),)), ADMIN_URL, creds
    )
    assert grown.passwords[str(gm("gm0"))] == creds.passwords[str(gm("gm0"))]
    path = tmp_path / "broker.json"
    creds.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert BrokerCredentials.load(path) == creds
    assert load_broker_url(lm("lm1"), environ={CREDENTIALS_ENV: str(path)}) == creds.url(lm("lm1"))
    with pytest.raises(ConfigError) as exc:
        creds.url(user("mallory"))
    assert exc.value.reason == "no_credentials"
    with pytest.raises(ConfigError):
        load_broker_url(lm("lm1"), environ={})
    path.write_text("{}")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError) as exc:
        BrokerCredentials.load(path)
    assert exc.value.reason == "bad_credentials"
    with pytest.raises(ConfigError):
        make_credentials(lay, "http://127.0.0.1/")


def test_rabbitmqctl_failures_are_config_errors() -> None:
    with pytest.raises(ConfigError) as exc:
        Rabbitmqctl(("/bin/false",)).run("list_vhosts")
    assert exc.value.reason == "rabbitmqctl_failed"
    with pytest.raises(ConfigError):
        Rabbitmqctl(("/nonexistent/rabbitmqctl",)).run("list_vhosts")
    absent = Rabbitmqctl(("/bin/sh", "-c", "echo 'User x does not exist'; exit 2", "sh"))
    assert absent.run("delete_user", "x", absent_ok=True) == ""
    absent.run_all([["delete_user", "x"], ["delete_user", "y"]], absent_ok=True)
    with pytest.raises(ConfigError):
        absent.run_all([["delete_user", "x"]])
    with pytest.raises(ConfigError):
        Rabbitmqctl(("/bin/false",)).run_all([["a"], ["b"], ["c"]], parallel=2)


# ----------------------------------------------------- the real broker
def _broker_available() -> str | None:
    if os.geteuid() != 0:
        return "rabbitmqctl needs root"
    if shutil.which("rabbitmqctl") is None:
        return "no rabbitmqctl"
    try:
        socket.create_connection(("127.0.0.1", 5672), 1).close()
    except OSError:
        return "no broker on 127.0.0.1:5672"
    return None


_SKIP = _broker_available()
F = TypeVar("F", bound=Callable[..., object])
Fed = tuple[BrokerLayout, BrokerCredentials]


def needs_broker(test: F) -> F:
    marked = pytest.mark.broker_acl(test)
    return pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")(marked)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def fed() -> Iterator[Fed]:
    """A provisioned federation, unique on the shared broker, removed afterwards."""
    lay = BrokerLayout(  # few parties: each broker user costs a rabbitmqctl call to remove
        federation=f"megha-sectest-{secrets.token_hex(4)}",
        gms=("gm0", "gm1"),
        lms=("lm0",),
        users=(("alice", "gm0"), ("bob", "gm1")),
    )
    creds = make_credentials(lay, ADMIN_URL)
    ctl = Rabbitmqctl()
    try:
        provision(lay, creds, ctl)
        yield lay, creds
    finally:
        teardown(lay, ctl)


@contextlib.asynccontextmanager
async def connected(creds: BrokerCredentials, who: Identity) -> AsyncIterator[AbstractConnection]:
    conn = await aio_pika.connect(creds.url(who), timeout=5)
    try:
        yield conn
    finally:
        await conn.close()


Action = Callable[[AbstractChannel], Awaitable[object]]


async def refused(conn: AbstractConnection, action: Action) -> str:
    """Run ``action`` on a fresh channel; the broker must close it with ACCESS_REFUSED."""
    ch = await conn.channel(publisher_confirms=True)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as exc:
        await action(ch)
    return str(exc.value)


def publish(exchange: str, key: str, body: bytes = b"x", **headers: str | int) -> Action:
    async def go(ch: AbstractChannel) -> object:
        ex = await ch.get_exchange(exchange, ensure=False)
        msg = aio_pika.Message(body, headers=dict(headers) or None, delivery_mode=2)
        return await ex.publish(msg, routing_key=key)

    return go


async def ignore(msg: AbstractIncomingMessage) -> None:
    pass


def consume(queue: str) -> Action:
    async def go(ch: AbstractChannel) -> object:
        q = await ch.get_queue(queue, ensure=False)
        return await q.consume(ignore)

    return go


def bind_private(exchange: str, key: str) -> Action:
    async def go(ch: AbstractChannel) -> object:
        q = await ch.declare_queue(exclusive=True, auto_delete=True)
        return await q.bind(exchange, routing_key=key)

    return go


async def get_one(conn: AbstractConnection, queue: str) -> AbstractIncomingMessage:
    """The next message of ``queue`` (the broker routes asynchronously: wait for it)."""
    ch = await conn.channel()
    q = await ch.get_queue(queue, ensure=False)
    got: asyncio.Future[AbstractIncomingMessage] = asyncio.get_running_loop().create_future()

    async def on_message(msg: AbstractIncomingMessage) -> None:
        if not got.done():
            got.set_result(msg)

    tag = await q.consume(on_message, no_ack=True)
    try:
        return await asyncio.wait_for(got, 5)
    finally:
        await q.cancel(tag)
        await ch.close()


async def depth(conn: AbstractConnection, queue: str) -> int:
    ch = await conn.channel()
    q = await ch.declare_queue(queue, passive=True)
    return q.declaration_result.message_count or 0


@needs_broker
def test_legitimate_operations_work(fed: Fed) -> None:
    lay, creds = fed
    secret = Secret.from_text("0123456789abcdef0123456789abcdef-acl", "test")

    async def run() -> None:
        async with (
            connected(creds, user("alice")) as alice,
            connected(creds, gm("gm0")) as gm0,
            connected(creds, gm("gm1")) as gm1,
            connected(creds, lm("lm0")) as lm0,
            connected(creds, workers("lm0")),
            connected(creds, OPERATOR) as op,
        ):
            # alice submits into her own queue; her GM takes it
            await publish(lay.submit_exchange, submit_key("alice"), b"job")(
                await alice.channel(publisher_confirms=True)
            )
            assert (await get_one(gm0, lay.user_queue("alice"))).body == b"job"
            # lm0 publishes a sealed state update; both GMs get it and it opens
            body = b"state-of-lm0"
            headers = seal(body, lm("lm0"), 1, 1, sealing_key(secret, lm("lm0")), stream="state")
            await publish(lay.state_exchange, state_key("lm0"), body, **headers)(
                await lm0.channel(publisher_confirms=True)
            )
            for g in (gm0, gm1):
                got = await get_one(g, lay.gm_state_queue("gm0" if g is gm0 else "gm1"))
                opener = Opener(keyring_for(secret, [lm("lm0"), lm("lm1")]), "state")
                assert opener.open(got.headers, got.body) == Opened(lm("lm0"), 1, 1)
            # lm0's task events reach the placing GM (a user hears of them from its GM)
            ch = await lm0.channel(publisher_confirms=True)
            await publish(lay.events_exchange, gm_event_key("gm0", "lm0"), b"ev-gm")(ch)
            assert (await get_one(gm0, lay.gm_events_queue("gm0"))).body == b"ev-gm"
            # a GM tells its own user about a failure, and dead-letters a refused job
            ch = await gm0.channel(publisher_confirms=True)
            await publish(lay.events_exchange, user_event_key("alice", "gm0"), b"failed")(ch)
            await publish(lay.dead_letter_exchange, "", b"refused-job")(ch)
            assert (await get_one(alice, lay.user_events_queue("alice"))).body == b"failed"
            assert (await get_one(op, lay.dead_letter_queue)).body == b"refused-job"
            assert await depth(op, lay.user_queue("bob")) == 0

    asyncio.run(run())


@needs_broker
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_the_broker_keeps_dead_letters_and_user_queues_within_bounds(queue_type: str) -> None:
    """RabbitMQ takes the limits on either queue type: the dead letters keep the newest,
    a user's queue refuses what goes beyond its bytes."""
    lay = BrokerLayout(
        federation=f"megha-sectest-{secrets.token_hex(4)}", gms=("gm0",), lms=(),
        users=(("alice", "gm0"),), queue_type=queue_type, max_user_queue_bytes=4096,
        max_dead_letters=3, max_dead_letter_bytes=1 << 20,
    )  # fmt: skip
    creds = make_credentials(lay, ADMIN_URL)
    ctl = Rabbitmqctl()

    async def run() -> int:
        async with (
            connected(creds, user("alice")) as alice,
            connected(creds, gm("gm0")) as gm0,
            connected(creds, OPERATOR) as op,
        ):
            ch = await gm0.channel(publisher_confirms=True)
            for i in range(5):
                await publish(lay.dead_letter_exchange, "", f"refused-{i}".encode())(ch)
            assert await depth(op, lay.dead_letter_queue) == 3
            assert (await get_one(op, lay.dead_letter_queue)).body == b"refused-2"
            ch = await alice.channel(publisher_confirms=True)
            taken = 0
            while True:
                try:
                    await publish(lay.submit_exchange, submit_key("alice"), b"\x00" * 3000)(ch)
                except aiormq.exceptions.DeliveryError:  # a nack: the queue is full
                    break
                taken += 1
                assert taken <= 2, "a user's queue takes more bytes than its bound"
            assert await depth(op, lay.user_queue("alice")) == taken
            return taken

    try:
        provision(lay, creds, ctl)
        assert 1 <= asyncio.run(run()) <= 2  # quorum queues refuse once over the limit
    finally:
        teardown(lay, ctl)


@needs_broker
def test_a_user_cannot_publish_with_another_users_routing_key(
    fed: Fed,
) -> None:
    lay, creds = fed

    async def run() -> None:
        async with connected(creds, user("alice")) as alice, connected(creds, OPERATOR) as op:
            for key in ("bob", "alice.x", "#", ""):
                why = await refused(alice, publish(lay.submit_exchange, key, b"stolen"))
                assert "ACCESS_REFUSED" in why
            # the default exchange would reach any queue by name: refused too
            await refused(alice, publish("", lay.user_queue("bob"), b"stolen"))
            assert await depth(op, lay.user_queue("bob")) == 0

    asyncio.run(run())


@needs_broker
def test_a_user_cannot_bind_to_another_users_events(
    fed: Fed,
) -> None:
    lay, creds = fed

    async def run() -> None:
        async with connected(creds, user("alice")) as alice:
            for key in ("user.bob.#", "#", "user.*.#", "*.bob.#", "gm.gm0.#", "user.bob.lm0"):
                assert "ACCESS_REFUSED" in await refused(
                    alice, bind_private(lay.events_exchange, key)
                )
            for exchange in (lay.submit_exchange, lay.state_exchange, lay.dead_letter_exchange):
                await refused(alice, bind_private(exchange, "#"))

    asyncio.run(run())


@needs_broker
def test_no_queue_theft(fed: Fed) -> None:
    lay, creds = fed

    async def purge(ch: AbstractChannel) -> object:
        return await (await ch.get_queue(lay.user_queue("bob"), ensure=False)).purge()

    async def delete(ch: AbstractChannel) -> object:
        return await ch.queue_delete(lay.user_queue("bob"))

    async def run() -> None:
        async with (
            connected(creds, user("alice")) as alice,
            connected(creds, gm("gm0")) as gm0,
            connected(creds, gm("gm1")) as gm1,
            connected(creds, lm("lm0")) as lm0,
        ):
            stolen = [
                lay.user_queue("bob"),
                lay.user_queue("alice"),  # even her own: only her GM consumes it
                lay.user_events_queue("bob"),
                lay.gm_events_queue("gm0"),
                lay.gm_state_queue("gm0"),
                lay.dead_letter_queue,
            ]
            for q in stolen:
                assert "ACCESS_REFUSED" in await refused(alice, consume(q))
            await refused(alice, purge)
            await refused(alice, delete)
            # a GM consumes only the queues of the users it serves
            await refused(gm0, consume(lay.user_queue("bob")))
            await refused(gm1, consume(lay.user_queue("alice")))
            await refused(gm0, consume(lay.gm_events_queue("gm1")))
            await refused(lm0, consume(lay.user_queue("alice")))

    asyncio.run(run())


@needs_broker
def test_forged_state_updates_and_events_are_refused(
    fed: Fed,
) -> None:
    lay, creds = fed
    forged = b"StateUpdated(lm0, version=2**62)"

    async def run() -> None:
        async with (
            connected(creds, user("alice")) as alice,
            connected(creds, gm("gm0")) as gm0,
            connected(creds, lm("lm0")) as lm0,
            connected(creds, workers("lm0")) as pool,
            connected(creds, OPERATOR) as op,
        ):
            attempts: list[tuple[AbstractConnection, Action]] = [
                (alice, publish(lay.state_exchange, "lm0", forged)),
                (alice, publish(lay.events_exchange, gm_event_key("gm0", "lm0"), b"finished")),
                (alice, publish(lay.events_exchange, user_event_key("bob", "lm0"), b"finished")),
                (gm0, publish(lay.state_exchange, "lm0", forged)),
                (gm0, publish(lay.events_exchange, user_event_key("bob", "gm0"), b"failed")),
                (gm0, publish(lay.events_exchange, gm_event_key("gm1", "lm0"), b"finished")),
                (lm0, publish(lay.state_exchange, "lm1", forged)),  # as another LM
                (lm0, publish(lay.events_exchange, gm_event_key("gm0", "lm1"), b"x")),
                # an LM forging a user's outcome (issue 32 item 7)
                (lm0, publish(lay.events_exchange, user_event_key("alice", "lm0"), b"x")),
                (lm0, publish(lay.submit_exchange, "alice", b"job")),
                (pool, publish(lay.state_exchange, "lm0", forged)),
                (pool, publish(lay.events_exchange, gm_event_key("gm0", "lm0"), b"x")),
            ]
            for conn, action in attempts:
                assert "ACCESS_REFUSED" in await refused(conn, action)
            for g in lay.gms:
                assert await depth(op, lay.gm_state_queue(g)) == 0
                assert await depth(op, lay.gm_events_queue(g)) == 0

    asyncio.run(run())


@needs_broker
def test_nobody_but_the_operator_changes_the_topology(
    fed: Fed,
) -> None:
    lay, creds = fed

    async def declare_exchange(ch: AbstractChannel) -> object:
        return await ch.declare_exchange(f"{lay.federation}.mine", aio_pika.ExchangeType.TOPIC)

    async def declare_named_queue(ch: AbstractChannel) -> object:
        return await ch.declare_queue(lay.user_queue("alice"), durable=True)

    async def rebind(ch: AbstractChannel) -> object:
        q = await ch.get_queue(lay.user_queue("alice"), ensure=False)
        return await q.bind(lay.submit_exchange, routing_key="#")

    async def delete_exchange(ch: AbstractChannel) -> object:
        return await ch.exchange_delete(lay.state_exchange)

    async def run() -> None:
        async with (
            connected(creds, user("alice")) as alice,
            connected(creds, gm("gm0")) as gm0,
            connected(creds, lm("lm0")) as lm0,
        ):
            for conn in (alice, gm0, lm0):
                for action in (declare_exchange, declare_named_queue, rebind, delete_exchange):
                    await refused(conn, action)

    asyncio.run(run())


@needs_broker
def test_guest_and_wrong_passwords_cannot_log_in(
    fed: Fed,
) -> None:
    lay, creds = fed

    async def run() -> None:
        # guest logs in to the broker, but the federation's vhost refuses it (the broker
        # answers Connection.Close 530 NOT_ALLOWED, which aiormq reports as a bad frame)
        guest = await aio_pika.connect(ADMIN_URL, timeout=5)
        await guest.close()
        with pytest.raises(aiormq.exceptions.AMQPError) as exc:
            await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:5672/{lay.vhost}", timeout=5)
        assert "Connection.Close" in str(exc.value)
        assert "guest" not in Rabbitmqctl().users_with_access(lay.vhost)
        wrong = creds.url(user("alice")).replace(creds.passwords[str(user("alice"))], "guessed")
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(wrong, timeout=5)

    asyncio.run(run())


@needs_broker
def test_provision_refuses_a_taken_vhost_reprovisions_and_tears_down() -> None:
    lay = BrokerLayout(f"megha-sectest-{secrets.token_hex(4)}", ("gm0",), ("lm0",), (("u", "gm0"),))
    creds = make_credentials(lay, ADMIN_URL)
    ctl = Rabbitmqctl()
    try:
        provision(lay, creds, ctl)
        with pytest.raises(ConfigError) as exc:
            provision(lay, creds, ctl)
        assert exc.value.reason == "vhost_exists"
        # a party that is not in the layout any more loses access when provisioned again
        ctl.run("set_permissions", "-p", lay.vhost, "guest", ".*", ".*", ".*")
        provision(lay, creds, ctl, allow_existing=True)
        assert sorted(ctl.users_with_access(lay.vhost)) == sorted(
            lay.broker_user(i) for i in lay.identities()
        )

        async def login() -> None:
            async with connected(creds, user("u")):
                pass

        asyncio.run(login())
    finally:
        teardown(lay, ctl)
    assert not ctl.vhost_exists(lay.vhost)
    names = {r["user"] for r in ctl.json("list_users")}
    assert not names & {lay.broker_user(i) for i in lay.identities()}


def _logging_ctl(log: Path, script: str) -> Rabbitmqctl:
    """A rabbitmqctl stand-in that appends each call's arguments to ``log``, then runs
    ``script`` (``$@``: the arguments after ``-q``)."""
    return Rabbitmqctl(("/bin/sh", "-c", f'echo "$*" >> {log}; shift; {script}', "sh"))


def test_deleting_users_falls_back_to_one_delete_user_each(tmp_path: Path) -> None:
    """A broker whose ``eval`` fails or does not answer ``true`` (another version, a
    deletion that failed part-way) still gets every user deleted, one by one."""
    for eval_does in ("exit 70", "echo false"):
        log = tmp_path / "calls"
        log.unlink(missing_ok=True)
        ctl = _logging_ctl(log, f'[ "$1" = eval ] && {{ {eval_does}; exit 0; }}; exit 0')
        ctl.delete_users(["a.gm.gm0", "a.user.u"])
        calls = log.read_text().splitlines()
        assert calls[0].startswith("-q eval lists:all(")
        assert sorted(calls[1:]) == ["-q delete_user a.gm.gm0", "-q delete_user a.user.u"]
    log.unlink()
    _logging_ctl(log, "exit 0").delete_users([])
    assert not log.exists()  # nothing to delete: no VM started


@needs_broker
def test_users_are_deleted_in_one_call_whatever_their_names(tmp_path: Path) -> None:
    """One ``rabbitmqctl`` for all of them; a name that would end an Erlang string or
    binary literal is data, not code; an absent user is skipped."""
    real = shutil.which("rabbitmqctl")
    assert real is not None
    odd = f'megha-sectest-{secrets.token_hex(4)}">>, exit(injected), <<"'
    plain = f"megha-sectest-{secrets.token_hex(4)}.user.u"
    ctl = Rabbitmqctl()
    for name in (odd, plain):
        ctl.run("add_user", name, secrets.token_hex(8))
    log = tmp_path / "calls"
    try:
        _logging_ctl(log, f'exec {real} -q "$@"').delete_users([odd, plain, "megha-absent"])
        assert len(log.read_text().splitlines()) == 1
    finally:
        ctl.run_all([["delete_user", n] for n in (odd, plain)], absent_ok=True)
    assert not {odd, plain} & set(ctl.users())


@needs_broker
def test_teardown_deletes_the_users_an_older_config_left() -> None:
    """`megha up` on a config without user `gone` only took its access; `megha down
    --purge` deletes its broker user too, and every other one of the federation."""
    fed = f"megha-sectest-{secrets.token_hex(4)}"
    older = BrokerLayout(fed, ("gm0",), ("lm0",), (("u", "gm0"), ("gone", "gm0")))
    now = BrokerLayout(fed, ("gm0",), ("lm0",), (("u", "gm0"),))
    ctl = Rabbitmqctl()
    try:
        provision(older, make_credentials(older, ADMIN_URL), ctl)
        provision(now, make_credentials(now, ADMIN_URL), ctl, allow_existing=True)
        assert f"{fed}.user.gone" not in ctl.users_with_access(fed)
        assert f"{fed}.user.gone" in ctl.users()
    finally:
        left = teardown(now, ctl)
    assert left == [f"{fed}.user.gone"]
    assert not [n for n in ctl.users() if n.startswith(f"{fed}.")]


@needs_broker
def test_declaring_again_keeps_a_queue_made_with_other_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--insecure-dev`` on a topology declared before its limits changed: RabbitMQ
    would refuse the redeclare (PRECONDITION_FAILED); the queue is kept, with a warning."""
    cfg = FederationConfig(name=f"megha-sectest-{secrets.token_hex(4)}", gms=1, lms=1).validate()
    url = f"amqp://guest:guest@127.0.0.1:5672/{cfg.name}"
    ctl = Rabbitmqctl()

    async def run() -> int:
        async with contextlib.AsyncExitStack() as stack:
            conn = await stack.enter_async_context(await aio_pika.connect(url, timeout=5))
            ch = await conn.channel()
            await ch.declare_queue(cfg.dead_letter_queue, durable=True)  # older arguments
            await declare_topology(cfg, url)
            ch = await conn.channel()
            for q in topology(BrokerLayout.from_config(cfg)).queues:
                await ch.declare_queue(q.name, passive=True)  # every queue is there
            return len(topology(BrokerLayout.from_config(cfg)).queues)

    ctl.run("add_vhost", cfg.name)
    try:
        ctl.run("set_permissions", "-p", cfg.name, "guest", ".*", ".*", ".*")
        assert asyncio.run(run()) > 1
    finally:
        ctl.run("delete_vhost", cfg.name, absent_ok=True)
    assert any(cfg.dead_letter_queue in r.getMessage() for r in caplog.records)
