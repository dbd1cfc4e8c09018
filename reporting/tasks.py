"""The task CSVs: ``tasks.csv`` of ``megha bench`` and ``tasks-<scheduler>.csv`` (or
``tasks-<policy>.csv``) of ``megha simulate``, one row per task in ``TASK_COLUMNS``
order, the same for every driver.

``megha bench`` writes a task's row when it ends; a simulation's CSV lists the tasks in
the order they were submitted, though they end in any order: ``OrderedRows`` takes each
row as its task ends, with its place in that order, keeps a bounded run of them, spills
each run sorted to a scratch file and merges the runs into the CSV at the end (an
external merge sort), so a trace of millions of tasks holds no row it is done with.
"""

from __future__ import annotations

import csv
import heapq
import itertools
import struct
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


_EXACT = float(2**23)
"""From here on (in magnitude) a float has no bit below 1e-9 that ``round(x, 9)``
could change: it is its own rounding (a Unix timestamp is ~2**30)."""


def _r9(x: float) -> float:
    """``round(x, 9)``, without its decimal conversion where it is ``x`` itself."""
    return x if not -_EXACT < x < _EXACT else round(x, 9)


def components_of(task: Task) -> list[float]:
    """``task.components()``, without its per-call look at ``len(Phase)`` (the rows of a
    live run take it for every task)."""
    out = [0.0, 0.0, 0.0, 0.0, 0.0]
    marks = task.marks
    if len(marks) < 2:
        return out
    end = task.started_at
    t0, p0 = marks[0]
    if end >= 0:
        for t1, p1 in itertools.islice(marks, 1, None):
            if t0 >= end:
                break
            out[p0] += t1 - t0
            t0, p0 = t1, p1
    else:
        for t1, p1 in itertools.islice(marks, 1, None):
            out[p0] += t1 - t0
            t0, p0 = t1, p1
    return out


def task_row(
    task: Task, failure: str | None = None, components: list[float] | None = None
) -> list[Any]:
    """One CSV row per task, in ``TASK_COLUMNS`` order: identity, timestamps,
    allocation time and its split, decisions and waits, how it ended and why it failed
    (``failure``: None unless it failed; ``components``: ``task.components()`` if the
    caller has it already).  ``task_lines`` writes the same rows faster."""
    submitted, first, started = task.submitted_at, task.first_started_at, task.started_at
    if components is None:
        components = task.components()
    spec = task.spec
    return [
        spec.task_id, spec.job_id, spec.user, task.gm or "",
        _r9(submitted), _r9(first), _r9(started), _r9(task.finished_at),
        _r9(started - submitted) if started >= 0 else -1.0,
        _r9(first - submitted) if first >= 0 else -1.0,
        _r9(max(0.0, started - first)) if started >= 0 else -1.0,
        *[round(value, 9) for value in components],
        task.attempt, task.decisions,
        *task.waits,
        task_state(task, failure), failure or "",
    ]  # fmt: skip


_TIMES = 3
"""The times that go into a row's head (submission, first and final start)."""
_SPLIT = 8
"""The durations of a row's tail (allocation, to the first start, reallocation, the
components)."""
_ROW = "%s,%s,%s,%s,%s,%s,%s,%s"
"""A row as ``csv.writer`` writes it when no field needs quotes: each value's ``str``
(a float's is its ``repr``): its four ids, then its head (three times), end, tail
(eight durations) and rest, each head, tail and rest one text made beforehand."""
_REST = ",".join(["%s"] * (len(TASK_COLUMNS) - 4 - _TIMES - 1 - _SPLIT)) + "\r\n"
"""A row's rest (its attempt, decisions, waits, state and failure), made once per run
of rows alike: a launch's tasks mostly share it (their counts are ints, whose text
equal values share)."""


def _text(text: dict[float, str], x: float) -> str:
    """``task_lines``' text of a value other than zero it has not written yet in its
    batch: ``repr(_r9(x))``, kept in ``text`` for the batch's next rows."""
    text[x] = s = repr(x if not -_EXACT < x < _EXACT else round(x, 9))
    return s


def components_all(tasks: Sequence[Task]) -> list[list[float]]:
    """``components_of`` of each task, a row after a task with the same marks and final
    start given the same list (a launch's tasks share both): read them, never change
    them.  Equal marks make equal components, to the bit: each sum starts at +0.0, so
    a mark's zero of either sign adds +0.0."""
    out: list[list[float]] = []
    add = out.append
    marks: object = None
    start = comps = None
    for task in tasks:
        if task.marks != marks or task.started_at != start:
            marks, start = task.marks, task.started_at
            comps = components_of(task)
        add(comps)  # type: ignore[arg-type]
    return out


