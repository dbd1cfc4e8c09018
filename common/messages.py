"""Messages between GMs, LMs and workers.

Commands are imperative (``LaunchRequest``, ``PreemptRequest``), facts are in the past
tense (``StateUpdated``, ``TaskStarted``).  All are frozen, slotted, keyword-only.
``common.codec`` owns their wire form.

State travels as ``StateDelta``: the LM's version plus, for every node changed since
``base_version``, its free resources and the version at which it changed.  A GM
applies a node only if its version is newer than what it holds, so deltas can be
applied in any order; a gap (``base_version`` newer than the GM's view) is detected
and answered with a full snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.ids import GmId, LmId, NodeIndex, TaskId, UserId
from common.model import Resources, Task


@dataclass(frozen=True, slots=True, kw_only=True)
class StateDelta:
    """What changed in an LM's cluster between ``base_version`` and ``version``."""

    lm: LmId
    version: int
    base_version: int
    nodes: tuple[NodeIndex, ...]
    free: tuple[Resources, ...]
    node_versions: tuple[int, ...]
    usage: dict[UserId, Resources] = field(default_factory=dict)
    """Resources in use per user on this LM's cluster (all users, every time)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterLayout:
    """The static part of an LM's cluster: what a GM needs once, in a full snapshot."""

    lm: LmId
    capacity: tuple[Resources, ...]
    constraints: tuple[int, ...]
    home: tuple[GmId, ...]
    """The GM whose partition each physical node belongs to."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StateSnapshot:
    """A full snapshot: layout plus a delta from version 0."""

    layout: ClusterLayout
    state: StateDelta
    placed_by_gm: tuple[TaskId, ...] = ()
    """Tasks of the receiving GM this LM has accepted (active or done): a restarted,
    stateless GM uses them to skip redelivered tasks that already run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StateUpdated:
    """Periodic LM heartbeat, fanned out to all GMs."""

    delta: StateDelta


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotRequest:
    gm: GmId
    lm: LmId


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Launch ``task`` on ``node``; ``repartition`` when the node is in another GM's partition."""

    task: Task
    node: NodeIndex
    repartition: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    gm: GmId
    lm: LmId
    request_id: int
    placements: tuple[Placement, ...]
    known_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementResult:
    task_id: TaskId
    accepted: bool
    reason: str = ""
    """``ok``, ``duplicate`` (already accepted: idempotent), ``insufficient_resources``,
    ``constraints_unmet``, ``node_down``, ``unknown_node``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResponse:
    gm: GmId
    lm: LmId
    request_id: int
    results: tuple[PlacementResult, ...]
    delta: StateDelta
    received_at: float = 0.0
    """When the LM received the request; with ``sent_at`` it splits the round trip
    into communication and LM processing exactly."""
    sent_at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptRequest:
    """Free room for ``task`` by preempting tasks of ``victim``, then launch it."""

    gm: GmId
    lm: LmId
    request_id: int
    task: Task
    victim: UserId
    known_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptResponse:
    gm: GmId
    lm: LmId
    request_id: int
    task_id: TaskId
    accepted: bool
    reason: str
    node: NodeIndex | None
    preempted: tuple[TaskId, ...]
    delta: StateDelta
    received_at: float = 0.0
    sent_at: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTask:
    """LM -> worker: run ``task`` on ``node``."""

    lm: LmId
    node: NodeIndex
    task: Task


@dataclass(frozen=True, slots=True, kw_only=True)
class StopTask:
    """LM -> worker: stop a preempted task."""

    lm: LmId
    node: NodeIndex
    task_id: TaskId


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerReport:
    """Worker -> LM: a task started, finished or failed on ``node`` at ``at``."""

    lm: LmId
    node: NodeIndex
    task_id: TaskId
    kind: str  # "started" | "finished" | "failed"
    at: float
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskEvent:
    """LM -> the GM that placed the task (and to result listeners).

    ``kind``: ``started``, ``finished``, ``failed``, ``preempted`` (back to the front of
    its queue) or ``requeued`` (its worker died and no other node could take it).
    ``node_state`` piggybacks the node's fresh free resources so the placing GM learns
    of freed resources at once, not at the next heartbeat.
    """

    kind: str
    lm: LmId
    gm: GmId
    task: Task
    node: NodeIndex
    node_free: Resources
    node_version: int
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFailed:
    """A GM gives up on a task (explicit failure status, never a silent drop)."""

    gm: GmId
    task: Task
    reason: str
    at: float
