"""Google's published cluster traces as ``TraceJob`` s, streamed as they are replayed.

* ``google2011``: the 2011 cluster-data ``task_events`` table (ClusterData2011_2):
  CSV rows without a header, ``timestamp, missing info, job ID, task index, machine ID,
  event type, user, scheduling class, priority, CPU request, memory request, disk
  request, different-machines restriction``; event types 0 SUBMIT, 1 SCHEDULE, 2 EVICT,
  3 FAIL, 4 FINISH, 5 KILL, 6 LOST, 7-8 UPDATE.
* ``google2019``: the 2019 traces' ``instance_events`` table as BigQuery exports it to
  CSV (a header row naming the columns: ``time``, ``type``, ``collection_id``,
  ``instance_index`` are read, ``collection_type`` if present: alloc-set instances,
  type 1, are reservations, not work, and are skipped); event types 0 SUBMIT, 1 QUEUE,
  2 ENABLE, 3 SCHEDULE, 4 EVICT, 5 FAIL, 6 FINISH, 7 KILL, 8 LOST, 9-10 UPDATE.

Times are microseconds (0: before the trace window; 2**63-1: after its end, skipped).
Rows must come in time order (the 2011 part files are, given in order; a 2019 export
is sorted with ``ORDER BY time`` or ``sort -t, -k1,1n``); one that goes back is an
error naming it.

How events become jobs (``GoogleReplay``): a task arrives at its first SUBMIT; the
tasks of a trace job not yet handed on form one job arriving at the first of them
(tasks submitted after it was handed on form the next job of the same trace job).  A
task's duration is the time it ran, summed over its attempts (SCHEDULE to EVICT, FAIL,
FINISH, KILL or LOST); FINISH, KILL and LOST end it, EVICT and FAIL end an attempt (it
may be submitted again).  A job is handed on, in arrival order, once each of its tasks
has ended; a task still open ``lookahead`` seconds after its job arrived is cut there
(one running counts as having run until then: ``clipped``; the ends of tasks not held
are ``unmatched``), so memory holds at most that span of the trace.  A SCHEDULE of a
task never submitted (missing data) submits it then -- unless the task ended at that very
timestamp: events of one timestamp come in any order, and a SCHEDULE listed after its own
FINISH is not a new task running to the lookahead (``reordered``).  Tasks that never ran
are dropped
(``never_ran``; a FINISH with no SCHEDULE read: ``finished_unscheduled``); tasks
running when the trace ends run to its last event (``unfinished``).
The counts are ``stats``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from workload.tracefiles import columns, csv_files, csv_rows, integer
from workload.traces import TraceJob

AFTER_END = 2**63 - 1
"""A timestamp meaning "after the trace window"."""

SUBMIT, SCHEDULE, ATTEMPT_ENDS, TASK_ENDS, OTHER, FINISH = range(6)
"""What an event does to its task; ``FINISH`` ends it as ``TASK_ENDS`` does, and says it ran."""
KINDS_2011 = {0: SUBMIT, 1: SCHEDULE, 2: ATTEMPT_ENDS, 3: ATTEMPT_ENDS, 4: FINISH,
              5: TASK_ENDS, 6: TASK_ENDS, 7: OTHER, 8: OTHER}  # fmt: skip
KINDS_2019 = {0: SUBMIT, 1: OTHER, 2: OTHER, 3: SCHEDULE, 4: ATTEMPT_ENDS, 5: ATTEMPT_ENDS,
              6: FINISH, 7: TASK_ENDS, 8: TASK_ENDS, 9: OTHER, 10: OTHER}  # fmt: skip

Event = tuple[int, str, int, int, str]
"""``(time in us, job, task index, kind, where)``."""


@dataclass
class ReplayStats:
    """What a replay made of the trace's events."""

    events: int = 0
    jobs: int = 0
    tasks: int = 0
    clipped: int = 0
    """Tasks running when the lookahead cut them."""
    unfinished: int = 0
    """Tasks running when the trace ended."""
    never_ran: int = 0
    finished_unscheduled: int = 0
    """Tasks that FINISHed with no SCHEDULE read (a record missing from the trace):
    dropped, as how long they ran is not known."""
    after_end: int = 0
    skipped_rows: int = 0
    unmatched: int = 0
    """Events of a task not held: ended or cut already, or never submitted."""
    reordered: int = 0
    """SCHEDULEs of a task that ended at the same timestamp (listed after its end)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Task:
    slice: _Slice
    start: float | None = None
    ran: float = 0.0
    scheduled: bool = False


@dataclass(slots=True)
class _Slice:
    job: str
    arrival: float
    durations: list[float] = field(default_factory=list)
    open: dict[tuple[str, int], _Task] = field(default_factory=dict)
    handed: bool = False


class GoogleReplay:
    """Jobs of a stream of task events, in arrival order (module docstring)."""

    def __init__(self, events: Iterator[Event], lookahead: float = math.inf) -> None:
        if not lookahead > 0:
            raise ConfigError(f"lookahead must be positive, got {lookahead}", reason="bad_trace")
        self._events = events
        self.lookahead = lookahead
        self.stats = ReplayStats()
        self._tasks: dict[tuple[str, int], _Task] = {}
        self._current: dict[str, _Slice] = {}
        self._queue: deque[_Slice] = deque()
        self._ended_now: set[tuple[str, int]] = set()
        """Tasks that ended at the timestamp being read (cleared as time moves on)."""

    @property
    def held_tasks(self) -> int:
        """Tasks read and not yet handed on (what the replay holds in memory)."""
        return len(self._tasks) + sum(len(s.durations) for s in self._queue)

    def __iter__(self) -> Iterator[TraceJob]:
        now = -math.inf
        for t_us, job, index, kind, where in self._events:
            self.stats.events += 1
            if t_us >= AFTER_END:
                self.stats.after_end += 1
                continue
            t = t_us / 1e6
            if t < now:
                raise ConfigError(
                    f"{where}: time {t_us} goes back (the last row read was at {now * 1e6:.0f}): "
                    "give the files in time order (sort an export by time)",
                    reason="bad_trace",
                )
            if t > now and self._ended_now:
                self._ended_now.clear()
            now = t
            yield from self._hand_on(now)  # the jobs past the lookahead, before this row
            self._event(t, job, index, kind)
            yield from self._hand_on(now)
        yield from self._hand_on(now, end=True)

    def _event(self, t: float, job: str, index: int, kind: int) -> None:
        key = (job, index)
        task = self._tasks.get(key)
        if task is None and kind not in (SUBMIT, SCHEDULE):
            self.stats.unmatched += kind != OTHER
            return
        if task is None:  # a SCHEDULE without a SUBMIT (missing data) arrives with it
            if key in self._ended_now:  # ...or after its own end, in the same timestamp
                self.stats.reordered += 1
                return
            s = self._current.get(job)
            if s is None:
                s = self._current[job] = _Slice(job, t)
                self._queue.append(s)
            task = self._tasks[key] = s.open[key] = _Task(s)
        if kind in (SUBMIT, OTHER):
            return
        if kind == SCHEDULE:
            if task.start is not None:  # scheduled again with no end read between (a
                task.ran += t - task.start  # record missing): it ran until now, not lost
            task.start, task.scheduled = t, True
            return
        if task.start is not None:
            task.ran += t - task.start
            task.start = None
        if kind in (TASK_ENDS, FINISH):
            self._end(key, task, finished=kind == FINISH)

    def _end(
        self, key: tuple[str, int], task: _Task, now: float | None = None, finished: bool = False
    ) -> None:
        """``task`` is over (cut at ``now`` if given, while it runs)."""
        if now is not None and task.start is not None:
            task.ran += now - task.start
        del self._tasks[key]
        del task.slice.open[key]
        if now is None:
            self._ended_now.add(key)
        if task.scheduled:
            task.slice.durations.append(task.ran)
        elif finished:
            self.stats.finished_unscheduled += 1
        else:
            self.stats.never_ran += 1

    def _hand_on(self, now: float, end: bool = False) -> Iterator[TraceJob]:
        """The jobs at the head of the queue that are done (or past the lookahead)."""
        q = self._queue
        while q and (not q[0].open or end or now - q[0].arrival > self.lookahead):
            s = q.popleft()
            # a task still open is cut at the lookahead's end, not at the row that
            # found it open: rows may be hours apart (a trace filtered to a few jobs)
            cut = min(now, s.arrival + self.lookahead)
            for key, task in list(s.open.items()):
                # a task evicted or failed and not submitted again was not cut: it ended
                if task.start is not None:
                    if end:
                        self.stats.unfinished += 1
                    else:
                        self.stats.clipped += 1
                self._end(key, task, cut)
            if self._current.get(s.job) is s:
                del self._current[s.job]
            if s.durations:
                self.stats.jobs += 1
                self.stats.tasks += len(s.durations)
                yield TraceJob(s.arrival, tuple(s.durations))


def _time(text: str, what: str, where: str) -> int:
    """A row's time in microseconds: a whole number, not negative (the traces' times
    start at 0, "before the window"; a negative one replayed at 0 while its job's
    completion time still counted from it)."""
    t = integer(text, what, where)
    if t < 0:
        raise ConfigError(f"{where}: {what} {text!r} is negative", reason="bad_trace")
    return t


def google2011_events(paths: Sequence[str | Path]) -> Iterator[Event]:
    """The ``task_events`` rows of the 2011 trace as events."""
    for where, row in csv_rows(paths):
        columns(row, 6, "task_events", where)
        t = _time(row[0], "timestamp", where)
        kind = KINDS_2011.get(integer(row[5], "event type", where))
        if kind is None:
            raise ConfigError(f"{where}: event type {row[5]!r} is not 0-8", reason="bad_trace")
        yield t, row[2], integer(row[3], "task index", where), kind, where


def google2019_events(paths: Sequence[str | Path], stats: ReplayStats) -> Iterator[Event]:
    """The ``instance_events`` rows of a 2019 export (each file with its header: its
    first row, blank lines before it skipped)."""
    for _, rows in csv_files(paths):
        header = next(rows, None)
        if header is None:
            continue  # an empty file: no rows, no header
        where, row = header
        names = {n.strip(): i for i, n in enumerate(row)}
        missing = [c for c in ("time", "type", "collection_id", "instance_index") if c not in names]
        if missing:
            raise ConfigError(
                f"{where}: the header names no {', '.join(missing)} column "
                "(export instance_events to CSV with its header row)",
                reason="bad_trace",
            )
        for where, row in rows:
            yield from _event_2019(where, row, names, stats)


def _event_2019(
    where: str, row: list[str], names: dict[str, int], stats: ReplayStats
) -> Iterator[Event]:
    ct = names.get("collection_type")
    if ct is not None and ct < len(row) and row[ct] == "1":
        stats.skipped_rows += 1
        return
    columns(row, len(names), "instance_events", where)
    kind = KINDS_2019.get(integer(row[names["type"]], "type", where))
    if kind is None:
        raise ConfigError(
            f"{where}: event type {row[names['type']]!r} is not 0-10", reason="bad_trace"
        )
    t = _time(row[names["time"]], "time", where)
    index = integer(row[names["instance_index"]], "instance_index", where)
    yield t, row[names["collection_id"]], index, kind, where


def read_google(fmt: str, paths: Sequence[str | Path], lookahead: float = math.inf) -> GoogleReplay:
    """A replay of ``google2011`` or ``google2019`` files (iterate it for the jobs)."""
    if fmt == "google2011":
        return GoogleReplay(google2011_events(paths), lookahead)
    stats = ReplayStats()
    replay = GoogleReplay(google2019_events(paths, stats), lookahead)
    replay.stats = stats
    return replay
