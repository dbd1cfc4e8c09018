"""The Local Master's pure core: the only consistent state of one cluster.

Theory of operation (Megha paper §IV-A, §IV-B4, §IV-B6, §IV-C, §IV-D):

* The LM owns the truth about its worker nodes: capacity, free resources, machine
  constraints, liveness, and the *active task list* (which task holds what where).
* The cluster is split into one partition per GM: every physical node has a *home*
  GM.  A **repartition** carves exactly the requested resources out of a node in
  another GM's partition into a *logical node* of the requesting GM's partition; the
  logical node lives as long as its task and its resources return to the physical
  node when the task ends.  Granularity is resources, never whole nodes.
* Every request from a GM is **validated** against true state; a request that the
  true state cannot satisfy is refused (an *inconsistency*) and every response
  piggybacks a delta of the cluster's state since the version the GM said it knows.
* **Versions**: ``version`` grows by one on every change of any node; each node
  remembers the version of its last change.  Deltas carry per-node versions, so GMs
  apply them in any order and never go backwards.

Invariants (checked by tests/property): for every node ``0 <= free <= capacity``
componentwise and ``free + sum(demand of active tasks on it) == capacity`` while the
node is alive; every accepted task id is active or done, never both; ``version`` is
monotone.

No clocks, sockets or randomness: ``now`` is an argument, effects are returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.effects import Effect, ToAllGms, ToGm, ToWorker
from common.ids import GmId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    ClusterLayout,
    LaunchRequest,
    LaunchResponse,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StartTask,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    StopTask,
    TaskEvent,
    WorkerReport,
)
from common.model import NodeSpec, Phase, Resources, Task, satisfies


@dataclass(slots=True)
class ActiveTask:
    """An entry of the active task list."""

    task: Task
    node: NodeIndex
    gm: GmId
    logical: bool
    """Placed on a logical node carved out of another GM's partition (a repartition)."""
    accepted_at: float = 0.0
    """When this LM accepted it (its own clock: victim choice never depends on hearsay)."""
    started: bool = False


