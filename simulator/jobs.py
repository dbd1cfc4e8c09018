"""Which tasks of which job are done: job completion times, failures, makespan.

One book for every simulated scheduler, so Megha, Sparrow and the centralized
configuration count finished jobs the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from common.ids import JobId, TaskId
from common.model import Task


class JobLike(Protocol):
    job_id: JobId
    arrival: float

    @property
    def tasks(self) -> list[Task]: ...


class JobBook:
    """Tasks in, completions out; a job completes when its last task is done."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.job_arrival: dict[JobId, float] = {}
        self.job_left: dict[JobId, int] = {}
        self.job_completion: dict[JobId, float] = {}
        self.failed: dict[TaskId, str] = {}
        self.first_arrival: float | None = None
        self.last_finish = 0.0

    def add(self, job: JobLike) -> None:
        tasks: Sequence[Task] = job.tasks
        self.tasks.extend(tasks)
        self.job_arrival[job.job_id] = job.arrival
        self.job_left[job.job_id] = len(tasks)
        if self.first_arrival is None or job.arrival < self.first_arrival:
            self.first_arrival = job.arrival

    def done(self, task: Task, t: float, failure: str = "") -> None:
        """``task`` finished at ``t`` (or failed, with the reason)."""
        if failure:
            self.failed[task.task_id] = failure
        else:
            task.finished_at = t
        self.last_finish = max(self.last_finish, t)
        left = self.job_left[task.job_id] - 1
        self.job_left[task.job_id] = left
        if left == 0:
            self.job_completion[task.job_id] = t - self.job_arrival[task.job_id]

    @property
    def makespan(self) -> float:
        return self.last_finish - (self.first_arrival or 0.0)
