"""What a pure core asks its driver to do.  Drivers (the simulator, the aiohttp and
aio-pika services) carry effects out; the cores never touch a socket or a clock."""

from __future__ import annotations

from dataclasses import dataclass

from common.ids import GmId, LmId, NodeIndex
from common.messages import (
    LaunchRequest,
    LaunchResponse,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StartTask,
    StateSnapshot,
    StateUpdated,
    StopTask,
    TaskEvent,
    TaskFailed,
)
from common.model import Phase


@dataclass(frozen=True, slots=True)
class ToLm:
    """GM -> LM, synchronous request (HTTP in the live federation)."""

    lm: LmId
    msg: LaunchRequest | PreemptRequest | SnapshotRequest


@dataclass(frozen=True, slots=True)
class ToGm:
    """LM -> one GM: a response to its request, a snapshot, or a task event."""

    gm: GmId
    msg: LaunchResponse | PreemptResponse | StateSnapshot | TaskEvent


@dataclass(frozen=True, slots=True)
class ToAllGms:
    """LM -> every GM: the periodic state update (a RabbitMQ fan-out when live)."""

    msg: StateUpdated


@dataclass(frozen=True, slots=True)
class ToWorker:
    """LM -> the worker hosting ``node``."""

    node: NodeIndex
    msg: StartTask | StopTask


@dataclass(frozen=True, slots=True)
class Report:
    """A fact for result listeners only (a task the GM gave up on)."""

    msg: TaskFailed


Effect = ToLm | ToGm | ToAllGms | ToWorker | Report


def stamp_sent(effects: list[Effect], at: float) -> None:
    """Charge a GM's decision time up to ``at`` and put its dispatched tasks on the wire."""
    for eff in effects:
        if isinstance(eff, ToLm):
            msg = eff.msg
            if isinstance(msg, LaunchRequest):
                for p in msg.placements:
                    p.task.enter(Phase.COMMUNICATION, at)
            elif isinstance(msg, PreemptRequest):
                msg.task.enter(Phase.COMMUNICATION, at)
