"""A run's allocation-time figures, with the same keys for ``megha simulate``, ``megha
bench`` and the benchmarks (``common.metrics.percentiles`` of each).

Allocation time (SPEC §3) is reported three ways, all from submission to the GM queue:

* ``allocation_time_s``: to the **final** start, the one that ran to completion (the
  paper's metric for a task that runs); its components (``components_s``: queueing,
  processing, communication, worker queueing, preempted running) add up to it;
* ``first_start_s``: to the first start;
* ``reallocation_s``: final start - first start, the delay preemptions caused.

``TaskTally`` takes tasks one at a time and keeps only their figures (``FloatColumns``,
spilled to a temporary file past a bound): a long live run, or a simulated trace of
millions of tasks, holds no task's ledger.  The percentiles stay exact (nearest rank of
every value): a report reads one column back at a time, 8 bytes a value, and sorts it
(``tails``), the same figures ``common.metrics.percentiles`` gives of the whole list.
"""

from __future__ import annotations

import math
import tempfile
from array import array
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from common.metrics import PERCENTILE_KEYS, nearest_rank
from common.model import COMPONENTS, Task, WaitReason

Floats = npt.NDArray[np.float64]

_READ_ROWS = 1 << 16
"""Rows read back at a time when one column is taken from a spilled file."""


def tails(values: Sequence[float] | Floats) -> dict[str, float]:
    """``common.metrics.percentiles`` of ``values`` (a list or an array), the same
    figures: nearest rank of the sorted values, the largest, and the mean as the
    correctly rounded sum (``math.fsum``, whatever the order) over the count."""
    xs = np.sort(np.asarray(values, dtype=np.float64))
    if not len(xs):
        return dict.fromkeys(PERCENTILE_KEYS, 0.0)
    return {
        "p50": float(nearest_rank(xs, 0.5)),  # type: ignore[arg-type]
        "p90": float(nearest_rank(xs, 0.9)),  # type: ignore[arg-type]
        "p99": float(nearest_rank(xs, 0.99)),  # type: ignore[arg-type]
        "p999": float(nearest_rank(xs, 0.999)),  # type: ignore[arg-type]
        "max": float(xs[-1]),
        "mean": math.fsum(xs) / len(xs),
    }


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
        self.extend(values)

    def extend(self, values: Sequence[float]) -> None:
        """Rows one after the other, flat: a value per column, in order, for each."""
        rows, rest = divmod(len(values), len(self.names))
        if rest:
            raise ValueError(f"{len(values)} values for rows of {len(self.names)} columns")
        self._buf.extend(values)
        self.rows += rows
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

    def column(self, name: str) -> Floats:
        """One column's values in the order of the rows (8 bytes a value), read back in
        blocks: a report never holds every column at once."""
        i, k = self.names.index(name), len(self.names)
        out = np.empty(self.rows, dtype=np.float64)
        at = 0
        if self._file is not None:
            self._file.seek(0)
            left = self._spilled
            while left:
                n = min(left, _READ_ROWS * k)
                block = np.frombuffer(self._file.read(8 * n), dtype=np.float64)
                got = block[i::k]
                out[at : at + len(got)] = got
                at += len(got)
                left -= n
            self._file.seek(0, 2)
        tail = np.frombuffer(self._buf, dtype=np.float64)[i::k] if len(self._buf) else ()
        out[at : at + len(tail)] = tail
        return out

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
        self._no_waits = [0] * len(WaitReason)

    def add(self, t: Task, components: list[float] | None = None) -> None:
        """One task (``components``: ``t.components()`` if the caller has it already)."""
        self.add_many([t], None if components is None else [components])

    def add_many(self, tasks: Sequence[Task], components: Sequence[list[float]] | None) -> None:
        """Tasks one after the other (``components``: each one's ``t.components()``, if
        the caller has them), their figures added to the columns at once."""
        if components is None:
            components = [t.components() for t in tasks]
        zero = self._no_waits
        waits, waited, users = self.waits, self.waited, self.users
        values: list[float] = []
        started = restarted = 0
        k = len(COMPONENTS)
        for t, comps in zip(tasks, components, strict=True):
            w = t.waits
            if w != zero:
                for r, n in enumerate(w):
                    waits[r] += n
                    waited[r] += 1 if n else 0
            start = t.started_at
            if start < 0:
                continue
            started += 1
            first, sub = t.first_started_at, t.submitted_at
            if start > first:
                restarted += 1
            user = users.get(t.spec.user)
            if user is None:
                user = users[t.spec.user] = len(users)
            values += (
                start - sub,  # t.allocation_time, started
                first - sub if first >= 0 else -1.0,  # t.first_allocation_time
                start - first,
                *comps[:k],
                float(user),
            )
        self.tasks += len(tasks)
        self.started += started
        self.restarted += restarted
        self.values.extend(values)

    def allocation_times(self) -> Floats:
        """Every started task's allocation time (for a CDF)."""
        return self.values.column("allocation")

    def first_allocation_times(self) -> Floats:
        """Every started task's time to its first start."""
        return self.values.column("first_start")

    def summary(self) -> dict[str, Any]:
        col = self.values.column
        alloc, who = col("allocation"), col("user")
        per_user = {u: tails(alloc[who == float(i)]) for u, i in sorted(self.users.items())}
        del who
        return {
            "allocation_time_s": tails(alloc),
            "first_start_s": tails(col("first_start")),
            "reallocation_s": tails(col("reallocation")),
            "components_s": {name: tails(col(name)) for name in COMPONENTS},
            "per_user": per_user,
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


def jct_stats(jct: Mapping[Any, float] | Floats) -> dict[str, float]:
    """Job completion times (a mapping's values, or an array): mean, p50, p95, max
    (nearest rank)."""
    xs = np.sort(np.fromiter(jct.values(), dtype=np.float64) if isinstance(jct, Mapping) else jct)
    if not len(xs):
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0, "jobs": 0}
    p = tails(xs)
    p95 = float(nearest_rank(xs, 0.95))  # type: ignore[arg-type]
    return {"mean": p["mean"], "p50": p["p50"], "p95": p95, "max": p["max"], "jobs": len(xs)}
