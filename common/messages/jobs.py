"""Jobs as users submit them and as the GM admits them; cancel."""

from __future__ import annotations

from typing import Annotated

import msgspec

from common.ids import GmId, JobId, LmId, UserId
from common.messages._base import MAX_JOB_TASKS, MAX_STAGES
from common.messages.state import PlacedRef
from common.model import TaskSpec, Time
from common.schema import Text, UInt, Wire, in_range, message, n_items


class StageSpec(Wire, frozen=True, kw_only=True):
    """One stage of a DAG job: its id, the stages it waits for, how many tasks.  A
    ``gang`` stage starts all-or-nothing across LMs (``global_master.gang``): all its
    tasks, or at least ``min`` of them (``0``: all; Armada's minimum cardinality)."""

    stage_id: UInt
    parents: Annotated[tuple[UInt, ...], n_items(0, MAX_STAGES)] = ()
    count: Annotated[int, in_range(1, None)]
    gang: bool = False
    min_count: UInt = msgspec.field(default=0, name="min")


@message("submit_job")
class SubmitJob(Wire, frozen=True, kw_only=True):
    """A job into its user's queue; ``token`` is the user's credential.  A DAG job
    lists its tasks stage by stage and ``stages`` gives the layout."""

    job_id: JobId
    user: UserId
    token: Text
    submitted_at: Time
    tasks: Annotated[tuple[TaskSpec, ...], n_items(1, MAX_JOB_TASKS, below="empty_job")]
    stages: Annotated[tuple[StageSpec, ...], n_items(1, MAX_STAGES)] | None = None
    resumes: JobId | None = None
    """Set by a GM on tasks of an acknowledged job that came back to its queue
    (preempted, requeued): kept on the broker until they are placed again, so a GM
    killed meanwhile loses none of them."""
    attempt: UInt = 0
    """With ``resumes``: the attempt the returned task last ran as (a GM that queues it
    again places a newer one, which no worker has stopped yet); 0 on a user's job."""


@message("admit_job")
class AdmitJob(Wire, frozen=True, kw_only=True):
    """GM driver -> core: a submission was delivered (``redelivered``: again, after a
    consumer or GM failure).  The core admits it or answers ``JobRefused``."""

    job: SubmitJob
    redelivered: bool = False


@message("admit_more")
class AdmitMore(Wire, frozen=True, kw_only=True):
    """GM core -> itself (an ``After`` timer): admit the next slice of a large job, so
    that one submission of many tasks does not hold the GM for the whole of it."""

    user: UserId
    job_id: JobId


@message("cancel_job")
class CancelJob(Wire, frozen=True, kw_only=True):
    """A user (through its GM's front door) -> the GM core: cancel job ``job_id``.
    Its queued tasks are dropped, its running ones stopped (``CancelTasks``); each ends
    ``cancelled`` unless it ended otherwise first.  Idempotent."""

    user: UserId
    job_id: JobId


@message("cancel_tasks")
class CancelTasks(Wire, frozen=True, kw_only=True):
    """GM -> LM: stop these attempts of cancelled tasks, as a preemption stops them.
    Each goes back to its GM (``PREEMPTED``) once its pool confirms the stop; an
    attempt the LM no longer holds is ignored."""

    gm: GmId
    lm: LmId
    tasks: Annotated[tuple[PlacedRef, ...], n_items(1, MAX_JOB_TASKS)]
