"""Recovery after a restart: what a GM learns of tasks it does not hold (paper §IV-A:
a GM is stateless; everything it knows is rebuilt from its LMs and the durable queues).

Invariants:

* A GM that restarted holds nothing of its users' tasks until their jobs come back
  from the broker.  Meanwhile its LMs tell it what they hold for it (the ``held``
  tasks of a snapshot: adopted, see ``GlobalMaster._adopt``) and what lately ended,
  and their events arrive about tasks it does not know (``orphans``).  All of it is
  kept here, bounded (``limit``), until the job comes back: a redelivered job runs
  none of its tasks twice (``sort_redelivered``).
* ``known_done``: tasks known to have ended that the GM holds no job record for (it
  restarted, or their job was acknowledged before), with whether their user was told
  (``reported``) and whether the task's spec is known or only its end event's word.
* A task returned to its queue after its job's delivery was acknowledged is kept on
  the broker as a one-task job (``resume_job``, ``resume_id``); when that message comes
  back, the tasks it names that the GM still holds are bound to it (``resumes``) and
  it is acknowledged once they are placed again.
* What may be stale: an orphan event may be overtaken by a newer attempt (the
  redelivered job's task takes the newest attempt it has heard of); a remembered end
  may be of an attempt the LM since relaunched (the LM's snapshot decides).

Who changes what: this piece holds only its own tables and returns values (tasks to
end, tasks found running, a job to persist); the core applies them to the ledger.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field

from msgspec import structs

from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.messages import EventKind, HeldTask, SubmitJob, TaskEvent
from common.model import Phase, Task, TaskKey, TaskSpec, new_task
from common.reasons import TaskFailure
from common.schema import MAX_ID_LEN

ResumeKey = tuple[UserId, JobId]
"""A persisted return's one-task job (its user, ``resume_id``)."""


@dataclass(slots=True)
class Ended:
    """A task known to have ended that this GM holds no job record for (it restarted,
    or its job was acknowledged before): what is known, and whether its user was told."""

    held: HeldTask
    spec_known: bool
    reported: bool


@dataclass(slots=True)
class Ending:
    """A task whose end its user is to be told now (``GlobalMaster._ended``)."""

    task: Task
    finished: bool
    reason: str


@dataclass(slots=True)
class Resumed:
    """What a persisted return's message (``resume_job``) names, after ``resume``."""

    waiting: set[TaskKey] = field(default_factory=set)
    """Tasks held here (or queued again now) that it is bound to."""
    queued: list[Task] = field(default_factory=list)
    """Tasks lost with a predecessor of this GM: to the front of their queues."""
    failed: list[tuple[Task, str]] = field(default_factory=list)
    """Tasks that cannot run as they were (the federation changed meanwhile)."""


@dataclass(slots=True)
class Redelivered:
    """A redelivered job's tasks, sorted by where they are after a restart."""

    tasks: list[Task]
    """The job's tasks in its order: the one held here, running or ended where known."""
    kept: set[TaskKey] = field(default_factory=set)
    """Held here already (queued again from their own persisted message, or in flight)."""
    sent: list[Task] = field(default_factory=list)
    """In flight to an LM."""
    unqueue: list[Task] = field(default_factory=list)
    """A DAG's tasks queued already: out of their queue (the DAG queues them in turn)."""
    adopted: list[Task] = field(default_factory=list)
    """Running on an LM (placed here, or found running from an orphan event)."""
    found_running: list[Task] = field(default_factory=list)
    """Those of ``adopted`` an orphan event says run: to be placed in the ledger."""
    ended: list[tuple[Task, Ended]] = field(default_factory=list)


