"""Gang stages: reservations under a lease, commit, release, retry."""

from __future__ import annotations

from typing import Annotated

from common.ids import GmId, JobId, LmId, UserId
from common.messages._base import MAX_JOB_TASKS, Version
from common.messages.placement import Placement, PlacementResult
from common.messages.state import PlacedRef, StateDelta
from common.model import Seconds, Time
from common.schema import Seq, UInt, Wire, message, n_items


@message("reserve")
class ReserveRequest(Wire, frozen=True, kw_only=True):
    """GM -> LM: hold room for these placements of gang stage ``stage`` of a job (each
    validated as a launch is, nothing started) for ``lease_s`` seconds from receipt;
    the gang is due (expected to commit) within ``due_s``.  Holds of the same task
    replace the older one; ``CommitGang`` starts them, ``ReleaseGang`` or the lease
    ends them."""

    gm: GmId
    lm: LmId
    request_id: UInt
    user: UserId
    job_id: JobId
    stage: UInt
    placements: Annotated[tuple[Placement, ...], n_items(1, MAX_JOB_TASKS)]
    lease_s: Seconds
    due_s: Seconds
    known_version: Version
    sent_at: Time = -1.0


@message("reserve_response")
class ReserveResponse(Wire, frozen=True, kw_only=True):
    """LM -> GM: per placement, in order, whether it is held (``node``: where)."""

    gm: GmId
    lm: LmId
    request_id: UInt
    results: Seq[PlacementResult]
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    sent_at: Time = 0.0


@message("commit_gang")
class CommitGang(Wire, frozen=True, kw_only=True):
    """GM -> LM: the whole gang (or its ``min``) holds: start these held attempts.
    Answered with a ``LaunchResponse`` (per task, in order)."""

    gm: GmId
    lm: LmId
    request_id: UInt
    user: UserId
    job_id: JobId
    stage: UInt
    tasks: Annotated[tuple[PlacedRef, ...], n_items(1, MAX_JOB_TASKS)]
    known_version: Version
    sent_at: Time = -1.0


@message("release_gang")
class ReleaseGang(Wire, frozen=True, kw_only=True):
    """GM -> LM: give back every hold of this gang stage (it did not fill, or it
    failed); answered with nothing (204)."""

    gm: GmId
    lm: LmId
    user: UserId
    job_id: JobId
    stage: UInt


@message("gang_retry")
class GangRetry(Wire, frozen=True, kw_only=True):
    """GM core -> itself (an ``After`` timer): a gang that backed off tries again."""

    user: UserId
    job_id: JobId
    stage: UInt
