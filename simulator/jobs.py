"""Which tasks of which job are done: job completion times, failures, makespan.

One book for every simulated scheduler, so Megha, Sparrow and the centralized
configuration count finished jobs the same way.  Tasks are recorded as their
outcomes arrive (the GM's ledger of each task), into ``simulator.records``, and then
forgotten; a task with no outcome at the end is reported as it was submitted, never
started.  A job completes when every task
of it has finished; a job with a task that failed (or was refused) has failed: it
has no completion time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.dag import DagJob
from common.errors import ConfigError
from common.ids import JobId
from common.model import Task, TaskKey, TaskSpec, new_task
from simulator.records import RunRecords
from workload.jobs import Job, specs_of

HORIZON_S = 2.0**32
"""The latest virtual time a job may arrive or a task may end (about 136 years, past
any arrival in seconds since 1970).  Times are floats: at 2**32 s one step of a
float is 2**-20 s (1 us), the resolution the modelled costs need (a GM decision is
a few us, a hop half a ms); much later, a hop or a decision rounds to nothing and a
1-s task to 0 s, and past 2**53 periods a clock ticking that period stops moving."""


def check_horizon(job: Job | DagJob) -> None:
    """``ConfigError`` if ``job`` arrives, or one of its tasks could end, past
    ``HORIZON_S`` (as scaled: ``--time-scale``, ``--duration-scale``)."""
    arrival = job.arrival
    if isinstance(job, DagJob):
        longest = job.critical_path()
    else:
        longest = max((t.duration for t in job.tasks), default=0.0)
    if not math.isfinite(arrival) or arrival > HORIZON_S:
        what = f"arrives at {arrival:g} s"
    elif not math.isfinite(longest) or arrival + longest > HORIZON_S:
        what = f"arrives at {arrival:g} s and runs for {longest:g} s"
    else:
        return
    raise ConfigError(
        f"job {job.job_id} {what}: past {HORIZON_S:.4g} s (2**32), where simulated "
        "times lose their microseconds; subtract the first arrival, or give arrivals "
        "and durations in seconds (--time-scale / --duration-scale 0.001 for ms)",
        reason="past_horizon",
    )


@dataclass(slots=True)
class _Entry:
    """A task without an outcome yet: its place in submission order, spec, arrival."""

    index: int
    spec: TaskSpec
    arrival: float


@dataclass(slots=True)
class _OpenJob:
    """A job with a task still to end."""

    arrival: float
    left: int
    specs: list[TaskSpec]
    failed: bool = False


@dataclass
class KeptTasks:
    """Every task and job of a run, kept whole (``JobBook(keep=True)``)."""

    tasks: list[Task]
    """Every task, in submission order: its outcome, or as submitted."""
    job_completion: dict[JobId, float]
    job_arrival: dict[JobId, float]
    failed: dict[TaskKey, str]
    failed_jobs: set[JobId]
    """Jobs with a task that failed or was refused (not in ``job_completion``)."""


class JobBook:
    """Tasks in, completions out; a job completes when its last task has finished,
    and has failed (no completion time) if any task of it failed.

    The book holds the tasks and jobs without an outcome yet; each task, as it ends,
    and each job, as its last task ends, go to ``records`` (``RunRecords``: exact
    running figures, and the task CSV's rows) and are forgotten, so a book's size is
    what is in flight, not the trace.  With ``keep`` it also keeps every task and job
    whole (``kept``: for tests and the DAG runs, which read the tasks back)."""

    def __init__(self, records: RunRecords | None = None, *, keep: bool = True) -> None:
        self.records = records if records is not None else RunRecords()
        self._open: dict[TaskKey, _Entry] = {}
        self._jobs: dict[JobId, _OpenJob] = {}
        self._added = 0
        self._kept: list[tuple[int, Task]] | None = [] if keep else None
        self._completion: dict[JobId, float] = {}
        self._arrival: dict[JobId, float] = {}
        self._failed: dict[TaskKey, str] = {}
        self._failed_jobs: set[JobId] = set()
        self.first_arrival: float | None = None
        self.last_finish = 0.0
        self._finished = False

    def add(self, job: Job | DagJob) -> None:
        check_horizon(job)
        specs = specs_of(job)
        self._jobs[job.job_id] = _OpenJob(job.arrival, len(specs), specs)
        for s in specs:
            self._open[(s.user, s.task_id)] = _Entry(self._added, s, job.arrival)
            self._added += 1
        if self._kept is not None:
            self._arrival[job.job_id] = job.arrival
        if self.first_arrival is None or job.arrival < self.first_arrival:
            self.first_arrival = job.arrival

    def done(self, task: Task, t: float, failure: str = "") -> None:
        """``task`` finished at ``t`` (or failed, with the reason); a second outcome of
        a task is ignored."""
        entry = self._open.pop(task.key, None)
        if entry is None:
            return
        job = self._jobs[task.job_id]
        if failure:
            job.failed = True
        elif task.finished_at < 0:
            task.finished_at = t
        self.last_finish = max(self.last_finish, t)
        self._record(entry.index, task, failure)
        job.left -= 1
        if job.left == 0:
            del self._jobs[task.job_id]
            self._job_ended(task.job_id, job, t)

    def _record(self, index: int, task: Task, failure: str) -> None:
        self.records.task(index, task, failure)
        if self._kept is not None:
            self._kept.append((index, task))
            if failure:
                self._failed[task.key] = failure

    def _job_ended(self, job_id: JobId, job: _OpenJob, t: float) -> None:
        jct = None if job.failed else t - job.arrival
        self.records.job(jct)
        if self._kept is not None:
            if jct is None:
                self._failed_jobs.add(job_id)
            else:
                self._completion[job_id] = jct

    def done_spec(self, spec: TaskSpec, t: float, failure: str) -> None:
        """A task that failed before any scheduler made a ledger for it (ignored if it
        already has an outcome)."""
        e = self._open.get((spec.user, spec.task_id))
        if e is not None:
            self.done(new_task(spec, e.arrival), t, failure)

    def specs(self, job_id: JobId) -> list[TaskSpec]:
        """A job's task specs while it has a task without an outcome (else none)."""
        job = self._jobs.get(job_id)
        return job.specs if job is not None else []

    @property
    def outstanding(self) -> int:
        return len(self._open)

    def finish(self) -> None:
        """The run is over: each task without an outcome is recorded as it was
        submitted, never started (unfinished), and a job of them with a failed task
        counts as failed.  Once; ``add`` and ``done`` must not follow."""
        if self._finished:
            return
        self._finished = True
        for e in sorted(self._open.values(), key=lambda e: e.index):
            self._record(e.index, new_task(e.spec, e.arrival), "")
        self._open.clear()
        for job_id, job in self._jobs.items():
            if job.failed:
                self.records.jobs_failed += 1
                if self._kept is not None:
                    self._failed_jobs.add(job_id)
        self._jobs.clear()

    def kept(self) -> KeptTasks | None:
        """Every task and job whole, if kept (``keep``), once the run is ``finish`` ed."""
        if self._kept is None:
            return None
        self._kept.sort(key=lambda it: it[0])
        return KeptTasks(
            tasks=[t for _, t in self._kept],
            job_completion=self._completion,
            job_arrival=self._arrival,
            failed=self._failed,
            failed_jobs=self._failed_jobs,
        )

    @property
    def makespan(self) -> float:
        return self.last_finish - (self.first_arrival or 0.0)
