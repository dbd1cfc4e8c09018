"""Retained ends: the attempts that ended on one LM, remembered for a while.

Invariants:

* ``done`` holds the attempts that ended in the last ``retain_s`` seconds, oldest first
  (by when this LM learnt the end): a late duplicate launch of one is recognised, and a
  restarted GM learns what already ran.  A task is in it at most once (its last end).
* The ends of a job its GM asked to keep (``KeepEnds``: its delivery is held long, and a
  restarted GM must learn what of it ended) move to ``kept`` when they expire, and stay
  until the GM lets the job go; nothing else outlives ``retain_s``.  A task's end is in
  ``done`` or in ``kept``, never both (``kept_at`` says where), and a late launch of a
  kept attempt is recognised as one of ``done`` is.
* An end a new incarnation restores from its journal is kept at least ``retain_s``
  after the restore (``restored``): no GM could ask the LM while it was down, and the
  GMs that restart with it ask late (a whole-federation restart takes minutes).  The
  restore is journaled (``JournalRestored``), so the incarnation after it, replaying
  the same keeps, forgets nothing this one kept.
* A GM keeps a job's ends once and lets them go once: ``let_go`` remembers each let-go
  for ``retain_s``, and a keep that comes after it (held back on the way, within its
  signature's freshness, far shorter than ``retain_s``) is ignored -- applied, it would
  keep the ends for ever.
* An end is kept as an ``EndedRow``, a tuple of atoms the collector untracks.

Owned here only; it returns values and calls nothing of the LM's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from common.ids import GmId, JobId, UserId
from common.messages import ENDS_RETAINED_S, HeldTask, JournalEnded, JournalKeep, JournalRestored
from common.model import TaskKey, TaskSpec

JobKeyAt = tuple[GmId, UserId, JobId]
"""A job as an LM keeps its ends: its GM, user and id."""
EndedRow = tuple[Any, ...]
"""An ended attempt as ``done`` keeps it: atoms and tuples of atoms only.  A busy LM
keeps ``retain_s`` of them (80,000 at 667 ends/s); as ``HeldTask`` and ``TaskSpec``
objects they were three tracked objects each, and its full collections paused it for
up to 0.2 s at 2,000 tasks/s (bench_live ``gc_since_start``)."""
Ended = tuple[GmId, EndedRow, float]
"""An ended attempt's GM, row, and when this LM learnt of the end."""
_JOB, _ATTEMPT, _OK = 1, 7, 13


def ended_row(h: HeldTask) -> EndedRow:
    """``h`` as a row of atoms."""
    s = h.spec
    return (
        s.task_id, s.job_id, s.user, s.demand, s.duration, s.constraints, s.command,
        h.attempt, h.queued_at, h.accepted_at, h.worker_at, h.started_at, h.ended_at, h.ok,
    )  # fmt: skip


def held_of(row: EndedRow) -> HeldTask:
    """The ``HeldTask`` a row was made of."""
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


