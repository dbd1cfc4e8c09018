"""The federation's RabbitMQ side, shared by every service and the request generator.

Topology (every name under the federation's prefix ``<name>``):

* ``<name>.submit`` (direct): jobs, routing key = user -> durable queue
  ``<name>.user.<user>`` (classic or quorum; dead-letter exchange ``<name>.dlx``).
* ``<name>.dlx`` (fanout) -> ``<name>.dead``: refused messages, the reason in the
  ``x-megha-reason`` header.
* ``<name>.state`` (fanout): LM state updates to every GM (transient per-GM queues).
* ``<name>.events`` (topic): LM task events to the placing GM (``gm.<gm>`` -> durable
  queue ``<name>.gm.<gm>.events``), and task outcomes to their users (``user.<user>``
  -> durable queue ``<name>.user.<user>.outcomes``).

``Broker`` publishes persistent messages with confirms (an unroutable one raises),
consumes with a bounded prefetch, and wraps every consumer so that nothing loops
forever: bad input is dead-lettered at once with its reason; any other exception
requeues the message once and dead-letters it when it comes back and fails again.
The broker may be a cluster (``broker_url`` lists its nodes, comma-separated): a lost
connection fails over to the next node that answers, the process's setups (queues,
consumers) run again there, then ``on_reconnect`` (a GM asks for fresh snapshots).
With ``queue_type = "quorum"`` every durable queue is a quorum queue, replicated
over the cluster, so losing one node loses no job, event or outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)

from common.config import FederationConfig
from common.errors import MeghaError
from runtime.retry import Backoff, retry

REASON_HEADER = "x-megha-reason"
log = logging.getLogger("megha.broker")

OnMessage = Callable[[AbstractIncomingMessage], Awaitable[None]]
PUBLISH_ERRORS = (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError)
TRANSIENT = (
    aio_pika.exceptions.AMQPConnectionError,
    aio_pika.exceptions.ChannelInvalidStateError,
    aio_pika.exceptions.ChannelClosed,
    ConnectionError,
    RuntimeError,
    TimeoutError,
)
"""Publish failures worth another try once the connection recovers (a refusal -- an
unroutable message, a nack -- is not one of them)."""
CONNECT_ERRORS = (ConnectionError, OSError, aio_pika.exceptions.AMQPError, TimeoutError)
CONNECT_TIMEOUT_S = 5.0


def persistent(body: bytes, *, message_id: str | None = None, **headers: str) -> aio_pika.Message:
    return aio_pika.Message(
        body,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        content_type="application/x-msgpack",
        message_id=message_id,
        headers=dict(headers) if headers else None,
    )


def transient(body: bytes, *, message_id: str | None = None) -> aio_pika.Message:
    return aio_pika.Message(body, content_type="application/x-msgpack", message_id=message_id)


async def connect(cfg: FederationConfig, url: str | None = None) -> AbstractConnection:
    """One plain connection to ``url`` (default: the first of the federation's brokers)."""
    target = url or cfg.broker_urls[0]
    conn: AbstractConnection = await aio_pika.connect(target, timeout=CONNECT_TIMEOUT_S)
    return conn


async def connect_any(cfg: FederationConfig, *, start: int = 0) -> tuple[AbstractConnection, int]:
    """A connection to the first broker node that answers, trying them in turn from
    ``start``; raises the last error when none does."""
    urls = cfg.broker_urls
    last: BaseException | None = None
    for k in range(len(urls)):
        i = (start + k) % len(urls)
        try:
            return await connect(cfg, urls[i]), i
        except CONNECT_ERRORS as exc:
            last = exc
    assert last is not None
    raise last


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
    dead = await ch.declare_queue(
        cfg.dead_letter_queue, durable=True, arguments={"x-queue-type": cfg.queue_type}
    )
    await dead.bind(dlx, routing_key="")
    return Exchanges(submit, state, events, dlx)


async def declare_outcomes_queue(
    ch: AbstractChannel, cfg: FederationConfig, ex: Exchanges, user: str
) -> AbstractQueue:
    """A user's durable queue of task outcomes (declared by GMs and by clients)."""
    args: dict[str, Any] = {"x-queue-type": cfg.queue_type}
    q = await ch.declare_queue(cfg.user_outcomes_queue(user), durable=True, arguments=args)
    await q.bind(ex.events, routing_key=f"user.{user}")
    return q


async def declare_events_queue(
    ch: AbstractChannel, cfg: FederationConfig, gm: str
) -> AbstractQueue:
    """A GM's durable queue of task events from every LM."""
    args: dict[str, Any] = {"x-queue-type": cfg.queue_type}
    q = await ch.declare_queue(cfg.gm_events_queue(gm), durable=True, arguments=args)
    await q.bind(cfg.events_exchange, routing_key=f"gm.{gm}")
    return q


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


Setup = Callable[[], Awaitable[None]]


class Broker:
    """One process's connection: a confirming publisher channel and a consumer channel.

    The connection fails over: when it closes, the broker nodes are tried in turn
    (``cfg.broker_urls``, a cluster) until one answers; the channels and exchanges
    are made again, then every registered setup (queue declarations, consumers) runs
    again, then ``on_reconnect``.  Publishes wait for the connection meanwhile.
    """

    def __init__(self, cfg: FederationConfig, name: str) -> None:
        self.cfg = cfg
        self.name = name
        self.conn: AbstractConnection | None = None
        self.pub: AbstractChannel | None = None
        self.sub: AbstractChannel | None = None
        self._ex: Exchanges | None = None
        self._prefetch = cfg.prefetch
        self._setups: list[Setup] = []
        self._url_index = 0
        self._connected = asyncio.Event()
        self._closing = False
        self._recovery: asyncio.Task[None] | None = None
        self.on_reconnect: Callable[[], None] | None = None
        self.on_disconnect: Callable[[], None] | None = None
        self.dead_lettered = 0
        self.publish_errors = 0
        self.handler_errors = 0
        self.reconnects = 0

    @property
    def ex(self) -> Exchanges:
        assert self._ex is not None, "the broker is not open"
        return self._ex

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def url(self) -> str:
        """The broker node this process is connected to (or will try next)."""
        return self.cfg.broker_urls[self._url_index]

    async def open(self, *, prefetch: int | None = None) -> None:
        """Connect (retrying for up to a minute) and make the channels and exchanges."""
        if prefetch is not None:
            self._prefetch = prefetch
        await retry(
            self._connect_once,
            Backoff(first_s=0.2, cap_s=2.0, deadline_s=60.0),
            what=f"{self.name}: connect to the broker",
            retry_on=CONNECT_ERRORS,
        )

    async def _connect_once(self) -> None:
        conn, i = await connect_any(self.cfg, start=self._url_index)
        self._url_index = i
        try:
            pub = await conn.channel(publisher_confirms=True, on_return_raises=True)
            ex = await declare_exchanges(pub, self.cfg)
            sub = await conn.channel(publisher_confirms=False)
            await sub.set_qos(prefetch_count=self._prefetch)
            self.conn, self.pub, self.sub, self._ex = conn, pub, sub, ex
            for setup in self._setups:
                await setup()
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        conn.close_callbacks.add(self._lost)
        self._connected.set()

    def _lost(self, *_: object) -> None:
        """The connection closed: fail over unless this process is shutting down."""
        self._connected.clear()
        if self._closing:
            return
        log.warning("%s: broker connection to %s lost; failing over", self.name, self.url)
        if self.on_disconnect is not None:
            self.on_disconnect()
        self._url_index = (self._url_index + 1) % len(self.cfg.broker_urls)
        if self._recovery is None or self._recovery.done():
            self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        await retry(
            self._connect_once,
            Backoff(first_s=0.1, cap_s=2.0, deadline_s=None),
            what=f"{self.name}: reconnect to the broker",
            retry_on=CONNECT_ERRORS,
        )
        self.reconnects += 1
        log.warning("%s: broker connection recovered on %s", self.name, self.url)
        if self.on_reconnect is not None:
            self.on_reconnect()

    async def add_setup(self, setup: Setup) -> None:
        """Run ``setup`` now and after every reconnection (declare queues, consume)."""
        self._setups.append(setup)
        if self.connected:
            await setup()

    async def close(self) -> None:
        self._closing = True
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._recovery
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()

    async def publish(
        self,
        exchange: str,
        routing_key: str,
        message: aio_pika.Message,
        *,
        mandatory: bool = True,
        policy: Backoff | None = None,
    ) -> None:
        """Publish to the exchange named by its role (``submit``, ``events``, ``state``,
        ``dlx``) and wait for the broker's confirm, retrying transient failures (across
        a failover: the exchange is looked up again on each attempt)."""

        async def once() -> None:
            if not self._connected.is_set():
                raise ConnectionError("not connected to the broker")
            ex: AbstractExchange = getattr(self.ex, exchange)
            await ex.publish(message, routing_key=routing_key, mandatory=mandatory)

        def count(_: BaseException) -> None:
            self.publish_errors += 1

        await retry(
            once,
            policy or Backoff(first_s=0.05, cap_s=2.0, deadline_s=None),
            what=f"{self.name}: publish to {exchange}/{routing_key}",
            retry_on=TRANSIENT,
            on_retry=count,
        )

    async def dead_letter(
        self, msg: AbstractIncomingMessage, queue: str, reason: str, detail: str
    ) -> None:
        """Refuse a message: to the dead-letter exchange with its reason, then ack."""
        self.dead_lettered += 1
        log.info("%s: dead-lettering a message from %s: %s (%s)", self.name, queue, detail, reason)
        try:
            headers = {
                **(msg.headers or {}),
                REASON_HEADER: reason,
                "x-megha-detail": detail[:500],
                "x-megha-queue": queue,
            }
            await self.ex.dlx.publish(
                aio_pika.Message(
                    msg.body, headers=headers, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                ),
                routing_key="",
            )
        except PUBLISH_ERRORS:  # the queue's own dead-lettering still keeps the message
            log.exception("%s: dead-letter publish failed; rejecting instead", self.name)
            with contextlib.suppress(*PUBLISH_ERRORS):
                await msg.reject(requeue=False)
            return
        with contextlib.suppress(*PUBLISH_ERRORS):
            await msg.ack()

    async def consume(
        self, queue: AbstractQueue, handler: OnMessage, *, no_ack: bool = False
    ) -> None:
        """Consume ``queue`` with ``handler``; nothing a handler raises loops forever."""

        async def guarded(msg: AbstractIncomingMessage) -> None:
            try:
                await handler(msg)
            except MeghaError as exc:
                if not no_ack:
                    await self.dead_letter(msg, queue.name, exc.reason, str(exc))
            except Exception as exc:
                self.handler_errors += 1
                log.exception("%s: consumer of %s failed", self.name, queue.name)
                if no_ack:
                    return
                with contextlib.suppress(*PUBLISH_ERRORS):
                    if msg.redelivered:
                        await self.dead_letter(
                            msg, queue.name, "handler_error", f"{type(exc).__name__}: {exc}"
                        )
                    else:
                        await msg.nack(requeue=True)

        await queue.consume(guarded, no_ack=no_ack)


async def delete_topology(cfg: FederationConfig) -> None:
    """Remove every queue and exchange of the federation named ``cfg.name`` (tests, ``megha down --purge``)."""
    conn, _ = await connect_any(cfg)
    try:
        names = [cfg.user_queue(u.user) for u in cfg.user_configs]
        names += [cfg.user_outcomes_queue(u.user) for u in cfg.user_configs]
        names += [cfg.gm_events_queue(g) for g in cfg.gm_ids]
        names += [cfg.lm_epoch_queue(lm) for lm in cfg.lm_ids]
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
