"""What became of tasks: the LM's events to its GM, the GM's outcomes to users."""

from __future__ import annotations

from typing import Annotated

from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages._base import MAX_JOB_TASKS, EventKind, ExitCode, Output
from common.model import Resources, Task, TaskSpec, Time
from common.schema import Text, UInt, Wire, message, n_items


class TaskEvent(Wire, frozen=True, kw_only=True):
    """LM -> the GM that placed attempt ``attempt`` of a task.

    ``node_free`` piggybacks the node's fresh free resources so the placing GM learns
    of freed resources at once, not at the next heartbeat.  Worker-side times:
    ``worker_at`` (the StartTask reached the worker) and ``started_at`` (the attempt
    started); ``at`` is when the event happened.
    """

    kind: EventKind
    lm: LmId
    gm: GmId
    user: UserId
    task_id: TaskId
    attempt: UInt
    node: NodeIndex
    node_free: Resources
    node_version: UInt
    at: Time
    worker_at: Time = -1.0
    started_at: Time = -1.0
    detail: Text = ""
    job_id: JobId | None = None
    """The task's job and when it entered its GM's queue, as the LM holds them: a GM
    that restarted and has no record of the task can still tell its user of its end."""
    queued_at: Time = -1.0
    spec: TaskSpec | None = None
    """The task itself, on the events that give it back to its GM (requeued, preempted):
    a GM that restarted and holds no record of it queues it again from this (its job's
    delivery may have been acknowledged before: nothing else holds the task)."""
    exit_code: ExitCode = None
    stdout: Output = b""
    stderr: Output = b""
    """An end's exit status and output (commands on), for its user (``megha logs``)."""


@message("task_events")
class TaskEvents(Wire, frozen=True, kw_only=True):
    """The task events one LM has for one GM, batched per loop turn."""

    lm: LmId
    epoch: UInt = 0
    """The LM incarnation that sent them (node states of an older one are not taken)."""
    events: Annotated[tuple[TaskEvent, ...], n_items(1, MAX_JOB_TASKS)]


@message("task_outcome")
class TaskOutcome(Wire, frozen=True, kw_only=True):
    """GM -> the task's user: it finished, or failed for good (with the reason).
    Carries the whole ledger: what the user's reports are made of."""

    task: Task
    finished: bool
    reason: Text = ""


@message("task_outcomes")
class TaskOutcomes(Wire, frozen=True, kw_only=True):
    """The outcomes one GM has for one user, batched per loop turn."""

    gm: GmId
    outcomes: Annotated[tuple[TaskOutcome, ...], n_items(1, MAX_JOB_TASKS)]


@message("job_refusal")
class JobRefusal(Wire, frozen=True, kw_only=True):
    """GM -> a job's user, on the user's outcome stream: the job was refused whole, none
    of its tasks queued, for ``reason`` (the dead letter's).  Only for a job whose
    submitter the GM has authenticated: a forged job gets no word to anyone."""

    gm: GmId
    user: UserId
    job_id: JobId
    submitted_at: Time
    """The refused job's own ``submitted_at``: a client that submitted a job of that id
    again tells the two apart."""
    reason: Text
    detail: Text = ""