class LocalMaster:
    """One cluster's consistent state, and validation of every GM request."""

    def __init__(
        self,
        lm_id: LmId,
        nodes: Sequence[NodeSpec],
        home: Sequence[GmId],
        *,
        log_limit: int | None = None,
    ) -> None:
        if len(nodes) != len(home):
            raise ValueError("every node needs a home partition")
        if not nodes:
            raise ValueError("an LM needs at least one node")
        self.lm_id = lm_id
        self.capacity: list[Resources] = [n.capacity for n in nodes]
        self.constraints: list[int] = [n.constraints for n in nodes]
        self.home: list[GmId] = list(home)
        self.n_resources = len(self.capacity[0])
        self.free: list[list[int]] = [list(c) for c in self.capacity]
        self.alive: list[bool] = [True] * len(nodes)
        self.last_seen: list[float] = [0.0] * len(nodes)
        self.node_version: list[int] = [0] * len(nodes)
        self.version = 0
        self.active: dict[TaskId, ActiveTask] = {}
        self.on_node: list[set[TaskId]] = [set() for _ in nodes]
        self.accepted_by: dict[TaskId, GmId] = {}
        """Every task id this LM ever accepted, and its GM: launches are idempotent."""
        self.usage: dict[UserId, list[int]] = {}
        self._log: list[int] = []
        self._log_base = 0
        self._log_limit = log_limit if log_limit is not None else max(4 * len(nodes), 4096)
        self._heartbeat_version = 0
        self.counters: dict[str, int] = {
            "launches": 0,
            "repartitions": 0,
            "refused_internal": 0,
            "refused_external": 0,
            "duplicates": 0,
            "preemption_requests": 0,
            "preemptions": 0,
            "preemptions_refused": 0,
            "relaunched": 0,
            "returned_to_gm": 0,
            "workers_lost": 0,
        }

    # ------------------------------------------------------------------ state
    @property
    def n_nodes(self) -> int:
        return len(self.capacity)

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
        return StateDelta(
            lm=self.lm_id,
            version=self.version,
            base_version=base,
            nodes=idx,
            free=tuple(tuple(self.free[i]) for i in idx),
            node_versions=tuple(self.node_version[i] for i in idx),
            usage={u: tuple(v) for u, v in self.usage.items()},
        )

    def snapshot(self, gm: GmId | None = None) -> StateSnapshot:
        placed = () if gm is None else tuple(t for t, g in self.accepted_by.items() if g == gm)
        return StateSnapshot(layout=self.layout(), state=self.delta_since(-1), placed_by_gm=placed)

    def logical_nodes(self) -> list[tuple[TaskId, NodeIndex, GmId, Resources]]:
        """Logical nodes created by repartition: (task, physical node, GM, resources)."""
        return [(tid, a.node, a.gm, a.task.demand) for tid, a in self.active.items() if a.logical]

    # ------------------------------------------------------------- accounting
    def _commit(self, task: Task, node: int, gm: GmId, now: float) -> bool:
        """Take ``task.demand`` from ``node`` for ``gm``; True if it is a repartition."""
        free = self.free[node]
        for r, d in enumerate(task.demand):
            free[r] -= d
        use = self.usage.get(task.user)
        if use is None:
            use = self.usage[task.user] = [0] * self.n_resources
        for r, d in enumerate(task.demand):
            use[r] += d
        logical = self.home[node] != gm
        self.active[task.task_id] = ActiveTask(task, NodeIndex(node), gm, logical, now)
        self.on_node[node].add(task.task_id)
        self.accepted_by[task.task_id] = gm
        self._touch(node)
        return logical

    def _release(self, task_id: TaskId) -> ActiveTask | None:
        a = self.active.pop(task_id, None)
        if a is None:
            return None
        node = a.node
        self.on_node[node].discard(task_id)
        if self.alive[node]:
            free = self.free[node]
            for r, d in enumerate(a.task.demand):
                free[r] += d
        use = self.usage[a.task.user]
        for r, d in enumerate(a.task.demand):
            use[r] -= d
        if not any(use):
            del self.usage[a.task.user]
        self._touch(node)
        return a

    def _check(self, task: Task, node: int) -> str:
        if not 0 <= node < self.n_nodes:
            return "unknown_node"
        if not self.alive[node]:
            return "node_down"
        if not satisfies(self.constraints[node], task.constraints):
            return "constraints_unmet"
        free = self.free[node]
        for r, d in enumerate(task.demand):
            if free[r] < d:
                return "insufficient_resources"
        return "ok"

    def _start_effects(self, task: Task, node: int, now: float) -> ToWorker:
        task.enter(Phase.COMMUNICATION, now)
        return ToWorker(NodeIndex(node), StartTask(lm=self.lm_id, node=NodeIndex(node), task=task))

    # --------------------------------------------------------------- requests
    def on_launch(
        self, req: LaunchRequest, now: float, *, received_at: float | None = None
    ) -> list[Effect]:
        """Validate and enforce a batch of launches (internal) and repartitions (external).

        Partial acceptance: each placement is judged alone, in order.
        """
        recv = now if received_at is None else received_at
        effects: list[Effect] = []
        results: list[PlacementResult] = []
        for p in req.placements:
            results.append(self._launch_one(req.gm, p, recv, now, effects))
        response = LaunchResponse(
            gm=req.gm,
            lm=self.lm_id,
            request_id=req.request_id,
            results=tuple(results),
            delta=self.delta_since(req.known_version),
            received_at=recv,
            sent_at=now,
        )
        effects.insert(0, ToGm(req.gm, response))
        return effects

    def _launch_one(
        self, gm: GmId, p: Placement, recv: float, now: float, effects: list[Effect]
    ) -> PlacementResult:
        task = p.task
        if task.task_id in self.accepted_by:
            self.counters["duplicates"] += 1
            return PlacementResult(task_id=task.task_id, accepted=True, reason="duplicate")
        task.enter(Phase.PROCESSING, recv)
        reason = self._check(task, p.node)
        if reason != "ok":
            external = self.home[p.node] != gm if 0 <= p.node < self.n_nodes else p.repartition
            self.counters["refused_external" if external else "refused_internal"] += 1
            return PlacementResult(task_id=task.task_id, accepted=False, reason=reason)
        task.gm = gm
        if self._commit(task, p.node, gm, now):
            self.counters["repartitions"] += 1
        else:
            self.counters["launches"] += 1
        effects.append(self._start_effects(task, p.node, now))
        return PlacementResult(task_id=task.task_id, accepted=True, reason="ok")

    def on_preempt(
        self, req: PreemptRequest, now: float, *, received_at: float | None = None
    ) -> list[Effect]:
        """Verify that preempting ``req.victim``'s tasks frees room for ``req.task``; do it.

        The LM picks the node needing the fewest victims (altruistic tasks first, then
        the most recently accepted: the least work lost).  Refused when the victim has
        nothing here that would make room.
        """
        recv = now if received_at is None else received_at
        task = req.task
        self.counters["preemption_requests"] += 1
        effects: list[Effect] = []
        if task.task_id in self.accepted_by:
            self.counters["duplicates"] += 1
            return [self._preempt_response(req, recv, now, True, "duplicate", None, ())]
        task.enter(Phase.PROCESSING, recv)
        best: tuple[int, int, list[TaskId]] | None = None
        by_node: dict[int, list[ActiveTask]] = {}
        for a in self.active.values():
            if a.task.user == req.victim:
                by_node.setdefault(a.node, []).append(a)
        for node, victims in by_node.items():
            if not self.alive[node] or not satisfies(self.constraints[node], task.constraints):
                continue
            victims.sort(key=lambda a: (not a.task.altruistic, -a.accepted_at))
            room = list(self.free[node])
            chosen: list[TaskId] = []
            for a in victims:
                if all(f >= d for f, d in zip(room, task.demand, strict=True)):
                    break
                chosen.append(a.task.task_id)
                for r, d in enumerate(a.task.demand):
                    room[r] += d
            if all(f >= d for f, d in zip(room, task.demand, strict=True)) and (
                best is None or len(chosen) < best[1]
            ):
                best = (node, len(chosen), chosen)
        if best is None or not best[2]:
            self.counters["preemptions_refused"] += 1
            reason = "no_victim" if best is None else "room_free"
            if best is not None:
                # Room appeared without preempting anyone: launch as a plain placement.
                node = best[0]
                task.gm = req.gm
                self._commit(task, node, req.gm, now)
                effects.append(self._start_effects(task, node, now))
                return [
                    self._preempt_response(req, recv, now, True, reason, NodeIndex(node), ()),
                    *effects,
                ]
            return [self._preempt_response(req, recv, now, False, reason, None, ())]
        node, _, chosen = best
        for tid in chosen:
            victim = self._release(tid)
            assert victim is not None
            del self.accepted_by[tid]  # back to its GM's queue: a relaunch must run it
            self.counters["preemptions"] += 1
            victim.task.enter(Phase.COMMUNICATION, now)
            victim.task.started_at = -1.0
            effects.append(
                ToWorker(victim.node, StopTask(lm=self.lm_id, node=victim.node, task_id=tid))
            )
            effects.append(ToGm(victim.gm, self._event("preempted", victim, now)))
        task.gm = req.gm
        if self._commit(task, node, req.gm, now):
            self.counters["repartitions"] += 1
        effects.append(self._start_effects(task, node, now))
        response = self._preempt_response(req, recv, now, True, "ok", NodeIndex(node), chosen)
        return [response, *effects]

    def _preempt_response(
        self,
        req: PreemptRequest,
        recv: float,
        now: float,
        accepted: bool,
        reason: str,
        node: NodeIndex | None,
        preempted: Sequence[TaskId],
    ) -> ToGm:
        return ToGm(
            req.gm,
            PreemptResponse(
                gm=req.gm,
                lm=self.lm_id,
                request_id=req.request_id,
                task_id=req.task.task_id,
                accepted=accepted,
                reason=reason,
                node=node,
                preempted=tuple(preempted),
                delta=self.delta_since(req.known_version),
                received_at=recv,
                sent_at=now,
            ),
        )

    def on_snapshot_request(self, req: SnapshotRequest, now: float) -> list[Effect]:
        """A GM (new, restarted, or one that saw a gap) asks for the full state."""
        del now
        return [ToGm(req.gm, self.snapshot(req.gm))]

    # ---------------------------------------------------------------- workers
    def _event(self, kind: str, a: ActiveTask, now: float) -> TaskEvent:
        return TaskEvent(
            kind=kind,
            lm=self.lm_id,
            gm=a.gm,
            task=a.task,
            node=a.node,
            node_free=tuple(self.free[a.node]),
            node_version=self.node_version[a.node],
            at=now,
        )

    def on_worker_report(
        self, rep: WorkerReport, now: float, *, task: Task | None = None
    ) -> list[Effect]:
        """A worker says a task started, finished or failed.

        ``task`` is the worker's copy when it crossed a wire (its ledger is the
        authoritative one); in the simulator it is the same object.
        """
        self.last_seen[rep.node] = now
        a = self.active.get(rep.task_id)
        if a is None or a.node != rep.node:
            return []  # a preempted or relaunched task reporting late: nothing to do
        if task is not None and task is not a.task:
            a.task.spent = list(task.spent)
            a.task.phase = task.phase
            a.task.phase_since = task.phase_since
            a.task.started_at = task.started_at
        if rep.kind == "started":
            a.started = True
            if a.task.started_at < 0:
                a.task.start(rep.at)
            return [ToGm(a.gm, self._event("started", a, rep.at))]
        a.task.finished_at = rep.at
        self._release(rep.task_id)
        return [ToGm(a.gm, self._event(rep.kind, a, rep.at))]

    def on_worker_heartbeat(self, node: NodeIndex, now: float) -> list[Effect]:
        """A worker is alive; a node that had been declared dead comes back empty."""
        self.last_seen[node] = now
        if not self.alive[node]:
            self.alive[node] = True
            self.free[node] = list(self.capacity[node])
            self._touch(node)
        return []

    def check_workers(self, now: float, timeout: float) -> list[Effect]:
        """Declare nodes silent for ``timeout`` dead; relaunch their tasks (§IV-D).

        Each task of a dead node is relaunched on the first live node of its GM's
        partition that fits; failing that, it goes back to its GM, which re-queues it
        at the front of its queue.
        """
        effects: list[Effect] = []
        for node in range(self.n_nodes):
            if self.alive[node] and now - self.last_seen[node] > timeout:
                effects.extend(self._lose_node(node, now))
        return effects

    def _lose_node(self, node: int, now: float) -> list[Effect]:
        self.counters["workers_lost"] += 1
        self.alive[node] = False
        effects: list[Effect] = []
        orphans = [self.active[t] for t in list(self.on_node[node])]
        for a in orphans:
            self._release(a.task.task_id)
        self.free[node] = [0] * self.n_resources
        self._touch(node)
        for a in orphans:
            task = a.task
            task.started_at = -1.0
            task.enter(Phase.PROCESSING, now)
            target = next(
                (
                    n
                    for n in range(self.n_nodes)
                    if self.home[n] == a.gm and self._check(task, n) == "ok"
                ),
                None,
            )
            if target is None:
                self.counters["returned_to_gm"] += 1
                del self.accepted_by[task.task_id]
                task.enter(Phase.COMMUNICATION, now)
                effects.append(
                    ToGm(
                        a.gm,
                        TaskEvent(
                            kind="requeued",
                            lm=self.lm_id,
                            gm=a.gm,
                            task=task,
                            node=NodeIndex(node),
                            node_free=tuple(self.free[node]),
                            node_version=self.node_version[node],
                            at=now,
                        ),
                    )
                )
                continue
            self.counters["relaunched"] += 1
            self._commit(task, target, a.gm, now)
            effects.append(self._start_effects(task, target, now))
        return effects

    # -------------------------------------------------------------- heartbeat
    def heartbeat(self, now: float) -> list[Effect]:
        """The periodic state update to every GM: a delta since the previous one."""
        del now
        delta = self.delta_since(self._heartbeat_version)
        self._heartbeat_version = self.version
        return [ToAllGms(StateUpdated(delta=delta))]

    def handle(self, msg: object, now: float) -> list[Effect]:
        """Single entry point for drivers that do not dispatch by type themselves."""
        if isinstance(msg, LaunchRequest):
            return self.on_launch(msg, now)
        if isinstance(msg, PreemptRequest):
            return self.on_preempt(msg, now)
        if isinstance(msg, SnapshotRequest):
            return self.on_snapshot_request(msg, now)
        if isinstance(msg, WorkerReport):
            return self.on_worker_report(msg, now)
        raise TypeError(f"an LM does not handle {type(msg).__name__}")