class Ends:
    """The ended attempts one LM remembers, and the jobs whose ends it keeps."""

    def __init__(self, retain_s: float = ENDS_RETAINED_S) -> None:
        self.retain_s = retain_s
        self.done: OrderedDict[TaskKey, Ended] = OrderedDict()
        """Attempts that ended here in the last ``retain_s`` seconds."""
        self.keep_ends: set[JobKeyAt] = set()
        """Jobs (GM, user, job) whose GM asked that their ended attempts be kept."""
        self.kept: dict[JobKeyAt, dict[TaskKey, Ended]] = {}
        """Ended attempts of those jobs past ``retain_s``, until their GM lets them go."""
        self.kept_at: dict[TaskKey, JobKeyAt] = {}
        """The job under which each task's kept end is (an end is in ``done`` or here)."""
        self.let_go: OrderedDict[JobKeyAt, float] = OrderedDict()
        """Jobs whose GM let their ends go in the last ``retain_s`` seconds (when)."""
        self.since = -float("inf")
        """When this incarnation restored its journal: no end expires before
        ``since + retain_s`` (an end's age counts from its learning or from this)."""
        self.journal: list[object] | None = None
        """Where a durable LM's ends and keeps go (``JournalEnded``, ``JournalKeep``);
        None: not durable.  Expiry writes nothing: it follows from the times recorded."""

    def __contains__(self, key: object) -> bool:
        return key in self.done

    def retire(self, key: TaskKey, gm: GmId, held: HeldTask, now: float) -> None:
        """Task ``key``'s attempt ``held`` (for ``gm``) ended; this LM learnt it ``now``."""
        self.done[key] = (gm, ended_row(held), now)
        self.done.move_to_end(key)
        job = self.kept_at.pop(key, None)
        if job is not None:  # a later attempt: the task's end is this one now, as a
            self._unkeep(job, key)  # new incarnation's replay of the journal has it
        if self.journal is not None:
            self.journal.append(JournalEnded(gm=gm, held=held, learnt_at=now))

    def covering(self, key: TaskKey, job: JobId, attempt: int) -> tuple[int, bool] | None:
        """(attempt, ok) of task ``key``'s end here lately if it is attempt ``attempt``
        or a later one of job ``job`` (a user may use a task id again in a later job,
        which is a new task); else None."""
        past = self.done.get(key)
        if past is None:
            at = self.kept_at.get(key)  # an end past retain_s, of a job kept: a late
            if at is None:  # launch of its attempt must not run it again
                return None
            past = self.kept[at][key]
        row = past[1]
        if row[_ATTEMPT] >= attempt and row[_JOB] == job:
            return row[_ATTEMPT], row[_OK]
        return None

    def held(self, gm: GmId) -> tuple[HeldTask, ...]:
        """The ends ``gm`` placed that are remembered or kept."""
        return tuple(
            held_of(row)
            for ended in (self.done, *self.kept.values())
            for g, row, _ in ended.values()
            if g == gm
        )

    def expire(self, now: float) -> None:
        """Forget the ends older than ``retain_s`` (and restored over ``retain_s``
        ago), but those of jobs kept."""
        done = self.done
        horizon = now - self.retain_s
        if horizon < self.since:
            return
        while done:
            key, entry = next(iter(done.items()))
            if entry[2] > horizon:
                break
            done.popitem(last=False)
            if self.keep_ends:
                job = (entry[0], key[0], entry[1][_JOB])
                if job in self.keep_ends:
                    self.kept.setdefault(job, {})[key] = entry
                    self.kept_at[key] = job

    def restored(self, now: float) -> None:
        """A new incarnation took its journal back ``now``: what it remembers is kept
        at least ``retain_s`` more, however old (it could answer no one while down)."""
        self.since = now

    def keep(self, job: JobKeyAt, keep: bool, now: float) -> bool:
        """Keep (or let go) ``job``'s ends past ``retain_s``; False when a keep comes
        after the job's let-go and is ignored."""
        let_go = self.let_go
        while let_go and next(iter(let_go.values())) < now - self.retain_s:
            let_go.popitem(last=False)
        if keep:
            if job in let_go:
                return False
            self.keep_ends.add(job)
        else:
            self.keep_ends.discard(job)
            for key in self.kept.pop(job, ()):
                del self.kept_at[key]
            let_go[job] = now
            let_go.move_to_end(job)
        if self.journal is not None:
            gm, user, job_id = job
            self.journal.append(JournalKeep(gm=gm, user=user, job_id=job_id, keep=keep, at=now))
        return True

    def _unkeep(self, job: JobKeyAt, key: TaskKey) -> None:
        ends = self.kept[job]
        del ends[key]
        if not ends:
            del self.kept[job]

    def records(self) -> list[object]:
        """Everything kept here as journal records (a compacted journal's ends): the
        keeps and let-gos first, then every end oldest first, kept ones included; first of
        all, when this incarnation restored its journal (``since``)."""
        out: list[object] = [JournalRestored(at=self.since)] if self.since > -float("inf") else []
        out.extend(
            JournalKeep(gm=g, user=u, job_id=j, keep=True, at=0.0) for g, u, j in self.keep_ends
        )
        out.extend(
            JournalKeep(gm=g, user=u, job_id=j, keep=False, at=at)
            for (g, u, j), at in self.let_go.items()
        )
        ended = [e for kept in self.kept.values() for e in kept.items()]
        ended.extend(self.done.items())
        ended.sort(key=lambda item: item[1][2])
        out.extend(
            JournalEnded(gm=gm, held=held_of(row), learnt_at=at) for _, (gm, row, at) in ended
        )
        return out