def task_lines(
    tasks: Sequence[Task],
    failures: Sequence[str | None] | None = None,
    components: Sequence[list[float]] | None = None,
) -> str:
    """The ``task_row`` of each task as ``csv.writer`` writes it, joined (``failures``:
    each one's, None: none failed; ``components``: each one's ``task.components()``
    if the caller has them): a batch of outcomes' rows, for ``tasks.csv`` at once.

    Every number of a row is ``task_row``'s, rounded as it rounds it (``round(x, 9)``,
    which ``_r9`` is), formatted at once.  The text of a value is made once per batch
    (of a row's 12 times and durations, a batch of a live run has 2 or 3 values per
    task), and a row's head (its three times) and tail (its eight durations) once per
    run of rows that share them: a launch's tasks, one after the other, differ only in
    their ids and ends.  A row a field of which needs quotes (a comma, a quote, a line
    break) or is None is written by ``csv.writer`` instead."""
    return _lines(
        tasks,
        [None] * len(tasks) if failures is None else failures,
        components_all(tasks) if components is None else components,
    )


def _lines(
    tasks: Sequence[Task], failures: Sequence[str | None], components: Sequence[list[float]]
) -> str:
    """``task_lines``' rows, each failure and components given."""
    out: list[str] = []
    add = out.append
    text: dict[float, str] = {}  # repr(_r9(value)) by value, but 0.0: -0.0 == 0.0
    shared: list[Any] = [None, None, None, None, "", ""]  # sub, first, start, comps, head, tail
    rest: tuple[Any, ...] = (None, None, None, None, None, "")
    for task, failure, comps in zip(tasks, failures, components, strict=True):
        spec = task.spec
        sub, first = task.submitted_at, task.first_started_at
        start, end = task.started_at, task.finished_at
        if comps is not shared[3] or start != shared[2] or sub != shared[0] or first != shared[1]:
            _share(shared, text, sub, first, start, comps)
        if failure is not None:
            state = "failed"
        elif start >= 0 and end >= start:
            state = "finished"
        else:
            state = "unfinished"
        attempt, decisions, waits = task.attempt, task.decisions, task.waits
        if (
            attempt != rest[0] or decisions != rest[1] or waits != rest[2]
            or state is not rest[3] or failure != rest[4]
        ):  # fmt: skip
            rest = (attempt, decisions, waits, state, failure,
                    _REST % (attempt, decisions, *waits, state, failure or ""))  # fmt: skip
        add(_ROW % (
            spec.task_id, spec.job_id, spec.user, task.gm or "", shared[4],
            repr(end if not -_EXACT < end < _EXACT else round(end, 9)), shared[5], rest[5],
        ))  # fmt: skip
    joined = "".join(out)
    if _plain(joined, len(out)):
        return joined
    return "".join(
        line if _plain(line, 1) else _csv_line(task_row(task, failure, comps))
        for line, task, failure, comps in zip(out, tasks, failures, components, strict=True)
    )


_COMMAS = len(TASK_COLUMNS) - 1


def _plain(text: str, rows: int) -> bool:
    """Whether ``rows`` lines of ``_lines``' own formatting, joined, are as
    ``csv.writer`` writes them: no field needs quotes (a comma, a quote, a line break)
    or is None (written ``None``, where ``csv.writer`` writes nothing).  Each line has
    at least its commas and its one CR LF, and ``None`` cannot span a comma or a line
    end: the whole text passes if and only if each of its lines does."""
    return (
        text.count(",") == _COMMAS * rows
        and '"' not in text
        and text.count("\n") == rows
        and text.count("\r") == rows
        and "None" not in text
    )


def _share(
    shared: list[Any],
    text: dict[float, str],
    sub: float,
    first: float,
    start: float,
    comps: list[float],
) -> None:
    """``_lines``' head and tail of a row (and of the rows after it with the same three
    times and the same components list), into ``shared``; a row with a zero time shares
    them with none (0.0 == -0.0, whose texts differ)."""
    seen, new = text.get, _text
    alloc = again = -1.0
    if start >= 0:
        alloc, again = start - sub, max(0.0, start - first)
    to_first = first - sub if first >= 0 else -1.0
    c0, c1, c2, c3, c4 = comps
    # a zero's text is its repr (its own rounding), never kept (0.0 == -0.0)
    shared[4] = ",".join((
        seen(sub) or (new(text, sub) if sub else repr(sub)),
        seen(first) or (new(text, first) if first else repr(first)),
        seen(start) or (new(text, start) if start else repr(start)),
    ))  # fmt: skip
    shared[5] = ",".join((
        seen(alloc) or (new(text, alloc) if alloc else repr(alloc)),
        seen(to_first) or (new(text, to_first) if to_first else repr(to_first)),
        seen(again) or (new(text, again) if again else repr(again)),
        seen(c0) or (new(text, c0) if c0 else repr(c0)),
        seen(c1) or (new(text, c1) if c1 else repr(c1)),
        seen(c2) or (new(text, c2) if c2 else repr(c2)),
        seen(c3) or (new(text, c3) if c3 else repr(c3)),
        seen(c4) or (new(text, c4) if c4 else repr(c4)),
    ))  # fmt: skip
    shared[:4] = (sub, first, start, comps if sub and first and start else None)


