"""One user cannot stall the broker or LM fail-over (issue 32, item 3): per-user
connection and channel limits, a bounded events queue, no queue of a user's making
(the vhost's ``max-queues`` stays the LMs'), and a leader election that tells a
refusal from a lost race.  Against the shared RabbitMQ (marker ``broker_acl``), in a
vhost and users of its own, removed afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator

import aio_pika
import aiormq
import pytest

from common.broker_names import user_event_key
from runtime.election import Election, Outcome, classify
from security.broker_acl import (
    BrokerCredentials,
    BrokerLayout,
    Rabbitmqctl,
    make_credentials,
    provision,
    teardown,
)
from security.identity import OPERATOR, Identity, gm, lm, user
from tests.security.test_broker_acl import needs_broker

ADMIN_URL = "amqp://guest:guest@127.0.0.1:5672/"
Fed = tuple[BrokerLayout, BrokerCredentials]


@pytest.fixture(scope="module")
def fed() -> Iterator[Fed]:
    lay = BrokerLayout(
        federation=f"megha-limits-{secrets.token_hex(4)}", gms=("gm0",), lms=("lm0",),
        users=(("alice", "gm0"),), user_max_connections=2, user_max_channels=3,
        max_user_events=5, extra_queues=2,
    )  # fmt: skip
    creds = make_credentials(lay, ADMIN_URL)
    ctl = Rabbitmqctl()
    try:
        provision(lay, creds, ctl)
        yield lay, creds
    finally:
        teardown(lay, ctl)


@contextlib.asynccontextmanager
async def connected(creds: BrokerCredentials, who: Identity) -> AsyncIterator[aio_pika.abc.AbstractConnection]:  # fmt: skip
    conn = await aio_pika.connect(creds.url(who), timeout=5)
    try:
        yield conn
    finally:
        await conn.close()


@needs_broker
def test_a_user_holds_only_so_many_connections_and_channels(fed: Fed) -> None:
    _, creds = fed

    async def run() -> None:
        async with connected(creds, user("alice")) as a, connected(creds, user("alice")):
            with pytest.raises((aiormq.exceptions.AMQPError, ConnectionError)):
                await aio_pika.connect(creds.url(user("alice")), timeout=5)
            channels = [await a.channel() for _ in range(3)]
            with pytest.raises(aiormq.exceptions.AMQPError):
                await a.channel()
            for ch in channels:
                await ch.close()

    asyncio.run(run())


@needs_broker
def test_a_user_declares_no_queue(fed: Fed) -> None:
    _, creds = fed

    async def run() -> None:
        async with connected(creds, user("alice")) as a:
            ch = await a.channel()
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                await ch.declare_queue(exclusive=True, auto_delete=True)

    asyncio.run(run())


@needs_broker
def test_outcomes_no_one_reads_are_bounded_oldest_dropped(fed: Fed) -> None:
    lay, creds = fed

    async def run() -> None:
        # a user's outcomes come from its GM (an LM may publish none: issue 32 item 7)
        async with connected(creds, gm("gm0")) as gm0, connected(creds, OPERATOR) as op:
            ch = await gm0.channel(publisher_confirms=True)
            ex = await ch.get_exchange(lay.events_exchange, ensure=False)
            for i in range(8):
                body = f"outcome-{i}".encode()
                await ex.publish(aio_pika.Message(body), user_event_key("alice", "gm0"))
            och = await op.channel()
            q = await och.declare_queue(lay.user_events_queue("alice"), passive=True)
            assert q.declaration_result.message_count == 5
            first = await q.get(no_ack=True)
            assert first is not None
            assert first.body == b"outcome-3"

    asyncio.run(run())


async def _attempt(creds: BrokerCredentials, lay: BrokerLayout) -> BaseException | None:
    """One LM process's declaration of its leader queue (``LocalMaster._acquire``)."""
    conn = await aio_pika.connect(creds.url(lm("lm0")), timeout=5)
    try:
        ch = await conn.channel()
        await ch.declare_queue(lay.lm_leader_queue("lm0"), exclusive=True)
    except aiormq.exceptions.AMQPChannelError as exc:
        return exc
    finally:
        await conn.close()
    return None


@needs_broker
def test_a_full_vhost_is_a_refusal_of_the_lead_not_a_lost_race(fed: Fed) -> None:
    """With the vhost's queues all taken, the leader queue cannot be declared: the
    election says so (``REFUSED``, backing off) instead of "another process leads";
    a declaration held by another connection is a lost race."""
    lay, creds = fed

    async def run() -> None:
        assert classify(await _attempt(creds, lay)) is Outcome.LEADS
        async with connected(creds, lm("lm0")) as holder:
            ch = await holder.channel()
            await ch.declare_queue(lay.lm_leader_queue("lm0"), exclusive=True)
            assert classify(await _attempt(creds, lay)) is Outcome.LOST
        async with connected(creds, OPERATOR) as op:  # the vhost filled up
            och = await op.channel()
            for _ in range(lay.extra_queues):
                await och.declare_queue(exclusive=True)
            election = Election("lm0", period_s=0.1, max_backoff_s=0.4)
            waits = []
            for _ in range(4):
                outcome, wait = election.tried(await _attempt(creds, lay))
                assert outcome is Outcome.REFUSED
                waits.append(wait)
            assert waits == [0.1, 0.2, 0.4, 0.4]
            assert "queue limit" in election.last_refusal
            assert election.page()["attempts"]["refused"] == 4

    asyncio.run(run())