class Recovery:
    """What this GM learned of tasks it holds no record of, bounded."""

    def __init__(self, gm: GmId, *, limit: int) -> None:
        self.gm = gm
        self.limit = limit
        """At most this many orphan events and remembered ends."""
        self.known_done: dict[TaskKey, Ended] = {}
        self.orphans: dict[TaskKey, TaskEvent] = {}
        """Tasks that run (or ran) on an LM, unknown to this GM (it restarted): a
        redelivered job takes them as they are instead of running them twice."""
        self.resumes: dict[ResumeKey, set[TaskKey]] = {}
        """Persisted returns (see ``resume_job``) still waiting to be placed again."""
        self.resume_of: dict[TaskKey, ResumeKey] = {}
        """The persisted return each task is bound to (read-only outside)."""

    # ------------------------------------------------------------- ends
    def remember_done(self, task: Task, ok: bool) -> None:
        """``task`` ended without a job record here: remembered (its user was told)."""
        held = HeldTask(
            spec=task.spec,
            attempt=task.attempt,
            queued_at=task.submitted_at,
            started_at=task.started_at,
            ended_at=task.finished_at,
            ok=ok,
        )
        self.known_done[task.key] = Ended(held, spec_known=True, reported=True)
        while len(self.known_done) > self.limit:
            del self.known_done[next(iter(self.known_done))]

    def unknown_end(self, key: TaskKey, held: bool) -> bool:
        """An LM says task ``key`` ended lately; ``held``: the ledger has it (in flight,
        placed, or ended in a job recorded here).  True: unknown here, or known only
        from its end event -- its user is to be told now (and it is forgotten here)."""
        known = self.known_done.get(key)
        unknown = not (held or known is not None) or (known is not None and not known.spec_known)
        if unknown:
            self.known_done.pop(key, None)
        return unknown

    # ------------------------------------------------------------- orphans
    def orphan(self, ev: TaskEvent, job_ended_here: bool) -> Ending | None:
        """An event about a task of this GM's users that it does not hold (it restarted,
        and the task's job has not come back yet): kept, bounded, for that job.  An
        end: the task's ending if its user is to be told now (``job_ended_here``: the
        event names a job that ended here, whose tasks were all told already)."""
        key = (ev.user, ev.task_id)
        ending = None
        if ev.kind not in (EventKind.FINISHED, EventKind.FAILED):
            self.orphans[key] = ev
        else:
            self.orphans.pop(key, None)
            if not job_ended_here:
                ending = self._orphan_ended(key, ev)
        while len(self.orphans) > self.limit:
            del self.orphans[next(iter(self.orphans))]
        return ending

    def given_back(self, ev: TaskEvent, gm: GmId) -> Task | None:
        """A task its LM gave back (requeued, preempted: the event names it whole) that
        this GM holds no record of: the task to queue again, as the attempt it was.  Its
        job may have been acknowledged before this GM restarted, so nothing else would
        place it; if the job comes back, it finds the task queued (``sort_redelivered``)."""
        if ev.spec is None or ev.kind not in (EventKind.REQUEUED, EventKind.PREEMPTED):
            return None
        self.orphans.pop((ev.user, ev.task_id), None)
        queued = ev.queued_at if ev.queued_at >= 0 else ev.at
        held = HeldTask(spec=ev.spec, attempt=ev.attempt, queued_at=queued)
        return recovered_task(held, gm)

    def _orphan_ended(self, key: TaskKey, ev: TaskEvent) -> Ending | None:
        """A task ended that this GM holds no record of.  If its LM said whose job it is
        (the event, or a snapshot), its user is told now (its job may have been
        acknowledged already: nothing else would tell); otherwise a redelivered job, or
        the LM's snapshot, will."""
        ok = ev.kind == EventKind.FINISHED
        known = self.known_done.get(key)
        if known is not None and known.reported:
            return None
        if known is None or not known.spec_known:
            spec = TaskSpec(task_id=ev.task_id, job_id=ev.job_id or JobId("unknown"),
                            user=ev.user, demand=(0,), duration=0.0)  # fmt: skip
            held = HeldTask(spec=spec, attempt=ev.attempt, queued_at=ev.queued_at,
                            worker_at=ev.worker_at, started_at=ev.started_at, ended_at=ev.at,
                            ok=ok)  # fmt: skip
            if ev.job_id is None:  # a pool's word: its LM (a snapshot) will say whose job
                self.known_done[key] = Ended(held, spec_known=False, reported=False)
                return None
            # its LM knew its job: the user is told now (that job may have been
            # acknowledged before this GM restarted, and nothing else would tell)
            known = Ended(held, spec_known=True, reported=False)
        task = recovered_task(
            structs.replace(known.held, worker_at=ev.worker_at, started_at=ev.started_at, ended_at=ev.at,
                    ok=ok),
            self.gm,
        )  # fmt: skip
        why = "" if ok else TaskFailure.on_worker(ev.detail)
        return Ending(task, ok, why)

    def running_orphan(self, task: Task) -> bool:
        """A redelivered task an orphan event says runs (or ran and came back): its
        attempt, times and LM are taken from the event; True if it runs."""
        ev = self.orphans.pop(task.key, None)
        if ev is None:
            return False
        task.attempt = max(task.attempt, ev.attempt)
        if ev.kind in (EventKind.STARTED, EventKind.RELAUNCHED):
            if ev.worker_at >= 0:
                task.mark(Phase.WORKER_QUEUEING, ev.worker_at)
            if ev.started_at >= 0:
                task.start(ev.started_at)
            task.lm = ev.lm
            return True
        return False  # preempted or requeued: it waits in the queue like the others

    def sort_redelivered(
        self,
        tasks: list[Task],
        dag: bool,
        live: Mapping[TaskKey, Task],
        placed: Mapping[TaskKey, Task],
        inflight: Mapping[TaskKey, object],
    ) -> Redelivered:
        """A job that came back after a restart: which of its ``tasks`` run, on their
        way to an LM, ended, or are queued here already (none runs twice)."""
        out = Redelivered(tasks)
        for i, t in enumerate(tasks):
            key = t.key
            held = live.get(key)
            if held is not None and key not in placed:
                tasks[i] = held  # persisted and queued again already: keep that one
                if key in inflight:
                    out.sent.append(held)
                elif dag:  # queued by its DAG, in its turn
                    out.unqueue.append(held)
                    continue
                out.kept.add(key)
                continue
            running = held
            if running is None and self.running_orphan(t):
                running = t
                out.found_running.append(t)
            if running is not None:
                tasks[i] = running
                out.adopted.append(running)
                continue
            known = self.known_done.pop(key, None)
            if known is not None:  # (the spec it was remembered with may be partial)
                tasks[i] = recovered_task(structs.replace(known.held, spec=t.spec), self.gm)
                out.ended.append((tasks[i], known))
        return out

    # ------------------------------------------------------------- resumes
    def resuming(self, rk: ResumeKey) -> bool:
        """The persisted return ``rk`` is bound already (its message came again)."""
        return rk in self.resumes

    def resume(
        self,
        job: SubmitJob,
        now: float,
        placed: Container[TaskKey],
        live: Container[TaskKey],
        known: Container[TaskKey],
        width: int,
    ) -> Resumed:
        """A persisted return's message came (``job``; not bound yet: ``resuming``).
        The tasks it names that this GM holds (``live``, not ``placed``) are bound to
        it; those it does not hold nor ``known`` to have ended (a predecessor of this
        GM had them) are made again, as the newer attempt it names."""
        rk = (job.user, job.job_id)
        out = Resumed()
        seen: set[TaskKey] = set()
        for spec in job.tasks:
            key = (spec.user, spec.task_id)
            if key in seen or key in placed or spec.user != job.user:
                continue
            seen.add(key)
            if key not in live:
                if key in known:
                    continue
                task = new_task(spec, now, gm=self.gm)  # lost with a predecessor: queue it
                if width and len(spec.demand) != width:  # the federation changed meanwhile
                    why = (
                        f"wrong_resources: {len(spec.demand)} resource amounts, "
                        f"the federation has {width}"
                    )
                    out.failed.append((task, why))
                    continue
                task.attempt = job.attempt  # placed again as a newer attempt than it ran as
                out.queued.append(task)
            out.waiting.add(key)  # acknowledged once placed
            self.resume_of[key] = rk
        if out.waiting:
            self.resumes[rk] = out.waiting
        return out

    def settle(self, key: TaskKey) -> ResumeKey | None:
        """Task ``key`` was accepted by an LM or failed: the persisted return it was bound
        to, if that was its last task (it may be acknowledged now)."""
        rk = self.resume_of.pop(key, None)
        if rk is None:
            return None
        waiting = self.resumes.get(rk)
        if waiting is None:
            return None
        waiting.discard(key)
        if waiting:
            return None
        del self.resumes[rk]
        return rk


