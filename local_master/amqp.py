"""An LM's RabbitMQ side: state updates to every GM (fan-out) and task events to
the placing GM (topic), batched per GM so a burst of events costs one publish."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from common import broker, codec
from common.config import FederationConfig
from common.messages import StateUpdated, TaskEvent

log = logging.getLogger("megha.lm.amqp")


class LmPublisher:
    """Publishes with confirms; events are batched per GM within one loop turn."""

    def __init__(self, cfg: FederationConfig) -> None:
        self.cfg = cfg
        self.conn: AbstractRobustConnection | None = None
        self.ch: AbstractChannel | None = None
        self.ex: broker.Exchanges | None = None
        self._events: dict[str, list[TaskEvent]] = {}
        self._flushing = False
        self._bg: set[asyncio.Task[None]] = set()
        self.published = 0
        self.publish_errors = 0

    async def open(self) -> None:
        self.conn = await broker.connect(self.cfg)
        self.ch = await broker.channel(self.conn)
        self.ex = await broker.declare_exchanges(self.ch, self.cfg)

    async def close(self) -> None:
        for t in list(self._bg):
            t.cancel()
        if self.conn is not None:
            await self.conn.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.ensure_future(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    async def publish_state(self, msg: StateUpdated) -> None:
        assert self.ex is not None
        try:
            await self.ex.state.publish(
                broker.transient(codec.encode(msg)), routing_key="", mandatory=False
            )
            self.published += 1
        except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            self.publish_errors += 1
            log.warning("state update not published: %s", exc)

    def event(self, ev: TaskEvent) -> None:
        self._events.setdefault(ev.gm, []).append(ev)
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)
            while self._events:
                batches, self._events = self._events, {}
                for gm, evs in batches.items():
                    await self._publish_events(gm, evs)
        finally:
            self._flushing = False

    async def _publish_events(self, gm: str, evs: list[TaskEvent]) -> None:
        assert self.ex is not None
        body = codec.encode_batch(evs)
        delay = 0.05
        for _ in range(20):
            try:
                await self.ex.events.publish(
                    broker.persistent(body), routing_key=f"gm.{gm}", mandatory=False
                )
                self.published += 1
                return
            except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
                self.publish_errors += 1
                log.warning("events for %s not published yet: %s", gm, exc)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)
        log.error("dropped %d task events for %s after retries", len(evs), gm)
