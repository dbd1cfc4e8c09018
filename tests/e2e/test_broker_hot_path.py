"""``runtime.broker`` on the real RabbitMQ, through aiormq's channels: what a consumer
acked (one by one, in a ``multiple`` ack, or out of order) never comes back after its
connection is lost; what it held, nacked or had not settled comes back, redelivered; an
unroutable publish still raises.  A private topology (a unique federation name) on the
shared broker, deleted afterwards."""

from __future__ import annotations

import asyncio

import aiormq.exceptions
import pytest

from common import broker_names as names
from common.config import FederationConfig
from runtime import broker as amqp
from tests.e2e.conftest import private_topology

pytestmark = pytest.mark.e2e


def config() -> FederationConfig:
    return private_topology("e2e-acks")


async def take(b: amqp.Broker, cfg: FederationConfig, n: int) -> list[amqp.Delivery]:
    """The first ``n`` deliveries of GM gm0's events queue, unsettled."""
    got: list[amqp.Delivery] = []
    full = asyncio.Event()

    async def handler(msg: amqp.Delivery) -> None:
        got.append(msg)
        if len(got) == n:
            full.set()
        await asyncio.Event().wait()  # held: settled by the test

    assert b.sub is not None
    q = await amqp.open_queue(b.sub, cfg.gm_events_queue("gm0"))
    await b.consume(q, handler)
    await asyncio.wait_for(full.wait(), 30)
    return got


async def acked_twice_over(cfg: FederationConfig) -> tuple[list[str], list[str], list[bool]]:
    await amqp.declare_topology(cfg, cfg.broker_url)
    try:
        first = amqp.Broker(cfg, "gm0", urls=[cfg.broker_url])
        await first.open(prefetch=50)
        key = names.gm_event_key("gm0", "lm0")
        for i in range(12):
            await first.publish("events", key, amqp.persistent(f"m{i}".encode()))
        with pytest.raises(aiormq.exceptions.DeliveryError):  # returned: no such binding
            await first.publish("events", "gm.nobody.lm0", amqp.persistent(b"lost"))
        got = await take(first, cfg, 12)
        for i in (0, 1, 2, 4, 5, 9):  # 3 and 6-8 held, 10 nacked back, 11 acked last
            await got[i].ack()
        await got[10].nack(requeue=True)
        await got[11].ack()
        await asyncio.sleep(0.5)  # the acks' turn of the loop, and the broker's
        acked = [got[i].body.decode() for i in (0, 1, 2, 4, 5, 9, 11)]
        await first.close()  # 3, 6, 7, 8 unsettled: back to the queue, as 10 is
        second = amqp.Broker(cfg, "gm0", urls=[cfg.broker_url])
        await second.open(prefetch=50)
        again = await take(second, cfg, 5)
        await asyncio.sleep(0.5)  # nothing more comes (it would be in ``again``)
        await second.close()
        back = sorted(m.body.decode() for m in again)
        return acked, back, [m.redelivered for m in again]
    finally:
        await amqp.delete_topology(cfg, cfg.broker_url)


def test_acked_deliveries_never_come_back_and_the_others_all_do() -> None:
    acked, back, redelivered = asyncio.run(acked_twice_over(config()))
    assert back == ["m10", "m3", "m6", "m7", "m8"]
    assert not set(back) & set(acked)
    assert all(redelivered)
