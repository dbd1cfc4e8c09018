"""A full classic queue (``reject-publish``: a user's queue at its bound) nacks every
publish into it.  The shared publisher channel was then closed and opened again, as for
a quorum queue electing a leader, failing every confirm in flight on it -- the events
and outcomes published beside a hostile user's submissions.  Now it is kept: those
publishes are confirmed as they come, and the nacked one is refused in bounded time.
A private topology on the shared broker, deleted afterwards."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pytest

from common import broker_names as names
from common.config import FederationConfig
from runtime import broker as amqp
from runtime.retry import Backoff, GiveUp
from tests.e2e.conftest import private_topology

pytestmark = pytest.mark.e2e


def config() -> FederationConfig:
    return private_topology("e2e-full")


async def nack_beside_events(cfg: FederationConfig) -> tuple[int, bool, list[object]]:
    await amqp.declare_topology(cfg, cfg.broker_url)
    full = f"{cfg.name}.full-{uuid.uuid4().hex[:6]}"
    side = await aio_pika.connect(cfg.broker_url)
    b = amqp.Broker(cfg, "gm0", urls=[cfg.broker_url])
    try:
        ch = await side.channel()
        q = await ch.declare_queue(full, auto_delete=True, arguments={
            "x-max-length": 1, "x-overflow": "reject-publish"})  # fmt: skip
        await b.open(prefetch=50)
        await q.bind(b.ex.submit.name, routing_key="full.key")
        await b.publish("submit", "full.key", amqp.persistent(b"first"))  # fills it
        channel = b.pub
        key = names.gm_event_key("gm0", "lm0")

        async def nacked() -> object:
            try:
                await b.publish("submit", "full.key", amqp.persistent(b"second"),
                                policy=Backoff(first_s=0.02, cap_s=0.1, deadline_s=1.0))  # fmt: skip
            except GiveUp as exc:
                return exc.last
            return None

        async def event(i: int) -> object:
            await asyncio.sleep(0.005 * i)
            await b.publish("events", key, amqp.persistent(b"e%d" % i),
                            policy=Backoff(first_s=0.02, cap_s=0.1, deadline_s=0.0))  # fmt: skip
            return None

        results = await asyncio.gather(nacked(), *(event(i) for i in range(100)),
                                       return_exceptions=True)  # fmt: skip
        events = await amqp.open_queue(b.sub, cfg.gm_events_queue("gm0")) if b.sub else None
        assert events is not None
        got = 0
        while (m := await events.get(no_ack=True, fail=False)) is not None:
            got += 1
            del m
        return got, b.pub is channel, results
    finally:
        await b.close()
        await side.close()
        await amqp.delete_topology(cfg, cfg.broker_url)


def test_a_full_queue_nacks_its_publish_and_leaves_the_shared_channel_alone() -> None:
    got, same_channel, results = asyncio.run(nack_beside_events(config()))
    assert isinstance(results[0], amqp.Nacked)  # refused, in bounded time
    assert results[1:] == [None] * 100  # each event confirmed at its first try
    assert same_channel
    assert got == 100
