"""Deliveries a GM holds unacknowledged until what it made of them is on the broker
(``global_master.app``): a task-event batch until its outcomes and returned tasks are
published -- by the flush that publishes the last of them, so no task waits per
delivery -- and a job until the core settles it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from runtime import broker as amqp
from runtime.supervisor import Supervisor

log = logging.getLogger("megha.gm")


class Held:
    """An event delivery held unacknowledged until what the core made of it (task
    outcomes, returned tasks: ``left`` of them) is on the broker.  A failed publication
    of any of them keeps it unacknowledged: the broker delivers it again (to this GM
    once its channel is gone, or to the next)."""

    __slots__ = ("failed", "left", "msg")

    def __init__(self, msg: amqp.Delivery) -> None:
        self.msg = msg
        self.left = 0
        self.failed = False


async def published(items: list[tuple[Any, Held | None]]) -> None:
    """``items`` are on the broker: the deliveries of which they were the last, acked
    (a broker's delivery at once, ``settle``: no coroutine per ack)."""
    for _, held in items:
        if held is not None:
            held.left -= 1
            if not held.left and not held.failed:
                msg = held.msg
                if type(msg) is amqp.Delivery:
                    settle(msg)
                else:
                    await ack(msg)


def unpublished(items: list[tuple[Any, Held | None]]) -> None:
    """``items`` failed to go out: their deliveries are never acked here."""
    for _, held in items:
        if held is not None:
            held.failed = True


async def ack(msg: amqp.Delivery) -> None:
    try:
        await msg.ack()
    except Exception as exc:  # channel gone: the broker will redeliver; the core knows it
        log.warning("ack failed (%s): the message will be redelivered and recognised", exc)


def settle(msg: amqp.Delivery) -> None:
    """``ack`` of a broker's own delivery, without a coroutine or a task: it leaves with
    its channel's other acks of this loop turn (``amqp.Delivery.ack_now``).  A delivery
    of another kind (a stand-in with only ``async ack``) goes through ``ack``."""
    try:
        msg.ack_now()
    except Exception as exc:  # settled already: the broker will redeliver; the core knows it
        log.warning("ack failed (%s): the message will be redelivered and recognised", exc)


class SettledJobs:
    """Job deliveries the core settled during a loop turn, acked at its end: after the
    turn's job history records (``before``: the rest of its effects too), with no task
    per ack (a broker's delivery is acked at once: ``settle``)."""

    __slots__ = ("_msgs", "before", "sup")

    def __init__(self, before: Callable[[], None], sup: Supervisor) -> None:
        self.before = before
        self.sup = sup
        self._msgs: list[amqp.Delivery] = []

    def add(self, msg: amqp.Delivery) -> None:
        if not self._msgs:
            asyncio.get_running_loop().call_soon(self._ack)
        self._msgs.append(msg)

    def _ack(self) -> None:
        msgs, self._msgs = self._msgs, []
        self.before()
        for msg in msgs:
            if type(msg) is amqp.Delivery:
                settle(msg)
            else:
                self.sup.spawn(ack(msg), "job ack")
