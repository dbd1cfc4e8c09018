"""The Local Master's pure core: the only consistent state of one cluster.

Theory of operation (Megha paper §IV-A, §IV-B4, §IV-B6, §IV-C, §IV-D):

* One entry: ``handle(message, now) -> effects``.  GM requests are answered with a
  ``Reply`` (a request it will not take: ``Reply(Refused(reason))``); worker reports,
  worker heartbeats and the driver's timers (``Heartbeat``, ``CheckWorkers``) are
  messages too.  Every handler that takes a message addressed to an LM passes one
  address guard first (``validation.Address.refuse``).
* The LM owns the truth about its worker nodes (``nodes.NodeTable``: capacity, free
  resources, constraints, liveness, the *active task list*, versions and the delta
  log).  The cluster is split into one partition per GM; a **repartition** carves
  exactly the requested resources out of a node of another GM's partition into a
  *logical node* that lives as long as its task.
* Every request from a GM is **validated** against true state; a placement that the
  true state cannot satisfy is refused (an *inconsistency*) and every response
  piggybacks a delta of the cluster's state since the version the GM said it knows.
  With ``reroute``, a placement refused only because its node has no room (or is
  down) goes instead to the last node that fits (``nodes.reroute``), the GM's first,
  then in another's (a repartition): Alg. 1 on the true state, without a round trip.
* **Attempts**: each placement is an attempt of a task; a launch of the attempt the
  LM already holds (or recently finished: ``ends.Ends``) is a duplicate and changes
  nothing; a newer attempt supersedes an older one still held here (the older is
  stopped first), so a worker never runs two attempts of one task.  Reports about an
  attempt the LM does not hold are stale; a worker still running one is told to stop.
* **Preemption** (``victims.choose``): the LM verifies that stopping the victim's
  attempts makes room, stops them, and hands each back to its GM only once its pool
  confirms the stop (``stopping``).
* **Versions**: deltas carry per-node versions, so GMs apply them in any order and
  never go backwards; ``epoch`` is this LM's incarnation.

This module sequences; the pieces (``nodes``, ``ends``, ``victims``, ``validation``)
each own their state or are pure, and never call the core or one another.  No clocks,
sockets or randomness: ``now`` is an argument, effects are returned.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from msgspec import structs

from common.effects import Effect, Record, Reply, ToAllGms, ToGm, ToWorker
from common.ids import GmId, LmId, NodeIndex, UserId
from common.messages import (
    ENDS_RETAINED_S,
    CancelTasks,
    CheckWorkers,
    CommitGang,
    EventKind,
    Heartbeat,
    HeldTask,
    JournalEnded,
    JournalHeld,
    JournalHold,
    JournalKeep,
    JournalRestored,
    KeepEnds,
    LaunchRequest,
    LaunchResponse,
    PlacedRef,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    RegisterWorkers,
    ReleaseGang,
    ReportKind,
    ReserveRequest,
    SnapshotRequest,
    StartTask,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    StopTask,
    StopUserTasks,
    UserTasksStopped,
    WorkerHeartbeat,
    WorkerReport,
    WorkerReports,
)
from common.metrics import LmCounters
from common.model import NodeSpec, Resources, TaskKey, TaskSpec, key_of
from common.reasons import NO_ROOM, Answer
from local_master import durable
from local_master.core_register import REGISTRATIONS_REMEMBERED, Registration
from local_master.ends import Ends
from local_master.gang_requests import GangRequests
from local_master.nodes import ActiveTask, NodeTable
from local_master.reservations import Reservations
from local_master.validation import (
    ASK_LATER,
    REGISTER_FIRST,
    Address,
    refuse_request,
    refused_user,
    unknown_node,
)
from local_master.victims import choose

ENDS = (ReportKind.FINISHED, ReportKind.FAILED)
_STARTED, _STOPPED, _LOST, _FINISHED = (
    ReportKind.STARTED, ReportKind.STOPPED, ReportKind.LOST, ReportKind.FINISHED,
)  # fmt: skip
_OK = PlacementResult(accepted=True, reason=Answer.OK)
_FITS, _REROUTED = Answer.OK, Answer.REROUTED  # (bound once: see local_master.nodes)


class LocalMaster(GangRequests, Registration):
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
        durable: bool = False,
        owners: Mapping[UserId, GmId | None] | None = None,
    ) -> None:
        self.lm_id = lm_id
        self.owners = owners
        """Each user's GM (the driver keeps it current; ``validation.refused_user``; None: revoked)."""
        self.nodes = NodeTable(
            lm_id, epoch, nodes, home, alive=not awaiting_workers, log_limit=log_limit
        )
        self.ends = Ends(retain_s)
        self.reservations = Reservations()
        self.nodes.on_release = lambda key: self.reservations.released(key, self.nodes)
        """Gang holds under a lease, and backfill on them (``gang_requests``)."""
        self.gms: frozenset[GmId] = frozenset(home) | frozenset(gms)
        """The federation's GMs (the only ones whose requests are taken)."""
        self.address = Address(lm_id, self.gms, registered=not awaiting_workers)
        self.registrations_taken: deque[RegisterWorkers] = deque(maxlen=REGISTRATIONS_REMEMBERED)
        """The latest registrations taken: a copy of one is not taken again."""
        self.report_starts = report_starts
        self.victims_younger_than_wait = victims_younger_than_wait
        """Preempt only tasks that ran for less time than the requester waited
        (``common.overload.OverloadPolicy``)."""
        self.reroute = reroute
        """Place a task whose node has no room on another that fits, instead of refusing
        (``common.overload.OverloadPolicy.reroute_at_lm``)."""
        self._heartbeat_version = 0
        self._last_check = -1.0
        self.counters = LmCounters()
        self._journal: list[object] | None = [] if durable else None
        """``durable``: what changed in the active and stopping lists and the ends, for
        the driver to write to the journal before anything leaves (a ``Record``)."""
        self.nodes.journal = self.ends.journal = self.reservations.journal = self._journal
        self._handlers = self._handler_table()

    def _handler_table(self) -> dict[type, Callable[[Any, float], list[Effect]]]:
        """Each message an LM takes, and its handler."""
        return {
            LaunchRequest: self._on_launch,
            PreemptRequest: self._on_preempt,
            SnapshotRequest: self._on_snapshot_request,
            KeepEnds: self._on_keep_ends,
            CancelTasks: self._on_cancel,
            WorkerReports: self._on_worker_reports,
            WorkerHeartbeat: self._on_worker_heartbeat,
            RegisterWorkers: self._on_register,
            Heartbeat: self._on_heartbeat,
            CheckWorkers: self._on_check_workers,
            StopUserTasks: self._on_stop_user_tasks,
            ReserveRequest: self._on_reserve,
            CommitGang: self._on_commit,
            ReleaseGang: self._on_release,
        }

    # --------------------------------------------------------------- the entry
    def handle(self, msg: object, now: float) -> list[Effect]:
        """Take one message at time ``now``; return what the driver must do."""
        try:
            handler = self._handlers[type(msg)]
        except KeyError:
            raise TypeError(f"an LM does not handle {type(msg).__name__}") from None
        gangs: list[Effect] = []
        self._gang_step(now, gangs)  # leases that ended before this message
        effects = handler(msg, now)
        self._gang_step(now, effects)
        effects += gangs
        journal = self._journal
        if journal:
            effects.append(Record(tuple(journal)))
            journal.clear()
        return effects

    # ------------------------------------------------ state (drivers, operators)
    # What the service (app.py), the simulator, inspect and tests read; the pieces own it.
    @property
    def epoch(self) -> int:
        """This LM's incarnation (its deltas carry it: ``NodeTable.epoch``)."""
        return self.nodes.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.nodes.epoch = epoch

    @property
    def registered(self) -> bool:
        """Whether the worker pool has told this incarnation what runs; until it has, no
        node is alive (a restarted LM must not count a running task's resources as free)."""
        return self.address.registered

    @property
    def n_nodes(self) -> int:
        return self.nodes.n_nodes

    @property
    def version(self) -> int:
        return self.nodes.version

    @property
    def free(self) -> list[list[int]]:
        return self.nodes.free

    @property
    def alive(self) -> list[bool]:
        return self.nodes.alive

    @property
    def active(self) -> dict[TaskKey, ActiveTask]:
        return self.nodes.active

    def idle_nodes(self) -> int:
        """Nodes free of any attempt this LM holds, counting one attempt per node (a
        node that holds several counts them all: a low bound)."""
        return max(self.nodes.n_nodes - len(self.nodes.active), 0)

    def logical_nodes(self) -> list[tuple[TaskKey, NodeIndex, GmId, Resources]]:
        """Logical nodes created by repartition: (task, physical node, GM, resources)."""
        return self.nodes.logical_nodes()

    def delta_since(self, base: int) -> StateDelta:
        """Every node changed after version ``base`` (all nodes if the log is too short)."""
        return self.nodes.delta_since(base)

    def snapshot(self, gm: GmId | None = None) -> StateSnapshot:
        """The full state; with ``gm``, also what this LM holds or held lately for it."""
        held: tuple[HeldTask, ...] = ()
        if gm is not None:
            held = self.nodes.held(gm) + self.ends.held(gm)
        nodes = self.nodes
        return StateSnapshot(layout=nodes.layout(), state=nodes.delta_since(-1), held=held)

    def still_starts(self, s: StartTask) -> bool:
        """Whether this LM still holds the attempt ``s`` starts, where ``s`` starts it."""
        a = self.nodes.active.get((s.spec.user, s.spec.task_id))
        return a is not None and a.attempt == s.attempt and a.node == s.node

    # --------------------------------------------------------------- requests
    def _on_launch(self, req: LaunchRequest, now: float) -> list[Effect]:
        """Validate and enforce a batch of launches (internal) and repartitions (external).

        Partial acceptance: each placement is judged alone, in order.
        """
        refused = self.address.refuse(req.lm, req.gm, ASK_LATER) or refuse_request(
            (p.spec for p in req.placements), self.nodes.n_resources
        )
        if refused is not None:
            self.counters.refused_requests += 1
            return [Reply(refused)]
        effects: list[Effect] = []
        ps = req.placements  # (``asked``: the nodes of those not yet judged, ``nodes.reroute``)
        asked: Counter[int] | None = Counter(p.node for p in ps) if self.reroute else None
        results = tuple(self._launch_one(req.gm, p, now, effects, asked) for p in ps)
        response = LaunchResponse(
            gm=req.gm,
            lm=self.lm_id,
            request_id=req.request_id,
            results=results,
            delta=self.nodes.delta_since(req.known_version),
            request_sent_at=req.sent_at,
            received_at=now,
            sent_at=now,
        )
        effects.insert(0, Reply(response))
        return effects

    def _held(self, spec: TaskSpec, attempt: int, effects: list[Effect]) -> PlacementResult | None:
        """The answer to a placement of an attempt this LM holds, or held lately (a
        duplicate: nothing changes), or None.  An older attempt still held here is
        superseded: stopped and released, and the new one is judged afresh."""
        key = (spec.user, spec.task_id)
        a = self.nodes.active.get(key)
        if a is not None:
            if a.attempt >= attempt:
                return PlacementResult(accepted=True, reason=Answer.DUPLICATE, attempt=a.attempt)
            self.nodes.release(key)
            effects.append(ToWorker(a.stop()))
        past = self.ends.covering(key, spec.job_id, attempt)
        if past is not None:
            ended, ok = past
            return PlacementResult(
                accepted=True, reason=Answer.FINISHED if ok else Answer.FAILED, attempt=ended
            )
        return None

    def _launch_one(
        self, gm: GmId, p: Placement, now: float, effects: list[Effect], asked: Counter[int] | None
    ) -> PlacementResult:
        spec = p.spec
        if asked is not None:
            asked[p.node] -= 1  # (this one is being judged)
        why = refused_user(self.owners, spec.user, gm)
        if why is not None:
            self.counters.refused_foreign += 1
            return PlacementResult(accepted=False, reason=why)
        held = self._held(spec, p.attempt, effects)
        if held is not None:
            self.counters.duplicates += 1
            return held
        nodes = self.nodes
        node: int = p.node
        reason = nodes.check(spec, node)
        if reason in NO_ROOM and self.reroute and (other := nodes.reroute(spec, gm, asked)) >= 0:
            node, reason = other, _REROUTED
            self.counters.rerouted += 1
        elif reason is Answer.INSUFFICIENT_RESOURCES and self._backfill(key_of(spec), p, now):
            reason = _FITS
        if reason is not _FITS and reason is not _REROUTED:
            external = nodes.home[p.node] != gm if nodes.has(p.node) else p.repartition
            if external:
                self.counters.refused_external += 1
            else:
                self.counters.refused_internal += 1
            return PlacementResult(accepted=False, reason=reason)
        a = nodes.place(spec, p.attempt, node, gm, p.altruistic, now, p.queued_at)
        if a.logical:
            self.counters.repartitions += 1
        else:
            self.counters.launches += 1
        effects.append(ToWorker(a.start()))
        if reason is _REROUTED:
            return PlacementResult(accepted=True, reason=reason, node=node)
        return _OK

    def _on_preempt(self, req: PreemptRequest, now: float) -> list[Effect]:
        """Verify that preempting ``req.victim``'s tasks frees room for ``req.spec``; do it.

        The LM picks the node where making room throws away the least work
        (``victims.choose``); the work thrown away is counted (``preempted_work_s``).
        Refused when the victim has nothing here that would make room; when the room is
        free already, the task is placed without preempting anyone.
        """
        refused = self.address.refuse(req.lm, req.gm, ASK_LATER) or refuse_request(
            (req.spec,), self.nodes.n_resources
        )
        if refused is not None:
            self.counters.refused_requests += 1
            return [Reply(refused)]
        spec = req.spec
        self.counters.preemption_requests += 1
        why = refused_user(self.owners, spec.user, req.gm)
        if why is not None:
            self.counters.refused_foreign += 1
            return [self._preempt_response(req, now, False, why, None, ())]
        effects: list[Effect] = []
        held = self._held(spec, req.attempt, effects)
        if held is not None:
            self.counters.duplicates += 1
            dup = self._preempt_response(req, now, True, held.reason, None, (), held.attempt)
            return [dup, *effects]
        nodes = self.nodes
        # a higher class's preemption pays no matter what the victims have run
        paying = self.victims_younger_than_wait and req.queued_at >= 0 and not req.lower_only
        choice = choose(
            spec, req.victim, self.reservations.victims(nodes.active), nodes.free, nodes.alive,
            nodes.constraints, now, now - req.queued_at if paying else None, req.lower_only,
        )  # fmt: skip
        if choice is None:
            self.counters.preemptions_refused += 1
            return [self._preempt_response(req, now, False, Answer.NO_VICTIM, None, ()), *effects]
        if not choice.victims:  # room appeared without preempting anyone: a plain placement
            self.counters.preemptions_refused += 1
            a = nodes.place(spec, req.attempt, choice.node, req.gm, False, now, req.queued_at)
            effects.append(ToWorker(a.start()))
            return [self._preempt_response(req, now, True, Answer.ROOM_FREE, a.node, ()), *effects]
        self.counters.preempted_work_s += choice.lost
        refs = [self._preempt(victim, effects) for victim in choice.victims]
        a = nodes.place(spec, req.attempt, choice.node, req.gm, False, now, req.queued_at)
        if a.logical:
            self.counters.repartitions += 1
        effects.append(ToWorker(a.start()))
        return [self._preempt_response(req, now, True, Answer.OK, a.node, refs), *effects]

    def _preempt(self, victim: ActiveTask, effects: list[Effect]) -> PlacedRef:
        """Stop ``victim`` and release what it holds.  It goes back to its GM once its
        pool confirms the stop (a STOPPED report), so the next attempt cannot start
        while this one still runs."""
        key = (victim.spec.user, victim.spec.task_id)
        self.nodes.stop(key)
        self.counters.preemptions += 1
        effects.append(ToWorker(victim.stop()))
        return PlacedRef(user=key[0], task_id=key[1], attempt=victim.attempt)

    def _on_stop_user_tasks(self, msg: StopUserTasks, now: float) -> list[Effect]:
        """Stop every attempt of ``msg.user`` that GM ``msg.gm`` placed here (its token
        was revoked), as a preemption stops a victim: each goes back to that GM once its
        pool confirms the stop.  Another GM's placements are not touched."""
        if (refused := self.address.refuse(msg.lm, msg.gm, ASK_LATER)) is not None:
            return [Reply(refused)]
        effects: list[Effect] = []
        mine = [a for a in self.nodes.active.values() if a.gm == msg.gm and a.spec.user == msg.user]
        stopped = tuple(self._preempt(a, effects) for a in mine)
        self.counters.revoked_stops += len(stopped)
        answer = UserTasksStopped(gm=msg.gm, lm=self.lm_id, user=msg.user, stopped=stopped)
        return [Reply(answer), *effects]

    def _preempt_response(
        self, req: PreemptRequest, now: float, accepted: bool, reason: str,
        node: NodeIndex | None, preempted: Sequence[PlacedRef], attempt: int = 0,
    ) -> Reply:  # fmt: skip
        response = PreemptResponse(
            gm=req.gm, lm=self.lm_id, request_id=req.request_id, accepted=accepted,
            reason=reason, node=node, preempted=tuple(preempted), attempt=attempt,
            delta=self.nodes.delta_since(req.known_version), request_sent_at=req.sent_at,
            received_at=now, sent_at=now,
        )  # fmt: skip
        return Reply(response)

    def _on_snapshot_request(self, req: SnapshotRequest, now: float) -> list[Effect]:
        """A GM (new, restarted, or one that saw a gap) asks for the full state."""
        if (refused := self.address.refuse(req.lm, req.gm, ASK_LATER)) is not None:
            return [Reply(refused)]
        return [Reply(self.snapshot(req.gm))]

    def _on_keep_ends(self, msg: KeepEnds, now: float) -> list[Effect]:
        """A GM keeps (or lets go) the ended attempts of some of its jobs past
        ``retain_s``, in the order it names them; taken before the pool registers (a
        keep after the job's let-go is late and ignored: ``Ends.keep``)."""
        if (refused := self.address.refuse(msg.lm, msg.gm)) is not None:
            return [Reply(refused)]
        gm, keep = msg.gm, self.ends.keep
        for j in msg.jobs:
            if not keep((gm, j.user, j.job_id), j.keep, now):
                self.counters.stale_keep_ends += 1
        return []

    def _on_cancel(self, msg: CancelTasks, now: float) -> list[Effect]:
        """A GM cancels tasks it placed here: each attempt it names (or a newer one this
        LM made, a relaunch) is stopped as a preempted one is (``nodes.stop``), and goes
        back to the GM once its pool confirms the stop.  Unheld ones: ignored."""
        if (refused := self.address.refuse(msg.lm, msg.gm)) is not None:
            return [Reply(refused)]
        effects: list[Effect] = []
        for ref in msg.tasks:
            key = (ref.user, ref.task_id)
            a = self.nodes.active.get(key)
            if a is None or a.gm != msg.gm or a.attempt < ref.attempt:
                continue
            self.nodes.stop(key)
            effects.append(ToWorker(a.stop()))
        return effects

    # ---------------------------------------------------------------- workers
    def _on_worker_reports(self, msg: WorkerReports, now: float) -> list[Effect]:
        """Worker reports: a task started, finished or failed on a node."""
        if (refused := self.address.refuse(msg.lm, None, REGISTER_FIRST)) is not None:
            return [Reply(refused)]
        effects: list[Effect] = []
        has, report = self.nodes.has, self._report
        for rep in msg.reports:
            if not has(rep.node):
                self.counters.stale_reports += 1
                continue
            report(rep, now, effects)
        return effects

    def _report(self, rep: WorkerReport, now: float, effects: list[Effect]) -> None:
        nodes = self.nodes
        node, kind = rep.node, rep.kind
        nodes.last_seen[node] = now
        key = (rep.user, rep.task_id)
        if kind == _STOPPED:
            self._preempted(nodes.stopped((key, rep.attempt)), now, effects)
            return
        a = nodes.active.get(key)
        if a is None or a.node != node or a.attempt != rep.attempt:
            self._stale_report(rep, a is None, effects)
            return
        a.worker_at = rep.worker_at
        if rep.started_at >= 0:
            a.started_at = rep.started_at
        if kind == _STARTED:
            if self.report_starts:
                effects.append(ToGm(a.gm, nodes.event(EventKind.STARTED, a, rep.at)))
            return
        nodes.release(key)
        if kind == _LOST:  # its pool stopped it: placed again (new attempt)
            effects.extend(self._relaunch([a], now))
            return
        ok = kind == _FINISHED
        self.ends.retire(key, a.gm, a.held(ended_at=rep.at, ok=ok), now)
        ev = nodes.event(EventKind.FINISHED if ok else EventKind.FAILED, a, rep.at, rep.detail)
        if rep.exit_code is not None or rep.stdout or rep.stderr:  # a command's end
            ev = structs.replace(ev, exit_code=rep.exit_code, stdout=rep.stdout, stderr=rep.stderr)
        effects.append(ToGm(a.gm, ev))

    def _stale_report(self, rep: WorkerReport, unheld: bool, effects: list[Effect]) -> None:
        """A report of an attempt this LM does not hold (preempted, superseded,
        relaunched; or it ended while this LM was down): its GM judges the attempt, so
        an end goes on; an attempt that still runs is stopped."""
        self.counters.stale_reports += 1
        if rep.kind != ReportKind.STARTED and unheld and rep.gm in self.gms:
            effects.append(ToGm(rep.gm, self.nodes.report_event(rep)))
        if rep.kind == ReportKind.STARTED:
            stop = StopTask(
                node=rep.node, user=rep.user, task_id=rep.task_id, attempt=rep.attempt, gm=rep.gm
            )
            effects.append(ToWorker(stop))

    def _on_worker_heartbeat(self, msg: WorkerHeartbeat, now: float) -> list[Effect]:
        """A worker pool's nodes are alive; a node that had been declared dead comes
        back with what it still held."""
        if (refused := self.address.refuse(msg.lm, None, REGISTER_FIRST)) is not None:
            return [Reply(refused)]
        bad = next((n for n in msg.nodes if not self.nodes.has(n)), None)
        if bad is not None:
            return [Reply(unknown_node(bad))]
        self._seen(msg.nodes, now)
        return []

    def _seen(self, nodes: Iterable[int], now: float) -> None:
        """Its pool says these nodes live: a node declared dead comes back with what it
        still held (its pool's reports settle those attempts)."""
        self.counters.held_through_silence += self.nodes.seen(nodes, now)

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
        nodes = self.nodes
        paused = self._last_check >= 0 and now - self._last_check > msg.timeout
        self._last_check = now
        if paused:
            # this LM did not run for a whole timeout (paused, starved): the silence it
            # sees is its own; give every node a fresh timeout instead of declaring all dead
            self.counters.pauses += 1
            nodes.seen_all(now)
            return effects
        give_up = max(msg.lost_after, msg.timeout)
        for node in range(nodes.n_nodes):
            silent = now - nodes.last_seen[node]
            if nodes.alive[node] and silent > msg.timeout:
                self.counters.workers_lost += 1
                nodes.lose(node)
            if not nodes.alive[node] and silent > give_up and nodes.holds(node):
                effects.extend(self._give_up(node, now))
        self.address.checked(now, give_up)  # a pool silent that long since is given up
        return effects

    def _give_up(self, node: int, now: float) -> list[Effect]:
        """Silent for ``lost_after``: its tasks run again elsewhere (its pool fenced
        itself long ago: its lease is shorter than the timeout)."""
        self.counters.nodes_given_up += 1
        nodes = self.nodes
        orphans = [nodes.active[k] for k in list(nodes.on_node[node])]
        for a in orphans:
            nodes.release((a.spec.user, a.spec.task_id))
        effects = self._relaunch(orphans, now)
        self._confirm_stops(lambda k, a: a.node == node, now, effects)
        return effects

    def _preempted(self, victim: ActiveTask | None, now: float, effects: list[Effect]) -> None:
        """A preempted attempt runs no more: its GM re-queues the task."""
        if victim is None:
            self.counters.stale_reports += 1
            return
        effects.append(ToGm(victim.gm, self.nodes.event(EventKind.PREEMPTED, victim, now)))

    def _confirm_stops(
        self, gone: Callable[[tuple[TaskKey, int], ActiveTask], bool], now: float,
        effects: list[Effect],
    ) -> None:  # fmt: skip
        """Preempted attempts known to run no more without their pool's report."""
        for k, a in list(self.nodes.stopping.items()):
            if gone(k, a):
                self._preempted(self.nodes.stopped(k), now, effects)

    def _relaunch(self, orphans: list[ActiveTask], now: float) -> list[Effect]:
        """Attempts that no worker runs any more (released already): each goes, as a new
        attempt, to the first live node of its GM's partition that fits; failing that,
        back to its GM, which re-queues it at the front of its queue."""
        effects: list[Effect] = []
        nodes = self.nodes
        for a in orphans:
            target = nodes.first_fit(a.spec, a.gm, elsewhere=False)
            if target < 0:
                self.counters.returned_to_gm += 1
                effects.append(ToGm(a.gm, nodes.event(EventKind.REQUEUED, a, now, "worker lost")))
                continue
            self.counters.relaunched += 1
            lost = nodes.event(EventKind.RELAUNCHED, a, now, "worker lost")
            attempt = a.attempt + 1
            b = nodes.place(a.spec, attempt, target, a.gm, a.altruistic, now, a.queued_at)
            # it names the new attempt and node, and keeps the lost one's start (work lost)
            effects.append(ToGm(a.gm, structs.replace(lost, attempt=attempt, node=b.node)))
            effects.append(ToWorker(b.start()))
        return effects

    # -------------------------------------------------------------- heartbeat
    def _on_heartbeat(self, msg: Heartbeat, now: float) -> list[Effect]:
        """The periodic state update to every GM: a delta since the previous one; ends
        past ``retain_s`` are forgotten (or kept, for jobs kept)."""
        delta = self.nodes.delta_since(self._heartbeat_version)
        self._heartbeat_version = self.nodes.version
        self.ends.expire(now)
        return [ToAllGms(StateUpdated(delta=delta))]

    # ---------------------------------------------------------------- journal
    def records(self) -> list[object]:
        """This LM's durable state as journal records (a compacted journal): what its
        active and stopping lists hold, its ends and keeps, and its gang holds."""
        return [*self.nodes.records(), *self.ends.records(), *self.reservations.records()]

    def restore(self, records: Iterable[object], now: float) -> None:
        """Take back what a former incarnation wrote to its journal, before anything
        else reaches this one: the attempts it held (on nodes not alive until their pool
        registers: an attempt the pool no longer runs is then run again), the preempted
        ones whose stop was not confirmed, and the ends and keeps.  An end's retention
        counts from ``now`` (``Ends.restored``): a GM that restarts with this LM asks
        late, and must learn what already ended before it places it again.  The gang
        holds whose lease lasts past ``now`` (or committed) are held again once the pool
        has registered (``Reservations.resume``): a commit after the restart starts them."""
        journal, self._journal = self._journal, None
        self.nodes.journal = self.ends.journal = self.reservations.journal = None
        self.nodes.seen_all(now)  # a silence counts from here, not from before the restart
        restored = durable.fold(records)
        for e in restored.ends:
            if isinstance(e, JournalKeep):
                # the ends past retain_s when it came had gone (or moved to ``kept``) at
                # a heartbeat before it: a keep does not bring them back
                self.ends.expire(e.at)
                self.ends.keep((e.gm, e.user, e.job_id), e.keep, e.at)
            elif isinstance(e, JournalRestored):  # a former incarnation's restore
                self.ends.restored(e.at)
            else:
                self._restore_end(e)
        for h in (*restored.held.values(), *restored.stopping.values()):
            if self._restorable(h):
                self.nodes.restore(h)
                if h.gang and not h.stopping:  # a gang's part: never a lone victim
                    self.reservations.gang_tasks.add((h.start.spec.user, h.start.spec.task_id))
        self.ends.restored(now)
        for hold in restored.holds.values():
            if self._hold_restorable(hold, now):
                self.reservations.restore(hold)
        if self.address.registered:
            self.reservations.resume(self.nodes, now)
        self._journal = journal
        self.nodes.journal = self.ends.journal = self.reservations.journal = journal
        if journal is not None:  # written before anything this incarnation does
            journal.append(JournalRestored(at=now))

    def _restorable(self, r: JournalHeld) -> bool:
        ok = self.nodes.has(r.start.node) and r.start.gm in self.gms
        if ok:
            self.counters.journal_restored += 1
        else:
            self.counters.journal_skipped += 1
        return ok

    def _hold_restorable(self, r: JournalHold, now: float) -> bool:
        """A hold of a GM of the federation on a node here, committed or under its lease."""
        ok = self.nodes.has(r.placement.node) and r.gm in self.gms
        if ok and not r.committed and now >= r.until:
            self.reservations.expired += 1
            return False
        self.counters.journal_restored += ok
        self.counters.journal_skipped += not ok
        return ok

    def _restore_end(self, r: JournalEnded) -> None:
        if r.gm not in self.gms:
            self.counters.journal_skipped += 1
            return
        s = r.held.spec
        self.ends.retire((s.user, s.task_id), r.gm, r.held, r.learnt_at)
        self.counters.journal_restored += 1
