"""A GM's RabbitMQ side: its users' durable queues, LM state updates, task events.

Submissions are acknowledged only when every task of the job is accepted by an LM
or has failed explicitly: a GM killed before that leaves the job unacked, the
broker redelivers it to the restarted GM, and LM snapshots (``placed_by_gm``) tell
which of its tasks already run, so none runs twice.  Refused submissions go to the
dead-letter exchange with the reason in a header, then are acked.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from common import broker
from common.config import FederationConfig
from common.errors import MeghaError

log = logging.getLogger("megha.gm.amqp")

OnMessage = Callable[[AbstractIncomingMessage], Awaitable[None]]


class GmBroker:
    """Connections, topology and consumers of one GM."""

    def __init__(self, cfg: FederationConfig, gm: str) -> None:
        self.cfg = cfg
        self.gm = gm
        self.conn: AbstractRobustConnection | None = None
        self.pub: AbstractChannel | None = None
        self.sub: AbstractChannel | None = None
        self.ex: broker.Exchanges | None = None
        self.user_queues: dict[str, AbstractQueue] = {}
        self.dead_lettered = 0

    async def open(self) -> None:
        self.conn = await broker.connect(self.cfg)
        self.pub = await broker.channel(self.conn)
        self.ex = await broker.declare_exchanges(self.pub, self.cfg)
        self.sub = await broker.channel(self.conn, confirms=False)
        await self.sub.set_qos(prefetch_count=self.cfg.prefetch)
        for u in self.cfg.user_configs:
            if u.gm == self.gm:
                self.user_queues[u.user] = await broker.declare_user_queue(
                    self.sub, self.cfg, self.ex, u.user
                )

    async def consume(
        self,
        on_state: OnMessage,
        on_events: OnMessage,
        on_job: Callable[[str, AbstractIncomingMessage], Awaitable[None]],
    ) -> None:
        """Start consuming; call after the GM's views are built from LM snapshots."""
        assert self.sub is not None
        assert self.ex is not None
        state_q = await self.sub.declare_queue(exclusive=True, auto_delete=True)
        await state_q.bind(self.cfg.state_exchange, routing_key="")
        await state_q.consume(on_state, no_ack=True)
        events_q = await self.sub.declare_queue(self.cfg.gm_events_queue(self.gm), durable=True)
        await events_q.bind(self.cfg.events_exchange, routing_key=f"gm.{self.gm}")
        await events_q.consume(on_events)
        for user, q in self.user_queues.items():

            async def job(msg: AbstractIncomingMessage, user: str = user) -> None:
                await on_job(user, msg)

            await q.consume(job)

    async def dead_letter(self, msg: AbstractIncomingMessage, queue: str, exc: MeghaError) -> None:
        """Refuse a message: to the dead-letter exchange with its reason, then ack."""
        assert self.ex is not None
        self.dead_lettered += 1
        log.info("dead-lettering a message from %s: %s (%s)", queue, exc, exc.reason)
        try:
            headers = {
                **(msg.headers or {}),
                broker.REASON_HEADER: exc.reason,
                "x-megha-detail": str(exc)[:500],
                "x-megha-queue": queue,
            }
            await self.ex.dlx.publish(
                aio_pika.Message(
                    msg.body, headers=headers, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                ),
                routing_key="",
            )
        except Exception:  # the broker's own dead-lettering still keeps the message
            log.exception("dead-letter publish failed; rejecting instead")
            await msg.reject(requeue=False)
            return
        await msg.ack()

    async def publish_failure(self, body: bytes) -> None:
        assert self.ex is not None
        await self.ex.events.publish(broker.persistent(body), routing_key=f"failed.{self.gm}")

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
