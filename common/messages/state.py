"""An LM's state as GMs see it: deltas, snapshots, held tasks, kept ends."""

from __future__ import annotations

from typing import Annotated

from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages._base import Version
from common.model import Resources, TaskSpec, Time
from common.schema import Map, Seq, UInt, Wire, message, n_items


class GangHold(Wire, frozen=True, kw_only=True):
    """Resources an LM holds for a gang stage of ``gm``'s (its reservation), idle until
    the gang commits: ``held`` on ``node`` (what is not lent to backfill), reserved
    until ``lease_until`` and due (the gang expected to start) at ``due``, in the LM's
    time.  Other tasks may use it only if they end before ``due`` (backfill)."""

    gm: GmId
    user: UserId
    job_id: JobId
    stage: UInt
    node: NodeIndex
    held: Resources
    due: Time
    lease_until: Time


class StateDelta(Wire, frozen=True, kw_only=True):
    """What changed in an LM's cluster between ``base_version`` and ``version``."""

    lm: LmId
    epoch: UInt = 0
    version: Version
    base_version: Version
    nodes: Seq[NodeIndex]
    free: Seq[Resources]
    node_versions: Seq[UInt]
    usage: Map[UserId, Resources] = {}
    """Resources in use per user on this LM's cluster (all users, every time)."""
    holds: Seq[GangHold] = ()
    """Every gang hold this LM keeps (all of them, every time): what is reserved-but-idle
    where, until when (``local_master.reservations``)."""


class ClusterLayout(Wire, frozen=True, kw_only=True):
    """The static part of an LM's cluster: what a GM needs once, in a full snapshot."""

    lm: LmId
    capacity: Seq[Resources]
    constraints: Seq[UInt]
    home: Seq[GmId]
    """The GM whose partition each physical node belongs to."""


class PlacedRef(Wire, frozen=True, kw_only=True):
    """A task an LM holds for a GM: which attempt, where."""

    user: UserId
    task_id: TaskId
    attempt: UInt


class HeldTask(Wire, frozen=True, kw_only=True):
    """A task an LM holds (or held lately) for a GM, with what the LM knows of it."""

    spec: TaskSpec
    attempt: UInt
    queued_at: Time = -1.0
    """When it entered its GM's queue (the GM said so in the placement)."""
    accepted_at: Time = -1.0
    worker_at: Time = -1.0
    started_at: Time = -1.0
    ended_at: Time = -1.0
    """When it finished or failed (``-1``: it still runs)."""
    ok: bool = True


@message("snapshot")
class StateSnapshot(Wire, frozen=True, kw_only=True):
    """A full snapshot: layout plus a delta from version 0."""

    layout: ClusterLayout
    state: StateDelta
    held: Seq[HeldTask] = ()
    """Tasks of the receiving GM this LM runs, or ended in the last few minutes: a
    restarted, stateless GM adopts the running ones (their events and outcomes come to
    it) and never runs an ended one again when its job is redelivered."""


@message("state_updated")
class StateUpdated(Wire, frozen=True, kw_only=True):
    """Periodic LM heartbeat, fanned out to all GMs."""

    delta: StateDelta


@message("snapshot_request")
class SnapshotRequest(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId


ENDS_RETAINED_S = 120.0
"""How long an LM keeps an ended attempt for its GM's snapshot (``LocalMaster.retain_s``):
a restarted GM learns from it what of a redelivered job ended, and runs none of it
again.  A job whose delivery is held longer than a fraction of this is ``KeepEnds``'d."""


class JobKeep(Wire, frozen=True, kw_only=True):
    """One job's word in a ``KeepEnds``: keep its ended attempts, or (``keep`` False)
    let them go."""

    user: UserId
    job_id: JobId
    keep: bool


MAX_KEEPS = 10_000
"""Jobs one ``KeepEnds`` names at most (a GM's driver sends more as several)."""


@message("keep_ends")
class KeepEnds(Wire, frozen=True, kw_only=True):
    """GM -> one LM: keep (or, ``keep`` False, stop keeping) the ended attempts of
    these jobs of its past ``ENDS_RETAINED_S``, applied in the order given.  A job's
    delivery is still held, so the job comes back if the GM dies, possibly long after
    some of its tasks (a DAG's first stages, a flat job's head under overload) ended:
    the snapshot must still say so.  The GM's core names one job per message; its
    service sends those of one loop turn to one LM as one message, in order (a job's
    keep before its let-go)."""

    gm: GmId
    lm: LmId
    jobs: Annotated[tuple[JobKeep, ...], n_items(1, MAX_KEEPS)]
