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
* Durable when its GM keeps a journal (``global_master.history``): each change is a
  history record (``Opened``, ``Noted``, ``TaskEnded``, ``JobEnded``) taken by the core
  as a ``Record`` effect; ``replay`` rebuilds the book from them after a restart
  (through the same steps as the live changes, so the same book), ``records`` is the
  book as records again (the journal's compaction).  Times are the core's ``now``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

import msgspec

from common.effects import Effect, JobRefused, ToUser
from common.ids import JobId, TaskId, UserId
from common.messages import (
    OUTPUT_BYTES,
    CancelJob,
    EventKind,
    JobRefusal,
    SubmitJob,
    TaskEvents,
    TaskOutcome,
)
from common.model import TaskState
from global_master.ledger import Ledger

__all__ = ["OUTPUT_BYTES", "HistoryRecord", "JobBook", "JobStatus", "TaskStatus"]

CANCELLED = "cancelled"
REFUSED = "job refused"


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
_FINISHED, _FAILED, _CANCELLED = TaskStatus.FINISHED, TaskStatus.FAILED, TaskStatus.CANCELLED
_ENDS = (EventKind.FINISHED, EventKind.FAILED)
"""(bound once: an enum member read off its class is slow on 3.11)"""
_LIVE = {
    TaskState.QUEUED: TaskStatus.QUEUED,
    TaskState.DISPATCHED: TaskStatus.QUEUED,
    TaskState.PLACED: TaskStatus.RUNNING,
}


class Opened(msgspec.Struct, tag="opened", array_like=True, frozen=True):
    """A job was admitted: its tasks, and each one's stage as (stage id, count) runs."""

    user: str
    job_id: str
    at: float
    task_ids: tuple[str, ...]
    stage_runs: tuple[tuple[int, int], ...]


class Noted(msgspec.Struct, tag="noted", array_like=True, frozen=True):
    """Its user asked to cancel a job (``what`` ``cancel``), or the GM refused it
    (``refused``, ``detail`` why)."""

    user: str
    job_id: str
    at: float
    what: str
    detail: str = ""


class TaskEnded(msgspec.Struct, tag="task", array_like=True, frozen=True):
    """A task ended, as its user reads it from then on."""

    user: str
    job_id: str
    task_id: str
    state: str
    reason: str
    attempts: int
    lm: str
    exit_code: int | None
    started_at: float
    ended_at: float
    stdout: bytes
    stderr: bytes


class JobEnded(msgspec.Struct, tag="ended", array_like=True, frozen=True):
    user: str
    job_id: str
    at: float


HistoryRecord = Opened | Noted | TaskEnded | JobEnded


class TaskRecord(msgspec.Struct, gc=False):
    """One task as its user sees it (kept for ``keep_s`` after its job ended: never
    tracked by the collector, ``gc=False``, as it holds atoms only)."""

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
        self.changes: list[HistoryRecord] | None = None
        """The history records of the changes not yet taken (``take``); None: the book
        keeps no history (its GM keeps no journal)."""
        self._replaying = False

    # ------------------------------------------------------------- history
    def keep_history(self) -> None:
        """From now on each change is a history record (``take`` them)."""
        if self.changes is None:
            self.changes = []

    def take(self) -> list[HistoryRecord]:
        """The history records of the changes since the last ``take``."""
        out = self.changes or []
        if out:
            self.changes = []
        return out

    def _note(self, rec: HistoryRecord) -> None:
        if self.changes is not None:
            self.changes.append(rec)

    def replay(self, records: Iterable[HistoryRecord], now: float) -> None:
        """Rebuild the book from its history (no records made of it); then ended jobs
        past ``keep_s`` at ``now`` go."""
        keep, self.changes, self._replaying = self.changes, None, True
        try:
            for r in records:
                self._apply(r)
        finally:
            self.changes, self._replaying = keep, False
        self.expire(now)

    def _apply(self, r: HistoryRecord) -> None:
        if type(r) is Opened:
            self._open(UserId(r.user), JobId(r.job_id), r.at, r.task_ids, _unrun(r.stage_runs))
            return
        rec = self.jobs.get((UserId(r.user), JobId(r.job_id)))
        if type(r) is Noted and r.what == "refused":
            self._refuse(UserId(r.user), JobId(r.job_id), r.detail, r.at)
        elif rec is None:
            return  # a job dropped (per_user) before the history was compacted
        elif type(r) is Noted:
            self._cancel(rec, r.at)
        elif type(r) is TaskEnded:
            t = rec.tasks.get(TaskId(r.task_id))
            if t is not None and t.state is None:
                self._task_end(rec, t, r)
        elif type(r) is JobEnded and not rec.ended:
            self._end(rec, r.at)

    def records(self) -> list[HistoryRecord]:
        """The whole book as history records (what ``replay`` makes it again from):
        every job's opening, notes and ended tasks, then the ends of the ended jobs in
        the order they ended."""
        out: list[HistoryRecord] = []
        for rec in self.jobs.values():
            out += _job_records(rec)
        for user, per in self.ended.items():
            out += [JobEnded(user, job_id, at) for job_id, at in per.items()]
        return out

    # ------------------------------------------------------------- feeding
    def observe(self, msg: object, effects: Iterable[Effect], now: float, ledger: Ledger) -> None:
        """What the core just did with ``msg`` (its ``effects``), at ``now``."""
        kind = type(msg)
        if kind is TaskEvents:
            self._events(msg, now)  # type: ignore[arg-type]
        elif kind is CancelJob:
            rec = self.jobs.get((msg.user, msg.job_id))  # type: ignore[attr-defined]
            if rec is not None and rec.cancelled_at < 0 and not rec.ended:
                self._cancel(rec, now)
        elif kind is JobRefusal:  # refused before the core saw it (its service's word)
            r = cast("JobRefusal", msg)
            if (r.user, r.job_id) not in self.jobs:  # a copy of a job taken: not that job
                self._refuse(
                    r.user, r.job_id, f"{r.reason}: {r.detail}" if r.detail else r.reason, now
                )
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
        if job.resumes is not None or self.admitted(*jk) is not None:
            return  # returned tasks, or a redelivery (a refused job's id may come again)
        stage_of = _stages(job.stages, len(job.tasks))
        ids = tuple([s.task_id for s in job.tasks])
        self._open(job.user, job.job_id, now, ids, stage_of)
        self._note(Opened(job.user, job.job_id, now, ids, _runs(stage_of)))

    def _open(
        self, user: UserId, job_id: JobId, now: float, ids: Iterable[str], stage_of: list[int]
    ) -> None:
        # (ids are task ids already: ``TaskId`` is a call per task that returns its
        # argument; one record per task, every task's job in one update)
        tids = cast("Iterable[TaskId]", ids)
        ended = self.ended.get(user)
        if ended:  # a job refused before, sent again: the new one is live
            ended.pop(job_id, None)
        tasks = {t: TaskRecord(t, stage_of[i]) for i, t in enumerate(tids)}
        self.jobs[(user, job_id)] = rec = JobRecord(user, job_id, now, tasks, len(tasks))
        rec.timeline.append((now, "submitted"))
        self.job_of.update(dict.fromkeys([(user, tid) for tid in tasks], job_id))

    def _cancel(self, rec: JobRecord, now: float) -> None:
        rec.cancelled_at = now
        rec.timeline.append((now, "cancel requested"))
        self._note(Noted(rec.user, rec.job_id, now, "cancel"))

    def _refused(self, e: JobRefused, now: float) -> None:
        if e.resume or e.reason == "duplicate_job_id":
            return
        self._refuse(e.user, e.job_id, f"{e.reason}: {e.detail}" if e.detail else e.reason, now)

    def _refuse(self, user: UserId, job_id: JobId, why: str, now: float) -> None:
        rec = self.jobs.get((user, job_id))
        if rec is None:
            rec = self.jobs[(user, job_id)] = JobRecord(user, job_id, now, {}, 0)
        rec.refused = why
        rec.timeline.append((now, f"refused: {why}"))
        self._note(Noted(user, job_id, now, "refused", why))
        for t in rec.tasks.values():
            if t.state is None:
                t.state, t.reason = TaskStatus.FAILED, REFUSED
        if not self._replaying and not rec.ended:
            self._end(rec, now)  # (replayed: its JobEnded follows)

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
            if ev.kind in _ENDS:
                t.exit_code = ev.exit_code
                t.stdout, t.stderr = ev.stdout[-OUTPUT_BYTES:], ev.stderr[-OUTPUT_BYTES:]

    def _outcome(self, out: TaskOutcome, now: float) -> None:
        task = out.task
        spec = task.spec
        rec = self.jobs.get((spec.user, spec.job_id))
        t = rec.tasks.get(spec.task_id) if rec is not None else None
        if rec is None or t is None or t.state is not None:
            return
        if out.finished:
            state = _FINISHED
            if t.exit_code is None and task.spec.command:
                t.exit_code = 0
        else:
            state = _CANCELLED if out.reason == CANCELLED else _FAILED
        # as ``_task_end`` of the ``TaskEnded`` below (its state is ``state``), without
        # making the record when the book keeps no history
        started = task.first_started_at if task.first_started_at >= 0 else t.started_at
        t.state, t.reason, t.attempts, t.lm = state, out.reason, task.attempt, task.lm or t.lm
        t.started_at, t.ended_at = started, task.finished_at if task.finished_at >= 0 else now
        rec.left -= 1
        if self.changes is not None:
            self.changes.append(_ended(rec, t))
        if rec.left <= 0:
            self._end(rec, now)

    def _task_end(self, rec: JobRecord, t: TaskRecord, e: TaskEnded) -> None:
        t.state, t.reason, t.attempts, t.lm = TaskStatus(e.state), e.reason, e.attempts, e.lm
        t.exit_code, t.started_at, t.ended_at = e.exit_code, e.started_at, e.ended_at
        t.stdout, t.stderr = e.stdout, e.stderr
        rec.left -= 1

    def _end(self, rec: JobRecord, now: float) -> None:
        rec.ended_at = now
        rec.timeline.append((now, str(self.status(rec))))
        self._note(JobEnded(rec.user, rec.job_id, now))
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

    def admitted(self, user: UserId, job_id: JobId) -> JobRecord | None:
        """The record of a job its GM admitted (live or ended): its id is taken.  A job
        refused whole is not one -- its id may be sent again."""
        rec = self.jobs.get((user, job_id))
        return rec if rec is not None and not rec.refused else None

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
        started = t.started_at
        if started < 0 and live is not None and live.first_started_at >= 0:
            started = live.first_started_at  # running: its LM said so, no event yet
        return {
            "task_id": t.task_id, "job_id": rec.job_id, "stage": t.stage,
            "state": str(self.task_status(rec, t, ledger)), "attempts": attempts,
            "lm": (live.lm if live is not None and live.lm else t.lm) or None,
            "exit_code": t.exit_code, "reason": t.reason,
            "started_at": started if started >= 0 else None,
            "ended_at": t.ended_at if t.ended_at >= 0 else None,
            "stdout_bytes": len(t.stdout), "stderr_bytes": len(t.stderr),
        }  # fmt: skip


def _job_records(rec: JobRecord) -> list[HistoryRecord]:
    """A job's opening, notes and ended tasks, as ``replay`` takes them."""
    if rec.refused and not rec.tasks:
        return [Noted(rec.user, rec.job_id, rec.submitted_at, "refused", rec.refused)]
    ids = tuple(rec.tasks)
    stage_of = [t.stage for t in rec.tasks.values()]
    out: list[HistoryRecord] = [Opened(rec.user, rec.job_id, rec.submitted_at, ids,
                                       _runs(stage_of))]  # fmt: skip
    if rec.cancelled_at >= 0:
        out.append(Noted(rec.user, rec.job_id, rec.cancelled_at, "cancel"))
    out += [
        _ended(rec, t)
        for t in rec.tasks.values()
        if t.state is not None and not (rec.refused and t.reason == REFUSED)
    ]
    if rec.refused:  # its other tasks fail with it again
        at = next((at for at, what in rec.timeline if what.startswith("refused")), rec.ended_at)
        out.append(Noted(rec.user, rec.job_id, at, "refused", rec.refused))
    return out


def _ended(rec: JobRecord, t: TaskRecord) -> TaskEnded:
    return TaskEnded(
        rec.user, rec.job_id, t.task_id, str(t.state), t.reason, t.attempts, t.lm,
        t.exit_code, t.started_at, t.ended_at, t.stdout, t.stderr,
    )  # fmt: skip


def _runs(stage_of: list[int]) -> tuple[tuple[int, int], ...]:
    """``[0, 0, 0, 1]`` as ``((0, 3), (1, 1))``."""
    out: list[tuple[int, int]] = []
    for s in stage_of:
        if out and out[-1][0] == s:
            out[-1] = (s, out[-1][1] + 1)
        else:
            out.append((s, 1))
    return tuple(out)


def _unrun(runs: Iterable[tuple[int, int]]) -> list[int]:
    return [s for s, n in runs for _ in range(n)]


def _stages(stages: Iterable[Any] | None, n: int) -> list[int]:
    """The stage id of each task of a job (0 for a flat job)."""
    if stages is None:
        return [0] * n
    out: list[int] = []
    for st in stages:
        out += [int(st.stage_id)] * st.count
    return out + [0] * (n - len(out))
