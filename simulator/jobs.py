"""Which tasks of which job are done: job completion times, failures, makespan.

One book for every simulated scheduler, so Megha, Sparrow and the centralized
configuration count finished jobs the same way.  Tasks are recorded as their
outcomes arrive (the GM's ledger of each task); a task with no outcome at the end
is reported as it was submitted, never started.  A job completes when every task
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
    spec: TaskSpec
    arrival: float


class JobBook:
    """Tasks in, completions out; a job completes when its last task has finished,
    and has failed (``failed_jobs``, no completion time) if any task of it failed."""

    def __init__(self) -> None:
        self._entries: dict[TaskKey, _Entry] = {}
        self._outcomes: dict[TaskKey, Task] = {}
        self._jobs: dict[JobId, list[TaskSpec]] = {}
        self.job_arrival: dict[JobId, float] = {}
        self.job_left: dict[JobId, int] = {}
        self.job_completion: dict[JobId, float] = {}
        self.failed: dict[TaskKey, str] = {}
        self.failed_jobs: set[JobId] = set()
        self.first_arrival: float | None = None
        self.last_finish = 0.0

    def add(self, job: Job | DagJob) -> None:
        check_horizon(job)
        specs = specs_of(job)
        self._jobs[job.job_id] = specs
        for s in specs:
            self._entries[(s.user, s.task_id)] = _Entry(s, job.arrival)
        self.job_arrival[job.job_id] = job.arrival
        self.job_left[job.job_id] = len(specs)
        if self.first_arrival is None or job.arrival < self.first_arrival:
            self.first_arrival = job.arrival

    def done(self, task: Task, t: float, failure: str = "") -> None:
        """``task`` finished at ``t`` (or failed, with the reason)."""
        key = task.key
        if key in self._outcomes:
            return
        self._outcomes[key] = task
        if failure:
            self.failed[key] = failure
            self.failed_jobs.add(task.job_id)
        elif task.finished_at < 0:
            task.finished_at = t
        self.last_finish = max(self.last_finish, t)
        left = self.job_left[task.job_id] - 1
        self.job_left[task.job_id] = left
        if left == 0 and task.job_id not in self.failed_jobs:
            self.job_completion[task.job_id] = t - self.job_arrival[task.job_id]

    def done_spec(self, spec: TaskSpec, t: float, failure: str) -> None:
        """A task that failed before any scheduler made a ledger for it."""
        e = self._entries[(spec.user, spec.task_id)]
        self.done(new_task(spec, e.arrival), t, failure)

    def specs(self, job_id: JobId) -> list[TaskSpec]:
        return self._jobs.get(job_id, [])

    @property
    def outstanding(self) -> int:
        return len(self._entries) - len(self._outcomes)

    @property
    def tasks(self) -> list[Task]:
        """Every task, in submission order: its outcome, or as submitted."""
        out = []
        for key, e in self._entries.items():
            task = self._outcomes.get(key)
            out.append(task if task is not None else new_task(e.spec, e.arrival))
        return out

    @property
    def makespan(self) -> float:
        return self.last_finish - (self.first_arrival or 0.0)
