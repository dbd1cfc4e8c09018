"""What a simulation keeps of its tasks and jobs as they end: exact running figures,
and the task CSV's rows in submission order, never the tasks themselves.

``JobBook`` hands every task here once, when it ends (finished, failed, refused) or
when the run ends without it (unfinished), with its place in submission order, and
every job once, when its last task ended.  The figures are the summary
``simulator.trace_run`` writes: ``reporting.tally.TaskTally``'s allocation-time tails
(compact columns of 8-byte values spilled to a scratch file, sorted exactly at the
end), the priority classes', the JCTs', and counts.  So what a run holds grows with
what is in flight, not with the trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.model import Task
from reporting.tally import FloatColumns, Floats, TaskTally, jct_stats, tails
from reporting.tasks import OrderedRows


class RunRecords:
    """A run's tasks and jobs as they end (module docstring).  ``rows``: also keep the
    task CSV's rows (``write_csv``); ``close`` drops the scratch files."""

    def __init__(self, *, rows: bool = False) -> None:
        self.tally = TaskTally()
        self.classes: dict[int, int] = {}
        """Tasks per priority class."""
        self._by_class = FloatColumns(("priority", "allocation", "first_start"))
        self._jct = FloatColumns(("jct",))
        self.failed_tasks = 0
        self.jobs_failed = 0
        self.rows = OrderedRows() if rows else None

    @property
    def tasks(self) -> int:
        return self.tally.tasks

    @property
    def jobs_completed(self) -> int:
        return self._jct.rows

    def task(self, index: int, task: Task, failure: str = "") -> None:
        """``task`` ended (or the run did), ``index``-th submitted; ``failure``: why
        it failed ("" unless it did)."""
        comps = task.components()  # (once, for the tally and the row)
        self.tally.add(task, comps)
        cls = task.spec.priority
        self.classes[cls] = self.classes.get(cls, 0) + 1
        if task.started_at >= 0:
            self._by_class.add(float(cls), task.allocation_time, task.first_allocation_time)
        if failure:
            self.failed_tasks += 1
        if self.rows is not None:
            self.rows.add(index, task, failure or None, comps)

    def job(self, jct: float | None) -> None:
        """A job's last task ended: it completed in ``jct`` s, or failed (None)."""
        if jct is None:
            self.jobs_failed += 1
        else:
            self._jct.add(jct)

    def summary(self) -> dict[str, Any]:
        """The tasks' tails (``TaskTally.summary``), the JCTs, failures, and each
        priority class's tails when there is more than class 0."""
        s = self.tally.summary()
        s["jct_s"] = jct_stats(self._jct.column("jct"))
        s["failed_tasks"] = self.failed_tasks
        s["jobs_completed"] = self.jobs_completed
        s["jobs_failed"] = self.jobs_failed
        if sorted(self.classes) != [0]:
            s["classes"] = self._class_summaries()
        return s

    def _class_summaries(self) -> dict[str, Any]:
        """Per class: its tasks, allocation time to the final start and to the first."""
        col = self._by_class.column
        cls, alloc, first = col("priority"), col("allocation"), col("first_start")
        out = {}
        for c in sorted(self.classes):
            mine = cls == float(c)
            out[str(c)] = {
                "tasks": self.classes[c],
                "allocation_time_s": tails(alloc[mine]),
                "first_start_s": tails(first[mine]),
            }
        return out

    def allocation_times(self) -> Floats:
        """Every started task's allocation time to its final start (any order)."""
        return self.tally.allocation_times()

    def first_allocation_times(self) -> Floats | None:
        """Every started task's time to its first start, if a preemption made any
        differ from the final start (else None)."""
        return self.tally.first_allocation_times() if self.tally.restarted else None

    def write_csv(self, path: Path) -> None:
        """The task CSV, one row per task in submission order (``rows`` must be on)."""
        if self.rows is None:
            raise ValueError("these records keep no rows: made without rows=True")
        self.rows.write(path)

    def close(self) -> None:
        self.tally.close()
        self._by_class.close()
        self._jct.close()
        if self.rows is not None:
            self.rows.close()
