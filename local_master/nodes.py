"""The node table of one LM: its worker nodes, what holds them, and the log of changes.

Invariants (checked by tests/property):

* For every node ``0 <= free <= capacity`` componentwise and, while the node is alive,
  ``free + sum(demand of the attempts on it) == capacity``; a dead node has nothing free
  (no placement goes there) yet keeps what it held.
* ``stopping`` holds preempted attempts (released: they hold nothing) until their pool
  confirms the stop; a node that holds one is not given up in silence.
* With a ``journal``, every change of ``active`` and ``stopping`` is written there as it
  happens (``JournalHeld``, ``JournalDropped``); ``restore`` takes them back.
* ``active`` holds each task at most once (one attempt, on one node); ``on_node[n]`` is
  exactly the keys of the attempts on ``n``; ``usage[u]`` is the sum of user ``u``'s
  active demands and holds no all-zero row.
* Every node has a *home* GM (its partition).  An attempt placed for another GM holds a
  *logical node* carved out of its physical node (a repartition, §IV-B4): the node
  stays in its home partition and its resources return when the attempt goes.
* ``version`` grows by one on every change of any node and ``node_version[n]`` is the
  version of ``n``'s last change; ``_log`` names the node of every version since
  ``_log_base`` (halved when over its limit), which is what ``delta_since`` reads.

The table owns this state: only its methods change it.  It decides nothing (the core
does) and returns values: deltas, layouts, events and effects' messages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from common.ids import GmId, LmId, NodeIndex
from common.messages import (
    ClusterLayout,
    EventKind,
    GangHold,
    HeldTask,
    JournalDropped,
    JournalHeld,
    ReportKind,
    StartTask,
    StateDelta,
    StopTask,
    TaskEvent,
    WorkerReport,
)
from common.model import NodeSpec, Resources, TaskKey, TaskSpec, satisfies
from common.reasons import Answer

RECENT_REPARTITIONS = 64
# ``check``'s answers, bound once: an enum member read off its class costs ~30 times a
# global on Python 3.11, and ``check`` runs for every node ``first_fit`` tries
_OK, _UNKNOWN, _DOWN = Answer.OK, Answer.UNKNOWN_NODE, Answer.NODE_DOWN
_UNMET, _WRONG, _NO_ROOM = (
    Answer.CONSTRAINTS_UNMET,
    Answer.WRONG_RESOURCES,
    Answer.INSUFFICIENT_RESOURCES,
)
_REPORT_EVENT = {ReportKind.FINISHED: EventKind.FINISHED, ReportKind.FAILED: EventKind.FAILED}
_GIVEN_BACK = (EventKind.REQUEUED, EventKind.PREEMPTED)
"""Events that hand a task back to its GM's queue: they carry the task's spec."""


@dataclass(frozen=True, slots=True)
class Repartition:
    """A logical node carved for ``gm`` out of node ``node`` of ``home``'s partition."""

    at: float
    task: TaskKey
    attempt: int
    node: NodeIndex
    home: GmId
    gm: GmId
    demand: Resources


@dataclass(slots=True)
class ActiveTask:
    """An entry of the active task list: one attempt of one task, on one node."""

    spec: TaskSpec
    attempt: int
    node: NodeIndex
    gm: GmId
    logical: bool
    """Placed on a logical node carved out of another GM's partition (a repartition)."""
    altruistic: bool = False
    accepted_at: float = 0.0
    """When this LM accepted it (its own clock: victim choice never depends on hearsay)."""
    worker_at: float = -1.0
    started_at: float = -1.0
    queued_at: float = -1.0
    gang: bool = False
    """Started by a gang's commit (``local_master.reservations``): journaled with it."""

    def held(self, ended_at: float = -1.0, ok: bool = True) -> HeldTask:
        """What a GM learns of it (ended at ``ended_at`` if that is not -1)."""
        return HeldTask(
            spec=self.spec,
            attempt=self.attempt,
            queued_at=self.queued_at,
            accepted_at=self.accepted_at,
            worker_at=self.worker_at,
            started_at=self.started_at,
            ended_at=ended_at,
            ok=ok,
        )

    def start(self) -> StartTask:
        """The command its worker pool runs it by."""
        return StartTask(
            node=self.node, spec=self.spec, attempt=self.attempt, gm=self.gm,
            altruistic=self.altruistic, queued_at=self.queued_at,
        )  # fmt: skip

    def stop(self) -> StopTask:
        """The command its worker pool stops it by."""
        s = self.spec
        return StopTask(
            node=self.node, user=s.user, task_id=s.task_id, attempt=self.attempt, gm=self.gm
        )


