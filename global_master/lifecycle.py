"""The jobs a GM's users can see: each job's and each task's lifecycle (the front door).

Theory of operation:

* The GM is the authority for its users' jobs; this book is what it tells them.  It is
  fed by the core's entry (``observe``: the message handled and the effects it made)
  and sends nothing: a job is opened when its submission is admitted, refused when
  the core refuses it, and each task ends when the core tells its user so (a
  ``TaskOutcome``).  While a task lives, where it is comes from the ledger.
* States, as users of Slurm, Nomad and Ray Jobs know them: a task is ``queued``
  (waiting in its user's queue, or on its way to an LM), ``running`` (accepted by an
  LM), then ``finished``, ``failed`` or ``cancelled``; a job is ``queued`` until one
  of its tasks runs, ``running`` until every task ended, then ``finished`` (every
  task finished), ``cancelled`` (cancelled by its user, not all finished) or
  ``failed``.  A refused job is ``failed`` with the refusal's reason.
* Bounded: each user's ended jobs are kept ``keep_s`` after their end and at most
  ``per_user`` of them (the oldest go first); a task keeps the last ``OUTPUT_BYTES``
  of its stdout and stderr (commands on), its attempts and its exit code.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common.effects import Effect, JobRefused, ToUser
from common.ids import JobId, TaskId, UserId
from common.messages import (
    OUTPUT_BYTES,
    CancelJob,
    EventKind,
    SubmitJob,
    TaskEvents,
    TaskOutcome,
)
from common.model import TaskState
from global_master.ledger import Ledger

__all__ = ["OUTPUT_BYTES", "JobBook", "JobStatus", "TaskStatus"]

CANCELLED = "cancelled"


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


ENDED = frozenset({TaskStatus.FINISHED, TaskStatus.FAILED, TaskStatus.CANCELLED})
_LIVE = {
    TaskState.QUEUED: TaskStatus.QUEUED,
    TaskState.DISPATCHED: TaskStatus.QUEUED,
    TaskState.PLACED: TaskStatus.RUNNING,
}


@dataclass(slots=True)
class TaskRecord:
    """One task as its user sees it."""

    task_id: TaskId
    stage: int = 0
    state: TaskStatus | None = None
    """Set once it ended (while it lives, the ledger says where it is)."""
    attempts: int = 0
    lm: str = ""
    reason: str = ""
    exit_code: int | None = None
    started_at: float = -1.0
    ended_at: float = -1.0
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass(slots=True)
class JobRecord:
    """One job of a user: its tasks in submission order, and its timeline."""

    user: UserId
    job_id: JobId
    submitted_at: float
    tasks: dict[TaskId, TaskRecord]
    left: int
    timeline: list[tuple[float, str]] = field(default_factory=list)
    cancelled_at: float = -1.0
    ended_at: float = -1.0
    refused: str = ""

    @property
    def ended(self) -> bool:
        return self.ended_at >= 0


class JobBook:
    """Every job of this GM's users that is live, or ended within ``keep_s``."""

    def __init__(self, *, per_user: int = 1000, keep_s: float = 3600.0) -> None:
        if per_user < 1 or keep_s < 0:
            raise ValueError(f"per_user >= 1 and keep_s >= 0, got {per_user}, {keep_s}")
        self.per_user = per_user
        self.keep_s = keep_s
        self.jobs: dict[tuple[UserId, JobId], JobRecord] = {}
        self.ended: dict[UserId, OrderedDict[JobId, float]] = {}
        """Per user, its ended jobs by when they ended (oldest first)."""
        self.job_of: dict[tuple[UserId, TaskId], JobId] = {}

    # ------------------------------------------------------------- feeding
    def observe(self, msg: object, effects: Iterable[Effect], now: float, ledger: Ledger) -> None:
        """What the core just did with ``msg`` (its ``effects``), at ``now``."""
        kind = type(msg)
        if kind is TaskEvents:
            self._events(msg, now)  # type: ignore[arg-type]
        elif kind is CancelJob:
            rec = self.jobs.get((msg.user, msg.job_id))  # type: ignore[attr-defined]
            if rec is not None and rec.cancelled_at < 0 and not rec.ended:
                rec.cancelled_at = now
                rec.timeline.append((now, "cancel requested"))
        for e in effects:
            if isinstance(e, ToUser):
                if isinstance(e.msg, TaskOutcome):
                    self._outcome(e.msg, now)
            elif isinstance(e, JobRefused):
                self._refused(e, now)
        self.expire(now)

    def opened(self, job: SubmitJob, now: float) -> None:
        """The core admitted ``job`` (its record is made with its first tasks queued)."""
        jk = (job.user, job.job_id)
        if job.resumes is not None or jk in self.jobs:
            return  # returned tasks, or a redelivery
        stage_of = _stages(job.stages, len(job.tasks))
        tasks = {s.task_id: TaskRecord(s.task_id, stage_of[i]) for i, s in enumerate(job.tasks)}
        self.jobs[jk] = JobRecord(job.user, job.job_id, now, tasks, len(tasks))
        self.jobs[jk].timeline.append((now, "submitted"))
        for s in job.tasks:
            self.job_of[(job.user, s.task_id)] = job.job_id

    def _refused(self, e: JobRefused, now: float) -> None:
        jk = (e.user, e.job_id)
        if e.resume or e.reason == "duplicate_job_id":
            return
        rec = self.jobs.get(jk)
        if rec is None:
            rec = self.jobs[jk] = JobRecord(e.user, e.job_id, now, {}, 0)
        rec.refused = f"{e.reason}: {e.detail}" if e.detail else e.reason
        rec.timeline.append((now, f"refused: {rec.refused}"))
        for t in rec.tasks.values():
            if t.state is None:
                t.state, t.reason = TaskStatus.FAILED, "job refused"
        self._end(rec, now)

    def _events(self, msg: TaskEvents, now: float) -> None:
        for ev in msg.events:
            jid = self.job_of.get((ev.user, ev.task_id))
            rec = self.jobs.get((ev.user, jid)) if jid is not None else None
            t = rec.tasks.get(ev.task_id) if rec is not None else None
            if t is None or t.state is not None:
                continue
            t.lm = ev.lm
            if ev.started_at >= 0 and t.started_at < 0:
                t.started_at = ev.started_at
            if ev.kind in (EventKind.FINISHED, EventKind.FAILED):
                t.exit_code = ev.exit_code
                t.stdout, t.stderr = ev.stdout[-OUTPUT_BYTES:], ev.stderr[-OUTPUT_BYTES:]

    def _outcome(self, out: TaskOutcome, now: float) -> None:
        task = out.task
        rec = self.jobs.get((task.user, task.job_id))
        t = rec.tasks.get(task.task_id) if rec is not None else None
        if rec is None or t is None or t.state is not None:
            return
        if out.finished:
            t.state = TaskStatus.FINISHED
            if t.exit_code is None and task.spec.command:
                t.exit_code = 0
        else:
            t.state = TaskStatus.CANCELLED if out.reason == CANCELLED else TaskStatus.FAILED
        t.reason = out.reason
        t.attempts = task.attempt
        t.lm = task.lm or t.lm
        if task.first_started_at >= 0:
            t.started_at = task.first_started_at
        t.ended_at = task.finished_at if task.finished_at >= 0 else now
        rec.left -= 1
        if rec.left <= 0:
            self._end(rec, now)

    def _end(self, rec: JobRecord, now: float) -> None:
        rec.ended_at = now
        rec.timeline.append((now, str(self.status(rec))))
        per = self.ended.setdefault(rec.user, OrderedDict())
        per[rec.job_id] = now
        while len(per) > self.per_user:
            self._drop(rec.user, per.popitem(last=False)[0])

    def expire(self, now: float) -> None:
        """Ended jobs past ``keep_s`` go."""
        for user, per in self.ended.items():
            while per and next(iter(per.values())) + self.keep_s < now:
                self._drop(user, per.popitem(last=False)[0])

    def _drop(self, user: UserId, job_id: JobId) -> None:
        rec = self.jobs.pop((user, job_id), None)
        if rec is not None:
            for tid in rec.tasks:
                self.job_of.pop((user, tid), None)

    # ------------------------------------------------------------- reading
    def task_status(self, rec: JobRecord, t: TaskRecord, ledger: Ledger) -> TaskStatus:
        if t.state is not None:
            return t.state
        where = ledger.state_of((rec.user, t.task_id))
        return _LIVE.get(where, TaskStatus.QUEUED) if where is not None else TaskStatus.QUEUED

    def status(self, rec: JobRecord, ledger: Ledger | None = None) -> JobStatus:
        """A job's state, from its tasks'."""
        if rec.refused:
            return JobStatus.FAILED
        if not rec.ended:
            if ledger is None:
                return JobStatus.RUNNING
            states = {self.task_status(rec, t, ledger) for t in rec.tasks.values()}
            return JobStatus.RUNNING if states - {TaskStatus.QUEUED} else JobStatus.QUEUED
        states = {t.state for t in rec.tasks.values() if t.state is not None}
        if states <= {TaskStatus.FINISHED}:
            return JobStatus.FINISHED
        if TaskStatus.CANCELLED in states or rec.cancelled_at >= 0:
            return JobStatus.CANCELLED
        return JobStatus.FAILED

    def get(self, user: UserId, job_id: JobId) -> JobRecord | None:
        return self.jobs.get((user, job_id))

    def of_user(self, user: UserId) -> list[JobRecord]:
        """A user's jobs, oldest first."""
        return sorted(
            (r for (u, _), r in self.jobs.items() if u == user), key=lambda r: r.submitted_at
        )

    def task(self, user: UserId, task_id: TaskId) -> tuple[JobRecord, TaskRecord] | None:
        jid = self.job_of.get((user, task_id))
        rec = self.jobs.get((user, jid)) if jid is not None else None
        if rec is None:
            return None
        return rec, rec.tasks[task_id]

    def summary(self, rec: JobRecord, ledger: Ledger) -> dict[str, Any]:
        """A job as its user reads it (``megha jobs``)."""
        counts: dict[str, int] = {}
        for t in rec.tasks.values():
            s = str(self.task_status(rec, t, ledger))
            counts[s] = counts.get(s, 0) + 1
        return {
            "job_id": rec.job_id, "user": rec.user, "state": str(self.status(rec, ledger)),
            "tasks": len(rec.tasks), "tasks_by_state": counts,
            "submitted_at": rec.submitted_at,
            "ended_at": rec.ended_at if rec.ended else None,
            "reason": rec.refused,
        }  # fmt: skip

    def detail(self, rec: JobRecord, ledger: Ledger) -> dict[str, Any]:
        """A job with its tasks and timeline (``megha job``)."""
        out = self.summary(rec, ledger)
        out["timeline"] = [{"at": at, "what": what} for at, what in rec.timeline]
        out["task_list"] = [self.task_detail(rec, t, ledger) for t in rec.tasks.values()]
        return out

    def task_detail(self, rec: JobRecord, t: TaskRecord, ledger: Ledger) -> dict[str, Any]:
        live = ledger.live.get((rec.user, t.task_id))
        attempts = live.attempt if live is not None else t.attempts
        return {
            "task_id": t.task_id, "job_id": rec.job_id, "stage": t.stage,
            "state": str(self.task_status(rec, t, ledger)), "attempts": attempts,
            "lm": (live.lm if live is not None and live.lm else t.lm) or None,
            "exit_code": t.exit_code, "reason": t.reason,
            "started_at": t.started_at if t.started_at >= 0 else None,
            "ended_at": t.ended_at if t.ended_at >= 0 else None,
            "stdout_bytes": len(t.stdout), "stderr_bytes": len(t.stderr),
        }  # fmt: skip


def _stages(stages: Iterable[Any] | None, n: int) -> list[int]:
    """The stage id of each task of a job (0 for a flat job)."""
    if stages is None:
        return [0] * n
    out: list[int] = []
    for st in stages:
        out += [int(st.stage_id)] * st.count
    return out + [0] * (n - len(out))
