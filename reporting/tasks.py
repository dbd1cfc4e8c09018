"""The task CSVs: ``tasks.csv`` of ``megha bench`` and ``tasks-<scheduler>.csv`` (or
``tasks-<policy>.csv``) of ``megha simulate``, one row per task in ``TASK_COLUMNS``
order, the same for every driver.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from common.model import COMPONENTS, Task, TaskKey, WaitReason

TASK_COLUMNS: tuple[str, ...] = (
    "task_id", "job_id", "user", "gm",
    "submitted_at", "first_started_at", "started_at", "finished_at",
    "allocation_s", "first_start_s", "reallocation_s",
    *(f"{name}_s" for name in COMPONENTS),
    "attempt", "decisions",
    *(f"waits_{reason.key}" for reason in WaitReason),
    "state", "failure",
)  # fmt: skip
"""The columns of ``tasks.csv``, in order (``task_row``)."""


def task_state(task: Task, failure: str | None) -> str:
    """How a task ended: ``failed`` (refused, or failed on its worker: ``failure`` says
    why), ``finished``, or ``unfinished`` (not done when the run ended)."""
    if failure is not None:
        return "failed"
    if task.started_at >= 0 and task.finished_at >= task.started_at:
        return "finished"
    return "unfinished"


def task_row(task: Task, failure: str | None = None) -> list[Any]:
    """One CSV row per task, in ``TASK_COLUMNS`` order: identity, timestamps,
    allocation time and its split, decisions and waits, how it ended and why it failed
    (``failure``: None unless it failed)."""
    started = task.started_at
    return [
        task.task_id, task.job_id, task.user, task.gm or "",
        round(task.submitted_at, 9), round(task.first_started_at, 9),
        round(started, 9), round(task.finished_at, 9),
        round(task.allocation_time, 9), round(task.first_allocation_time, 9),
        round(max(0.0, started - task.first_started_at), 9) if started >= 0 else -1.0,
        *(round(value, 9) for value in task.components()),
        task.attempt, task.decisions,
        *task.waits,
        task_state(task, failure), failure or "",
    ]  # fmt: skip


class TaskCsv:
    """``tasks.csv`` written as tasks end: a header (``TASK_COLUMNS``), then one
    ``task_row`` per task, flushed every ``flush_every`` rows and on ``close``."""

    def __init__(self, path: Path, *, flush_every: int = 1000) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.rows = 0
        self._fh: IO[str] = path.open("w", newline="")
        self._writer = csv.writer(self._fh)
        self._writer.writerow(TASK_COLUMNS)
        self._flush_every = max(1, flush_every)

    def write(self, task: Task, failure: str | None = None) -> None:
        """``task``'s row; ``failure``: why it failed, None unless it did."""
        self._writer.writerow(task_row(task, failure))
        self.rows += 1
        if self.rows % self._flush_every == 0:
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> TaskCsv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_records_csv(
    path: Path, tasks: Iterable[Task], failed: Mapping[TaskKey, str] | None = None
) -> None:
    """``tasks`` to ``path``; ``failed``: why each task that failed did."""
    why = failed or {}
    with TaskCsv(path) as out:
        for t in tasks:
            out.write(t, why.get(t.key))
