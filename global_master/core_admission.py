"""The GM core's handlers of submissions: a job admitted whole (in slices if large)
or refused with the reason, a redelivered job's tasks sorted by recovery, returned
tasks resumed.

Part of the core (``global_master.core.GlobalMaster`` inherits ``AdmissionSteps``):
like ``core.py`` it sequences the pieces -- ``admission`` decides, ``recovery`` sorts,
the ``ledger`` and the queues take the tasks -- and no piece imports it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from common.effects import After, Effect, JobRefused, JobSettled
from common.messages import AdmitJob, AdmitMore, SubmitJob
from common.model import Task
from common.reasons import JobReason, TaskFailure
from global_master.admission import Admission, Cluster, Refusal, dag_of
from global_master.recovery import Redelivered

if TYPE_CHECKING:
    from common.ids import GmId
    from common.metrics import GmCounters
    from common.model import TaskKey
    from global_master.admission import Admissions, JobKey
    from global_master.ledger import InFlightTable, JobRecord, Ledger, LiveTable
    from global_master.lifecycle import JobBook
    from global_master.queues import UserQueues
    from global_master.recovery import Recovery
    from global_master.view import Views


class AdmissionSteps:
    """Submissions into the user queues (a mixin of ``GlobalMaster``)."""

    if TYPE_CHECKING:  # what these steps use of the core (``GlobalMaster`` has them)
        gm_id: GmId
        book: JobBook | None
        counters: GmCounters
        admission: Admissions
        admitting: dict[JobKey, Admission]
        ledger: Ledger
        jobs: dict[JobKey, JobRecord]
        live: LiveTable
        placed: dict[TaskKey, Task]
        inflight: InFlightTable
        lm_views: Views
        queues: UserQueues
        recovery: Recovery

        @property
        def ready(self) -> bool: ...
        def knows(self, key: TaskKey) -> bool: ...
        def _settle(self, task: Task, effects: list[Effect]) -> None: ...
        def _end(
            self,
            task: Task,
            ok: bool,
            why: str,
            now: float,
            effects: list[Effect],
            tell: bool = True,
        ) -> None: ...
        def _fail(
            self, task: Task, reason: str, effects: list[Effect], *, tell: bool = True
        ) -> None: ...

    def _admit_job(self, msg: AdmitJob, came: float, now: float) -> list[Effect]:
        """A submission that came at ``came`` (its tasks' queueing starts then): admitted
        into its user's queue, or refused with the reason before any task is queued."""
        job, admission = msg.job, self.admission
        jk = (job.user, job.job_id)
        if admission.hold(msg, came):  # behind its user's job still being admitted
            return []
        if job.resumes is not None:
            return self._on_resume(job, now)
        record = self.jobs.get(jk)
        if (
            record is not None or self.ledger.is_recent(jk) or jk in self.admitting
            or self._in_history(jk, msg.redelivered)
        ):  # fmt: skip
            if msg.redelivered:  # the same job again (its ack was lost): nothing to run twice
                if jk in self.admitting:
                    return []  # settled once admitted and placed
                settled = record is None or record.settled
                return [JobSettled(job.job_id, job.user)] if settled else []
            dup = Refusal(JobReason.DUPLICATE_JOB_ID, f"job {job.job_id!r} already submitted")
            return [self._refuse(job, dup)]
        held = self.live.per_user.get(job.user, 0)
        why = admission.job_error(job, has_queue=job.user in self.queues, ready=self.ready,
                                  redelivered=msg.redelivered, held=held)  # fmt: skip
        if why is not None:
            return [self._refuse(job, why)]
        adm = Admission(job, msg.redelivered, came)
        n = len(job.tasks)
        if n > admission.slice:
            admission.begin(adm)
            return self._admit_step(adm, now)
        why = admission.check(adm, n, self.live, self._cluster())  # in one step
        return [self._refuse(job, why)] if why is not None else self._queue_tasks(adm, n, now)

    def _in_history(self, jk: JobKey, redelivered: bool) -> bool:
        """The job book (read back from the journal after a restart, when the ledger's
        recent jobs are gone) holds ``jk`` as admitted before: a submission again is a
        duplicate, a redelivery of an ended job has nothing left to run.  A redelivery
        of a job it holds open is the job (some of its tasks may never have run); a job
        it holds only as refused may come again."""
        rec = self.book.admitted(*jk) if self.book is not None else None
        return rec is not None and (rec.ended or not redelivered)

    def task_refusal(self, job: SubmitJob) -> Refusal | None:
        """Why admission would refuse ``job`` for its user's task limit as things stand,
        or one of its tasks for its demand, command or duration, checked as
        ``_admit_job`` checks them (None: it would not, or this GM has no view of every
        LM yet).  Reads only: a front door says so before it sends the job on."""
        held = self.live.per_user.get(job.user, 0)
        over = self.admission.over_limit(job, False, held)
        if over is not None or not self.ready:
            return over
        cluster = self._cluster()
        for spec in job.tasks:
            why = self.admission.spec_error(spec, cluster)
            if why is not None:
                return why
        return None

    def _cluster(self) -> Cluster:
        return Cluster(len(self.lm_views.capacity), self.lm_views.node_caps)

    def _refuse(self, job: SubmitJob, why: Refusal) -> JobRefused:
        self.counters.jobs_refused += 1
        sub = job.submitted_at
        return JobRefused(job.job_id, job.user, why.reason, why.detail, submitted_at=sub)

    def _on_admit_more(self, msg: AdmitMore, now: float) -> list[Effect]:
        adm = self.admitting.get((msg.user, msg.job_id))
        return [] if adm is None else self._admit_step(adm, now)

    def _admit_step(self, adm: Admission, now: float) -> list[Effect]:
        """One slice of a large job (``Admissions.step``), then the next is due."""
        job = adm.job
        end = self.admission.step(adm, self.live, self._cluster())
        if isinstance(end, Refusal):
            return [self._refuse(job, end), *self._admitted(adm, now)]
        effects = [] if end is None else self._queue_tasks(adm, end, now)
        if end is not None and adm.queued < end:  # refused: a DAG whose stages do not fit
            return [*effects, *self._admitted(adm, now)]
        if adm.queued < len(job.tasks):
            effects.append(After(0.0, AdmitMore(user=job.user, job_id=job.job_id)))
        else:
            effects += self._admitted(adm, now)
        return effects

    def _admitted(self, adm: Admission, now: float) -> list[Effect]:
        """``adm`` is queued or refused: its user's jobs that came meanwhile are
        admitted now, in order, until one is large enough to need slices again."""
        held = self.admission.done(adm)
        effects: list[Effect] = []
        while held:
            effects += self._admit_job(*held.popleft(), now)
            if self.admission.follow(adm.job.user, held):  # sliced again: the rest follow
                break
        return effects

    def _queue_tasks(self, adm: Admission, end: int, now: float) -> list[Effect]:
        """Queue ``adm``'s tasks up to ``end`` (all checked); the job's record, with every
        task, is made with the first of them."""
        job = adm.job
        tasks = adm.tasks_upto(end, self.gm_id)
        dag_job = job.stages is not None
        found = self._redelivered(tasks, dag_job) if adm.redelivered else Redelivered(tasks)
        dag = dag_of(adm, tasks) if dag_job else None
        if isinstance(dag, Refusal):
            return [self._refuse(job, dag)]
        if adm.queued == 0:
            self.ledger.open_job((job.user, job.job_id), adm.keys(), now, adm.redelivered)
            if self.book is not None:
                self.book.opened(job, now)
            self.counters.jobs_admitted += 1
        adm.queued_upto(end, tasks)
        live = self.live
        for t in tasks:
            live[t.key] = t
        if dag is not None:
            # what runs, is on its way to an LM or ended is never released again
            out = [t.task_id for t in (*found.adopted, *found.sent)]
            self.queues.add_job(dag, adm.at, out + [t.task_id for t, _ in found.ended])
            for t in found.sent:
                self.queues.on_dispatched(t, now)
        else:
            skip = {t.key for t in found.adopted} | {t.key for t, _ in found.ended} | found.kept
            push = self.queues.push_back
            for t in tasks:
                if not skip or t.key not in skip:
                    push(t)
        return self._resume(found, dag is not None, now)

    def _redelivered(self, tasks: list[Task], dag: bool) -> Redelivered:
        """A job that came back after a restart: its tasks as recovery finds them
        (``Recovery.sort_redelivered``), those running placed in the ledger."""
        found = self.recovery.sort_redelivered(tasks, dag, self.live, self.placed, self.inflight)
        for t in found.unqueue:
            self.queues.remove(t)
        for t in found.found_running:
            self.ledger.adopt(t)
            self.counters.tasks_adopted += 1
        return found

    def _resume(self, found: Redelivered, dag: bool, now: float) -> list[Effect]:
        """A redelivered job's tasks that ran on since a restart (adopted) or ended: none
        runs twice; a DAG goes on from the stages they released."""
        effects: list[Effect] = []
        for t in found.adopted:
            self.counters.redelivered_skipped += 1
            if dag:
                self.queues.on_dispatched(t, now)
            self._settle(t, effects)
        for t, known in found.ended:
            self.counters.redelivered_skipped += 1
            self._settle(t, effects)
            self._end(t, known.held.ok, TaskFailure.ON_WORKER, now, effects, not known.reported)
        return effects

    def _on_resume(self, job: SubmitJob, now: float) -> list[Effect]:
        """Tasks this GM (or a predecessor) persisted when they came back to its queue.
        Those it still holds are bound to the message, acknowledged once they are
        placed again; those it does not (it restarted) are queued again."""
        if job.user not in self.queues:
            unknown = Refusal(JobReason.UNKNOWN_USER, f"{job.user!r} has no queue here")
            return [replace(self._refuse(job, unknown), resume=True)]
        if self.recovery.resuming((job.user, job.job_id)):  # the same message again
            return []  # its delivery is rebound
        keys = [(spec.user, spec.task_id) for spec in job.tasks]
        known = {k for k in keys if self.knows(k)}
        width = len(self.lm_views.capacity)
        plan = self.recovery.resume(job, now, self.placed, self.live, known, width)
        effects: list[Effect] = []
        for task, why in plan.failed:
            self._fail(task, why, effects)
        for task in plan.queued:
            self.live[task.key] = task
            self.queues.push_front(task)
        if not plan.waiting:
            return [*effects, JobSettled(job.job_id, job.user, resume=True)]
        return effects