def _csv_line(row: list[Any]) -> str:
    """``row`` as ``csv.writer`` writes it (quoted where it must be): ``task_lines``'
    rows that its own formatting would not write alike."""
    buf = _Line()
    csv.writer(buf).writerow(row)
    return buf.line


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

    def write(
        self, task: Task, failure: str | None = None, components: list[float] | None = None
    ) -> None:
        """``task``'s row; ``failure``: why it failed, None unless it did
        (``components``: ``task.components()`` if the caller has it already)."""
        self.write_many([task], [failure], None if components is None else [components])

    def write_many(
        self,
        tasks: Sequence[Task],
        failures: Sequence[str | None] | None = None,
        components: Sequence[list[float]] | None = None,
    ) -> None:
        """The tasks' rows at once (``task_lines``), flushed as ``write`` flushes them."""
        self._fh.write(task_lines(tasks, failures, components))
        before, self.rows = self.rows, self.rows + len(tasks)
        if self.rows // self._flush_every > before // self._flush_every:
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


class _Line:
    """A file for ``csv.writer`` that keeps the one line written last."""

    __slots__ = ("line",)

    def __init__(self) -> None:
        self.line = ""

    def write(self, text: str) -> int:
        self.line = text
        return len(text)


_HEAD = struct.Struct("<qI")
"""A spilled row: its place in the order (int64) and its line's length in bytes."""


def _read_run(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb", buffering=1 << 16) as f:
        head = f.read(_HEAD.size)
        while head:
            index, size = _HEAD.unpack(head)
            yield index, f.read(size)
            head = f.read(_HEAD.size)


class OrderedRows:
    """Task rows (``task_row``, as ``task_lines`` writes them) taken in any order, each with its place in the final
    order, written to a CSV in that order (``write``).  At most ``run_rows`` rows are
    held; each full run is sorted and spilled to a scratch file, and every ``fan_in``
    runs are merged into one, so few files are open at once."""

    def __init__(self, *, run_rows: int = 65536, fan_in: int = 64) -> None:
        self._run: list[tuple[int, bytes]] = []
        self._run_rows = max(1, run_rows)
        self._fan_in = max(2, fan_in)
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._runs: list[Path] = []
        self._made = 0
        self.rows = 0

    def add(
        self,
        index: int,
        task: Task,
        failure: str | None = None,
        components: list[float] | None = None,
    ) -> None:
        """``task``'s row, ``index``-th in the order; ``failure``: why it failed
        (``components``: ``task_row``'s)."""
        line = task_lines([task], [failure], None if components is None else [components])
        self._run.append((index, line.encode()))
        self.rows += 1
        if len(self._run) >= self._run_rows:
            self._spill()

    def _scratch(self) -> Path:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="megha-rows-")
        self._made += 1
        return Path(self._dir.name) / f"run{self._made}"

    def _write_run(self, rows: Iterable[tuple[int, bytes]]) -> Path:
        path = self._scratch()
        pack = _HEAD.pack
        with path.open("wb", buffering=1 << 16) as f:
            for index, line in rows:
                f.write(pack(index, len(line)))
                f.write(line)
        return path

    def _spill(self) -> None:
        self._run.sort(key=_first)
        self._runs.append(self._write_run(self._run))
        self._run = []
        if len(self._runs) >= self._fan_in:
            merged = self._write_run(self._merged(self._runs))
            for path in self._runs:
                path.unlink()
            self._runs = [merged]

    def _merged(self, runs: list[Path]) -> Iterator[tuple[int, bytes]]:
        return heapq.merge(*(_read_run(p) for p in runs), key=_first)

    def write(self, path: Path) -> None:
        """Every row, in order, to ``path`` under the ``TASK_COLUMNS`` header."""
        self._run.sort(key=_first)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            head = _Line()
            csv.writer(head).writerow(TASK_COLUMNS)
            out.write(head.line.encode())
            for _, line in heapq.merge(*(_read_run(p) for p in self._runs), self._run, key=_first):
                out.write(line)

    def close(self) -> None:
        self._run = []
        self._runs = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def _first(row: tuple[int, bytes]) -> int:
    return row[0]
