"""Deliveries a GM holds unacknowledged until what it made of them is on the broker
(``global_master.app``): a task-event batch until its outcomes and returned tasks are
published -- by the flush that publishes the last of them, so no task waits per
delivery -- and a job until the core settles it."""

from __future__ import annotations

import logging
from typing import Any

from runtime import broker as amqp

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
    """``items`` are on the broker: the deliveries of which they were the last, acked."""
    for _, held in items:
        if held is not None:
            held.left -= 1
            if not held.left and not held.failed:
                await ack(held.msg)


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
