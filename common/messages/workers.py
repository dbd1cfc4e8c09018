"""Between an LM and its worker pools: starts, stops, reports, registration."""

from __future__ import annotations

from typing import Annotated

from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages._base import MAX_JOB_TASKS, ExitCode, Output, ReportKind
from common.model import TaskSpec, Time
from common.schema import Seq, Text, UInt, Wire, message, n_items


class StartTask(Wire, frozen=True, kw_only=True):
    """LM -> worker pool: run attempt ``attempt`` of ``spec`` on ``node``.  The pool keeps
    what the LM knows of the placement, so a restarted LM can learn it back."""

    node: NodeIndex
    spec: TaskSpec
    attempt: UInt
    gm: GmId
    altruistic: bool = False
    queued_at: Time = -1.0


@message("start_tasks")
class StartTasks(Wire, frozen=True, kw_only=True):
    """LM -> worker pool: start these attempts.  ``sent``: the LM's clock when it sent
    them (-1: not said); a pool whose lease lapsed runs none sent before it was back in
    touch with its LM (its LM may have given those attempts up and run them elsewhere)."""

    lm: LmId
    epoch: UInt = 0
    tasks: Annotated[tuple[StartTask, ...], n_items(1, MAX_JOB_TASKS)]
    sent: Time = -1.0


class StopTask(Wire, frozen=True, kw_only=True):
    """LM -> worker pool: stop a preempted (or superseded) attempt.  The pool answers
    with a ``STOPPED`` report for each: only then does a preempted task go back to its
    GM ``gm``, so its next attempt never overlaps this one."""

    node: NodeIndex
    user: UserId
    task_id: TaskId
    attempt: UInt
    gm: GmId


@message("stop_tasks")
class StopTasks(Wire, frozen=True, kw_only=True):
    lm: LmId
    epoch: UInt = 0
    tasks: Annotated[tuple[StopTask, ...], n_items(1, MAX_JOB_TASKS)]


class WorkerReport(Wire, frozen=True, kw_only=True):
    """Worker -> LM: attempt ``attempt`` of a task started, finished or failed."""

    kind: ReportKind
    node: NodeIndex
    user: UserId
    task_id: TaskId
    attempt: UInt
    gm: GmId
    """The GM that placed it: an LM that lost the task (it restarted) still tells it."""
    at: Time
    worker_at: Time
    started_at: Time = -1.0
    detail: Text = ""
    job_id: JobId | None = None
    """The task's job and queue time, from its start: an LM that does not hold the task
    (it restarted) passes them on, so its GM can tell the user of its end."""
    queued_at: Time = -1.0
    exit_code: ExitCode = None
    stdout: Output = b""
    stderr: Output = b""
    """An end's exit status and output (commands on), passed on in its ``TaskEvent``."""


@message("worker_reports")
class WorkerReports(Wire, frozen=True, kw_only=True):
    lm: LmId
    reports: Annotated[tuple[WorkerReport, ...], n_items(0, MAX_JOB_TASKS)]


@message("worker_heartbeat")
class WorkerHeartbeat(Wire, frozen=True, kw_only=True):
    """Worker pool -> LM: these nodes are alive at ``at``."""

    lm: LmId
    nodes: Seq[NodeIndex]
    at: Time


class EndedAttempt(Wire, frozen=True, kw_only=True):
    """An attempt that finished or failed on a pool whose report no LM has taken yet."""

    start: StartTask
    report: WorkerReport


@message("register_workers")
class RegisterWorkers(Wire, frozen=True, kw_only=True):
    """Worker pool -> its LM (a new LM incarnation, or the pool just started): these
    nodes are alive and run these attempts.  An LM takes no placement on a node
    before its pool has registered it, so it never counts a running task as free."""

    lm: LmId
    nodes: Seq[NodeIndex]
    at: Time
    """When the pool took stock (what its LM accepted later may still be on its way)."""
    running: Annotated[tuple[StartTask, ...], n_items(0, MAX_JOB_TASKS)] = ()
    started: Annotated[tuple[WorkerReport, ...], n_items(0, MAX_JOB_TASKS)] = ()
    """The start reports of what runs (worker and start times)."""
    ended: Annotated[tuple[EndedAttempt, ...], n_items(0, MAX_JOB_TASKS)] = ()
    """What ended while no LM took the reports: a new incarnation holds it as ended, so
    no GM places it again."""


@message("registered")
class Registered(Wire, frozen=True, kw_only=True):
    """LM -> its pool: registration taken; ``epoch`` is the LM's incarnation."""

    lm: LmId
    epoch: UInt


@message("register_pool")
class RegisterPool(Wire, frozen=True, kw_only=True):
    """Pool driver -> core: register with the LM (at start, or when the LM asks)."""
