"""The Global Master's pure core: Megha's decision path (paper §IV-B, §IV-C, Alg. 1-2).

Theory of operation:

* One entry: ``handle(message, now) -> effects``.  Submissions (``AdmitJob``), LM
  answers, state updates, task events and the driver's ``Decide`` are all messages;
  expected outcomes (a refused job, an infeasible task) are effects with a reason.
* This file sequences.  Each idea is a piece that owns its state and returns values,
  and never calls this core or another piece (as Nomad's ``scheduler/``; the import
  contracts in ``pyproject.toml`` enforce it): ``admission`` (jobs taken, large ones
  in slices, per-user limits), ``placement`` (Alg. 1: internal partitions, else a
  repartition), ``fairness`` (Alg. 2: a victim, or why none), ``outbox`` (request ids,
  the launch window, held launches, repartition batching), ``ledger`` (where each
  task is: the only state a GM holds consistently), ``recovery`` (what a restarted GM
  learns of tasks it does not hold), and ``view`` (the eventually consistent views of
  every LM's partitions).  Two handler groups of this class live beside it, in files
  of their own: ``core_admission`` (submissions) and ``core_answers`` (LM answers).
* A task moves between the ledger's tables only as ``common.transitions.NEXT`` allows;
  reasons are the enums of ``common.reasons``.
* A GM is stateless in the paper's sense: views are rebuilt from LM snapshots;
  unacknowledged jobs come back from the durable broker queues and run none of their
  tasks twice.  Requests are optimistic: a placement is reserved in the view until
  its answer; an LM's refusal is an **inconsistency**: the view is refreshed and the
  decision retried at once (up to ``max_retries``), then the task goes to the back of
  its queue.  Every placement is an **attempt** (a number that only grows); events of
  a superseded attempt are ignored.  Nothing is dropped: preempted tasks and those of
  dead workers go back to the front of their queue; a task no node anywhere could
  ever run fails explicitly.

No clocks, sockets or global randomness: ``now`` is an argument, effects are returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from common.effects import Effect, JobSettled, Persist, Record, ToLm, ToUser
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.messages import (
    ENDS_RETAINED_S,
    AdmitJob,
    AdmitMore,
    CancelJob,
    Decide,
    EventKind,
    GangRetry,
    HeldTask,
    JobKeep,
    JobRefusal,
    KeepEnds,
    LaunchResponse,
    Placement,
    PreemptResponse,
    RequestFailed,
    RequestSnapshots,
    ReserveResponse,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    TaskEvent,
    TaskEvents,
    TaskOutcome,
    UserAccess,
    UserTasksStopped,
)
from common.metrics import GmCounters
from common.model import Phase, Resources, Task, TaskKey, TaskState, UserConfig, WaitReason
from common.overload import OverloadPolicy
from common.reasons import TaskFailure
from global_master.admission import AdmissionLimits, Admissions
from global_master.core_admission import AdmissionSteps
from global_master.core_answers import Answers
from global_master.core_preempt import Preemptions
from global_master.core_users import UserRequests
from global_master.fairness import Fairness
from global_master.gang import Gangs, GangSettings
from global_master.journal import Journal
from global_master.ledger import InFlight, Ledger
from global_master.lifecycle import JobBook
from global_master.outbox import Outbox
from global_master.placement import Placer, woken
from global_master.priority import ClassPreemption
from global_master.queues import UserQueues
from global_master.recovery import Recovery, left_behind, recovered_task, resume_job
from global_master.revocation import Revocations
from global_master.view import LmView, Views

__all__ = ["AdmissionLimits", "GlobalMaster"]

Batches = dict[LmId, list[Placement]]
"""A round's placements, per LM (each LM's leave in one launch request)."""

# enum members the hot paths compare with, bound once (a member read off its class
# costs ~10x a global's on 3.11)
_STARTED, _FINISHED, _FAILED = EventKind.STARTED, EventKind.FINISHED, EventKind.FAILED
_RELAUNCHED, _PREEMPTED = EventKind.RELAUNCHED, EventKind.PREEMPTED
_QUEUEING, _PROCESSING = Phase.QUEUEING, Phase.PROCESSING
_NO_FREE_RESOURCES = WaitReason.NO_FREE_RESOURCES
_WAIT_KEYS = {r: r.key for r in WaitReason}  # (``WaitReason.key`` without a property call)


class GlobalMaster(AdmissionSteps, Answers, Preemptions, UserRequests):
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
        limits: AdmissionLimits | None = None,
        journal: Journal | None = None,
        overload: OverloadPolicy | None = None,
        admit_slice: int = 1000,
        keep_ends_after_s: float = ENDS_RETAINED_S / 4,
        book: JobBook | None = None,
        gangs: GangSettings | None = None,
    ) -> None:
        self.gm_id = gm_id
        self.journal = journal
        """Per-task timelines for operators (``global_master.inspect``); None: none kept."""
        self.lms: list[LmId] = list(lms)
        self.users: dict[UserId, UserConfig] = {u.user: u for u in users}
        mine = [u.user for u in users if u.gm == gm_id]
        self.queues = queues if queues is not None else UserQueues(mine, patience=patience)
        self.waiting = self.queues.waiting
        self.limits = limits = limits or AdmissionLimits()
        self.overload = overload = overload or OverloadPolicy()
        # plain FIFO queues: tasks that found no room wait in the index (job-aware
        # policies keep blocked tasks themselves)
        self._index = overload.wait_index and self.queues.kind == "fifo"
        self.counters = GmCounters()
        self.wait_reasons: list[int] = [0] * len(WaitReason)
        # the pieces; the tables drivers and operators read are named here too
        self.lm_views = Views(gm_id, self.lms, self.counters)
        self.admission = Admissions(gm_id, limits, admit_slice)
        self.ledger = ledger = Ledger(limits.recent_jobs, keep_ends_after_s)
        self.recovery = Recovery(gm_id, limit=limits.recent_jobs)
        self.outbox = Outbox(gm_id, overload)
        self.placer = Placer(gm_id, self.lms, max_retries)
        self.cancelled: set[TaskKey] = set()
        """Tasks of cancelled jobs not yet ended (``_on_cancel``): none is placed again."""
        self.book = book
        self.fairness = Fairness(users, overload)
        self.classes = ClassPreemption(overload.class_preempt_grace_s, overload.preempt_period_s)
        self.revocations = Revocations()
        self.gang = Gangs(gm_id, gangs)
        self._gang_of = self.gang.member
        self.views = self.lm_views.by_lm
        self.admitting, self.held_admissions = self.admission.admitting, self.admission.held
        self.inflight, self.placed, self.live = ledger.inflight, ledger.placed, ledger.live
        self.finished, self.failed, self.jobs = ledger.finished, ledger.failed, ledger.jobs
        self.known_done = self.recovery.known_done
        # what the hot paths look at before asking a piece (empty: nothing to ask)
        self._held, self._resume_of = self.outbox.held, self.recovery.resume_of
        self._retries, self._tried = self.placer.retries, self.fairness.tried
        self._revoked_users = self.revocations.users
        self._no_fit: dict[tuple[int, Resources], bool] = {}
        """Classes (constraints, demand) no view had room for this round, and if feasible:
        views only lose room in a round (a gang's may not: emptied), so none walks again."""
        self._handlers = self._handler_table()

    def _handler_table(self) -> dict[type, Callable[[Any, float], list[Effect]]]:
        """Which handler takes each message a GM is given."""
        return {
            AdmitJob: lambda msg, now: self.gang.admitted(msg.job, self._admit_job(msg, now, now)),
            AdmitMore: self._on_admit_more,
            CancelJob: self._on_cancel,
            Decide: lambda msg, now: self.decide(now, msg.max_tasks),
            RequestSnapshots: self._on_request_snapshots,
            StateUpdated: self._on_state_update,
            StateSnapshot: self._on_snapshot,
            LaunchResponse: lambda msg, now: (
                self.gang.commit_answered(msg) + self._on_launch_response(msg, now)
            ),
            PreemptResponse: self._on_preempt_response,
            RequestFailed: lambda msg, now: (
                self.gang.request_failed(self, msg, now) + self._on_request_failed(msg, now)
            ),
            TaskEvents: self._on_task_events,
            UserAccess: self._on_user_access,
            UserTasksStopped: lambda msg, now: [],  # their PREEMPTED events end them
            JobRefusal: lambda msg, now: [],  # refused before the core: the book records it
            ReserveResponse: lambda msg, now: self.gang.on_reserve_response(
                self, msg, now, self._apply(msg.delta)
            ),
            GangRetry: lambda msg, now: self.gang.retry(self, msg, now),
        }

    # --------------------------------------------------------------- the entry
    def handle(self, msg: object, now: float) -> list[Effect]:
        """Take one message at time ``now``; return what the driver must do."""
        try:
            handler = self._handlers[type(msg)]
        except KeyError:
            raise TypeError(f"a GM does not handle {type(msg).__name__}") from None
        effects = handler(msg, now)
        if self._index and self.waiting:
            self._wake(now)
        else:
            self.lm_views.clear_freed()
        if self._held:  # placements held back may leave now
            for lm, placements in self.outbox.release_held(now):
                self._send_launch(lm, placements, effects, now)
        if self.book is not None:
            self.book.observe(msg, effects, now, self.ledger)
            if self.book.changes:  # its history, written before the rest leaves
                effects.insert(0, Record(tuple(self.book.take())))
        return effects

    # ------------------------------------------------------------ read-only
    @property
    def ready(self) -> bool:
        """The GM has a view of every LM and may decide."""
        return len(self.views) == len(self.lms)

    def has_work(self) -> bool:
        return self.ready and self.queues.has_work()

    @property
    def keep_ends_after_s(self) -> float:
        """A job whose delivery is held this long has its LMs keep its ended attempts
        (``KeepEnds``) until it settles: well within what they keep anyway
        (``ENDS_RETAINED_S``), so nothing of it is forgotten before a restarted GM asks."""
        return self.ledger.keep_ends_after_s

    def state_of(self, key: TaskKey) -> TaskState | None:
        """Where a task is, as this GM sees it (None: never heard of it)."""
        return self.ledger.state_of(key)

    def knows(self, key: TaskKey) -> bool:
        """The task is in flight, placed, or known to have ended."""
        return self.ledger.holds(key) or key in self.known_done

    def tasks_of(self, keys: Iterable[TaskKey]) -> list[Task]:
        """The tasks this GM holds for ``keys`` (queued, in flight or placed)."""
        return self.ledger.tasks_of(keys)

    def dominant_shares(self) -> dict[UserId, float]:
        """Each user's dominant share of the federation, from the (stale) views."""
        return self.fairness.dominant_shares(self.views.values())

    def awaits(self, request_id: int) -> bool:
        """Whether a task still waits in flight for the answer to request
        ``request_id`` (an event, or the LM's new incarnation, may have settled it)."""
        keys = self.outbox.asked(request_id)
        return any(
            (fl := self.inflight.get(k)) is not None and fl.request_id == request_id for k in keys
        )

    def unchanged_until(self) -> float:
        """Until when a state update that changes nothing in the view (an LM's heartbeat
        with nothing new) changes nothing in this GM either, apart from counting itself
        (``updates_applied``): a pure query for a driver that skips such updates (the
        simulator's quiet spans).  Such an update wakes no waiting task on freed nodes
        (none freed), none for the preemption grace before ``Fairness.next_check``; held
        launches may leave by time alone (-inf then); the LMs are asked to keep the ends
        of jobs held long from the first one's time.  ``math.inf``: no work driven by
        time; a time at or before now: the next update may act."""
        if self._held:
            return -math.inf
        keep = self.ledger.next_keep_due()
        if self._index and self.waiting:
            return min(keep, self.fairness.next_check())
        return keep

    # ------------------------------------------------------------ settling, ends
    def _settle(self, task: Task, effects: list[Effect]) -> None:
        """The task was accepted by an LM or failed: its job may be acknowledged."""
        rk = self.recovery.settle(task.key) if self._resume_of else None
        if rk is not None:
            effects.append(JobSettled(rk[1], rk[0], resume=True))
        settled = self.ledger.settle(task)
        if settled is not None:
            self.counters.jobs_settled += 1
            effects.append(JobSettled(task.job_id, task.user))
            if settled[1]:  # its LMs kept its ends: acknowledged, it cannot come back
                effects += self._keep_ends(settled[0], keep=False)

    def _keep_ends(self, jk: tuple[UserId, JobId], keep: bool = True) -> list[Effect]:
        """Ask every LM to keep (or let go) the ended attempts of job ``jk``: one
        message per job and LM, as the simulator delivers them (the live service sends
        those of one loop turn to one LM together)."""
        if keep:
            self.counters.jobs_keeping_ends += 1
        user, job_id = jk
        jobs = (JobKeep(user=user, job_id=job_id, keep=keep),)
        return [ToLm(lm, KeepEnds(gm=self.gm_id, lm=lm, jobs=jobs)) for lm in self.lms]

    def _persist(self, task: Task, now: float, effects: list[Effect]) -> None:
        """A task back in the queue whose job was acknowledged: keep it on the broker."""
        rec = self.jobs.get((task.user, task.job_id))
        if rec is None or rec.settled:  # (held, its job's delivery keeps it)
            effects.append(Persist(resume_job(task, now)))

    def _end(
        self, task: Task, ok: bool, why: str, now: float, effects: list[Effect], tell: bool = True
    ) -> None:
        """An LM says the task finished (``ok``) or failed (``why``)."""
        if ok:
            self.queues.on_finished(task, now)
            self._ended(task, effects, finished=True, reason="", tell=tell)
        else:
            self._fail(task, why, effects, tell=tell)

    def _fail(self, task: Task, reason: str, effects: list[Effect], *, tell: bool = True) -> None:
        """The task failed for good; so do the DAG stages that needed it."""
        self._ended(task, effects, finished=False, reason=reason, tell=tell)
        why = TaskFailure.parent_failed(task.task_id)
        for lost in (abandoned := self.queues.abandon(task, 0.0)):
            self._ended(lost, effects, finished=False, reason=why)
        if abandoned and self._gang_of:  # their gang stages will never run: forgotten
            self.gang.drop(self, [t.key for t in abandoned], effects)

    def _ended(
        self, task: Task, effects: list[Effect], *, finished: bool, reason: str, tell: bool = True
    ) -> None:
        """A task finished or failed for good: tell its user (unless a predecessor of
        this GM did); retire its job when done."""
        spec = task.spec
        user = spec.user
        key = (user, spec.task_id)
        if self.cancelled:
            self.cancelled.discard(key)
        if self.journal is not None:
            self.journal.close_task(task, finished=finished, reason=reason)
        if finished:
            self.counters.tasks_finished += 1
        else:
            self.counters.failed += 1
        if self._retries or self._tried or self.classes.tried:
            self._forget(key)
        if tell:
            effects.append(ToUser(user, TaskOutcome(task=task, finished=finished, reason=reason)))
        jk = (user, spec.job_id)
        rec = self.jobs.get(jk)
        if rec is None or (self.admitting and self.admission.pending(jk, key)):
            # adopted after a restart: its job may still be redelivered, or still have
            # this task's slice to queue (which then finds it ended)
            self.ledger.end(key, finished=finished, reason=reason)
            self.recovery.remember_done(task, finished)
            return
        if not finished:
            self._settle(task, effects)
        self.ledger.end(key, finished=finished, reason=reason, job=(jk, rec))

    def _forget(self, key: TaskKey, classes: bool = True) -> None:
        """Task ``key`` was placed, went back to its queue, or ended: no retries held,
        no victims tried (and, with ``classes``, no LMs asked for lower classes)."""
        if self._retries:
            self.placer.forget(key)
        if self._tried:
            self.fairness.forget(key)
        if classes and self.classes.tried:
            self.classes.forget(key)

    # -------------------------------------------------------------- deciding
    def decide(self, now: float, max_tasks: int = 1) -> list[Effect]:
        """Make up to ``max_tasks`` decisions; launches to one LM share one request."""
        effects: list[Effect] = []
        batches: Batches = {}
        if not self.ready:
            return effects
        pop, place, processing, counters = self.queues.pop, self._place, _PROCESSING, self.counters
        for _ in range(max_tasks):
            task = pop()
            if task is None:
                break
            task.mark(processing, now)
            counters.decisions += 1
            place(task, now, batches, effects)
        return self._end_round(batches, effects, now)

    def _end_round(self, batches: Batches, effects: list[Effect], now: float) -> list[Effect]:
        """A round of decisions is over: the next one starts its walk at the next LM
        (``Placer.match``); each LM's placements leave in one launch request, unless
        the outbox holds them back (the launch window, repartition batching)."""
        self._no_fit.clear()
        if not batches:
            return effects
        self.placer.next_round()
        outbox = self.outbox
        for lm, placements in (
            batches.items() if outbox.passes_all else outbox.release(batches, now)
        ):
            self._send_launch(lm, placements, effects, now)
        return effects

    def _send_launch(
        self, lm: LmId, placements: list[Placement], effects: list[Effect], now: float
    ) -> None:
        keys = [(p.spec.user, p.spec.task_id) for p in placements]
        rep = any(p.repartition for p in placements)
        req = self.outbox.launch(lm, placements, keys, rep, now, self.lm_views.version_of(lm))
        self.counters.launch_requests += 1
        if rep:
            self.counters.repartition_messages += 1
        inflight, rid = self.inflight, req.request_id
        for key in keys:
            inflight[key].request_id = rid
        effects.append(ToLm(lm, req))

    def _place(self, task: Task, now: float, batches: Batches, effects: list[Effect]) -> None:
        """One pass of the decision path for one task (Alg. 1, then Alg. 2)."""
        spec = task.spec
        if self._revoked_users and spec.user in self._revoked_users:  # came back from an
            self._revoked(task, effects)  # LM (stopped) or crossed
            return
        if self.cancelled and task.key in self.cancelled:
            self._cancel_ends(task, effects)
            return
        task.decisions += 1
        if self._gang_of and task.key in self._gang_of:
            self._no_fit.clear()  # its gang may release room in the views
            if self.gang.place(self, task, now, effects):
                return  # a gang stage's task: its gang places it (global_master.gang)
        mask, demand = spec.constraints, spec.demand
        views = self.views
        # 1. internal partitions; 2. external partitions: repartition
        feasible = self._no_fit.get(cls := (mask, demand))  # (None: not known this round)
        if feasible is None:
            if self._dispatch_free(task, batches, now):
                return
            feasible = self.placer.feasible(views.values(), mask, demand)
            if self.queues.choose_node is None:
                self._no_fit[cls] = feasible
        # 3. nothing fits: infeasible, fairness, or back of the queue
        if not feasible:
            self._note(task, WaitReason.NO_CONSTRAINT_MATCH, now)
            self._fail(task, TaskFailure.INFEASIBLE, effects)
            return
        if self.gang.holds and (held := self.gang.backfill(self, task, now)) is not None:
            view, node = held  # backfill: reserved-but-idle room, free until it is due
            self._dispatch(task, view, node, view.home[node] != self.gm_id, batches, now)
            return
        self._note(task, _NO_FREE_RESOURCES, now)
        if task.spec.priority and self._preempt_lower(task, now, effects):
            return
        # altruistic tasks (Carbyne) use only what is free: never a reason to preempt
        preempts = self.queues.may_preempt_for(task) and self._may_preempt(task, now)
        if not (preempts and self._preempt(task, now, effects)):
            self._requeue(task, now, wait=True)  # no room anywhere in the view

    def _dispatch(
        self, task: Task, view: LmView, node: int, repartition: bool, batches: Batches, now: float
    ) -> None:
        """A match: reserved in the view, in flight in the ledger, into its LM's batch."""
        spec, lm, queues = task.spec, view.lm, self.queues
        view.reserve(node, spec.demand)
        attempt = task.attempt = task.attempt + 1
        self.ledger.dispatch(InFlight(task, lm, node, repartition))
        queues.on_dispatched(task, now)
        if repartition:
            self.counters.repartition_requests += 1
        else:
            self.counters.placed_internal += 1
        queues.placed(spec.user)
        if self.journal is not None:
            self.journal.note(
                (spec.user, spec.task_id), now, "repartition" if repartition else "launch",
                lm=lm, node=node, partition=view.home[node], detail=f"attempt {attempt}",
            )  # fmt: skip
        batch = batches.get(lm)
        if batch is None:
            batch = batches[lm] = []
        batch.append(
            Placement(spec=spec, attempt=attempt, node=NodeIndex(node),
                      repartition=repartition, altruistic=task.altruistic,
                      queued_at=task.submitted_at)
        )  # fmt: skip

    def _note(
        self, task: Task, reason: WaitReason, now: float, lm: str = "", why: str = ""
    ) -> None:
        """A decision did not place ``task``, for ``reason`` (an LM's refusal: ``why``)."""
        task.waits[reason] += 1
        self.wait_reasons[reason] += 1
        if self.journal is not None:
            key = _WAIT_KEYS[reason]
            detail = f"{key}: {why}" if why else key
            self.journal.wait((task.spec.user, task.spec.task_id), now, detail, lm)

    def _requeue(self, task: Task, now: float, wait: bool = False) -> None:
        """Back of its queue (§IV-B5; the queue may park until the view changes); with
        ``wait`` and plain FIFO queues, into the waiting index until freed resources
        could fit it."""
        self.counters.requeues += 1
        if self._retries or self._tried:  # (``_forget``'s, but the LMs asked for lower
            self._forget(task.key, classes=False)  # classes: it still waits for them)
        task.mark(_QUEUEING, now)
        if wait and self._index:
            self.counters.waited += 1
            self.waiting.add(task)
            return
        self.queues.push_back(task)
        self.queues.failed(task.spec.user)

    def _wake(self, now: float) -> None:
        """Waiting tasks that the freed nodes could fit go back to the front of their
        queues, users furthest below their share first (``placement.woken``); then those
        of starved users whose grace period is over (``Fairness.grace_due``)."""
        views = self.views.values()
        waiting, queues, fairness = self.waiting, self.queues, self.fairness
        woken_now = woken(views, waiting, lambda: fairness.wake_order(views, queues))
        if woken_now:
            self.counters.woken += len(woken_now)
            for t in reversed(woken_now):
                queues.push_front(t)
        if fairness.starved and now >= fairness.grace_check:
            for user, budget in fairness.grace_due(now, self.lms, waiting, views, self.inflight):
                for t in reversed(waiting.take_user(user, budget)):
                    queues.push_front(t)

    # ------------------------------------------------------- state from LMs
    def _apply(self, delta: StateDelta) -> list[Effect]:
        """An LM's state, in an update or an answer, into its view; a view that changed
        gives parked queues and the shares a new chance."""
        changed, asks = self.lm_views.apply(delta)
        self.gang.saw(delta)
        if changed:
            self.fairness.views_changed()
            self.queues.new_epoch()
        return [ToLm(ask.lm, ask) for ask in asks]

    def _on_state_update(self, msg: StateUpdated, now: float) -> list[Effect]:
        effects = self._apply(msg.delta)
        if self.ledger.next_keep_due() <= now:  # held long: their LMs keep their ends
            for jk in self.ledger.keep_ends_due(now):
                effects += self._keep_ends(jk)
        return effects

    def _on_request_snapshots(self, msg: RequestSnapshots, now: float) -> list[Effect]:
        """A (re)started GM asks every LM for a full snapshot."""
        want = self.lm_views.want_snapshot
        return [ToLm(lm, ask) for lm in self.lms for ask in want(lm)]

    def _on_snapshot(self, snap: StateSnapshot, now: float) -> list[Effect]:
        """An LM's full state: its view is made anew (capacities added up again), what
        it holds for this GM is adopted, and a new incarnation is reconciled."""
        views = self.lm_views
        restarted = views.take_snapshot(snap)
        if restarted is None:
            return []
        lm = snap.layout.lm
        self.placer.forget_feasible()
        self.fairness.rescale(views.capacity)
        self.inflight.rescale()
        self.queues.set_cluster(views.capacity, views.node_caps, views.node_classes)
        effects: list[Effect] = []
        self._adopt(lm, snap.held, effects)
        if restarted:
            self._reconcile(lm, snap.held, now, effects)
        self.queues.new_epoch()
        return effects

    def _adopt(self, lm: LmId, held: Sequence[HeldTask], effects: list[Effect]) -> None:
        """What an LM holds for this GM: a task running there that this GM does not know
        (it restarted) is adopted, so its events and outcome come here; a task that ended
        lately, unknown here or known only from its end event, is told to its user now (its
        job may have been acked before this GM restarted) and remembered, so a redelivered
        job does not run it again.  Not one whose end this GM took: the snapshot is older."""
        live, placed, ledger = self.live, self.placed, self.ledger
        for h in held:
            key = (h.spec.user, h.spec.task_id)
            if h.spec.user not in self.queues or ledger.ended_in_recent_job(key, h.spec.job_id):
                continue
            if h.ended_at >= 0:
                if key not in live and self.recovery.unknown_end(key, ledger.holds(key)):
                    why = "" if h.ok else TaskFailure.ON_WORKER
                    self._ended(recovered_task(h, self.gm_id), effects, finished=h.ok, reason=why)
                continue
            task = placed.get(key)
            if task is not None:
                task.attempt = max(task.attempt, h.attempt)
            elif key not in live and not ledger.holds(key):
                task = recovered_task(h, self.gm_id)
                self.ledger.adopt(task)
                live[key] = task
                task.lm = lm
                self.counters.tasks_adopted += 1

    def _reconcile(
        self, lm: LmId, held: Sequence[HeldTask], now: float, effects: list[Effect]
    ) -> None:
        """A new incarnation of ``lm`` (restarted, or its standby took over) holds what
        its workers told it.  A task this GM placed there that it does not hold was
        lost with the old incarnation (accepted, never started): back to the front of
        its queue, as a new attempt.  One that ended meanwhile has its outcome now."""
        for task, h in left_behind(lm, held, self.placed):
            del self.placed[task.key]
            if h is not None:
                task.finished_at = h.ended_at
                self._end(task, h.ok, TaskFailure.ON_WORKER, now, effects)
                continue
            self.counters.lost_with_lm += 1
            if self.journal is not None:
                self.journal.note(task.key, now, "lost_with_lm", lm=lm)
            task.lm = None
            task.mark(Phase.QUEUEING, now)
            self._back_to_front(task, now, effects)

    def _back_to_front(self, task: Task, now: float, effects: list[Effect]) -> None:
        """A task placed on an LM came back (preempted, requeued, lost with its LM): to
        the front of its own queue, kept on the broker if its job was acknowledged.
        A cancelled one ends here (its stop, or its LM's loss of it)."""
        if self.cancelled and task.key in self.cancelled:
            self._cancel_ends(task, effects)
            return
        self.queues.on_returned(task, now)
        self.queues.push_front(task)
        self._persist(task, now, effects)

    # ------------------------------------------------------------ task events
    def _on_task_events(self, msg: TaskEvents, now: float) -> list[Effect]:
        effects: list[Effect] = []
        view = self.views.get(msg.lm)
        fresh = view is not None and view.epoch == msg.epoch
        for ev in msg.events:
            self._on_task_event(ev, now, effects, fresh)
        return effects

    def _on_task_event(
        self, ev: TaskEvent, now: float, effects: list[Effect], fresh: bool = True
    ) -> None:
        """Started / finished / failed / preempted / requeued / relaunched, from the LM
        that holds the task (its node's state is taken if it is from the LM's current
        incarnation, ``fresh``)."""
        seen = self.lm_views.node_event(ev, fresh)
        if seen is None:
            self.counters.stale_events += 1  # not from an LM of this federation as it is
            return
        if seen:
            self.queues.new_epoch()
        kind = ev.kind
        if kind == _RELAUNCHED:
            task = self.ledger.relaunched(ev)
            if task is None:
                self.counters.stale_events += 1
            elif self.journal is not None:
                self.journal.event(task.key, ev)
            return
        task, fl = self.ledger.current(ev)
        if fl is not None:  # the event overtook its LM's answer: that request is over
            self._forget(fl.task.key)
            self._release(fl)
            if fl.node < 0:
                self.outbox.preempt_answered(fl.request_id)
        if task is None:
            self.counters.stale_events += 1
            self._orphan(ev, now, effects)
            return
        self._settle(task, effects)
        self.ledger.took(task, ev, now)
        if self.journal is not None:
            self.journal.event((ev.user, ev.task_id), ev)  # (``current`` found it so)
        if kind == _STARTED:
            return
        if kind in (_FINISHED, _FAILED):
            self.counters.ends_seen += 1
            self.counters.end_lag_s += now - ev.at
            if ev.user not in self.queues:
                return
            if kind == _FINISHED:
                self.queues.on_finished(task, now)
                self._ended(task, effects, finished=True, reason="")
            else:
                why = TaskFailure.on_worker(ev.detail)
                self._fail(task, why, effects)
            return
        # preempted or requeued: back to the front of its own queue, never lost
        if kind == _PREEMPTED:
            self.counters.preempted_requeued += 1
        self._back_to_front(task, now, effects)

    def _orphan(self, ev: TaskEvent, now: float, effects: list[Effect]) -> None:
        """An event about a task of this GM's users that it does not hold: recovery
        keeps it for the task's job; an end may be told to its user now; a task its LM
        gave back is queued again (nothing else holds it) unless its job ended here
        lately (every task of it ended and was told: the event is a late or redelivered
        copy about an attempt that ended, e.g. a stop confirmed after the task finished)."""
        key = (ev.user, ev.task_id)
        if ev.user not in self.queues or key in self.live:
            return  # a task this GM holds: its current attempt decides, not this one
        if self.ledger.holds(key):
            return  # ended in a job recorded here (a copy of its end): told once already
        recent = ev.job_id is not None and self.ledger.is_recent((ev.user, ev.job_id))
        back = None if recent else self.recovery.given_back(ev, self.gm_id)
        if back is not None:
            self.counters.orphans_queued += 1
            self.live[back.key] = back
            self._back_to_front(back, now, effects)
            return
        end = self.recovery.orphan(ev, recent)
        if end is not None:
            self._ended(end.task, effects, finished=end.finished, reason=end.reason)
