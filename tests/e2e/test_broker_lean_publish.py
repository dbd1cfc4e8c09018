"""``runtime.broker``'s lean publish path on the real RabbitMQ: many publishes at once,
some through aiormq's own ``basic_publish`` on the same channel meanwhile (a dead
letter), bodies from empty to several frames long, one unroutable among them: each
confirm settles its own publish (the unroutable one alone raises), and every message
comes back whole, delivered through the consumer channel's lean reader.  A private
topology (a unique federation name) on the shared broker, deleted afterwards."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq.exceptions
import pytest

from common import broker_names as names
from common.config import FederationConfig
from runtime import broker as amqp
from tests.e2e.conftest import private_topology

pytestmark = pytest.mark.e2e


def config() -> FederationConfig:
    return private_topology("e2e-lean")


async def round_trip(cfg: FederationConfig) -> tuple[dict[str, bytes], dict[str, bytes], int]:
    await amqp.declare_topology(cfg, cfg.broker_url)
    b = amqp.Broker(cfg, "gm0", urls=[cfg.broker_url])
    try:
        await b.open(prefetch=50)
        key = names.gm_event_key("gm0", "lm0")
        sizes = [0, 1, 600, 131_072 - 8, 131_072 - 7, 300_000]
        sent = {f"m{i}": bytes([i % 256]) * sizes[i % len(sizes)] for i in range(120)}
        assert b.pub is not None
        raw: Any = await b.pub.get_underlay_channel()

        async def one(mid: str) -> None:
            if mid == "m7":  # aiormq's own publish, on the same channel, meanwhile
                props = amqp.Properties(amqp.MSGPACK, None, 2, mid)
                await raw.basic_publish(
                    sent[mid], exchange=b.ex.events.name, routing_key=key, properties=props
                )
                return
            await b.publish("events", key, amqp.persistent(sent[mid], message_id=mid))

        async def lost() -> None:
            await b.publish("events", "gm.nobody.lm0", amqp.persistent(b"lost"))

        results = await asyncio.gather(
            *(one(m) for m in list(sent)[:60]), lost(), *(one(m) for m in list(sent)[60:]),
            return_exceptions=True,
        )  # fmt: skip
        refused = [r for r in results if r is not None]
        assert len(refused) == 1
        assert isinstance(refused[0], aiormq.exceptions.DeliveryError)
        assert not raw.confirmations
        assert not raw.message_id_delivery_tag

        got: dict[str, bytes] = {}
        full = asyncio.Event()

        async def handler(msg: amqp.Delivery) -> None:
            assert msg.message_id is not None
            got[msg.message_id] = msg.body
            await msg.ack()
            if len(got) == len(sent):
                full.set()

        assert b.sub is not None
        q = await amqp.open_queue(b.sub, cfg.gm_events_queue("gm0"))
        await b.consume(q, handler)
        await asyncio.wait_for(full.wait(), 60)
        return sent, got, b.publish_errors
    finally:
        await b.close()
        await amqp.delete_topology(cfg, cfg.broker_url)


def test_every_publish_is_confirmed_as_its_own_and_comes_back_whole() -> None:
    sent, got, errors = asyncio.run(round_trip(config()))
    assert got == sent
    assert errors == 0
