"""Timers and driver facts each core takes like any message; the refusal answer."""

from __future__ import annotations

from typing import Annotated

from common.ids import TaskId, UserId
from common.messages._base import ExitCode, Output
from common.messages.workers import WorkerReport
from common.model import Seconds, Time
from common.schema import Seq, Text, UInt, Wire, in_range, message


@message("decide")
class Decide(Wire, frozen=True, kw_only=True):
    """GM driver -> core: make up to ``max_tasks`` decisions (launches to one LM share
    one request)."""

    max_tasks: Annotated[int, in_range(1, None)] = 1


@message("user_access")
class UserAccess(Wire, frozen=True, kw_only=True):
    """GM driver -> core: ``user``'s token was revoked (its tasks end ``user_revoked``,
    queued or running), or issued again (``revoked`` false)."""

    user: UserId
    revoked: bool = True


@message("request_snapshots")
class RequestSnapshots(Wire, frozen=True, kw_only=True):
    """A (re)started GM asks every LM for a full snapshot."""


@message("heartbeat")
class Heartbeat(Wire, frozen=True, kw_only=True):
    """LM timer: publish the state delta since the previous heartbeat to every GM."""


@message("check_workers")
class CheckWorkers(Wire, frozen=True, kw_only=True):
    """LM timer: declare nodes silent for ``timeout`` seconds dead (nothing is placed on
    them); give up their tasks (run them again) once silent for ``lost_after`` seconds
    (at once if ``lost_after <= timeout``)."""

    timeout: Seconds
    lost_after: Seconds = 0.0


@message("reports_taken")
class ReportsTaken(Wire, frozen=True, kw_only=True):
    """Pool driver -> core: the LM took these reports (they need not be kept)."""

    reports: Seq[WorkerReport]


@message("lease_renewed")
class LeaseRenewed(Wire, frozen=True, kw_only=True):
    """Pool driver -> core: the LM answered (a heartbeat): the pool may go on running.
    The lease counts from ``sent``, when the answered request left (an answer read late,
    by a pool that was frozen meanwhile, renews nothing past it); -1: on receipt."""

    sent: Time = -1.0


@message("check_lease")
class CheckLease(Wire, frozen=True, kw_only=True):
    """Pool timer: has the pool been out of touch with its LM for longer than ``lease``?"""

    lease: Seconds


@message("task_due")
class TaskDue(Wire, frozen=True, kw_only=True):
    """Worker timer: a synthetic task's duration has elapsed."""

    user: UserId
    task_id: TaskId
    attempt: UInt


@message("command_started")
class CommandStarted(Wire, frozen=True, kw_only=True):
    """Worker runner -> core: a task's command is running."""

    user: UserId
    task_id: TaskId
    attempt: UInt


@message("command_exited")
class CommandExited(Wire, frozen=True, kw_only=True):
    """Worker runner -> core: a task's command ended."""

    user: UserId
    task_id: TaskId
    attempt: UInt
    ok: bool
    detail: Text = ""
    exit_code: ExitCode = None
    stdout: Output = b""
    stderr: Output = b""


@message("refused")
class Refused(Wire, frozen=True, kw_only=True):
    """A request a core will not take: the reason (machine-readable) and why."""

    reason: Text
    detail: Text = ""
