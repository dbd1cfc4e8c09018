"""The federation's RabbitMQ topology, declared the same way by every party.

* ``<name>.submit`` (direct): jobs, routing key = user -> durable quorum queue
  ``<name>.user.<user>`` (delivery limit, dead-letter exchange ``<name>.dlx``).
* ``<name>.dlx`` (fanout) -> ``<name>.dead``: refused submissions, with the reason in
  the ``x-megha-reason`` header.
* ``<name>.state`` (fanout): LM state updates to every GM (transient per-GM queues).
* ``<name>.events`` (topic): task events, routing key ``gm.<gm>`` (the placing GM's
  durable queue) and ``failed.<gm>`` (tasks a GM gave up on); result listeners bind ``#``.
"""

from __future__ import annotations

from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    AbstractRobustConnection,
)

from common.config import FederationConfig

REASON_HEADER = "x-megha-reason"


async def connect(cfg: FederationConfig) -> AbstractRobustConnection:
    conn: AbstractRobustConnection = await aio_pika.connect_robust(cfg.broker_url, timeout=5)
    return conn


async def channel(conn: AbstractRobustConnection, *, confirms: bool = True) -> AbstractChannel:
    ch: AbstractChannel = await conn.channel(publisher_confirms=confirms, on_return_raises=confirms)
    return ch


class Exchanges:
    """The four exchanges of a federation, declared on one channel."""

    def __init__(
        self,
        submit: AbstractExchange,
        state: AbstractExchange,
        events: AbstractExchange,
        dlx: AbstractExchange,
    ) -> None:
        self.submit = submit
        self.state = state
        self.events = events
        self.dlx = dlx


async def declare_exchanges(ch: AbstractChannel, cfg: FederationConfig) -> Exchanges:
    submit = await ch.declare_exchange(
        cfg.submit_exchange, aio_pika.ExchangeType.DIRECT, durable=True
    )
    state = await ch.declare_exchange(cfg.state_exchange, aio_pika.ExchangeType.FANOUT)
    events = await ch.declare_exchange(
        cfg.events_exchange, aio_pika.ExchangeType.TOPIC, durable=True
    )
    dlx = await ch.declare_exchange(
        cfg.dead_letter_exchange, aio_pika.ExchangeType.FANOUT, durable=True
    )
    dead = await ch.declare_queue(cfg.dead_letter_queue, durable=True)
    await dead.bind(dlx, routing_key="")
    return Exchanges(submit, state, events, dlx)


async def declare_user_queue(
    ch: AbstractChannel, cfg: FederationConfig, ex: Exchanges, user: str
) -> AbstractQueue:
    args: dict[str, Any] = {
        "x-queue-type": cfg.queue_type,
        "x-dead-letter-exchange": cfg.dead_letter_exchange,
    }
    if cfg.queue_type == "quorum":
        args["x-delivery-limit"] = cfg.delivery_limit
    q = await ch.declare_queue(cfg.user_queue(user), durable=True, arguments=args)
    await q.bind(ex.submit, routing_key=user)
    return q


async def declare_user_queues(
    ch: AbstractChannel, cfg: FederationConfig, ex: Exchanges
) -> dict[str, AbstractQueue]:
    return {u.user: await declare_user_queue(ch, cfg, ex, u.user) for u in cfg.user_configs}


def persistent(body: bytes, **headers: str) -> aio_pika.Message:
    return aio_pika.Message(
        body,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        content_type="application/x-msgpack",
        headers=dict(headers) if headers else None,
    )


def transient(body: bytes) -> aio_pika.Message:
    return aio_pika.Message(body, content_type="application/x-msgpack")


async def delete_topology(cfg: FederationConfig) -> None:
    """Remove every queue and exchange of the federation named ``cfg.name`` (tests, ``megha down --purge``)."""
    conn = await connect(cfg)
    try:
        names = [cfg.user_queue(u.user) for u in cfg.user_configs]
        names += [cfg.gm_events_queue(g) for g in cfg.gm_ids]
        names.append(cfg.dead_letter_queue)
        for q in names:
            ch = await conn.channel()
            try:
                await ch.queue_delete(q)
            except Exception:  # absent already: nothing to remove
                pass
            finally:
                if not ch.is_closed:
                    await ch.close()
        for ex in (
            cfg.submit_exchange,
            cfg.state_exchange,
            cfg.events_exchange,
            cfg.dead_letter_exchange,
        ):
            ch = await conn.channel()
            try:
                await ch.exchange_delete(ex)
            except Exception:  # absent already
                pass
            finally:
                if not ch.is_closed:
                    await ch.close()
    finally:
        await conn.close()
