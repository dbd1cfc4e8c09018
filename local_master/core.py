"""The Local Master's pure core: the only consistent state of one cluster.

Theory of operation (Megha paper §IV-A, §IV-B4, §IV-B6, §IV-C, §IV-D):

* One entry: ``handle(message, now) -> effects``.  GM requests are answered with a
  ``Reply`` (a request it will not take: ``Reply(Refused(reason))``); worker reports,
  worker heartbeats and the driver's timers (``Heartbeat``, ``CheckWorkers``) are
  messages too.
* The LM owns the truth about its worker nodes: capacity, free resources, machine
  constraints, liveness, and the *active task list* (which attempt of which task
  holds what where).
* The cluster is split into one partition per GM: every physical node has a *home*
  GM.  A **repartition** carves exactly the requested resources out of a node in
  another GM's partition into a *logical node* of the requesting GM's partition; the
  logical node lives as long as its task and its resources return to the physical
  node when the task ends.  Granularity is resources, never whole nodes.
* Every request from a GM is **validated** against true state; a placement that the
  true state cannot satisfy is refused (an *inconsistency*) and every response
  piggybacks a delta of the cluster's state since the version the GM said it knows.
  With ``reroute``, a placement refused only because its node has no room (or is
  down) goes instead to the first node that fits, in the GM's own partition first,
  then in another's (a repartition): Alg. 1 on the true state, without a round trip.
* **Attempts**: each placement is an attempt of a task; a launch of the attempt the
  LM already holds (or recently finished) is a duplicate and changes nothing; a newer
  attempt supersedes an older one still held here (the older is stopped first), so a
  worker never runs two attempts of one task.  Reports about an attempt the LM does
  not hold are stale; a worker still running one is told to stop.
* **Versions**: ``version`` grows by one on every change of any node; each node
  remembers the version of its last change.  Deltas carry per-node versions, so GMs
  apply them in any order and never go backwards; ``epoch`` is this LM's incarnation.

Invariants (checked by tests/property): for every node ``0 <= free <= capacity``
componentwise and ``free + sum(demand of active tasks on it) == capacity`` while the
node is alive; every task is active at most once; ``version`` is monotone.

Memory: finished attempts are remembered only for ``retain_s`` seconds (to refuse
late duplicate launches), as tuples of atoms the collector untracks (``EndedRow``) --
except those of a job its GM asked to keep (``KeepEnds``: its delivery is held long,
and a restarted GM must learn what of it ended), kept until the GM lets them go;
nothing else outlives its task.

No clocks, sockets or randomness: ``now`` is an argument, effects are returned.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from common.effects import Effect, Reply, ToAllGms, ToGm, ToWorker
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.messages import (
    ENDS_RETAINED_S,
    CheckWorkers,
    ClusterLayout,
    EndedAttempt,
    EventKind,
    Heartbeat,
    HeldTask,
    KeepEnds,
    LaunchRequest,
    LaunchResponse,
    PlacedRef,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    Refused,
    Registered,
    RegisterWorkers,
    ReportKind,
    SnapshotRequest,
    StartTask,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    StopTask,
    TaskEvent,
    WorkerHeartbeat,
    WorkerReport,
    WorkerReports,
)
from common.metrics import LmCounters
from common.model import NodeSpec, Resources, TaskKey, TaskSpec, satisfies

ENDS = (ReportKind.FINISHED, ReportKind.FAILED)
JobKeyAt = tuple[GmId, UserId, JobId]
"""A job as an LM keeps its ends: its GM, user and id."""
RECENT_REPARTITIONS = 64


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

    def held(self, ended_at: float = -1.0, ok: bool = True) -> HeldTask:
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


def _work(a: ActiveTask, now: float) -> float:
    """What preempting ``a`` now throws away: CPU-seconds run (0 if not started)."""
    if a.started_at < 0:
        return 0.0
    return max(0.0, now - a.started_at) * (a.spec.demand[0] if a.spec.demand else 1)


EndedRow = tuple[Any, ...]
"""An ended attempt as ``done`` keeps it: atoms and tuples of atoms only.  A busy LM
keeps ``retain_s`` of them (80,000 at 667 ends/s); as ``HeldTask`` and ``TaskSpec``
objects they were three tracked objects each, and its full collections paused it for
up to 0.2 s at 2,000 tasks/s (bench_live ``gc_since_start``)."""
_JOB, _ATTEMPT, _OK = 1, 7, 13
_NO_ROOM = ("insufficient_resources", "node_down")
"""Refusals another node could avoid (rerouting); a broken placement is refused."""


def ended_row(h: HeldTask) -> EndedRow:
    s = h.spec
    return (
        s.task_id, s.job_id, s.user, s.demand, s.duration, s.constraints, s.command,
        h.attempt, h.queued_at, h.accepted_at, h.worker_at, h.started_at, h.ended_at, h.ok,
    )  # fmt: skip


def held_of(row: EndedRow) -> HeldTask:
    task_id, job_id, user, demand, duration, constraints, command, *rest = row
    attempt, queued_at, accepted_at, worker_at, started_at, ended_at, ok = rest
    spec = TaskSpec(
        task_id=task_id, job_id=job_id, user=user, demand=demand, duration=duration,
        constraints=constraints, command=command,
    )  # fmt: skip
    return HeldTask(
        spec=spec, attempt=attempt, queued_at=queued_at, accepted_at=accepted_at,
        worker_at=worker_at, started_at=started_at, ended_at=ended_at, ok=ok,
    )  # fmt: skip


class LocalMaster:
    """One cluster's consistent state, and validation of every GM request."""

    def __init__(
        self,
        lm_id: LmId,
        nodes: Sequence[NodeSpec],
        home: Sequence[GmId],
        *,
        gms: Sequence[GmId] = (),
        epoch: int = 0,
        log_limit: int | None = None,
        retain_s: float = ENDS_RETAINED_S,
        report_starts: bool = False,
        awaiting_workers: bool = False,
        victims_younger_than_wait: bool = False,
        reroute: bool = False,
    ) -> None:
        if len(nodes) != len(home):
            raise ValueError("every node needs a home partition")
        if not nodes:
            raise ValueError("an LM needs at least one node")
        self.lm_id = lm_id
        self.epoch = epoch
        self.capacity: list[Resources] = [n.capacity for n in nodes]
        self.constraints: list[int] = [n.constraints for n in nodes]
        self.home: list[GmId] = list(home)
        self.gms: frozenset[GmId] = frozenset(home) | frozenset(gms)
        """The federation's GMs (the only ones whose requests are taken)."""
        self.n_resources = len(self.capacity[0])
        self.registered: bool = not awaiting_workers
        """Whether the worker pool has told this incarnation what runs; until it has, no
        node is alive (a restarted LM must not count a running task's resources as free)."""
        self.free: list[list[int]] = [
            list(c) if self.registered else [0] * len(c) for c in self.capacity
        ]
        self.alive: list[bool] = [self.registered] * len(nodes)
        self.last_seen: list[float] = [0.0] * len(nodes)
        self.node_version: list[int] = [0] * len(nodes)
        self.version = 0
        self.active: dict[TaskKey, ActiveTask] = {}
        self.stopping: dict[tuple[TaskKey, int], ActiveTask] = {}
        """Preempted attempts (released) whose stop the pool has not confirmed yet."""
        self.on_node: list[set[TaskKey]] = [set() for _ in nodes]
        self.done: OrderedDict[TaskKey, tuple[GmId, EndedRow, float]] = OrderedDict()
        """Attempts that ended here in the last ``retain_s`` seconds: a late duplicate
        launch is recognised, and a restarted GM learns what already ran."""
        self.retain_s = retain_s
        self.keep_ends: set[JobKeyAt] = set()
        """Jobs (GM, user, job) whose GM asked that their ended attempts be kept."""
        self.kept: dict[JobKeyAt, dict[TaskKey, tuple[GmId, EndedRow, float]]] = {}
        """Ended attempts of those jobs past ``retain_s``, until their GM lets them go."""
        self.let_go: OrderedDict[JobKeyAt, float] = OrderedDict()
        """Jobs whose GM let their ends go in the last ``retain_s`` seconds (when).  A GM
        keeps a job's ends once and lets them go once: a keep that comes after the
        let-go was held back on the way (within its signature's freshness, far shorter
        than ``retain_s``) and is ignored -- applied, it would keep them for ever."""
        self.report_starts = report_starts
        self.victims_younger_than_wait = victims_younger_than_wait
        """Preempt only tasks that ran for less time than the requester waited
        (``common.overload.OverloadPolicy``)."""
        self.reroute = reroute
        """Place a task whose node has no room on another that fits, instead of refusing
        (``common.overload.OverloadPolicy.reroute_at_lm``)."""
        self._partition: dict[GmId, tuple[list[int], list[int]]] = {}
        """Per GM: the nodes of its partition, and the others (rerouting's order)."""
        self.usage: dict[Any, list[int]] = {}
        self._log: list[int] = []
        self._log_base = 0
        self._log_limit = log_limit if log_limit is not None else max(4 * len(nodes), 4096)
        self._heartbeat_version = 0
        self._last_check = -1.0
        self.counters = LmCounters()
        self.recent_repartitions: deque[Repartition] = deque(maxlen=RECENT_REPARTITIONS)
        """The latest repartitions (for operators: ``local_master.inspect``)."""
        self._handlers: dict[type, Callable[[Any, float], list[Effect]]] = {
            LaunchRequest: self._on_launch,
            PreemptRequest: self._on_preempt,
            SnapshotRequest: self._on_snapshot_request,
            KeepEnds: self._on_keep_ends,
            WorkerReports: self._on_worker_reports,
            WorkerHeartbeat: self._on_worker_heartbeat,
            RegisterWorkers: self._on_register,
            Heartbeat: self._on_heartbeat,
            CheckWorkers: self._on_check_workers,
        }

    # --------------------------------------------------------------- the entry
    def handle(self, msg: object, now: float) -> list[Effect]:
        """Take one message at time ``now``; return what the driver must do."""
        try:
            handler = self._handlers[type(msg)]
        except KeyError:
            raise TypeError(f"an LM does not handle {type(msg).__name__}") from None
        return handler(msg, now)

    # ------------------------------------------------------------------ state
    @property
    def n_nodes(self) -> int:
        return len(self.capacity)

    def idle_nodes(self) -> int:
        """Nodes free of any attempt this LM holds, counting one attempt per node (a
        node that holds several counts them all: a low bound)."""
        return max(self.n_nodes - len(self.active), 0)

    def _touch(self, node: int) -> None:
        self.version += 1
        self.node_version[node] = self.version
        self._log.append(node)
        if len(self._log) > self._log_limit:
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_base += drop

    def layout(self) -> ClusterLayout:
        return ClusterLayout(
            lm=self.lm_id,
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
        idx = tuple(NodeIndex(i) for i in nodes)
        free = self.free
        nv = self.node_version
        return StateDelta(
            lm=self.lm_id,
            epoch=self.epoch,
            version=self.version,
            base_version=base,
            nodes=idx,
            free=tuple(tuple(free[i]) for i in idx),
            node_versions=tuple(nv[i] for i in idx),
            usage={u: tuple(v) for u, v in self.usage.items()},
        )

    def snapshot(self, gm: GmId | None = None) -> StateSnapshot:
        held: tuple[HeldTask, ...] = ()
        if gm is not None:
            held = tuple(a.held() for a in self.active.values() if a.gm == gm) + tuple(
                held_of(row)
                for ended in (self.done, *self.kept.values())
                for g, row, _ in ended.values()
                if g == gm
            )
        return StateSnapshot(layout=self.layout(), state=self.delta_since(-1), held=held)

    def logical_nodes(self) -> list[tuple[TaskKey, NodeIndex, GmId, Resources]]:
        """Logical nodes created by repartition: (task, physical node, GM, resources)."""
        return [(k, a.node, a.gm, a.spec.demand) for k, a in self.active.items() if a.logical]

    # ------------------------------------------------------------- accounting
    def _commit(
        self,
        spec: TaskSpec,
        attempt: int,
        node: int,
        gm: GmId,
        altruistic: bool,
        now: float,
        queued_at: float = -1.0,
    ) -> bool:
        """Take ``spec.demand`` from ``node`` for ``gm``; True if it is a repartition."""
        free = self.free[node]
        for r, d in enumerate(spec.demand):
            free[r] -= d
        use = self.usage.get(spec.user)
        if use is None:
            use = self.usage[spec.user] = [0] * self.n_resources
        for r, d in enumerate(spec.demand):
            use[r] += d
        logical = self.home[node] != gm
        key = (spec.user, spec.task_id)
        self.active[key] = ActiveTask(
            spec, attempt, NodeIndex(node), gm, logical, altruistic, accepted_at=now,
            queued_at=queued_at,
        )  # fmt: skip
        self.on_node[node].add(key)
        self._touch(node)
        if logical:
            self.recent_repartitions.append(
                Repartition(now, key, attempt, NodeIndex(node), self.home[node], gm, spec.demand)
            )
        return logical

    def _release(self, key: TaskKey) -> ActiveTask | None:
        a = self.active.pop(key, None)
        if a is None:
            return None
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
        if not any(use):
            del self.usage[user]
        self._touch(node)
        return a

    def _retire(self, key: TaskKey, a: ActiveTask, ended_at: float, ok: bool, now: float) -> None:
        self.done[key] = (a.gm, ended_row(a.held(ended_at=ended_at, ok=ok)), now)
        self.done.move_to_end(key)

    def _check(self, spec: TaskSpec, node: int) -> str:
        if not 0 <= node < self.n_nodes:
            return "unknown_node"
        if not self.alive[node]:
            return "node_down"
        if not satisfies(self.constraints[node], spec.constraints):
            return "constraints_unmet"
        if len(spec.demand) != self.n_resources:  # a pool's listing is not checked before
            return "wrong_resources"
        free = self.free[node]
        for r, d in enumerate(spec.demand):
            if free[r] < d:
                return "insufficient_resources"
        return "ok"

    def _start(self, key: TaskKey) -> ToWorker:
        a = self.active[key]
        return ToWorker(
            StartTask(
                node=a.node,
                spec=a.spec,
                attempt=a.attempt,
                gm=a.gm,
                altruistic=a.altruistic,
                queued_at=a.queued_at,
            )
        )

    def still_starts(self, s: StartTask) -> bool:
        """Whether this LM still holds the attempt ``s`` starts, where ``s`` starts it."""
        a = self.active.get((s.spec.user, s.spec.task_id))
        return a is not None and a.attempt == s.attempt and a.node == s.node

    def _stop(self, a: ActiveTask) -> ToWorker:
        return ToWorker(
            StopTask(
                node=a.node, user=a.spec.user, task_id=a.spec.task_id, attempt=a.attempt, gm=a.gm
            )
        )

    def _refuse_request(self, gm: GmId, lm: LmId, specs: Iterable[TaskSpec]) -> Refused | None:
        """Why a whole GM request is not for this LM (now), or None."""
        if lm != self.lm_id:
            return Refused(reason="wrong_lm", detail=f"this is {self.lm_id}, not {lm}")
        if not self.registered:  # it may hold the task without knowing yet: ask again later
            return Refused(reason="not_ready", detail=f"{self.lm_id} awaits its workers")
        if gm not in self.gms:
            return Refused(reason="unknown_gm", detail=f"{gm} is not a GM of this federation")
        seen: set[TaskKey] = set()
        for spec in specs:
            if len(spec.demand) != self.n_resources:
                return Refused(
                    reason="wrong_resources",
                    detail=f"task {spec.task_id}: {len(spec.demand)} resource amounts, "
                    f"this cluster has {self.n_resources}",
                )
            key = (spec.user, spec.task_id)
            if key in seen:
                return Refused(
                    reason="duplicate_task_id", detail=f"task {spec.task_id} twice in one request"
                )
            seen.add(key)
        return None

    # --------------------------------------------------------------- requests
    def _on_launch(self, req: LaunchRequest, now: float) -> list[Effect]:
        """Validate and enforce a batch of launches (internal) and repartitions (external).

        Partial acceptance: each placement is judged alone, in order.
        """
        refused = self._refuse_request(req.gm, req.lm, (p.spec for p in req.placements))
        if refused is not None:
            self.counters.refused_requests += 1
            return [Reply(refused)]
        effects: list[Effect] = []
        results = tuple(self._launch_one(req.gm, p, now, effects) for p in req.placements)
        response = LaunchResponse(
            gm=req.gm,
            lm=self.lm_id,
            request_id=req.request_id,
            results=results,
            delta=self.delta_since(req.known_version),
            request_sent_at=req.sent_at,
            received_at=now,
            sent_at=now,
        )
        effects.insert(0, Reply(response))
        return effects

    def _held(self, spec: TaskSpec, attempt: int, effects: list[Effect]) -> PlacementResult | None:
        """The answer to a placement of an attempt this LM holds, or held lately (a
        duplicate: nothing changes), or None.  An older attempt still held here is
        superseded: stopped and released, and the new one is judged afresh.  A task
        that ended here lately is that task only if of the same job: a user may use a
        task id again in a later job, which is a new task."""
        key = (spec.user, spec.task_id)
        a = self.active.get(key)
        if a is not None:
            if a.attempt >= attempt:
                return PlacementResult(accepted=True, reason="duplicate", attempt=a.attempt)
            self._release(key)
            effects.append(self._stop(a))
        past = self.done.get(key)
        if past is not None and past[1][_ATTEMPT] >= attempt and past[1][_JOB] == spec.job_id:
            row = past[1]
            reason = "finished" if row[_OK] else "failed"
            return PlacementResult(accepted=True, reason=reason, attempt=row[_ATTEMPT])
        return None

    _OK = PlacementResult(accepted=True, reason="ok")

    def _launch_one(
        self, gm: GmId, p: Placement, now: float, effects: list[Effect]
    ) -> PlacementResult:
        spec = p.spec
        held = self._held(spec, p.attempt, effects)
        if held is not None:
            self.counters.duplicates += 1
            return held
        node: int = p.node
        reason = self._check(spec, node)
        if reason in _NO_ROOM and self.reroute and (other := self._reroute(spec, gm)) >= 0:
            node, reason = other, "rerouted"
            self.counters.rerouted += 1
        if reason not in ("ok", "rerouted"):
            external = self.home[p.node] != gm if 0 <= p.node < self.n_nodes else p.repartition
            if external:
                self.counters.refused_external += 1
            else:
                self.counters.refused_internal += 1
            return PlacementResult(accepted=False, reason=reason)
        if self._commit(spec, p.attempt, node, gm, p.altruistic, now, p.queued_at):
            self.counters.repartitions += 1
        else:
            self.counters.launches += 1
        effects.append(self._start((spec.user, spec.task_id)))
        if reason == "rerouted":
            return PlacementResult(accepted=True, reason=reason, node=node)
        return self._OK

    def _reroute(self, spec: TaskSpec, gm: GmId) -> int:
        """The first node that fits ``spec`` now, in ``gm``'s partition first, then in
        the others; -1 if none does (the placement is refused)."""
        order = self._partition.get(gm)
        if order is None:
            mine = [i for i, h in enumerate(self.home) if h == gm]
            order = self._partition[gm] = (mine, [i for i, h in enumerate(self.home) if h != gm])
        for nodes in order:
            for i in nodes:
                if self._check(spec, i) == "ok":
                    return i
        return -1

    def _on_preempt(self, req: PreemptRequest, now: float) -> list[Effect]:
        """Verify that preempting ``req.victim``'s tasks frees room for ``req.spec``; do it.

        The LM picks the node where making room throws away the least work, then needs
        the fewest victims; on a node it takes altruistic tasks first, then the youngest
        (least run), and never more than the room needs.  The work thrown away is
        counted (``preempted_work_s``).  Refused when the victim has nothing here that
        would make room.
        """
        refused = self._refuse_request(req.gm, req.lm, (req.spec,))
        if refused is not None:
            self.counters.refused_requests += 1
            return [Reply(refused)]
        spec = req.spec
        self.counters.preemption_requests += 1
        effects: list[Effect] = []
        held = self._held(spec, req.attempt, effects)
        if held is not None:
            self.counters.duplicates += 1
            dup = self._preempt_response(req, now, True, held.reason, None, (), held.attempt)
            return [dup, *effects]
        best: tuple[float, int, int, list[ActiveTask]] | None = None
        by_node: dict[int, list[ActiveTask]] = {}
        waited = now - req.queued_at
        paying = self.victims_younger_than_wait and req.queued_at >= 0
        for a in self.active.values():
            if a.spec.user != req.victim:
                continue
            if paying and a.started_at >= 0 and now - a.started_at > waited:
                continue  # would throw away more work than the wait it ends
            by_node.setdefault(a.node, []).append(a)
        demand = spec.demand
        for node, victims in by_node.items():
            if not self.alive[node] or not satisfies(self.constraints[node], spec.constraints):
                continue
            victims.sort(key=lambda a: (not a.altruistic, _work(a, now)))
            room = list(self.free[node])
            chosen: list[ActiveTask] = []
            lost = 0.0
            for a in victims:
                if all(f >= d for f, d in zip(room, demand, strict=True)):
                    break
                chosen.append(a)
                lost += _work(a, now)
                for r, d in enumerate(a.spec.demand):
                    room[r] += d
            if all(f >= d for f, d in zip(room, demand, strict=True)) and (
                best is None or (lost, len(chosen)) < (best[0], best[1])
            ):
                best = (lost, len(chosen), node, chosen)
        if best is None or not best[3]:
            self.counters.preemptions_refused += 1
            reason = "no_victim" if best is None else "room_free"
            if best is not None:
                # Room appeared without preempting anyone: launch as a plain placement.
                node = best[2]
                self._commit(spec, req.attempt, node, req.gm, False, now, req.queued_at)
                effects.append(self._start((spec.user, spec.task_id)))
                return [
                    self._preempt_response(req, now, True, reason, NodeIndex(node), ()),
                    *effects,
                ]
            return [self._preempt_response(req, now, False, reason, None, ()), *effects]
        lost, _, node, chosen = best
        self.counters.preempted_work_s += lost
        refs = []
        for victim in chosen:
            key = (victim.spec.user, victim.spec.task_id)
            self._release(key)
            self.counters.preemptions += 1
            effects.append(self._stop(victim))
            # back to its GM once its pool confirms the stop (a STOPPED report), so the
            # next attempt cannot start while this one still runs
            self.stopping[(key, victim.attempt)] = victim
            refs.append(PlacedRef(user=key[0], task_id=key[1], attempt=victim.attempt))
        if self._commit(spec, req.attempt, node, req.gm, False, now, req.queued_at):
            self.counters.repartitions += 1
        effects.append(self._start((spec.user, spec.task_id)))
        response = self._preempt_response(req, now, True, "ok", NodeIndex(node), refs)
        return [response, *effects]

    def _preempt_response(
        self,
        req: PreemptRequest,
        now: float,
        accepted: bool,
        reason: str,
        node: NodeIndex | None,
        preempted: Sequence[PlacedRef],
        attempt: int = 0,
    ) -> Reply:
        return Reply(
            PreemptResponse(
                gm=req.gm,
                lm=self.lm_id,
                request_id=req.request_id,
                accepted=accepted,
                reason=reason,
                node=node,
                preempted=tuple(preempted),
                attempt=attempt,
                delta=self.delta_since(req.known_version),
                request_sent_at=req.sent_at,
                received_at=now,
                sent_at=now,
            )
        )

    def _on_snapshot_request(self, req: SnapshotRequest, now: float) -> list[Effect]:
        """A GM (new, restarted, or one that saw a gap) asks for the full state."""
        if not self.registered:
            return [Reply(Refused(reason="not_ready", detail=f"{self.lm_id} awaits its workers"))]
        if req.lm != self.lm_id:
            return [Reply(Refused(reason="wrong_lm", detail=f"this is {self.lm_id}"))]
        if req.gm not in self.gms:
            return [Reply(Refused(reason="unknown_gm", detail=f"{req.gm} is not a GM here"))]
        return [Reply(self.snapshot(req.gm))]

    def _on_keep_ends(self, msg: KeepEnds, now: float) -> list[Effect]:
        """A GM keeps (or lets go) the ended attempts of one of its jobs past ``retain_s``
        (a keep after the job's let-go is late: ``let_go``)."""
        if msg.lm != self.lm_id:
            return [Reply(Refused(reason="wrong_lm", detail=f"this is {self.lm_id}"))]
        if msg.gm not in self.gms:
            return [Reply(Refused(reason="unknown_gm", detail=f"{msg.gm} is not a GM here"))]
        job = (msg.gm, msg.user, msg.job_id)
        let_go = self.let_go
        while let_go and next(iter(let_go.values())) < now - self.retain_s:
            let_go.popitem(last=False)
        if msg.keep:
            if job in let_go:
                self.counters.stale_keep_ends += 1
            else:
                self.keep_ends.add(job)
        else:
            self.keep_ends.discard(job)
            self.kept.pop(job, None)
            let_go[job] = now
            let_go.move_to_end(job)
        return []

    # ---------------------------------------------------------------- workers
    def _event(self, kind: EventKind, a: ActiveTask, now: float, detail: str = "") -> TaskEvent:
        return TaskEvent(
            kind=kind,
            lm=self.lm_id,
            gm=a.gm,
            user=a.spec.user,
            task_id=a.spec.task_id,
            attempt=a.attempt,
            node=a.node,
            node_free=tuple(self.free[a.node]),
            node_version=self.node_version[a.node],
            at=now,
            worker_at=a.worker_at,
            started_at=a.started_at,
            detail=detail,
            job_id=a.spec.job_id,
            queued_at=a.queued_at,
        )

    def _on_worker_reports(self, msg: WorkerReports, now: float) -> list[Effect]:
        """Worker reports: a task started, finished or failed on a node."""
        if msg.lm != self.lm_id:
            return [Reply(Refused(reason="wrong_lm", detail=f"this is {self.lm_id}"))]
        if not self.registered:
            return [Reply(Refused(reason="register_first", detail=f"{self.lm_id} restarted"))]
        effects: list[Effect] = []
        for rep in msg.reports:
            if not 0 <= rep.node < self.n_nodes:
                self.counters.stale_reports += 1
                continue
            self._report(rep, now, effects)
        return effects

    def _report(self, rep: WorkerReport, now: float, effects: list[Effect]) -> None:
        self.last_seen[rep.node] = now
        key = (rep.user, rep.task_id)
        if rep.kind == ReportKind.STOPPED:
            self._preempted(self.stopping.pop((key, rep.attempt), None), now, effects)
            return
        a = self.active.get(key)
        if a is None or a.node != rep.node or a.attempt != rep.attempt:
            # an attempt this LM does not hold (preempted, superseded, relaunched; or it
            # ended while this LM was down): its GM judges the attempt, so an end goes on
            self.counters.stale_reports += 1
            if rep.kind != ReportKind.STARTED and a is None and rep.gm in self.gms:
                effects.append(ToGm(rep.gm, self._orphan_event(rep, now)))
            if rep.kind == ReportKind.STARTED:
                effects.append(
                    ToWorker(
                        StopTask(
                            node=rep.node,
                            user=rep.user,
                            task_id=rep.task_id,
                            attempt=rep.attempt,
                            gm=rep.gm,
                        )
                    )
                )
            return
        a.worker_at = rep.worker_at
        if rep.started_at >= 0:
            a.started_at = rep.started_at
        if rep.kind == ReportKind.STARTED:
            if self.report_starts:
                effects.append(ToGm(a.gm, self._event(EventKind.STARTED, a, rep.at)))
            return
        if rep.kind == ReportKind.LOST:  # its pool stopped it: placed again (new attempt)
            self._release(key)
            effects.extend(self._relaunch([a], now))
            return
        self._release(key)
        ok = rep.kind == ReportKind.FINISHED
        self._retire(key, a, rep.at, ok, now)
        kind = EventKind.FINISHED if ok else EventKind.FAILED
        effects.append(ToGm(a.gm, self._event(kind, a, rep.at, rep.detail)))

    def _orphan_event(self, rep: WorkerReport, now: float) -> TaskEvent:
        kind = {
            ReportKind.FINISHED: EventKind.FINISHED,
            ReportKind.FAILED: EventKind.FAILED,
        }.get(rep.kind, EventKind.REQUEUED)
        return TaskEvent(
            kind=kind, lm=self.lm_id, gm=rep.gm, user=rep.user, task_id=rep.task_id,
            attempt=rep.attempt, node=rep.node, node_free=tuple(self.free[rep.node]),
            node_version=self.node_version[rep.node], at=rep.at, worker_at=rep.worker_at,
            started_at=rep.started_at, detail=rep.detail, job_id=rep.job_id,
            queued_at=rep.queued_at,
        )  # fmt: skip

    def _on_register(self, msg: RegisterWorkers, now: float) -> list[Effect]:
        """The worker pool says which nodes live and what runs on them: this incarnation
        takes it as the truth (§IV-D: the workers hold what runs)."""
        if msg.lm != self.lm_id:
            return [Reply(Refused(reason="wrong_lm", detail=f"this is {self.lm_id}"))]
        bad = next((n for n in msg.nodes if not 0 <= n < self.n_nodes), None)
        if bad is None:
            bad = next((s.node for s in msg.running if not 0 <= s.node < self.n_nodes), None)
        if bad is not None:
            return [Reply(Refused(reason="unknown_node", detail=f"node {bad} is not here"))]
        self._seen(msg.nodes, now)
        started = {(r.user, r.task_id, r.attempt): r for r in msg.started}
        effects: list[Effect] = [Reply(Registered(lm=self.lm_id, epoch=self.epoch))]
        # what this LM holds on those nodes and the pool no longer runs (the pool
        # restarted) is lost; what it accepted after the pool spoke may still be on its way
        runs = {(s.spec.user, s.spec.task_id, s.attempt) for s in msg.running}
        nodes = set(msg.nodes)
        gone = [
            a for k, a in self.active.items()
            if a.node in nodes and (k[0], k[1], a.attempt) not in runs and a.accepted_at < msg.at
        ]  # fmt: skip
        for a in gone:
            self._release((a.spec.user, a.spec.task_id))
        effects.extend(self._relaunch(gone, now))
        self._confirm_stops(
            lambda k, a: a.node in nodes and (*k[0], k[1]) not in runs, now, effects
        )
        for s in msg.running:
            key = (s.spec.user, s.spec.task_id)
            held = self.active.get(key)
            if held is not None and held.attempt >= s.attempt:
                continue
            if held is not None:  # an older attempt here: the pool's is the one that runs
                self._release(key)
            if s.gm not in self.gms or self._check(s.spec, s.node) != "ok":
                self.counters.refused_internal += 1
                effects.append(
                    ToWorker(
                        StopTask(
                            node=s.node,
                            user=s.spec.user,
                            task_id=s.spec.task_id,
                            attempt=s.attempt,
                            gm=s.gm,
                        )
                    )
                )
                continue  # fmt: skip
            self._commit(s.spec, s.attempt, s.node, s.gm, s.altruistic, now, s.queued_at)
            rep = started.get((s.spec.user, s.spec.task_id, s.attempt))
            if rep is not None:
                self.active[key].worker_at = rep.worker_at
                self.active[key].started_at = rep.started_at
            self.counters.recovered += 1
        for e in msg.ended:
            self._learn_ended(e, now, effects)
        self.registered = True
        return effects

    def _learn_ended(self, e: EndedAttempt, now: float, effects: list[Effect]) -> None:
        """An attempt that ended while no LM took its report: held as ended (a GM that
        asks sees it ended, and does not place it again), its end sent on to its GM."""
        rep = e.report
        key = (rep.user, rep.task_id)
        if not 0 <= rep.node < self.n_nodes:
            return
        if rep.kind == ReportKind.LOST:
            self._learn_lost(e, now, effects)
            return
        if rep.kind not in ENDS:
            return
        a = self.active.get(key)
        if a is not None:
            if a.attempt == rep.attempt and a.node == rep.node:
                self._report(rep, now, effects)
            return
        if key in self.done or e.start.gm not in self.gms:
            return
        held = HeldTask(
            spec=e.start.spec,
            attempt=rep.attempt,
            queued_at=e.start.queued_at,
            worker_at=rep.worker_at,
            started_at=rep.started_at,
            ended_at=rep.at,
            ok=rep.kind == ReportKind.FINISHED,
        )
        self.done[key] = (e.start.gm, ended_row(held), now)
        self.counters.recovered_ends += 1
        effects.append(ToGm(e.start.gm, self._orphan_event(rep, now)))

    def _learn_lost(self, e: EndedAttempt, now: float, effects: list[Effect]) -> None:
        """An attempt its pool stopped when it lost its LM (the lease): if this
        incarnation holds nothing newer of it, it runs again, as a new attempt here (its
        GM, which may have restarted and forgotten it, hears RELAUNCHED, then its end)."""
        rep, start = e.report, e.start
        key = (rep.user, rep.task_id)
        if key in self.active or key in self.done or start.gm not in self.gms:
            return
        lost = ActiveTask(
            spec=start.spec, attempt=rep.attempt, node=rep.node, gm=start.gm, logical=False,
            altruistic=start.altruistic, accepted_at=now, worker_at=rep.worker_at,
            started_at=rep.started_at, queued_at=start.queued_at,
        )  # fmt: skip
        self.counters.recovered += 1
        effects.extend(self._relaunch([lost], now))

    def _on_worker_heartbeat(self, msg: WorkerHeartbeat, now: float) -> list[Effect]:
        """A worker pool's nodes are alive; a node that had been declared dead comes
        back empty."""
        if msg.lm != self.lm_id:
            return [Reply(Refused(reason="wrong_lm", detail=f"this is {self.lm_id}"))]
        if not self.registered:
            return [Reply(Refused(reason="register_first", detail=f"{self.lm_id} restarted"))]
        bad = next((n for n in msg.nodes if not 0 <= n < self.n_nodes), None)
        if bad is not None:
            return [Reply(Refused(reason="unknown_node", detail=f"node {bad} is not here"))]
        self._seen(msg.nodes, now)
        return []

    def _seen(self, nodes: Iterable[int], now: float) -> None:
        """Its pool says these nodes live: a node declared dead comes back with what it
        still held (its pool's reports settle those attempts)."""
        for node in nodes:
            self.last_seen[node] = now
            if not self.alive[node]:
                self.alive[node] = True
                free = list(self.capacity[node])
                for key in self.on_node[node]:
                    self.counters.held_through_silence += 1
                    for r, d in enumerate(self.active[key].spec.demand):
                        free[r] -= d
                self.free[node] = free
                self._touch(node)

    def _on_check_workers(self, msg: CheckWorkers, now: float) -> list[Effect]:
        """Declare nodes silent for ``timeout`` dead; give up the tasks of nodes silent
        for ``lost_after`` (§IV-D).

        A dead node gets no placements, but what it held stays held: a node that is
        only cut off (partition, frozen pool) may have finished a task whose end no one
        heard, so running it again at once could run it twice.  Its pool accounts for
        every attempt when it speaks again (ends, stops for want of a lease, runs on),
        or a restarted pool registers without them; only a node silent for
        ``lost_after`` is given up: each task goes as a new attempt to a live node.
        """
        effects: list[Effect] = []
        paused = self._last_check >= 0 and now - self._last_check > msg.timeout
        self._last_check = now
        if paused:
            # this LM did not run for a whole timeout (paused, starved): the silence it
            # sees is its own; give every node a fresh timeout instead of declaring all dead
            self.counters.pauses += 1
            self.last_seen = [now] * self.n_nodes
            return effects
        give_up = max(msg.lost_after, msg.timeout)
        for node in range(self.n_nodes):
            silent = now - self.last_seen[node]
            if self.alive[node] and silent > msg.timeout:
                self._lose_node(node)
            if not self.alive[node] and silent > give_up and self._holds(node):
                effects.extend(self._give_up(node, now))
        return effects

    def _holds(self, node: int) -> bool:
        return bool(self.on_node[node]) or any(a.node == node for a in self.stopping.values())

    def _lose_node(self, node: int) -> None:
        """Silent for the timeout: dead, nothing placed on it; its tasks stay held."""
        self.counters.workers_lost += 1
        self.alive[node] = False
        self.free[node] = [0] * self.n_resources
        self._touch(node)

    def _give_up(self, node: int, now: float) -> list[Effect]:
        """Silent for ``lost_after``: its tasks run again elsewhere (its pool fenced
        itself long ago: its lease is shorter than the timeout)."""
        self.counters.nodes_given_up += 1
        orphans = [self.active[k] for k in list(self.on_node[node])]
        for a in orphans:
            self._release((a.spec.user, a.spec.task_id))
        effects = self._relaunch(orphans, now)
        self._confirm_stops(lambda k, a: a.node == node, now, effects)
        return effects

    def _preempted(self, victim: ActiveTask | None, now: float, effects: list[Effect]) -> None:
        """A preempted attempt runs no more: its GM re-queues the task."""
        if victim is None:
            self.counters.stale_reports += 1
            return
        effects.append(ToGm(victim.gm, self._event(EventKind.PREEMPTED, victim, now)))

    def _confirm_stops(
        self, gone: Callable[[tuple[TaskKey, int], ActiveTask], bool], now: float,
        effects: list[Effect],
    ) -> None:  # fmt: skip
        """Preempted attempts known to run no more without their pool's report."""
        for k, a in list(self.stopping.items()):
            if gone(k, a):
                self._preempted(self.stopping.pop(k), now, effects)

    def _relaunch(self, orphans: list[ActiveTask], now: float) -> list[Effect]:
        """Attempts that no worker runs any more (released already): each goes, as a new
        attempt, to the first live node of its GM's partition that fits; failing that,
        back to its GM, which re-queues it at the front of its queue."""
        effects: list[Effect] = []
        for a in orphans:
            spec = a.spec
            target = next(
                (
                    n
                    for n in range(self.n_nodes)
                    if self.home[n] == a.gm and self._check(spec, n) == "ok"
                ),
                None,
            )
            if target is None:
                self.counters.returned_to_gm += 1
                effects.append(ToGm(a.gm, self._event(EventKind.REQUEUED, a, now, "worker lost")))
                continue
            self.counters.relaunched += 1
            lost = self._event(EventKind.RELAUNCHED, a, now, "worker lost")
            attempt = a.attempt + 1
            self._commit(spec, attempt, target, a.gm, a.altruistic, now, a.queued_at)
            # it names the new attempt and node, and keeps the lost one's start (work lost)
            effects.append(ToGm(a.gm, replace(lost, attempt=attempt, node=NodeIndex(target))))
            effects.append(self._start((spec.user, spec.task_id)))
        return effects

    # -------------------------------------------------------------- heartbeat
    def _on_heartbeat(self, msg: Heartbeat, now: float) -> list[Effect]:
        """The periodic state update to every GM: a delta since the previous one."""
        delta = self.delta_since(self._heartbeat_version)
        self._heartbeat_version = self.version
        done = self.done
        horizon = now - self.retain_s
        while done:
            key, entry = next(iter(done.items()))
            if entry[2] > horizon:
                break
            done.popitem(last=False)
            if self.keep_ends:
                job = (entry[0], key[0], entry[1][_JOB])
                if job in self.keep_ends:
                    self.kept.setdefault(job, {})[key] = entry
        return [ToAllGms(StateUpdated(delta=delta))]