class NodeTable:
    """The truth about one cluster's nodes: capacity, free resources, liveness,
    partitions, the active task list, and the versions GMs follow it by."""

    def __init__(
        self,
        lm: LmId,
        epoch: int,
        nodes: Sequence[NodeSpec],
        home: Sequence[GmId],
        *,
        alive: bool,
        log_limit: int | None = None,
    ) -> None:
        if len(nodes) != len(home):
            raise ValueError("every node needs a home partition")
        if not nodes:
            raise ValueError("an LM needs at least one node")
        self.lm = lm
        self.epoch = epoch
        self.capacity: list[Resources] = [n.capacity for n in nodes]
        self.constraints: list[int] = [n.constraints for n in nodes]
        self.home: list[GmId] = list(home)
        self.n_resources = len(self.capacity[0])
        self.free: list[list[int]] = [list(c) if alive else [0] * len(c) for c in self.capacity]
        self._free_t: list[tuple[int, ...]] = [tuple(f) for f in self.free]
        """Each node's free resources as of its last change, immutable: what deltas and
        events carry (one tuple per change, shared by every message that reports it)."""
        self.alive: list[bool] = [alive] * len(nodes)
        self.last_seen: list[float] = [0.0] * len(nodes)
        self.node_version: list[int] = [0] * len(nodes)
        self.version = 0
        self.active: dict[TaskKey, ActiveTask] = {}
        self.on_node: list[set[TaskKey]] = [set() for _ in nodes]
        self.stopping: dict[tuple[TaskKey, int], ActiveTask] = {}
        """Preempted attempts (released) whose stop their pool has not confirmed yet."""
        self.usage: dict[Any, list[int]] = {}
        self._usage_t: dict[Any, tuple[int, ...]] = {}
        """``usage`` as deltas carry it (the same users in the same order, each row a
        tuple made when it changes, not for every delta)."""
        self.recent_repartitions: deque[Repartition] = deque(maxlen=RECENT_REPARTITIONS)
        """The latest repartitions (for operators: ``local_master.inspect``)."""
        self._partition: dict[GmId, tuple[list[int], list[int]]] = {}
        """Per GM: the nodes of its partition, and the others (rerouting's order)."""
        self._log: list[int] = []
        self._log_base = 0
        self._log_limit = log_limit if log_limit is not None else max(4 * len(nodes), 4096)
        self.on_release: Callable[[TaskKey], None] | None = None
        """Told of every attempt released, after its resources are free again (a
        backfill task's loan goes back to its hold at once: ``reservations``)."""
        self.gang_holds: tuple[GangHold, ...] = ()
        """Every gang hold, as state updates carry it (``local_master.reservations``
        keeps it current; the resources held are out of ``free``)."""
        self.journal: list[object] | None = None
        """Where a durable LM's changes to the active task list go (``JournalHeld``,
        ``JournalDropped``), for its driver to write before anything leaves; None: not
        durable (the simulator)."""

    @property
    def n_nodes(self) -> int:
        return len(self.capacity)

    def _touch(self, node: int) -> None:
        self._free_t[node] = tuple(self.free[node])
        self.version += 1
        self.node_version[node] = self.version
        self._log.append(node)
        if len(self._log) > self._log_limit:
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_base += drop

    # ------------------------------------------------------------- what GMs read
    def layout(self) -> ClusterLayout:
        """The cluster's shape: capacity, constraints and home partition of every node."""
        return ClusterLayout(
            lm=self.lm,
            capacity=tuple(self.capacity),
            constraints=tuple(self.constraints),
            home=tuple(self.home),
        )

    def delta_since(self, base: int) -> StateDelta:
        """Every node changed after version ``base`` (all nodes if the log is too short)."""
        if base >= self.version:
            nodes: Iterable[int] = ()
        elif base < self._log_base:
            base = -1  # a full state: applies to any view
            nodes = range(self.n_nodes)
        else:
            nodes = sorted(set(self._log[base - self._log_base :]))
        idx: tuple[NodeIndex, ...] = tuple(nodes)  # type: ignore[arg-type]  # (NewType of int)
        free: tuple[Resources, ...]
        versions: tuple[int, ...]
        if len(idx) > 1:  # (an itemgetter of several indexes gives a tuple, in their order)
            pick = itemgetter(*idx)
            free, versions = pick(self._free_t), pick(self.node_version)
        elif idx:
            free, versions = (self._free_t[idx[0]],), (self.node_version[idx[0]],)
        else:
            free = versions = ()
        return StateDelta(
            lm=self.lm,
            epoch=self.epoch,
            version=self.version,
            base_version=base,
            nodes=idx,
            free=free,
            node_versions=versions,
            usage=dict(self._usage_t),
            holds=self.gang_holds,
        )

    def event(self, kind: EventKind, a: ActiveTask, at: float, detail: str = "") -> TaskEvent:
        """What ``a``'s GM hears of it, with its node's fresh state."""
        return TaskEvent(
            kind=kind, lm=self.lm, gm=a.gm, user=a.spec.user, task_id=a.spec.task_id,
            attempt=a.attempt, node=a.node, node_free=self._free_t[a.node],
            node_version=self.node_version[a.node], at=at, worker_at=a.worker_at,
            started_at=a.started_at, detail=detail, job_id=a.spec.job_id,
            queued_at=a.queued_at, spec=a.spec if kind in _GIVEN_BACK else None,
        )  # fmt: skip

    def report_event(self, rep: WorkerReport) -> TaskEvent:
        """What the GM of an attempt this LM does not hold hears of its report: its end,
        or that it must be placed again."""
        return TaskEvent(
            kind=_REPORT_EVENT.get(rep.kind, EventKind.REQUEUED), lm=self.lm, gm=rep.gm,
            user=rep.user, task_id=rep.task_id, attempt=rep.attempt, node=rep.node,
            node_free=self._free_t[rep.node], node_version=self.node_version[rep.node],
            at=rep.at, worker_at=rep.worker_at, started_at=rep.started_at, detail=rep.detail,
            job_id=rep.job_id, queued_at=rep.queued_at,
        )  # fmt: skip

    def held(self, gm: GmId) -> tuple[HeldTask, ...]:
        """The attempts held for ``gm``."""
        return tuple(a.held() for a in self.active.values() if a.gm == gm)

    def logical_nodes(self) -> list[tuple[TaskKey, NodeIndex, GmId, Resources]]:
        """Logical nodes created by repartition: (task, physical node, GM, resources)."""
        return [(k, a.node, a.gm, a.spec.demand) for k, a in self.active.items() if a.logical]

    def holds(self, node: int) -> bool:
        """Whether an attempt is held on ``node``, or being stopped there."""
        return bool(self.on_node[node]) or any(a.node == node for a in self.stopping.values())

    # ---------------------------------------------------------------- placement
    def has(self, node: int) -> bool:
        """Whether ``node`` is a node of this cluster."""
        return 0 <= node < len(self.capacity)

    def check(self, spec: TaskSpec, node: int) -> Answer:
        """Whether ``spec`` fits on ``node`` now: ``Answer.OK``, or the reason it does not."""
        if not 0 <= node < len(self.capacity):
            return _UNKNOWN
        if not self.alive[node]:
            return _DOWN
        if not satisfies(self.constraints[node], spec.constraints):
            return _UNMET
        if len(spec.demand) != self.n_resources:  # a pool's listing is not checked before
            return _WRONG
        free = self.free[node]
        for r, d in enumerate(spec.demand):
            if free[r] < d:
                return _NO_ROOM
        return _OK

    def first_fit(
        self,
        spec: TaskSpec,
        gm: GmId,
        *,
        elsewhere: bool = True,
        spare: Mapping[int, int] | None = None,
        from_end: bool = False,
    ) -> int:
        """The first node that fits ``spec`` now, in ``gm``'s partition first, then (if
        ``elsewhere``) in the others; -1 if none does.  ``spare``: nodes (with a count
        above 0) left alone while another node fits, so a reroute does not take the
        node that a later placement of the same request asks for."""
        order = self._partition.get(gm)
        if order is None:
            mine = [i for i, h in enumerate(self.home) if h == gm]
            order = self._partition[gm] = (mine, [i for i, h in enumerate(self.home) if h != gm])
        check = self.check
        for nodes in order if elsewhere else order[:1]:
            spared = -1
            for i in reversed(nodes) if from_end else nodes:
                if check(spec, i) is _OK:
                    if not spare or not spare.get(i):
                        return i
                    if spared < 0:
                        spared = i
            if spared >= 0:  # (a partition's own order still comes first)
                return spared
        return -1

    def reroute(self, spec: TaskSpec, gm: GmId, asked: Mapping[int, int] | None) -> int:
        """Where a placement of ``gm`` whose node had no room goes instead: the last node
        that fits, in ``gm``'s partition first (``gm`` fills it from the first, so its next
        decisions do not find it taken), sparing the nodes ``asked`` by placements of the
        same request still to be judged; -1 if none fits."""
        return self.first_fit(spec, gm, spare=asked, from_end=True)

    def place(
        self,
        spec: TaskSpec,
        attempt: int,
        node: int,
        gm: GmId,
        altruistic: bool,
        now: float,
        queued_at: float = -1.0,
        gang: bool = False,
    ) -> ActiveTask:
        """Take ``spec.demand`` from ``node`` for attempt ``attempt`` of ``gm``'s task
        (a logical node if ``node`` is in another GM's partition; ``gang``: started by a
        gang's commit); the caller checked it fits."""
        free = self.free[node]
        for r, d in enumerate(spec.demand):
            free[r] -= d
        use = self.usage.get(spec.user)
        if use is None:
            use = self.usage[spec.user] = [0] * self.n_resources
        for r, d in enumerate(spec.demand):
            use[r] += d
        self._usage_t[spec.user] = tuple(use)
        logical = self.home[node] != gm
        key = (spec.user, spec.task_id)
        a = self.active[key] = ActiveTask(
            spec, attempt, NodeIndex(node), gm, logical, altruistic, accepted_at=now,
            queued_at=queued_at, gang=gang,
        )  # fmt: skip
        self.on_node[node].add(key)
        self._touch(node)
        if self.journal is not None:
            self.journal.append(JournalHeld(start=a.start(), accepted_at=now, gang=gang))
        if logical:
            self.recent_repartitions.append(
                Repartition(now, key, attempt, NodeIndex(node), self.home[node], gm, spec.demand)
            )
        return a

    def take(self, node: int, amount: Sequence[int]) -> None:
        """``amount`` of ``node``'s free resources is held (a gang's reservation)."""
        free = self.free[node]
        for r, d in enumerate(amount):
            free[r] -= d
        self._touch(node)

    def give(self, node: int, amount: Sequence[int]) -> None:
        """``amount`` held on ``node`` is free again (on a live node)."""
        if self.alive[node]:
            free = self.free[node]
            for r, d in enumerate(amount):
                free[r] += d
        self._touch(node)

    def release(self, key: TaskKey) -> ActiveTask | None:
        """Give back what task ``key``'s attempt holds; the attempt, or None."""
        a = self.active.pop(key, None)
        if a is None:
            return None
        if self.journal is not None:
            self.journal.append(JournalDropped(user=key[0], task_id=key[1], attempt=a.attempt))
        node = a.node
        self.on_node[node].discard(key)
        if self.alive[node]:
            free = self.free[node]
            for r, d in enumerate(a.spec.demand):
                free[r] += d
        user = a.spec.user
        use = self.usage[user]
        for r, d in enumerate(a.spec.demand):
            use[r] -= d
        if any(use):
            self._usage_t[user] = tuple(use)
        else:
            del self.usage[user], self._usage_t[user]
        self._touch(node)
        if self.on_release is not None:
            self.on_release(key)
        return a

    def stop(self, key: TaskKey) -> ActiveTask | None:
        """Preempt task ``key``'s attempt: released, and held as stopping until its pool
        confirms the stop (``stopped``)."""
        a = self.release(key)
        if a is not None:
            self.stopping[(key, a.attempt)] = a
            if self.journal is not None:
                self.journal.append(
                    JournalHeld(start=a.start(), accepted_at=a.accepted_at, stopping=True)
                )
        return a

    def stopped(self, k: tuple[TaskKey, int]) -> ActiveTask | None:
        """A preempted attempt's stop is confirmed: it leaves the stopping list."""
        a = self.stopping.pop(k, None)
        if a is not None and self.journal is not None:
            (user, task_id), attempt = k
            self.journal.append(
                JournalDropped(user=user, task_id=task_id, attempt=attempt, stopping=True)
            )
        return a

    def records(self) -> list[JournalHeld]:
        """The attempts held and stopping, as journal records (a compacted journal)."""
        out = [
            JournalHeld(start=a.start(), accepted_at=a.accepted_at, gang=a.gang)
            for a in self.active.values()
        ]
        out.extend(
            JournalHeld(start=a.start(), accepted_at=a.accepted_at, stopping=True, gang=a.gang)
            for a in self.stopping.values()
        )
        return out

    def restore(self, row: JournalHeld) -> None:
        """Hold again an attempt a former incarnation held or was stopping (from its
        journal).  The nodes are not alive yet (their pool has not registered): what
        the attempt holds is counted when its node comes back (``seen``)."""
        s = row.start
        key = (s.spec.user, s.spec.task_id)
        a = ActiveTask(
            s.spec, s.attempt, s.node, s.gm, self.home[s.node] != s.gm, s.altruistic,
            accepted_at=row.accepted_at, queued_at=s.queued_at, gang=row.gang,
        )  # fmt: skip
        if row.stopping:
            self.stopping[(key, s.attempt)] = a
            return
        self.active[key] = a
        self.on_node[s.node].add(key)
        use = self.usage.setdefault(s.spec.user, [0] * self.n_resources)
        for r, d in enumerate(s.spec.demand):
            use[r] += d
        self._usage_t[s.spec.user] = tuple(use)
        if self.alive[s.node]:
            free = self.free[s.node]
            for r, d in enumerate(s.spec.demand):
                free[r] -= d
        self._touch(s.node)

    # ----------------------------------------------------------------- liveness
    def seen(self, nodes: Iterable[int], now: float) -> int:
        """Their pool says these nodes live: a dead one comes back with what it still
        holds.  Returns how many attempts were held through a silence."""
        held = 0
        for node in nodes:
            self.last_seen[node] = now
            if not self.alive[node]:
                self.alive[node] = True
                free = list(self.capacity[node])
                for key in self.on_node[node]:
                    held += 1
                    for r, d in enumerate(self.active[key].spec.demand):
                        free[r] -= d
                self.free[node] = free
                self._touch(node)
        return held

    def seen_all(self, now: float) -> None:
        """Give every node a fresh timeout (the silence was the LM's own)."""
        self.last_seen = [now] * self.n_nodes

    def lose(self, node: int) -> None:
        """``node`` is dead: nothing is placed on it; its attempts stay held."""
        self.alive[node] = False
        self.free[node] = [0] * self.n_resources
        self._touch(node)
