"""The Global Master's pure core: Megha's decision path (paper §IV-B, §IV-C, Alg. 1-2).

Theory of operation:

* One entry: ``handle(message, now) -> effects``.  Submissions (``AdmitJob``), LM
  answers, state updates, task events and the driver's ``Decide`` are all messages;
  expected outcomes (a refused job, an infeasible task) are effects with a reason.
* A GM owns its users' queues and the **ledger** of every task in them (the only
  state it holds consistently), and an eventually consistent ``LmView`` of every
  partition of every LM.  It is stateless in the paper's sense: views are rebuilt
  from LM snapshots; unacknowledged jobs come back from the durable broker queues.
  A job that comes back runs none of its tasks twice: those found running, on their
  way to an LM, ended or queued from their own broker message are taken as they are,
  and a DAG never releases them again (a DAG's delivery is held until its last
  stage is accepted, so a GM killed mid-DAG always gets it back).
* **Decide**: take the next task round-robin over the user queues; **match** in the
  GM's *internal* partitions, walking LMs round-robin (AND of the task's constraint
  vectors, first fit on free resources); otherwise look for an eligible node in the
  *external* partitions, round-robin over LMs, and ask that LM to **repartition**;
  otherwise, under contention, apply **fairness** (Alg. 2): if the user is below its
  share, ask an LM to preempt tasks of the user with the largest share violation; if
  it is at or above its share, re-queue at the back.  A task no node anywhere could
  ever run fails explicitly.
* Requests are optimistic: the GM reserves the resources in its view when it decides
  a placement and releases them when the answer comes.  A placement held back (the
  launch window, repartition batching) stays reserved and DISPATCHED until its request
  leaves with the next one to that LM.  An LM refusal is an
  **inconsistency**: the response's delta refreshes the view and the decision is
  retried at once (up to ``max_retries``), then the task goes to the back of its queue.
* Every placement is an **attempt** (a number that only grows); events of a
  superseded attempt are ignored.
* Every task is in exactly one of: a queue (QUEUED), ``inflight`` (DISPATCHED),
  ``placed`` (PLACED), finished or failed.  Nothing is dropped: preempted tasks and
  tasks of dead workers come back to the front of their queue.  A job is *settled*
  (its delivery may be acknowledged) once each of its tasks was accepted by an LM or
  failed; its records go when every task has finished or failed.
* A large job is admitted in slices of ``admit_slice`` tasks, one step per message
  (``AdmitMore`` timers): first every task is checked, then the tasks are queued.  A
  refusal still comes before any task is queued; other messages are handled between
  the steps, except its user's next jobs, which wait behind it (queued in order).  A
  DAG job's tasks are checked in slices and queued in one step (stages name each other).
  Until queued, a task of such a job is in no state above: it is its job's, in
  ``admitting`` or ``held_admissions``.  A user holds at most ``max_user_tasks`` tasks
  here (``live``, counted per user); a job that would pass it is refused whole.

No clocks, sockets or global randomness: ``now`` is an argument, effects are returned.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from common.dag import from_layout
from common.effects import After, Effect, JobRefused, JobSettled, Persist, ToLm, ToUser
from common.errors import ConfigError
from common.ids import GmId, LmId, NodeIndex, UserId
from common.messages import (
    ENDS_RETAINED_S,
    AdmitJob,
    AdmitMore,
    Decide,
    EventKind,
    HeldTask,
    KeepEnds,
    LaunchRequest,
    LaunchResponse,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    RequestFailed,
    RequestSnapshots,
    SnapshotRequest,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    SubmitJob,
    TaskEvent,
    TaskEvents,
    TaskOutcome,
)
from common.metrics import GmCounters
from common.model import (
    Phase,
    Resources,
    Task,
    TaskKey,
    TaskState,
    UserConfig,
    WaitReason,
    fits,
    new_task,
)
from common.overload import OverloadPolicy
from global_master.journal import Journal
from global_master.ledger import InFlight, JobKey, Ledger
from global_master.outbox import Outbox
from global_master.queues import UserQueues
from global_master.recovery import (
    Ended,
    Recovery,
    Redelivered,
    left_behind,
    recovered_task,
    resume_job,
)
from global_master.view import LmView

_MISSING = PlacementResult(accepted=False, reason="missing_result")


@dataclass(slots=True)
class Admission:
    """A job being admitted in slices: ``checked`` of its tasks passed admission,
    ``queued`` of them are in its user's queue."""

    job: SubmitJob
    redelivered: bool
    at: float
    """When it entered the GM queue: its tasks' queueing starts then, not at their slice."""
    checked: int = 0
    queued: int = 0
    seen: set[TaskKey] = field(default_factory=set)
    built: list[Task] = field(default_factory=list)
    """A DAG's tasks made so far, a slice per step once all are checked; the DAG is
    queued whole once all are made (its stages name each other)."""
    pending: set[TaskKey] = field(default_factory=set)
    """Once its record exists: its tasks not yet queued.  One of them may end meanwhile
    (it ran before a restart and the job was redelivered): it is remembered as ended
    then, and its slice finds it so."""


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """What a GM admits (beyond what the schema already checks)."""

    max_task_duration_s: float = 7 * 24 * 3600.0
    recent_jobs: int = 100_000
    """Completed job ids remembered per GM, so a reused id is refused (bounded)."""
    commands: bool = True
    """Whether a task may carry a command (the federation's ``task_commands``): without,
    a job with one is refused (``commands_disabled``) rather than run as if it had none."""
    max_user_tasks: int = 1_000_000
    """Tasks one user may have on this GM at once -- queued, being admitted, in flight or
    running (about 1 KB each); a job that would pass it is refused (``user_task_limit``)
    and the GM's memory stays bounded.  0: no limit."""


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
        limits: AdmissionLimits | None = None,
        journal: Journal | None = None,
        overload: OverloadPolicy | None = None,
        admit_slice: int = 1000,
        keep_ends_after_s: float = ENDS_RETAINED_S / 4,
    ) -> None:
        if admit_slice < 1:
            raise ConfigError(f"admit_slice must be >= 1, got {admit_slice}")
        if not 0.0 <= keep_ends_after_s < ENDS_RETAINED_S:
            raise ConfigError(
                f"keep_ends_after_s must be in [0, {ENDS_RETAINED_S:g}), got {keep_ends_after_s}"
            )
        self.gm_id = gm_id
        self.admit_slice = admit_slice
        """Tasks of one job checked or queued per step (larger jobs take several)."""
        self.admitting: dict[JobKey, Admission] = {}
        """Jobs admitted in slices, not yet wholly queued."""
        self.held_admissions: dict[UserId, deque[tuple[AdmitJob, float]]] = {}
        """Jobs that came while an earlier job of their user was in ``admitting``: they
        follow it, so that a user's jobs are queued in the order they came."""
        self.journal = journal
        """Per-task timelines for operators (``global_master.inspect``); None: none kept."""
        self.lms: list[LmId] = list(lms)
        self.users: dict[UserId, UserConfig] = {u.user: u for u in users}
        mine = [u.user for u in users if u.gm == gm_id]
        self.queues = queues if queues is not None else UserQueues(mine, patience=patience)
        self.limits = limits or AdmissionLimits()
        # the pieces, each with its own state (the tables drivers read are named here)
        self.ledger = ledger = Ledger(
            recent_jobs=self.limits.recent_jobs, keep_ends_after_s=keep_ends_after_s
        )
        self.inflight, self.placed, self.live = ledger.inflight, ledger.placed, ledger.live
        self.finished, self.failed, self.jobs = ledger.finished, ledger.failed, ledger.jobs
        self.recovery = Recovery(gm_id, limit=self.limits.recent_jobs)
        self.known_done = self.recovery.known_done
        self.overload = overload or OverloadPolicy()
        self.outbox = Outbox(self.overload)
        self._held = self.outbox.held
        self.waiting = self.queues.waiting
        self._index = self.overload.wait_index and self.queues.kind == "fifo"
        """Plain FIFO queues: tasks that found no room wait in the index (job-aware
        policies keep blocked tasks themselves)."""
        self._starved: dict[UserId, float] = {}
        """Users below their share with tasks waiting for room, since when."""
        self._grace_check = 0.0
        self._preempts_sent: dict[LmId, deque[float]] = {}
        self._shares: dict[UserId, float] | None = None
        self._no_victim: dict[tuple[UserId, LmId], float] = {}
        """(victim, LM) pairs an LM lately found nothing to preempt in, until when."""
        self.views: dict[LmId, LmView] = {}
        self.max_retries = max_retries
        self._retries: dict[TaskKey, int] = {}
        self._preempt_tried: dict[TaskKey, set[tuple[UserId, LmId]]] = {}
        self._rr: dict[bool, int] = {True: 0, False: 0}
        """Where the next round-robin walk of internal (True) / external partitions starts."""
        self._snapshot_wanted: set[LmId] = set()
        self._restart_counted: dict[LmId, int] = {}
        """The newest epoch of each LM counted in ``lm_restarts_seen``: an incarnation is
        counted once, however many of its updates come before its snapshot."""
        self._feasible: dict[tuple[int, tuple[int, ...]], bool] = {}
        self._capacity: list[int] = []
        self._node_caps: frozenset[tuple[int, ...]] = frozenset()
        self._victim_pending: dict[UserId, float] = {}
        self._preempt_victim: dict[TaskKey, tuple[UserId, float]] = {}
        self.counters = GmCounters()
        self.wait_reasons: list[int] = [0] * len(WaitReason)
        self._handlers: dict[type, Callable[[Any, float], list[Effect]]] = {
            AdmitJob: self._on_admit,
            AdmitMore: self._on_admit_more,
            Decide: self._on_decide,
            RequestSnapshots: self._on_request_snapshots,
            StateUpdated: self._on_state_update,
            StateSnapshot: self._on_snapshot,
            LaunchResponse: self._on_launch_response,
            PreemptResponse: self._on_preempt_response,
            RequestFailed: self._on_request_failed,
            TaskEvents: self._on_task_events,
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
            for v in self.views.values():
                if v.freed:
                    v.freed.clear()
        if self._held:  # placements held back may leave now
            for lm, placements in self.outbox.release_held(now):
                self._send_launch(lm, placements, effects, now)
        return effects

    # ------------------------------------------------------------ bookkeeping
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

    @property
    def ready(self) -> bool:
        """The GM has a view of every LM and may decide."""
        return len(self.views) == len(self.lms)

    def has_work(self) -> bool:
        return self.ready and self.queues.has_work()

    def unchanged_until(self) -> float:
        """Until when a state update that changes nothing in the view (an LM's heartbeat
        with nothing new) changes nothing in this GM either, apart from counting itself
        (``updates_applied``): a pure query for a driver that skips such updates (the
        simulator's quiet spans).

        Such an update applies an empty delta; then ``handle`` wakes waiting tasks, of
        which the freed nodes wake none (nothing freed) and the preemption grace
        (``_grace_due``) wakes none before ``_grace_check``, and none at all while no user
        is starved; and it flushes held launches (``Outbox.held``), which repartition
        batching may let go by time alone: -inf then.  ``math.inf``: no work driven by
        time; a time at or before now: the next update may act.  An update also asks
        the LMs to keep the ends of jobs held long (``_keep_ends_due``): from the first
        such job's time.
        """
        if self._held:
            return -math.inf
        keep = self.ledger.next_keep_due()
        if self._index and self.waiting and self._starved:
            return min(keep, self._grace_check)
        return keep

    def _known_version(self, lm: LmId) -> int:
        v = self.views.get(lm)
        return -1 if v is None else v.version

    # ------------------------------------------------------------ admission
    def _on_admit(self, msg: AdmitJob, now: float) -> list[Effect]:
        """A submission: admitted into its user's queue, or refused with the reason
        before any of its tasks is queued."""
        return self._admit_job(msg, now, now)

    def _admit_job(self, msg: AdmitJob, came: float, now: float) -> list[Effect]:
        """``_on_admit`` of a job that came at ``came`` (its tasks' queueing starts then)."""
        job = msg.job
        jk: JobKey = (job.user, job.job_id)
        held = self.held_admissions.get(job.user)
        if held is not None and jk not in self.admitting:
            # behind the user's job still being admitted (its task ids are not yet held)
            held.append((msg, came))
            return []
        if job.resumes is not None:
            return self._on_resume(job, msg.redelivered, now)
        record = self.jobs.get(jk)
        if record is not None or self.ledger.is_recent(jk) or jk in self.admitting:
            if msg.redelivered:  # the same job again (its ack was lost): nothing to run twice
                if jk in self.admitting:
                    return []  # settled once admitted and placed
                settled = record is None or record.settled
                return [JobSettled(job.job_id, job.user)] if settled else []
            return [self._refuse(job, "duplicate_job_id", f"job {job.job_id!r} already submitted")]
        why = self._job_error(job) or self._over_limit(job, msg.redelivered)
        if why is not None:
            return [self._refuse(job, *why)]
        adm = Admission(job, msg.redelivered, came)
        if len(job.tasks) <= self.admit_slice:  # in one step
            why = self._tasks_error(adm, len(job.tasks))
            if why is not None:
                return [self._refuse(job, *why)]
            return self._queue_tasks(adm, len(job.tasks), now)
        self.admitting[jk] = adm
        self.held_admissions[job.user] = deque()
        return self._admit_step(adm, now)

    def _on_admit_more(self, msg: AdmitMore, now: float) -> list[Effect]:
        adm = self.admitting.get((msg.user, msg.job_id))
        return [] if adm is None else self._admit_step(adm, now)

    def _admit_step(self, adm: Admission, now: float) -> list[Effect]:
        """One slice of a large job: check the next ``admit_slice`` tasks (reserving
        their ids), or, once all are checked, queue the next ``admit_slice``."""
        job = adm.job
        n = len(job.tasks)
        if adm.checked < n:
            why = self._tasks_error(adm, min(n, adm.checked + self.admit_slice))
            if why is not None:
                return [self._refuse(job, *why), *self._admitted(adm, now)]
            effects: list[Effect] = []
        elif job.stages is not None and len(adm.built) < n:
            # a DAG is queued whole (its stages name each other), its tasks made first
            made = len(adm.built)
            specs = job.tasks[made : made + self.admit_slice]
            adm.built += [new_task(spec, adm.at, gm=self.gm_id) for spec in specs]
            effects = []
        else:
            end = n if job.stages is not None else min(n, adm.queued + self.admit_slice)
            effects = self._queue_tasks(adm, end, now)
            if adm.queued < end:  # refused: a DAG whose stages do not fit together
                return [*effects, *self._admitted(adm, now)]
        if adm.queued < n:
            effects.append(After(0.0, AdmitMore(user=job.user, job_id=job.job_id)))
        else:
            effects += self._admitted(adm, now)
        return effects

    def _admitted(self, adm: Admission, now: float) -> list[Effect]:
        """``adm`` is queued or refused: its user's jobs that came meanwhile are
        admitted now, in order, until one is large enough to need slices again."""
        del self.admitting[(adm.job.user, adm.job.job_id)]
        held = self.held_admissions.pop(adm.job.user)
        effects: list[Effect] = []
        while held:
            effects += self._admit_job(*held.popleft(), now)
            following = self.held_admissions.get(adm.job.user)
            if following is not None:  # sliced again: the rest follow that one
                following.extend(held)
                break
        return effects

    def _queue_tasks(self, adm: Admission, end: int, now: float) -> list[Effect]:
        """Queue ``adm``'s tasks up to ``end`` (all checked); the job's record, with every
        task, is made with the first of them."""
        job = adm.job
        jk: JobKey = (job.user, job.job_id)
        specs = job.tasks[adm.queued : end]
        # a task enters the GM queue when its job came (its user's submission time is
        # job.submitted_at)
        if adm.built:  # a DAG admitted in slices: made already
            tasks, adm.built = adm.built, []
        else:
            tasks = [new_task(spec, adm.at, gm=self.gm_id) for spec in specs]
        found = Redelivered(tasks)
        if adm.redelivered:  # after a restart some of its tasks may run, or have run
            found = self.recovery.sort_redelivered(
                tasks, job.stages is not None, self.live, self.placed, self.inflight
            )
            for t in found.unqueue:
                self.queues.remove(t)
            for t in found.found_running:
                self.placed[t.key] = t
                self.counters.tasks_adopted += 1
        adopted, sent, ended = found.adopted, found.sent, found.ended
        dag = None
        if job.stages is not None:
            try:
                dag = from_layout(
                    job.job_id,
                    job.user,
                    adm.at,  # when it came: its roots queue from then, as a flat job's tasks do
                    tasks,
                    tuple((s.stage_id, s.parents, s.count) for s in job.stages),
                )
            except ConfigError as exc:
                return [self._refuse(job, "bad_dag", str(exc))]
        if adm.queued == 0:
            keys = [(spec.user, spec.task_id) for spec in job.tasks]
            self.ledger.open_job(jk, keys, now, adm.redelivered)
            self.counters.jobs_admitted += 1
            if end < len(keys):
                adm.pending = set(keys[end:])
        else:
            adm.pending.difference_update(t.key for t in tasks)
        adm.queued = end
        for t in tasks:
            self.live[t.key] = t
        if dag is not None:
            # what runs, is on its way to an LM or ended is never released again
            out = [t.task_id for t in (*adopted, *sent)] + [t.task_id for t, _ in ended]
            self.queues.add_job(dag, adm.at, out)
            for t in sent:
                self.queues.on_dispatched(t, now)
        else:
            skip = {t.key for t in adopted} | {t.key for t, _ in ended} | found.kept
            for t in tasks:
                if t.key not in skip:
                    self.queues.push_back(t)
        return self._resume(adopted, ended, dag is not None, now)

    def _keep_ends(self, jk: JobKey, keep: bool = True) -> list[Effect]:
        """Ask every LM to keep (or let go) the ended attempts of job ``jk``."""
        if keep:
            self.counters.jobs_keeping_ends += 1
        user, job_id = jk
        return [
            ToLm(lm, KeepEnds(gm=self.gm_id, lm=lm, user=user, job_id=job_id, keep=keep))
            for lm in self.lms
        ]

    def _resume(
        self, adopted: list[Task], ended: list[tuple[Task, Ended]], dag: bool, now: float
    ) -> list[Effect]:
        """A redelivered job's tasks that ran on since a restart (adopted) or ended: none
        runs twice; a DAG goes on from the stages they released."""
        effects: list[Effect] = []
        for t in adopted:
            self.counters.redelivered_skipped += 1
            if dag:
                self.queues.on_dispatched(t, now)
            self._settle(t, effects)
        for t, known in ended:
            self.counters.redelivered_skipped += 1
            self._settle(t, effects)
            tell = not known.reported
            if known.held.ok:
                self.queues.on_finished(t, now)
                self._ended(t, effects, finished=True, reason="", tell=tell)
            else:
                self._fail(t, "failed on worker", effects, tell=tell)
        return effects

    def _job_error(self, job: SubmitJob) -> tuple[str, str] | None:
        """Why ``job`` as a whole is not admitted here (None: it may be)."""
        if job.user not in self.queues:
            return "unknown_user", f"user {job.user!r} has no queue on {self.gm_id}"
        if not self.ready:
            return "not_ready", f"{self.gm_id} has no view of every LM yet"
        if job.attempt:
            return "reserved_field", "attempt is set by a GM, on the tasks it returns only"
        return None

    def _over_limit(self, job: SubmitJob, redelivered: bool) -> tuple[str, str] | None:
        """Why ``job`` would take its user past ``max_user_tasks`` (None: it would not).
        A redelivered job was admitted before (its tasks may run): never refused for it."""
        limit = self.limits.max_user_tasks
        if not limit or redelivered:
            return None
        # (the user's job being admitted in slices, if any, holds this one back until
        # its tasks are all in ``live``)
        held = self.live.per_user.get(job.user, 0)
        if held + len(job.tasks) <= limit:
            return None
        return "user_task_limit", (
            f"user {job.user!r} has {held} tasks on {self.gm_id}; {len(job.tasks)} more would "
            f"pass its limit of {limit} (max_user_tasks)"
        )

    def _tasks_error(self, adm: Admission, end: int) -> tuple[str, str] | None:
        """Check ``adm``'s tasks from ``adm.checked`` up to ``end``: why one is not
        admitted, or None (and ``checked`` moves on)."""
        job, redelivered, seen = adm.job, adm.redelivered, adm.seen
        live = self.live
        width = len(self._capacity)
        limit = self.limits.max_task_duration_s
        for spec in job.tasks[adm.checked : end]:
            key = (spec.user, spec.task_id)
            if spec.user != job.user or spec.job_id != job.job_id:
                return "wrong_job", (
                    f"task {spec.task_id} belongs to {spec.user}/{spec.job_id}, "
                    f"not {job.user}/{job.job_id}"
                )
            if key in seen or (key in live and not redelivered):
                return "duplicate_task_id", f"task id {spec.task_id!r} is already in use"
            seen.add(key)
            if len(spec.demand) != width:
                return "wrong_resources", (
                    f"task {spec.task_id}: {len(spec.demand)} resource amounts, "
                    f"the federation has {width}"
                )
            if not any(spec.demand):
                return "zero_demand", f"task {spec.task_id} asks for no resource at all"
            if spec.command and not self.limits.commands:
                return "commands_disabled", (
                    f"task {spec.task_id} has a command; this federation runs none"
                )
            if not any(fits(cap, spec.demand) for cap in self._node_caps):
                return "impossible_resources", (
                    f"task {spec.task_id}: demand {spec.demand} exceeds every node's capacity"
                )
            if spec.duration > limit:
                return "duration_too_long", (
                    f"task {spec.task_id}: duration {spec.duration:.6g} s exceeds {limit:g} s"
                )
        adm.checked = end
        return None

    def _refuse(self, job: SubmitJob, reason: str, detail: str) -> JobRefused:
        self.counters.jobs_refused += 1
        return JobRefused(job.job_id, job.user, reason, detail, submitted_at=job.submitted_at)

    def _on_resume(self, job: SubmitJob, redelivered: bool, now: float) -> list[Effect]:
        """Tasks this GM (or a predecessor) persisted when they came back to its queue.
        Those it still holds are bound to the message, acknowledged once they are
        placed again; those it does not (it restarted) are queued again."""
        if job.user not in self.queues:
            why = f"{job.user!r} has no queue here"
            return [replace(self._refuse(job, "unknown_user", why), resume=True)]
        jk: JobKey = (job.user, job.job_id)
        recovery = self.recovery
        if recovery.resuming(jk):  # the same message again: its delivery is rebound
            return []
        waiting: set[TaskKey] = set()
        effects: list[Effect] = []
        for spec in job.tasks:
            key = (spec.user, spec.task_id)
            if key in self.placed or spec.user != job.user:
                continue
            if key in self.live:  # still waiting here: acknowledged once placed
                waiting.add(key)
                recovery.follow(key, jk)
                continue
            if self.knows(key):
                continue
            task = new_task(spec, now, gm=self.gm_id)  # lost with a predecessor: queue it
            width = len(self._capacity)
            if width and len(spec.demand) != width:  # the federation changed meanwhile
                why = (
                    f"wrong_resources: {len(spec.demand)} resource amounts, "
                    f"the federation has {width}"
                )
                self._fail(task, why, effects)
                continue
            task.attempt = job.attempt  # placed again as a newer attempt than it ran as
            self.live[key] = task
            self.queues.push_front(task)
            waiting.add(key)
            recovery.follow(key, jk)
        if not recovery.bind(jk, waiting):
            return [*effects, JobSettled(job.job_id, job.user, resume=True)]
        return effects

    def _persist(self, task: Task, now: float, effects: list[Effect]) -> None:
        """A task back in the queue whose job was acknowledged: keep it on the broker."""
        rec = self.jobs.get((task.user, task.job_id))
        if rec is None or rec.settled:  # (held, its job's delivery keeps it)
            effects.append(Persist(resume_job(task, now)))

    def _settle(self, task: Task, effects: list[Effect]) -> None:
        """The task was accepted by an LM or failed: its job may be acknowledged."""
        rk = self.recovery.settle(task.key)
        if rk is not None:
            effects.append(JobSettled(rk[1], rk[0], resume=True))
        settled = self.ledger.settle(task)
        if settled is not None:
            self.counters.jobs_settled += 1
            effects.append(JobSettled(task.job_id, task.user))
            if settled[1]:  # its LMs kept its ends: acknowledged, it cannot come back
                effects += self._keep_ends(settled[0], keep=False)

    def _ended(
        self, task: Task, effects: list[Effect], *, finished: bool, reason: str, tell: bool = True
    ) -> None:
        """A task finished or failed for good: tell its user (unless a predecessor of
        this GM did); retire its job when done."""
        key = task.key
        self.ledger.end(task, finished=finished, reason=reason)
        if self.journal is not None:
            at = task.finished_at
            if at < 0:  # failed before it ran (infeasible, a parent failed): its last mark
                at = task.marks[-1][0] if task.marks else task.submitted_at
            self.journal.close(task, at, finished=finished, reason=reason)
        if finished:
            self.counters.tasks_finished += 1
        else:
            self.counters.failed += 1
        self._forget(key)
        if tell:
            outcome = TaskOutcome(task=task, finished=finished, reason=reason)
            effects.append(ToUser(task.user, outcome))
        jk = (task.user, task.job_id)
        rec = self.jobs.get(jk)
        adm = self.admitting.get(jk)
        if rec is None or (adm is not None and key in adm.pending):
            # adopted after a restart: its job may still be redelivered, or still have
            # this task's slice to queue (which then finds it ended)
            self.recovery.remember_done(task, finished)
            return
        if not finished:
            self._settle(task, effects)
        self.ledger.count_end(jk, rec)

    def _orphan(self, ev: TaskEvent, effects: list[Effect]) -> None:
        """An event about a task of this GM's users that it does not hold: recovery
        keeps it for the task's job; an end may be told to its user now."""
        if ev.user not in self.queues or (ev.user, ev.task_id) in self.live:
            return  # a task this GM holds: its current attempt decides, not this one
        recent = ev.job_id is not None and self.ledger.is_recent((ev.user, ev.job_id))
        end = self.recovery.orphan(ev, recent)
        if end is not None:
            self._ended(end.task, effects, finished=end.finished, reason=end.reason)

    # -------------------------------------------------------------- deciding
    def _on_decide(self, msg: Decide, now: float) -> list[Effect]:
        return self.decide(now, msg.max_tasks)

    def decide(self, now: float, max_tasks: int = 1) -> list[Effect]:
        """Make up to ``max_tasks`` decisions; launches to one LM share one request."""
        effects: list[Effect] = []
        batches: dict[LmId, list[Placement]] = {}
        if not self.ready:
            return effects
        for _ in range(max_tasks):
            task = self.queues.pop()
            if task is None:
                break
            task.mark(Phase.PROCESSING, now)
            self.counters.decisions += 1
            self._place(task, now, batches, effects)
        return self._end_round(batches, effects, now)

    def _end_round(
        self, batches: dict[LmId, list[Placement]], effects: list[Effect], now: float
    ) -> list[Effect]:
        """A round of decisions is over: the next one starts its walk at the next LM
        (``_match``), and each LM's placements leave in one request."""
        if batches:
            n = len(self.lms)
            self._rr = {k: (v + 1) % n for k, v in self._rr.items()}
        self._flush(batches, effects, now)
        return effects

    def _flush(
        self, batches: dict[LmId, list[Placement]], effects: list[Effect], now: float
    ) -> None:
        """One launch request per LM, unless the outbox holds its placements back (the
        launch window, repartition batching: they leave with the next one)."""
        for lm, placements in self.outbox.release(batches, now):
            self._send_launch(lm, placements, effects, now)

    def _send_launch(
        self, lm: LmId, placements: list[Placement], effects: list[Effect], now: float
    ) -> None:
        rid = self.outbox.launched(lm, placements, now)
        self.counters.launch_requests += 1
        if any(p.repartition for p in placements):
            self.counters.repartition_messages += 1
        inflight = self.inflight
        for p in placements:
            inflight[(p.spec.user, p.spec.task_id)].request_id = rid
        effects.append(
            ToLm(
                lm,
                LaunchRequest(
                    gm=self.gm_id,
                    lm=lm,
                    request_id=rid,
                    placements=tuple(placements),
                    known_version=self._known_version(lm),
                ),
            )
        )

    def _place(
        self,
        task: Task,
        now: float,
        batches: dict[LmId, list[Placement]],
        effects: list[Effect],
    ) -> None:
        """One pass of the decision path for one task (Alg. 1, then Alg. 2)."""
        task.decisions += 1
        mask, demand = task.constraints, task.demand
        # 1. internal partitions; 2. external partitions: repartition
        for internal in (True, False):
            found = self._match(mask, demand, internal)
            if found is not None:
                self._dispatch(task, found[0], found[1], not internal, batches, now)
                return
        # 3. nothing fits: infeasible, fairness, or back of the queue
        if not self._is_feasible(mask, demand):
            self._note(task, WaitReason.NO_CONSTRAINT_MATCH, now)
            self._fail(task, "infeasible: no node satisfies the constraints and demand", effects)
            return
        self._note(task, WaitReason.NO_FREE_RESOURCES, now)
        # altruistic tasks (Carbyne) use only what is free: never a reason to preempt
        if self.queues.may_preempt_for(task) and self._grace_over(task, now):
            req = self._preemption(task, now)
            if req is not None:
                self._send_preemption(task, req, now, effects)
                return
        self._wait(task, now)

    def _match(self, mask: int, demand: Resources, internal: bool) -> tuple[LmView, int] | None:
        """Alg. 1: walk the internal (or external) partitions round-robin over LMs; in
        each, AND the constraint vectors and take the first node that fits.  The walk
        starts where the previous match was, and moves on one LM per decision round
        (``decide``): a round's tasks fill one LM before the next, so they travel in
        one launch request, while successive rounds still spread over every LM."""
        lms, n, views, me = self.lms, len(self.lms), self.views, self.gm_id
        fit = self.queues.choose_node or LmView.first_fit
        full_skips = fit is LmView.first_fit and all(demand)  # first fit needs an avail node
        start = self._rr[internal]
        for k in range(n):
            view = views[lms[(start + k) % n]]
            if full_skips and not view.avail.any():
                continue
            node = fit(view, view.eligible(mask, me, internal), demand)
            if node >= 0:
                self._rr[internal] = (start + k) % n
                return view, node
        return None

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
        task.attempt += 1
        self.inflight[task.key] = InFlight(task, view.lm, node, repartition)
        self.queues.on_dispatched(task, now)
        if repartition:
            self.counters.repartition_requests += 1
        else:
            self.counters.placed_internal += 1
        self.queues.placed(task.user)
        if self.journal is not None:
            self.journal.note(
                task.key, now, "repartition" if repartition else "launch", lm=view.lm,
                node=node, partition=view.home[node], detail=f"attempt {task.attempt}",
            )  # fmt: skip
        batches.setdefault(view.lm, []).append(
            Placement(
                spec=task.spec,
                attempt=task.attempt,
                node=NodeIndex(node),
                repartition=repartition,
                altruistic=task.altruistic,
                queued_at=task.submitted_at,
            )
        )

    def _send_preemption(
        self, task: Task, req: PreemptRequest, now: float, effects: list[Effect]
    ) -> None:
        self.counters.preemption_attempts += 1
        self._preempts_sent.setdefault(req.lm, deque()).append(now)
        self.inflight[task.key] = InFlight(task, req.lm, -1, False, req.request_id)
        self.outbox.preempt_sent(req.request_id, task.key)
        self.queues.on_dispatched(task, now)
        if self.journal is not None:
            self.journal.note(task.key, now, "preempt_request", lm=req.lm,
                              detail=f"attempt {req.attempt}, victim {req.victim}")  # fmt: skip
        effects.append(ToLm(req.lm, req))

    def _note(
        self, task: Task, reason: WaitReason, now: float, lm: str = "", why: str = ""
    ) -> None:
        """A decision did not place ``task``, for ``reason`` (an LM's refusal: ``why``)."""
        task.waits[reason] += 1
        self.wait_reasons[reason] += 1
        if self.journal is not None:
            detail = f"{reason.name.lower()}: {why}" if why else reason.name.lower()
            self.journal.wait(task.key, now, detail, lm)

    def _is_feasible(self, mask: int, demand: tuple[int, ...]) -> bool:
        key = (mask, demand)
        ok = self._feasible.get(key)
        if ok is None:
            ok = any(v.feasible(mask, demand) for v in self.views.values())
            self._feasible[key] = ok
        return ok

    def _fail(self, task: Task, reason: str, effects: list[Effect], *, tell: bool = True) -> None:
        self._ended(task, effects, finished=False, reason=reason, tell=tell)
        self._abandon(task, effects)

    def _abandon(self, task: Task, effects: list[Effect]) -> None:
        """DAG jobs: the stages that needed a failed task can never run; fail them."""
        for lost in self.queues.abandon(task, 0.0):
            self._ended(lost, effects, finished=False, reason=f"parent task {task.task_id} failed")

    def _forget(self, key: TaskKey) -> None:
        self._retries.pop(key, None)
        self._preempt_tried.pop(key, None)

    def _wait(self, task: Task, now: float) -> None:
        """No room anywhere in the view: into the waiting index until freed resources
        could fit it (plain FIFO queues), else the back of its queue."""
        if not self._index:
            self._requeue(task, now)
            return
        self.counters.requeues += 1
        self.counters.waited += 1
        self._forget(task.key)
        task.mark(Phase.QUEUEING, now)
        self.waiting.add(task)

    def _wake(self, now: float) -> None:
        """Waiting tasks that the freed nodes could fit go back to the front of their
        queues: per freed node and class, as many as the node's room holds, users
        furthest below their share first.  No lost wake-up: every growth of a node's
        free resources in a view marks it freed (``LmView.freed``), and a task only
        waits after a full match found no node for it."""
        waiting = self.waiting
        woken: list[Task] = []
        order: list[UserId] | None = None
        for view in self.views.values():
            freed = view.freed
            if not freed:
                continue
            if waiting:
                masks, free = view.node_masks, view.free
                skip_empty = waiting.all_positive
                for i in freed:
                    room = free[i]
                    if skip_empty and 0 in room:
                        continue
                    node_mask = masks[i]
                    copied = False
                    for cls in list(waiting.by_class):
                        mask, demand = cls
                        if mask & ~node_mask:
                            continue
                        k = -1
                        for x, d in zip(room, demand, strict=True):
                            if d > 0:
                                q = x // d
                                if k < 0 or q < k:
                                    k = q
                                    if k <= 0:
                                        break
                        if k <= 0:
                            continue
                        users = waiting.by_class[cls]
                        if len(users) > 1 and order is None:
                            order = self._wake_order()
                        got = waiting.take(cls, k, order or ())
                        if not copied:
                            room, copied = list(room), True
                        for r, d in enumerate(demand):
                            room[r] -= d * len(got)
                        woken.extend(got)
                    if not waiting:
                        break
            freed.clear()
        if woken:
            self.counters.woken += len(woken)
            for t in reversed(woken):
                self.queues.push_front(t)
        self._grace_due(now)

    def _wake_order(self) -> list[UserId]:
        shares = self.dominant_shares()
        users = [u for u in self.users if u in self.queues]
        return sorted(users, key=lambda u: shares.get(u, 0.0) / max(self.users[u].share, 1e-9))

    def _below_share(self, user: UserId, fraction: float = 1.0) -> bool:
        """``user`` holds less than ``fraction`` of its share (its in-flight requests
        to LMs counted)."""
        own = self.inflight.share(user, self._share_of)
        return self.dominant_shares().get(user, 0.0) + own < self.users[user].share * fraction

    def _grace_over(self, task: Task, now: float) -> bool:
        """May ``task``'s user preempt now?  Once it has been below ``preempt_below`` of
        its share for ``preempt_grace_s`` it is *starved*, and preempts until it holds
        its share (YARN's fair-share preemption); a user at its share never does."""
        pol = self.overload
        if pol.preempt_grace_s <= 0 and pol.preempt_below >= 1:
            return True
        user = task.user
        since = self._starved.get(user)
        if since is None or now - since < pol.preempt_grace_s:
            if not self._below_share(user, pol.preempt_below):
                self._starved.pop(user, None)  # the shortfall closed by itself
                self._note(task, WaitReason.USER_AT_SHARE, now)
                return False
            if since is None:
                since = self._starved[user] = now
            if now - since < pol.preempt_grace_s:
                self.counters.preemptions_deferred += 1
                self._grace_check = min(self._grace_check, since + pol.preempt_grace_s)
                return False
        if not self._below_share(user):
            del self._starved[user]
            self._note(task, WaitReason.USER_AT_SHARE, now)
            return False
        return True

    def _grace_due(self, now: float) -> None:
        """Users whose grace period is over get waiting tasks woken to preempt for,
        as many as the LMs' preemption budgets allow."""
        if not self._starved or now < self._grace_check:
            return
        pol = self.overload
        period = max(pol.preempt_period_s, 1e-3)
        refills = [q[0] + period for q in self._preempts_sent.values() if q and q[0] + period > now]
        self._grace_check = min([now + period, *refills])  # when a budget refills
        for user, since in list(self._starved.items()):
            if now - since < pol.preempt_grace_s:
                self._grace_check = min(self._grace_check, since + pol.preempt_grace_s)
                continue
            if not self.waiting.count(user) or not self._below_share(user):
                del self._starved[user]
                continue
            budget = sum(self._preempt_room(lm, now) for lm in self.lms)
            for t in reversed(self.waiting.take_user(user, budget)):
                self.queues.push_front(t)

    def _preempt_room(self, lm: LmId, now: float) -> int:
        """Preemption requests this GM may still send ``lm`` in the current period."""
        limit = self.overload.preempt_per_lm
        if limit <= 0:
            return 1
        sent = self._preempts_sent.get(lm)
        if not sent:
            return limit
        horizon = now - self.overload.preempt_period_s
        while sent and sent[0] <= horizon:
            sent.popleft()
        return max(0, limit - len(sent))

    def _requeue(self, task: Task, now: float) -> None:
        """Back of its queue (§IV-B5); the queue may park until the view changes."""
        self.counters.requeues += 1
        self._forget(task.key)
        task.mark(Phase.QUEUEING, now)
        self.queues.push_back(task)
        self.queues.failed(task.user)

    # -------------------------------------------------------------- fairness
    def dominant_shares(self) -> dict[UserId, float]:
        """Each user's dominant share of the federation, from the (stale) views."""
        if self._shares is not None:
            return self._shares
        total = self._capacity
        if not total:
            return {}
        used: dict[UserId, list[int]] = {}
        for v in self.views.values():
            for u, res in v.usage.items():
                acc = used.get(u)
                if acc is None:
                    used[u] = list(res)
                else:
                    for r, x in enumerate(res):
                        acc[r] += x
        self._shares = {u: self._share_of(res) for u, res in used.items()}
        return self._shares

    def _share_of(self, res: Sequence[int]) -> float:
        best = 0.0
        for x, t in zip(res, self._capacity, strict=True):
            if t > 0 and x / t > best:
                best = x / t
        return best

    def _preemption(self, task: Task, now: float) -> PreemptRequest | None:
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
        own = self.inflight.share(task.user, self._share_of)
        mine = self.users[task.user].share
        have = shares.get(task.user, 0.0) + own
        if have >= mine:
            self._starved.pop(task.user, None)
            self._note(task, WaitReason.USER_AT_SHARE, now)
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
        tried = self._preempt_tried.setdefault(task.key, set())
        limited = False
        for _, victim in violators:
            ranked = sorted(
                (lm for lm, v in self.views.items() if any(v.usage.get(victim, ()))),
                key=lambda lm: -sum(self.views[lm].usage[victim]),
            )
            for lm in ranked:
                if (victim, lm) in tried:
                    continue
                if not self._preempt_room(lm, now):
                    limited = True
                    continue
                if self._index and self._no_victim.get((victim, lm), now) > now:
                    limited = True
                    continue
                tried.add((victim, lm))
                self._victim_pending[victim] = self._victim_pending.get(victim, 0.0) + need
                self._preempt_victim[task.key] = (victim, need)
                task.attempt += 1
                return PreemptRequest(
                    gm=self.gm_id,
                    lm=lm,
                    request_id=self.outbox.request_id(),
                    spec=task.spec,
                    attempt=task.attempt,
                    victim=victim,
                    known_version=self._known_version(lm),
                    queued_at=task.submitted_at,
                )
        if limited:  # its turn comes when the budgets refill (``_grace_due``)
            self.counters.preemptions_rate_limited += 1
            self._starved.setdefault(task.user, now)
        self._note(task, WaitReason.PREEMPTION_FAILED, now)
        return None

    # ------------------------------------------------------- state from LMs
    def _apply(self, delta: StateDelta) -> list[Effect]:
        view = self.views.get(delta.lm)
        if view is None:
            return self._want_snapshot(delta.lm)
        if delta.epoch != view.epoch:
            if delta.epoch < view.epoch:  # from an incarnation that has been replaced
                self.counters.stale_updates += 1
                return []
            if self._restart_counted.get(delta.lm, view.epoch) < delta.epoch:
                self._restart_counted[delta.lm] = delta.epoch  # the LM restarted
                self.counters.lm_restarts_seen += 1
            return self._want_snapshot(delta.lm)  # its versions began anew
        changed, gap = view.apply(delta)
        self.counters.updates_applied += 1
        if changed:
            self._shares = None
            self.queues.new_epoch()
        if gap:
            self.counters.gaps += 1
            return self._want_snapshot(delta.lm)
        return []

    def _want_snapshot(self, lm: LmId) -> list[Effect]:
        if lm in self._snapshot_wanted or lm not in self.lms:
            return []
        self._snapshot_wanted.add(lm)
        return [ToLm(lm, SnapshotRequest(gm=self.gm_id, lm=lm))]

    def _on_request_snapshots(self, msg: RequestSnapshots, now: float) -> list[Effect]:
        """A (re)started GM asks every LM for a full snapshot."""
        effects: list[Effect] = []
        for lm in self.lms:
            effects.extend(self._want_snapshot(lm))
        return effects

    def _on_snapshot(self, snap: StateSnapshot, now: float) -> list[Effect]:
        lm = snap.layout.lm
        if lm not in self.lms:
            return []
        old = self.views.get(lm)
        if old is not None and snap.state.epoch < old.epoch:
            self.counters.stale_updates += 1
            return []
        view = LmView(snap.layout)
        view.epoch = snap.state.epoch
        if old is not None:  # keep this GM's in-flight reservations
            for i, pend in enumerate(old.pending):
                if pend is not None and i < view.n:
                    view.pending[i] = list(pend)
        view.apply(snap.state)
        self.views[lm] = view
        self._shares = None
        self._feasible.clear()
        totals = [v.capacity_total for v in self.views.values() if v.n]
        self._capacity = [sum(col) for col in zip(*totals, strict=True)]
        self.inflight.rescale()
        self._node_caps = frozenset().union(*(v.capacity_kinds for v in self.views.values()))
        self.queues.set_cluster(self._capacity, self._node_caps)
        self._snapshot_wanted.discard(lm)
        effects: list[Effect] = []
        self._adopt(lm, snap.held, effects)
        if old is not None and snap.state.epoch > old.epoch:
            self._reconcile(lm, snap.held, now, effects)
        self.queues.new_epoch()
        return effects

    def _reconcile(
        self, lm: LmId, held: Sequence[HeldTask], now: float, effects: list[Effect]
    ) -> None:
        """A new incarnation of ``lm`` (restarted, or its standby took over) holds what
        its workers told it.  A task this GM placed there that it does not hold was
        lost with the old incarnation (accepted, never started): back to the front of
        its queue, as a new attempt.  One that ended meanwhile has its outcome now."""
        for task, h in left_behind(lm, held, self.placed):
            key = task.key
            del self.placed[key]
            if h is not None:
                task.finished_at = h.ended_at
                if h.ok:
                    self.queues.on_finished(task, now)
                    self._ended(task, effects, finished=True, reason="")
                else:
                    self._fail(task, "failed on worker", effects)
                continue
            self.counters.lost_with_lm += 1
            if self.journal is not None:
                self.journal.note(key, now, "lost_with_lm", lm=lm)
            task.lm = None
            task.mark(Phase.QUEUEING, now)
            self.queues.on_returned(task, now)
            self.queues.push_front(task)
            self._persist(task, now, effects)

    def _adopt(self, lm: LmId, held: Sequence[HeldTask], effects: list[Effect]) -> None:
        """What an LM holds for this GM: a task running there that this GM does not know
        (it restarted) is adopted, so its events and outcome come here; a task that ended
        lately, unknown here or known only from its end event, is told to its user now
        (its job may have been acknowledged before this GM restarted: nothing else
        would tell) and remembered, so a redelivered job does not run it again."""
        if not held:
            return
        ledger = self.ledger
        for h in held:
            spec = h.spec
            key = (spec.user, spec.task_id)
            if spec.user not in self.queues:
                continue
            if h.ended_at >= 0:
                if key not in self.live and self.recovery.unknown_end(key, ledger.holds(key)):
                    why = "" if h.ok else "failed on worker"
                    self._ended(recovered_task(h, self.gm_id), effects, finished=h.ok, reason=why)
                continue
            task = self.placed.get(key)
            if task is not None:
                task.attempt = max(task.attempt, h.attempt)
            elif key not in self.live:
                task = self.placed[key] = self.live[key] = recovered_task(h, self.gm_id)
                task.lm = lm
                self.counters.tasks_adopted += 1

    def _on_state_update(self, msg: StateUpdated, now: float) -> list[Effect]:
        effects = self._apply(msg.delta)
        if self.ledger.next_keep_due() <= now:  # held long: their LMs keep their ends
            for jk in self.ledger.keep_ends_due(now):
                effects += self._keep_ends(jk)
        return effects

    # --------------------------------------------------------------- answers
    def _on_launch_response(self, resp: LaunchResponse, now: float) -> list[Effect]:
        """Accepted placements are PLACED; refused ones are inconsistencies: the view
        is refreshed from the response and the decision retried at once."""
        sent = self.outbox.answered(resp.request_id)
        effects: list[Effect] = []
        retry: list[Task] = []
        if sent is not None and sent[0] == resp.lm:
            view = self.views.get(resp.lm)
            # an answer from an incarnation of the LM that has since been replaced: what
            # it accepted, the new one does not hold -- placed again, like a refusal
            stale = view is not None and resp.delta.epoch < view.epoch
            if stale:
                self.counters.stale_updates += 1
            results = resp.results
            for i, key in enumerate(sent[1]):
                res = results[i] if i < len(results) else _MISSING
                fl = self.inflight.get(key)
                if fl is None or fl.request_id != resp.request_id:
                    continue  # an event overtook this answer; the task has moved on
                del self.inflight[key]
                if view is not None:
                    view.release(fl.node, fl.task.demand)
                task = fl.task
                self._round_trip(task, resp.request_sent_at, resp.received_at, resp.sent_at)
                if res.accepted and not stale:
                    self._forget(key)
                    task.lm = resp.lm
                    if res.reason == "rerouted":  # the view was wrong; the LM made it good
                        self._inconsistency(fl.repartition)
                        self.counters.rerouted += 1
                    if self.journal is not None:
                        self.journal.note(key, now, "accepted", lm=resp.lm, node=res.node,
                                          detail=res.reason)  # fmt: skip
                    self._accepted(task, res.reason, res.attempt, now, effects)
                else:
                    task.mark(Phase.PROCESSING, now)
                    self.queues.on_returned(task, now)
                    self._inconsistency(fl.repartition)
                    why = "stale incarnation" if res.accepted else res.reason
                    self._note(task, WaitReason.REFUSED_BY_LM, now, resp.lm, why)
                    retry.append(task)
        effects.extend(self._apply(resp.delta))  # a new epoch if the delta changed the view
        effects.extend(self._retry(retry, now))
        return effects

    def _inconsistency(self, external: bool) -> None:
        if external:
            self.counters.external_inconsistencies += 1
        else:
            self.counters.internal_inconsistencies += 1

    def _accepted(
        self, task: Task, reason: str, attempt: int, now: float, effects: list[Effect]
    ) -> None:
        """An LM took the task.  A duplicate names the attempt it holds (this GM may
        have restarted and lost count); an attempt that already ended is an outcome."""
        task.attempt = max(task.attempt, attempt)
        self._settle(task, effects)
        if reason not in ("finished", "failed"):
            self.placed[task.key] = task
            return
        task.finished_at = now
        if reason == "finished":
            self.queues.on_finished(task, now)
            self._ended(task, effects, finished=True, reason="")
        else:
            self._fail(task, "failed on worker", effects)

    @staticmethod
    def _round_trip(task: Task, request_sent: float, received: float, sent: float) -> None:
        """A request's trip: on the wire, validated at the LM, on the wire back."""
        if request_sent >= 0:
            task.mark(Phase.COMMUNICATION, request_sent)
        task.mark(Phase.PROCESSING, received)
        task.mark(Phase.COMMUNICATION, sent)

    def _on_request_failed(self, msg: RequestFailed, now: float) -> list[Effect]:
        """No answer will come: everything the request asked for is refused."""
        retry: list[Task] = []
        sent = self.outbox.answered(msg.request_id)
        keys = list(sent[1]) if sent is not None and sent[0] == msg.lm else []
        pre = self.outbox.preempt_answered(msg.request_id)
        if pre is not None:
            keys.append(pre)
        effects: list[Effect] = []
        for key in dict.fromkeys(keys):
            fl = self.inflight.get(key)
            if fl is None or fl.request_id != msg.request_id or fl.lm != msg.lm:
                continue
            del self.inflight[key]
            view = self.views.get(fl.lm)
            if view is not None and fl.node >= 0:
                view.release(fl.node, fl.task.demand)
            self._release_victim(key)
            fl.task.mark(Phase.PROCESSING, now)
            self.queues.on_returned(fl.task, now)
            self._note(fl.task, WaitReason.REFUSED_BY_LM, now, msg.lm, msg.reason)
            retry.append(fl.task)
        for task in retry:
            self._requeue(task, now)
        return effects

    def _retry(self, tasks: list[Task], now: float) -> list[Effect]:
        effects: list[Effect] = []
        batches: dict[LmId, list[Placement]] = {}
        for task in tasks:
            n = self._retries.get(task.key, 0) + 1
            if n > self.max_retries:
                self._requeue(task, now)
                continue
            self._retries[task.key] = n
            self._place(task, now, batches, effects)
        return self._end_round(batches, effects, now)

    def _release_victim(self, key: TaskKey) -> None:
        pending = self._preempt_victim.pop(key, None)
        if pending is not None:
            left = self._victim_pending.get(pending[0], 0.0) - pending[1]
            if left > 1e-12:
                self._victim_pending[pending[0]] = left
            else:
                self._victim_pending.pop(pending[0], None)

    def _on_preempt_response(self, resp: PreemptResponse, now: float) -> list[Effect]:
        """Accepted: the task is placed (victims come back to their own GMs).
        Refused: failed verification, try the next victim (Alg. 2)."""
        key = self.outbox.preempt_answered(resp.request_id)
        effects = self._apply(resp.delta)
        fl = self.inflight.get(key) if key is not None else None
        if key is None or fl is None or fl.request_id != resp.request_id:
            return effects  # overtaken: the task has moved on
        del self.inflight[key]
        pending = self._preempt_victim.get(key)
        if pending is not None and not resp.accepted and resp.reason == "no_victim":
            # nothing of that victim there would make room (or pay): ask again later
            self._no_victim[(pending[0], resp.lm)] = now + self.overload.preempt_period_s
        self._release_victim(key)
        task = fl.task
        self._round_trip(task, resp.request_sent_at, resp.received_at, resp.sent_at)
        if self.journal is not None:
            what = "accepted" if resp.accepted else "preempt_refused"
            node = -1 if resp.node is None else resp.node
            self.journal.note(key, now, what, lm=resp.lm, node=node,
                              detail=f"{resp.reason}, {len(resp.preempted)} preempted")  # fmt: skip
        if resp.accepted:
            self.counters.preemptions_granted += len(resp.preempted)
            self._forget(key)
            self._accepted(task, resp.reason, resp.attempt, now, effects)
            return effects
        task.mark(Phase.PROCESSING, now)
        self.queues.on_returned(task, now)
        req = self._preemption(task, now)
        if req is None:
            self._requeue(task, now)
            return effects
        self._send_preemption(task, req, now, effects)
        return effects

    # ------------------------------------------------------------ task events
    def _on_task_events(self, msg: TaskEvents, now: float) -> list[Effect]:
        effects: list[Effect] = []
        view = self.views.get(msg.lm)
        fresh = view is not None and view.epoch == msg.epoch
        for ev in msg.events:
            self._on_task_event(ev, now, effects, fresh)
        return effects

    def _current(self, ev: TaskEvent) -> Task | None:
        """The task an event is about (``Ledger.current``); a request it settled is
        forgotten everywhere."""
        task, fl = self.ledger.current(ev)
        if fl is not None:
            key = fl.task.key
            self._forget(key)
            self._release_victim(key)
            if fl.node < 0:
                self.outbox.preempt_answered(fl.request_id)
            view = self.views.get(fl.lm)
            if view is not None and fl.node >= 0:
                view.release(fl.node, fl.task.demand)
        return task

    def _on_task_event(
        self, ev: TaskEvent, now: float, effects: list[Effect], fresh: bool = True
    ) -> None:
        """Started / finished / failed / preempted / requeued / relaunched, from the LM
        that holds the task (its node's state is taken if it is from the LM's current
        incarnation, ``fresh``)."""
        view = self.views.get(ev.lm)
        if view is None:
            if ev.lm not in self.lms:
                self.counters.stale_events += 1  # not from an LM of this federation
                return
            # before this (restarted) GM's first snapshot of that LM: the node's state
            # comes with the snapshot, the task's end must not be lost meanwhile
        elif not 0 <= ev.node < view.n or len(ev.node_free) != len(self._capacity):
            self.counters.stale_events += 1  # not from that LM as it is
            return
        elif fresh and view.set_node(ev.node, ev.node_free, ev.node_version):
            self.queues.new_epoch()
        kind = ev.kind
        if kind == EventKind.RELAUNCHED:
            task = self.placed.get((ev.user, ev.task_id))
            if task is None or ev.attempt <= task.attempt:
                self.counters.stale_events += 1
                return
            if ev.started_at >= 0:
                task.start(ev.started_at)
            task.mark(Phase.COMMUNICATION, ev.at)
            task.attempt = ev.attempt
            task.lm = ev.lm
            self._journal_event(task, ev)
            return
        task = self._current(ev)
        if task is None:
            self.counters.stale_events += 1
            self._orphan(ev, effects)
            return
        key = task.key
        self._settle(task, effects)
        if ev.worker_at >= 0:
            task.mark(Phase.WORKER_QUEUEING, ev.worker_at)
        if ev.started_at >= 0:
            task.start(ev.started_at)
        self._journal_event(task, ev)
        if kind == EventKind.STARTED:
            return
        del self.placed[key]
        if kind == EventKind.FINISHED or kind == EventKind.FAILED:
            task.finished_at = ev.at
            self.counters.ends_seen += 1
            self.counters.end_lag_s += now - ev.at
            ok = kind == EventKind.FINISHED
            if task.user in self.queues:
                if ok:
                    self.queues.on_finished(task, now)
                    self._ended(task, effects, finished=True, reason="")
                else:
                    why = f"failed on worker: {ev.detail}" if ev.detail else "failed on worker"
                    self._fail(task, why, effects)
            return
        # preempted or requeued: back to the front of its own queue, never lost
        if kind == EventKind.PREEMPTED:
            self.counters.preempted_requeued += 1
        task.mark(Phase.COMMUNICATION, ev.at)
        task.mark(Phase.QUEUEING, now)
        self.queues.on_returned(task, now)
        self.queues.push_front(task)
        self._persist(task, now, effects)

    def _journal_event(self, task: Task, ev: TaskEvent) -> None:
        """An LM's event, in the task's timeline (an end is noted when the task ends)."""
        j = self.journal
        if j is None:
            return
        if ev.started_at >= 0:
            j.started(task.key, ev.started_at, ev.lm, ev.node)
        if ev.kind not in (EventKind.STARTED, EventKind.FINISHED, EventKind.FAILED):
            j.note(task.key, ev.at, ev.kind.name.lower(), lm=ev.lm, node=ev.node, detail=ev.detail)

    # ------------------------------------------------------------ read-only
    def awaits(self, request_id: int) -> bool:
        """Whether a task still waits in flight for the answer to request
        ``request_id`` (an event, or the LM's new incarnation, may have settled it)."""
        keys = self.outbox.asked(request_id)
        return any(
            (fl := self.inflight.get(k)) is not None and fl.request_id == request_id for k in keys
        )

    def tasks_of(self, keys: Iterable[TaskKey]) -> list[Task]:
        """The tasks this GM holds for ``keys`` (queued, in flight or placed)."""
        return self.ledger.tasks_of(keys)