def left_behind(
    lm: LmId, held: Sequence[HeldTask], placed: Mapping[TaskKey, Task]
) -> list[tuple[Task, HeldTask | None]]:
    """A new incarnation of ``lm`` (restarted, or its standby took over) holds what its
    workers told it (``held``).  The tasks placed there that it does not run: with how
    they ended, or None when they were lost with the old incarnation (accepted, never
    started) and go back to the front of their queue as a new attempt."""
    by_key = {(h.spec.user, h.spec.task_id): h for h in held}
    out: list[tuple[Task, HeldTask | None]] = []
    for key, task in placed.items():
        if task.lm != lm:
            continue
        h = by_key.get(key)
        if h is not None and h.attempt >= task.attempt:
            if h.ended_at >= 0:
                out.append((task, h))
            continue  # else it runs there
        out.append((task, None))
    return out


def resume_job(task: Task, now: float) -> SubmitJob:
    """The one-task job that keeps ``task``, back in its queue after its job's delivery
    was acknowledged, on the broker (``Persist``)."""
    return SubmitJob(
        job_id=resume_id(task.task_id, task.attempt),
        user=task.user,
        token="",
        submitted_at=now,
        tasks=(task.spec,),
        resumes=task.job_id,
        attempt=task.attempt,
    )


def resume_id(task_id: TaskId, attempt: int) -> JobId:
    """The id of the one-task job that keeps a returned task on the broker: one per
    task and attempt (task ids are a user's own: two tasks of a job returned at once
    each get theirs), a valid id (as the codec checks) whatever the task id's length.
    It may equal a user's own job id: GMs tell the two apart by ``resumes``."""
    suffix = f"+r{attempt}"
    name = str(task_id)
    if len(name) + len(suffix) > MAX_ID_LEN:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = f"{name[: MAX_ID_LEN - len(suffix) - 17]}.{digest}"
    return JobId(f"{name}{suffix}")


def recovered_task(h: HeldTask, gm: GmId) -> Task:
    """A task rebuilt from what its LM knew (its GM restarted): the ledger keeps the
    LM's times; the GM-side split before the LM accepted it is lost (queueing)."""
    queued = h.queued_at if h.queued_at >= 0 else h.accepted_at
    task = new_task(h.spec, queued, gm=gm)
    task.attempt = h.attempt
    if h.accepted_at >= 0:
        task.mark(Phase.COMMUNICATION, h.accepted_at)
    if h.worker_at >= 0:
        task.mark(Phase.WORKER_QUEUEING, h.worker_at)
    if h.started_at >= 0:
        task.start(h.started_at)
    if h.ended_at >= 0:
        task.finished_at = h.ended_at
    return task
