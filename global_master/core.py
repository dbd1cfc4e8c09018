"""The Global Master's pure core: Megha's decision path (paper §IV-B, §IV-C, Alg. 1-2).

Theory of operation:

* A GM owns its users' queues (the only state it holds consistently) and an
  eventually consistent ``LmView`` of every partition of every LM.  It is stateless
  in the paper's sense: everything else is rebuilt from LM snapshots and updates.
* **Decide** (``decide``): take the next task round-robin over the user queues;
  **match** in the GM's *internal* partitions, walking LMs round-robin (AND of the
  task's constraint vectors, first fit on free resources); otherwise look for an
  eligible node in the *external* partitions, round-robin over LMs, and ask that LM
  to **repartition**; otherwise, under contention, apply **fairness** (Alg. 2): if
  the user is below its share, ask an LM to preempt tasks of the user with the
  largest share violation; if it is at or above its share, re-queue at the back.
  A task no node anywhere could ever run fails explicitly (``TaskFailed``).
* Requests are optimistic: the GM reserves the resources in its view when it sends
  a request and releases them when the answer comes.  An LM refusal is an
  **inconsistency**: the response's delta refreshes the view and the decision is
  retried at once (up to ``max_retries``), then the task goes to the back of its queue.
* Every task is in exactly one of: a queue (QUEUED), ``inflight`` (DISPATCHED),
  ``placed`` (PLACED), ``finished`` or ``failed``.  Nothing is dropped: preempted
  tasks and tasks of dead workers come back to the front of their queue.

No clocks, sockets or global randomness: ``now`` is an argument, effects are returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.dag import DagJob
from common.effects import Effect, Report, ToLm
from common.errors import ValidationError
from common.ids import GmId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    LaunchRequest,
    LaunchResponse,
    Placement,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    TaskEvent,
    TaskFailed,
)
from common.model import Phase, Task, TaskState, UserConfig, WaitReason
from global_master.queues import UserQueues
from global_master.view import LmView


@dataclass(slots=True)
class InFlight:
    """A task whose request to an LM has not been answered yet."""

    task: Task
    lm: LmId
    node: int  # -1 for a preemption request (the LM picks the node)
    repartition: bool
    request_id: int = 0
    """The request it rides on: only that request's answer concerns it."""


