"""What an LM or a worker pool writes to its write-ahead journal."""

from __future__ import annotations

from common.ids import GmId, JobId, TaskId, UserId
from common.messages.placement import Placement
from common.messages.state import HeldTask, PlacedRef
from common.messages.workers import EndedAttempt, StartTask
from common.model import Resources, Time
from common.schema import Seq, UInt, Wire, message


# What an LM or a worker pool writes to its write-ahead journal on local disk
# (``runtime.journal``) so that a restart of every process at once loses nothing: each
# record stands alone on disk, enveloped like a wire message.
@message("journal_held")
class JournalHeld(Wire, frozen=True, kw_only=True):
    """LM journal: an attempt entered the active task list (``stopping``: the list of
    preempted attempts whose stop their pool has not confirmed)."""

    start: StartTask
    accepted_at: Time
    stopping: bool = False
    gang: bool = False
    """Started by a gang's commit: never a preemption victim alone, after a restart too."""


@message("journal_dropped")
class JournalDropped(Wire, frozen=True, kw_only=True):
    """LM journal: attempt ``attempt`` of the task left the active (or stopping) list."""

    user: UserId
    task_id: TaskId
    attempt: UInt
    stopping: bool = False


@message("journal_ended")
class JournalEnded(Wire, frozen=True, kw_only=True):
    """LM journal: an attempt of ``gm``'s ended (``held.ended_at``); the LM learnt it at
    ``learnt_at`` and remembers it for its retention (longer if its job is kept)."""

    gm: GmId
    held: HeldTask
    learnt_at: Time


@message("journal_keep")
class JournalKeep(Wire, frozen=True, kw_only=True):
    """LM journal: ``gm`` asked that the ends of a job be kept (``keep``) or let go."""

    gm: GmId
    user: UserId
    job_id: JobId
    keep: bool
    at: Time


class HoldLoan(Wire, frozen=True, kw_only=True):
    """What of a hold attempt ``attempt`` of a backfill task borrows (``amount``)."""

    user: UserId
    task_id: TaskId
    attempt: UInt
    amount: Resources


@message("journal_restored")
class JournalRestored(Wire, frozen=True, kw_only=True):
    """LM journal: an incarnation took the journal back at ``at`` (its steady clock): the
    ends before this record are kept at least their retention after ``at``, so the
    incarnation after it keeps what this one kept (``local_master.ends``)."""

    at: Time


@message("journal_hold")
class JournalHold(Wire, frozen=True, kw_only=True):
    """LM journal: gang stage ``stage`` of ``gm``'s job holds ``placement`` (its node, its
    demand) under a lease ``until``, due at ``due`` (the LM's steady clock); what it lends
    to backfill tasks (``lent``, by ``loans``) and whether its GM committed it.  Written
    whole at every change of the hold: the last word on a task wins."""

    gm: GmId
    user: UserId
    job_id: JobId
    stage: UInt
    placement: Placement
    until: Time
    due: Time
    lent: Resources
    loans: Seq[HoldLoan] = ()
    committed: bool = False


@message("journal_hold_gone")
class JournalHoldGone(Wire, frozen=True, kw_only=True):
    """LM journal: the hold of the task ended (started by its commit, released, expired,
    or dropped with its node)."""

    user: UserId
    task_id: TaskId


@message("journal_unreported")
class JournalUnreported(Wire, frozen=True, kw_only=True):
    """Pool journal: an attempt ended here; no LM has taken its report yet."""

    ended: EndedAttempt


@message("journal_taken")
class JournalTaken(Wire, frozen=True, kw_only=True):
    """Pool journal: the LM took the reports of these attempts."""

    attempts: Seq[PlacedRef]
