"""A run's allocation-time figures, with the same keys for ``megha simulate``, ``megha
bench`` and the benchmarks (``common.metrics.percentiles`` of each).

Allocation time (SPEC §3) is reported three ways, all from submission to the GM queue:

* ``allocation_time_s``: to the **final** start, the one that ran to completion (the
  paper's metric for a task that runs); its components (``components_s``: queueing,
  processing, communication, worker queueing, preempted running) add up to it;
* ``first_start_s``: to the first start;
* ``reallocation_s``: final start - first start, the delay preemptions caused.

``TaskTally`` takes tasks one at a time and keeps only their figures (``FloatColumns``,
spilled to a temporary file past a bound): a long live run holds no task's ledger.
"""

from __future__ import annotations

import tempfile
from array import array
from collections.abc import Mapping, Sequence
from typing import IO, Any

from common.metrics import nearest_rank, percentiles
from common.model import COMPONENTS, Task, WaitReason


class FloatColumns:
    """Rows of floats kept compactly until a report needs every value (exact
    percentiles): packed doubles, moved to an unnamed temporary file every
    ``spill_rows`` rows, so a long run holds a bounded buffer, not every value."""

    def __init__(self, names: Sequence[str], *, spill_rows: int = 16384) -> None:
        self.names = tuple(names)
        self.rows = 0
        self._buf: array[float] = array("d")
        self._limit = max(1, spill_rows) * len(self.names)
        self._file: IO[bytes] | None = None
        self._spilled = 0

    def add(self, *values: float) -> None:
        """One row: a value per column, in order."""
        if len(values) != len(self.names):
            raise ValueError(f"{len(values)} values for {len(self.names)} columns")
        self._buf.extend(values)
        self.rows += 1
        if len(self._buf) >= self._limit:
            if self._file is None:
                # held open across calls, closed by ``close``
                self._file = tempfile.TemporaryFile(prefix="megha-values-")  # noqa: SIM115
            self._buf.tofile(self._file)
            self._spilled += len(self._buf)
            self._buf = array("d")

    @property
    def held(self) -> int:
        """Values held in memory (at most ``spill_rows`` rows)."""
        return len(self._buf)

    def columns(self) -> dict[str, array[float]]:
        """Every value of every column, in the order of the rows."""
        data: array[float] = array("d")
        if self._file is not None:
            self._file.seek(0)
            data.fromfile(self._file, self._spilled)
            self._file.seek(0, 2)
        data.extend(self._buf)
        k = len(self.names)
        return {name: data[i::k] for i, name in enumerate(self.names)}

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TaskTally:
    """``summarize_tasks`` one task at a time: counters, and for the tasks that started
    only their allocation times and components (``FloatColumns``), not the tasks."""

    COLUMNS = ("allocation", "first_start", "reallocation", *COMPONENTS, "user")

    def __init__(self, *, spill_rows: int = 16384) -> None:
        self.values = FloatColumns(self.COLUMNS, spill_rows=spill_rows)
        self.tasks = 0
        self.started = 0
        self.restarted = 0
        self.users: dict[str, int] = {}
        self.waits = [0] * len(WaitReason)
        self.waited = [0] * len(WaitReason)

    def add(self, t: Task) -> None:
        self.tasks += 1
        for r, n in enumerate(t.waits):
            self.waits[r] += n
            self.waited[r] += 1 if n else 0
        if t.started_at < 0:
            return
        self.started += 1
        if t.started_at > t.first_started_at:
            self.restarted += 1
        user = self.users.setdefault(t.user, len(self.users))
        comps = t.components()[: len(COMPONENTS)]
        self.values.add(
            t.allocation_time,
            t.first_allocation_time,
            t.started_at - t.first_started_at,
            *comps,
            float(user),
        )

    def allocation_times(self) -> array[float]:
        """Every started task's allocation time (for a CDF)."""
        return self.values.columns()["allocation"]

    def summary(self) -> dict[str, Any]:
        cols = self.values.columns()
        alloc, who = cols["allocation"], cols["user"]
        per_user: dict[str, list[float]] = {}
        names = {float(i): u for u, i in self.users.items()}
        for a, i in zip(alloc, who, strict=True):
            per_user.setdefault(names[i], []).append(a)
        return {
            "allocation_time_s": percentiles(alloc),
            "first_start_s": percentiles(cols["first_start"]),
            "reallocation_s": percentiles(cols["reallocation"]),
            "components_s": {name: percentiles(cols[name]) for name in COMPONENTS},
            "per_user": {u: percentiles(v) for u, v in sorted(per_user.items())},
            "tasks": self.tasks,
            "tasks_started": self.started,
            "tasks_restarted": self.restarted,
            "wait_reasons": {
                "decisions": WaitReason.counts(self.waits),
                "tasks": WaitReason.counts(self.waited),
            },
        }

    def close(self) -> None:
        self.values.close()


def summarize_tasks(tasks: Sequence[Task]) -> dict[str, Any]:
    """Tails of the tasks that started, per component and per user."""
    tally = TaskTally()
    try:
        for t in tasks:
            tally.add(t)
        return tally.summary()
    finally:
        tally.close()


def jct_stats(jct: Mapping[Any, float]) -> dict[str, float]:
    """Job completion times: mean, p50, p95, max (nearest rank)."""
    xs = list(jct.values())
    p = percentiles(xs)
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0, "jobs": 0}
    p95 = nearest_rank(sorted(xs), 0.95)
    return {"mean": p["mean"], "p50": p["p50"], "p95": p95, "max": p["max"], "jobs": len(xs)}