class GlobalMaster:
    """One GM: user queues in, launch / repartition / preemption requests out."""

    def __init__(
        self,
        gm_id: GmId,
        lms: Sequence[LmId],
        users: Sequence[UserConfig],
        *,
        max_retries: int = 3,
        patience: int = 8,
        queues: UserQueues | None = None,
    ) -> None:
        self.gm_id = gm_id
        self.lms: list[LmId] = list(lms)
        self.users: dict[UserId, UserConfig] = {u.user: u for u in users}
        mine = [u.user for u in users if u.gm == gm_id]
        self.queues = queues if queues is not None else UserQueues(mine, patience=patience)
        self.views: dict[LmId, LmView] = {}
        self.inflight: dict[TaskId, InFlight] = {}
        self.placed: dict[TaskId, Task] = {}
        self.finished: set[TaskId] = set()
        self.failed: dict[TaskId, str] = {}
        self.known_placed: set[TaskId] = set()
        self.max_retries = max_retries
        self._retries: dict[TaskId, int] = {}
        self._preempt_tried: dict[TaskId, set[tuple[UserId, LmId]]] = {}
        self._rr_internal = 0
        self._rr_external = 0
        self._next_request = 0
        self._snapshot_wanted: set[LmId] = set()
        self._feasible: dict[tuple[int, tuple[int, ...]], bool] = {}
        self._capacity: list[int] = []
        self._victim_pending: dict[UserId, float] = {}
        self._preempt_victim: dict[TaskId, tuple[UserId, float]] = {}
        self.counters: dict[str, int] = {
            "decisions": 0,
            "placed_internal": 0,
            "repartition_requests": 0,
            "internal_inconsistencies": 0,
            "external_inconsistencies": 0,
            "preemption_attempts": 0,
            "preemptions_granted": 0,
            "preempted_requeued": 0,
            "requeues": 0,
            "failed": 0,
            "redelivered_skipped": 0,
            "updates_applied": 0,
            "gaps": 0,
        }
        self.wait_reasons: list[int] = [0] * len(WaitReason)

    # ----------------------------------------------------------- bookkeeping
    def state_of(self, task_id: TaskId) -> TaskState | None:
        """Where a task is, as this GM sees it (None: never heard of it)."""
        if task_id in self.inflight:
            return TaskState.DISPATCHED
        if task_id in self.placed:
            return TaskState.PLACED
        if task_id in self.finished:
            return TaskState.FINISHED
        if task_id in self.failed:
            return TaskState.FAILED
        if any(t.task_id == task_id for t in self.queues):
            return TaskState.QUEUED
        return None

    def knows(self, task_id: TaskId) -> bool:
        return (
            task_id in self.inflight
            or task_id in self.placed
            or task_id in self.finished
            or task_id in self.failed
            or task_id in self.known_placed
        )

    @property
    def ready(self) -> bool:
        """The GM has a view of every LM and may decide."""
        return len(self.views) == len(self.lms)

    def has_work(self) -> bool:
        return self.ready and self.queues.has_work()

    def _request_id(self) -> int:
        self._next_request += 1
        return self._next_request

    def _known_version(self, lm: LmId) -> int:
        v = self.views.get(lm)
        return -1 if v is None else v.version

    # ------------------------------------------------------------ submission
    def submit(self, tasks: Iterable[Task], now: float) -> list[Effect]:
        """Tasks enter their users' queues.  Unknown users and duplicate ids are
        refused (``ValidationError``) before any task of the batch is queued.

        A task an LM already accepted for this GM before a restart (seen in a
        snapshot) is not queued again: a redelivered job never runs a task twice.
        """
        batch = list(tasks)
        seen: set[TaskId] = set()
        for t in batch:
            if t.user not in self.queues:
                raise ValidationError(
                    f"user {t.user!r} has no queue on {self.gm_id}", reason="unknown_user"
                )
            if t.task_id in seen or (self.knows(t.task_id) and t.task_id not in self.known_placed):
                raise ValidationError(
                    f"duplicate task id {t.task_id!r}", reason="duplicate_task_id"
                )
            seen.add(t.task_id)
        for t in batch:
            if t.task_id in self.known_placed:
                self.counters["redelivered_skipped"] += 1
                continue
            t.gm = self.gm_id
            t.submit(now)
            self.queues.push_back(t)
        return []

    def submit_job(self, job: DagJob, now: float) -> list[Effect]:
        """A DAG job enters its user's queue: root stages now, the others as their
        parent stages finish.  Refused like ``submit`` before anything is queued."""
        if job.user not in self.queues:
            raise ValidationError(
                f"user {job.user!r} has no queue on {self.gm_id}", reason="unknown_user"
            )
        seen: set[TaskId] = set()
        for t in job.tasks:
            if t.user != job.user:
                raise ValidationError(
                    f"task {t.task_id!r} belongs to {t.user!r}, not {job.user!r}",
                    reason="invalid_field",
                )
            if t.task_id in seen or self.knows(t.task_id):
                raise ValidationError(
                    f"duplicate task id {t.task_id!r}", reason="duplicate_task_id"
                )
            seen.add(t.task_id)
            t.gm = self.gm_id
        self.queues.add_job(job, now)
        return []

    # -------------------------------------------------------------- deciding
    def decide(self, now: float, max_tasks: int = 1) -> list[Effect]:
        """Make up to ``max_tasks`` decisions; launches to one LM share one request."""
        effects: list[Effect] = []
        batches: dict[LmId, list[Placement]] = {}
        for _ in range(max_tasks):
            task = self.queues.pop()
            if task is None:
                break
            task.enter(Phase.PROCESSING, now)
            self.counters["decisions"] += 1
            self._place(task, now, batches, effects)
        for lm, placements in batches.items():
            effects.append(ToLm(lm, self._launch_request(lm, placements)))
        return effects

    def _launch_request(self, lm: LmId, placements: list[Placement]) -> LaunchRequest:
        rid = self._request_id()
        for p in placements:
            self.inflight[p.task.task_id].request_id = rid
        return LaunchRequest(
            gm=self.gm_id,
            lm=lm,
            request_id=rid,
            placements=tuple(placements),
            known_version=self._known_version(lm),
        )

    def _place(
        self,
        task: Task,
        now: float,
        batches: dict[LmId, list[Placement]],
        effects: list[Effect],
    ) -> None:
        """One pass of the decision path for one task (Alg. 1, then Alg. 2)."""
        task.attempts += 1
        lms = self.lms
        n = len(lms)
        views = self.views
        mask, demand, me = task.constraints, task.demand, self.gm_id
        fit = self.queues.choose_node or LmView.first_fit
        # 1. internal partitions, round-robin over LMs
        for k in range(n):
            lm = lms[(self._rr_internal + k) % n]
            view = views[lm]
            node = fit(view, view.eligible(mask, me, True), demand)
            if node >= 0:
                self._rr_internal = (self._rr_internal + k + 1) % n
                self._dispatch(task, view, node, False, batches, now)
                return
        # 2. external partitions, round-robin over LMs: repartition
        for k in range(n):
            lm = lms[(self._rr_external + k) % n]
            view = views[lm]
            node = fit(view, view.eligible(mask, me, False), demand)
            if node >= 0:
                self._rr_external = (self._rr_external + k + 1) % n
                self._dispatch(task, view, node, True, batches, now)
                return
        # 3. nothing fits: infeasible, fairness, or back of the queue
        if not self._is_feasible(mask, demand):
            self._fail(
                task, "infeasible: no node satisfies the constraints and demand", now, effects
            )
            self._note(task, WaitReason.NO_CONSTRAINT_MATCH)
            return
        self._note(task, WaitReason.NO_FREE_RESOURCES)
        # altruistic tasks (Carbyne) use only what is free: never a reason to preempt
        req = None if task.altruistic else self._preemption(task)
        if req is not None:
            self.counters["preemption_attempts"] += 1
            self.inflight[task.task_id] = InFlight(task, req.lm, -1, False, req.request_id)
            self.queues.on_dispatched(task, now)
            effects.append(ToLm(req.lm, req))
            return
        self._requeue(task, now)

    def _dispatch(
        self,
        task: Task,
        view: LmView,
        node: int,
        repartition: bool,
        batches: dict[LmId, list[Placement]],
        now: float,
    ) -> None:
        view.reserve(node, task.demand)
        self.inflight[task.task_id] = InFlight(task, view.lm, node, repartition)
        self.queues.on_dispatched(task, now)
        self.counters["repartition_requests" if repartition else "placed_internal"] += 1
        self.queues.placed(task.user)
        batches.setdefault(view.lm, []).append(
            Placement(task=task, node=NodeIndex(node), repartition=repartition)
        )

    def _note(self, task: Task, reason: WaitReason) -> None:
        task.waits[reason] += 1
        self.wait_reasons[reason] += 1

    def _is_feasible(self, mask: int, demand: tuple[int, ...]) -> bool:
        key = (mask, demand)
        ok = self._feasible.get(key)
        if ok is None:
            ok = any(v.feasible(mask, demand) for v in self.views.values())
            self._feasible[key] = ok
        return ok

    def _fail(self, task: Task, reason: str, now: float, effects: list[Effect]) -> None:
        self.counters["failed"] += 1
        self.failed[task.task_id] = reason
        self._forget(task.task_id)
        effects.append(Report(TaskFailed(gm=self.gm_id, task=task, reason=reason, at=now)))
        self._abandon(task, now, effects)

    def _abandon(self, task: Task, now: float, effects: list[Effect]) -> None:
        """DAG jobs: the stages that needed a failed task can never run; fail them."""
        for lost in self.queues.abandon(task, now):
            why = f"parent task {task.task_id} failed"
            self.counters["failed"] += 1
            self.failed[lost.task_id] = why
            effects.append(Report(TaskFailed(gm=self.gm_id, task=lost, reason=why, at=now)))

    def _forget(self, task_id: TaskId) -> None:
        self._retries.pop(task_id, None)
        self._preempt_tried.pop(task_id, None)

    def _requeue(self, task: Task, now: float) -> None:
        """Back of its queue (§IV-B5); the queue may park until the view changes."""
        self.counters["requeues"] += 1
        self._forget(task.task_id)
        task.enter(Phase.QUEUEING, now)
        self.queues.push_back(task)
        self.queues.failed(task.user)

    # -------------------------------------------------------------- fairness
    def dominant_shares(self) -> dict[UserId, float]:
        """Each user's dominant share of the federation, from the (stale) views."""
        total = self._capacity
        if not total:
            return {}
        used: dict[UserId, list[int]] = {}
        for v in self.views.values():
            for u, res in v.usage.items():
                acc = used.setdefault(u, [0] * len(res))
                for r, x in enumerate(res):
                    acc[r] += x
        return {u: self._share_of(res) for u, res in used.items()}

    def _share_of(self, res: Sequence[int]) -> float:
        return max((x / t for x, t in zip(res, self._capacity, strict=True) if t > 0), default=0.0)

    def _preemption(self, task: Task) -> PreemptRequest | None:
        """Alg. 2: a preemption request on behalf of an under-share user, or None.

        The requester must be below its share (the paper's test).  A victim must
        be in violation of its share, and the move must make the allocation fairer:
        afterwards the requester's share, relative to what it is promised, may not
        exceed the victim's.  That is what keeps two users from preempting each
        other back and forth on stale views.  Shares count this GM's own in-flight
        requests (the part of the state it knows consistently).
        """
        shares = self.dominant_shares()
        need = self._share_of(task.demand)
        own = 0.0
        for fl in self.inflight.values():
            if fl.task.user == task.user:
                own += self._share_of(fl.task.demand)
        mine = self.users[task.user].share
        have = shares.get(task.user, 0.0) + own
        if have >= mine:
            self._note(task, WaitReason.USER_AT_SHARE)
            return None
        after = (have + need) / mine
        violators = []
        for u, ds in shares.items():
            cfg = self.users.get(u)
            if cfg is None or u == task.user or ds <= cfg.share:
                continue
            left = ds - self._victim_pending.get(u, 0.0) - need
            if after <= left / cfg.share + 1e-9:
                violators.append((ds - cfg.share, u))
        violators.sort(reverse=True)
        tried = self._preempt_tried.setdefault(task.task_id, set())
        for _, victim in violators:
            ranked = sorted(
                (lm for lm, v in self.views.items() if any(v.usage.get(victim, ()))),
                key=lambda lm: -sum(self.views[lm].usage[victim]),
            )
            for lm in ranked:
                if (victim, lm) in tried:
                    continue
                tried.add((victim, lm))
                self._victim_pending[victim] = self._victim_pending.get(victim, 0.0) + need
                self._preempt_victim[task.task_id] = (victim, need)
                return PreemptRequest(
                    gm=self.gm_id,
                    lm=lm,
                    request_id=self._request_id(),
                    task=task,
                    victim=victim,
                    known_version=self._known_version(lm),
                )
        self._note(task, WaitReason.PREEMPTION_FAILED)
        return None

    # ------------------------------------------------------- state from LMs
    def _apply(self, delta: StateDelta) -> list[Effect]:
        view = self.views.get(delta.lm)
        if view is None:
            return self._want_snapshot(delta.lm)
        changed, gap = view.apply(delta)
        self.counters["updates_applied"] += 1
        if changed:
            self.queues.new_epoch()
        if gap:
            self.counters["gaps"] += 1
            return self._want_snapshot(delta.lm)
        return []

    def _want_snapshot(self, lm: LmId) -> list[Effect]:
        if lm in self._snapshot_wanted or lm not in self.lms:
            return []
        self._snapshot_wanted.add(lm)
        return [ToLm(lm, SnapshotRequest(gm=self.gm_id, lm=lm))]

    def start(self, now: float) -> list[Effect]:
        """A (re)started GM asks every LM for a full snapshot."""
        del now
        effects: list[Effect] = []
        for lm in self.lms:
            effects.extend(self._want_snapshot(lm))
        return effects

    def on_snapshot(self, snap: StateSnapshot, now: float) -> list[Effect]:
        del now
        lm = snap.layout.lm
        old = self.views.get(lm)
        view = LmView(snap.layout)
        if old is not None:  # keep this GM's in-flight reservations
            for i, pend in enumerate(old.pending):
                if pend is not None:
                    view.pending[i] = list(pend)
        view.apply(snap.state)
        self.views[lm] = view
        self._feasible.clear()
        totals = [v.total_capacity() for v in self.views.values()]
        self._capacity = [sum(col) for col in zip(*totals, strict=True)]
        self.queues.set_cluster(
            self._capacity, {c for v in self.views.values() for c in v.capacity}
        )
        self._snapshot_wanted.discard(lm)
        self.known_placed.update(t for t in snap.placed_by_gm if t not in self.placed)
        self.queues.new_epoch()
        return []

    def on_state_update(self, msg: StateUpdated, now: float) -> list[Effect]:
        del now
        return self._apply(msg.delta)

    # --------------------------------------------------------------- answers
    def on_launch_response(self, resp: LaunchResponse, now: float) -> list[Effect]:
        """Accepted placements are PLACED; refused ones are inconsistencies: the view
        is refreshed from the response and the decision retried at once."""
        view = self.views.get(resp.lm)
        retry: list[Task] = []
        for res in resp.results:
            fl = self.inflight.get(res.task_id)
            if fl is None or fl.request_id != resp.request_id:
                continue  # an event overtook this answer; the task may have moved on
            del self.inflight[res.task_id]
            if view is not None:
                view.release(fl.node, fl.task.demand)
            task = fl.task
            if res.accepted:
                # the task is on its way to a worker: its ledger is the LM's to stamp now
                self._forget(task.task_id)
                self.placed[task.task_id] = task
            else:
                self._back_from_lm(task, resp.received_at, resp.sent_at, now)
                self.queues.on_returned(task, now)
                self.counters[
                    "external_inconsistencies" if fl.repartition else "internal_inconsistencies"
                ] += 1
                self._note(task, WaitReason.REFUSED_BY_LM)
                retry.append(task)
        effects = self._apply(resp.delta)  # a new epoch if the delta changed the view
        return effects + self._retry(retry, now)

    @staticmethod
    def _back_from_lm(task: Task, received_at: float, sent_at: float, now: float) -> None:
        """A refused task's round trip: wire, LM validation, wire, then GM processing.

        Idempotent for a ledger the LM already stamped (the simulator shares objects).
        """
        task.enter(Phase.PROCESSING, received_at)
        task.enter(Phase.COMMUNICATION, sent_at)
        task.enter(Phase.PROCESSING, now)

    def _retry(self, tasks: list[Task], now: float) -> list[Effect]:
        effects: list[Effect] = []
        batches: dict[LmId, list[Placement]] = {}
        for task in tasks:
            n = self._retries.get(task.task_id, 0) + 1
            if n > self.max_retries:
                self._requeue(task, now)
                continue
            self._retries[task.task_id] = n
            self._place(task, now, batches, effects)
        for lm, placements in batches.items():
            effects.append(ToLm(lm, self._launch_request(lm, placements)))
        return effects

    def on_preempt_response(self, resp: PreemptResponse, now: float) -> list[Effect]:
        """Accepted: the task is placed (victims come back to their own GMs).
        Refused: failed verification, try the next victim (Alg. 2)."""
        fl = self.inflight.get(resp.task_id)
        if fl is not None and fl.request_id != resp.request_id:
            return self._apply(resp.delta)  # overtaken: the task has moved on
        self.inflight.pop(resp.task_id, None)
        pending = self._preempt_victim.pop(resp.task_id, None)
        if pending is not None:
            left = self._victim_pending.get(pending[0], 0.0) - pending[1]
            if left > 1e-12:
                self._victim_pending[pending[0]] = left
            else:
                self._victim_pending.pop(pending[0], None)
        effects = self._apply(resp.delta)
        if fl is None:
            return effects
        task = fl.task
        if resp.accepted:
            self.counters["preemptions_granted"] += len(resp.preempted)
            self._forget(task.task_id)
            self.placed[task.task_id] = task
            return effects
        self._back_from_lm(task, resp.received_at, resp.sent_at, now)
        self.queues.on_returned(task, now)
        req = self._preemption(task)
        if req is None:
            self._requeue(task, now)
            return effects
        self.counters["preemption_attempts"] += 1
        self.inflight[task.task_id] = InFlight(task, req.lm, -1, False, req.request_id)
        self.queues.on_dispatched(task, now)
        return [*effects, ToLm(req.lm, req)]

    def on_task_event(self, ev: TaskEvent, now: float) -> list[Effect]:
        """Started / finished / failed / preempted / requeued, from the LM that ran it."""
        view = self.views.get(ev.lm)
        if view is not None and view.set_node(ev.node, ev.node_free, ev.node_version):
            self.queues.new_epoch()
        tid = ev.task.task_id
        kind = ev.kind
        if kind == "started":
            task = self.placed.get(tid)
            if task is not None and task is not ev.task:
                self.placed[tid] = ev.task
            return []
        if kind in ("finished", "failed"):
            self._overtaken(tid)
            self.placed.pop(tid, None)
            self.known_placed.discard(tid)
            if kind == "finished":
                self.finished.add(tid)
                if ev.task.user in self.queues:
                    self.queues.on_finished(ev.task, now)
            else:
                self.failed[tid] = "failed on worker"
                lost: list[Effect] = []
                if ev.task.user in self.queues:
                    self._abandon(ev.task, now, lost)
                return lost
            return []
        # preempted or requeued: back to the front of its own queue, never lost
        self._overtaken(tid)
        self.placed.pop(tid, None)
        self.known_placed.discard(tid)
        if ev.task.user not in self.queues:
            return []
        if kind == "preempted":
            self.counters["preempted_requeued"] += 1
        task = ev.task
        task.gm = self.gm_id
        task.enter(Phase.QUEUEING, now)
        self.queues.on_returned(task, now)
        self.queues.push_front(task)
        return []

    def _overtaken(self, tid: TaskId) -> None:
        """An event of the task overtook the LM's answer to its request: the LM had
        accepted it, so the request is over (its late answer matches no request in flight)."""
        fl = self.inflight.pop(tid, None)
        if fl is None:
            return
        self._forget(tid)
        view = self.views.get(fl.lm)
        if view is not None and fl.node >= 0:
            view.release(fl.node, fl.task.demand)

    def handle(self, msg: object, now: float) -> list[Effect]:
        """Single entry point for drivers that do not dispatch by type themselves."""
        if isinstance(msg, StateUpdated):
            return self.on_state_update(msg, now)
        if isinstance(msg, LaunchResponse):
            return self.on_launch_response(msg, now)
        if isinstance(msg, PreemptResponse):
            return self.on_preempt_response(msg, now)
        if isinstance(msg, TaskEvent):
            return self.on_task_event(msg, now)
        if isinstance(msg, StateSnapshot):
            return self.on_snapshot(msg, now)
        raise TypeError(f"a GM does not handle {type(msg).__name__}")
