"""What a pure core asks its driver to do.

Every core has one entry, ``handle(message, now) -> list[Effect]``.  Drivers (the
simulator, the aiohttp and aio-pika services) deliver messages and carry effects out;
the cores never touch a socket, a clock or a process.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.messages import (
    CancelTasks,
    CommitGang,
    KeepEnds,
    LaunchRequest,
    PreemptRequest,
    RegisterWorkers,
    ReleaseGang,
    ReserveRequest,
    SnapshotRequest,
    StartTask,
    StateUpdated,
    StopTask,
    StopUserTasks,
    SubmitJob,
    TaskEvent,
    TaskOutcome,
    WorkerHeartbeat,
    WorkerReport,
)
from common.model import TaskSpec


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to the message being handled (an HTTP response when live)."""

    msg: object


@dataclass(frozen=True, slots=True)
class ToLm:
    """GM -> LM request (HTTP), or worker pool -> its LM (reports, heartbeats)."""

    lm: LmId
    msg: (
        LaunchRequest
        | PreemptRequest
        | SnapshotRequest
        | KeepEnds
        | CancelTasks
        | StopUserTasks
        | WorkerReport
        | WorkerHeartbeat
        | RegisterWorkers
        | ReserveRequest
        | CommitGang
        | ReleaseGang
    )


@dataclass(frozen=True, slots=True)
class ToGm:
    """LM -> the GM that placed a task: a task event (batched per GM by the driver)."""

    gm: GmId
    msg: TaskEvent


@dataclass(frozen=True, slots=True)
class ToAllGms:
    """LM -> every GM: the periodic state update (a RabbitMQ fan-out when live)."""

    msg: StateUpdated


@dataclass(frozen=True, slots=True)
class ToWorker:
    """LM -> the worker pool hosting ``msg.node`` (batched per pool by the driver)."""

    msg: StartTask | StopTask


@dataclass(frozen=True, slots=True)
class ToUser:
    """GM -> a task's user: its outcome (finished, or failed with the reason)."""

    user: UserId
    msg: TaskOutcome


@dataclass(frozen=True, slots=True)
class After:
    """Deliver ``msg`` back to this core ``delay`` seconds from now (a timer)."""

    delay: float
    msg: object


@dataclass(frozen=True, slots=True)
class JobSettled:
    """GM: every task of the job is accepted by an LM or has failed explicitly, so the
    job's delivery may be acknowledged."""

    job_id: JobId
    user: UserId
    resume: bool = False
    """The job is returned tasks (``SubmitJob.resumes``): a delivery apart from a user's
    job of the same id."""


@dataclass(frozen=True, slots=True)
class JobRefused:
    """GM: the job cannot be admitted (dead-letter it with the reason)."""

    job_id: JobId
    user: UserId
    reason: str
    detail: str
    resume: bool = False
    submitted_at: float = -1.0
    """The job's own ``submitted_at`` (tells it from a later job of the same id)."""


@dataclass(frozen=True, slots=True)
class Persist:
    """GM: publish ``job`` durably into its user's queue (tasks of an acknowledged job
    that came back) before acknowledging the input that caused it."""

    job: SubmitJob


@dataclass(frozen=True, slots=True)
class RunCommand:
    """Worker: start a real process for attempt ``attempt`` of ``spec``."""

    spec: TaskSpec
    attempt: int


@dataclass(frozen=True, slots=True)
class KillCommand:
    """Worker: stop the process of attempt ``attempt`` of a task."""

    user: UserId
    task_id: TaskId
    attempt: int


@dataclass(frozen=True, slots=True)
class Record:
    """Write these records to the service's journal (``runtime.journal``) before any
    other effect of the same message leaves the process: an LM's or pool's state that
    must outlive a restart of every process (``common.messages`` ``Journal*``)."""

    records: tuple[object, ...]


Effect = (
    Reply
    | ToLm
    | ToGm
    | ToAllGms
    | ToWorker
    | ToUser
    | After
    | JobSettled
    | JobRefused
    | Persist
    | RunCommand
    | KillCommand
    | Record
)

__all__ = [
    "After",
    "Effect",
    "JobRefused",
    "JobSettled",
    "KillCommand",
    "Persist",
    "Record",
    "Reply",
    "RunCommand",
    "ToAllGms",
    "ToGm",
    "ToLm",
    "ToUser",
    "ToWorker",
]
