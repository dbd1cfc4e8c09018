"""Alibaba's cluster-trace-v2018 ``batch_task`` table as DAG jobs, streamed.

Rows (no header, schema.md 1.5): ``task_name, instance_num, job_name, task_type,
status, start_time, end_time, plan_cpu, plan_mem``; times in seconds.  A task's name
gives the job's DAG (trace_2018.md): ``M1`` is task 1, ``R2_1`` task 2 after task 1,
``J3_1_2`` task 3 after tasks 1 and 2 (any letters, then the task's number, then its
parents' numbers after ``_``).  A name without that shape (``task_...``,
``MergeTask``) is a task with no dependency.

Each task is a stage of ``instance_num`` instances, each running ``end_time -
start_time`` (the table gives the task's span, not each instance's:
``batch_instance`` is not read); a job arrives at its first task's start.  Only
``Terminated`` tasks with ``0 < start_time <= end_time`` are replayed; a row repeating
another of its job (name, instances, start and end) is read once (``duplicate_rows``:
it skipped the job, or ran the task twice); a dependency on a task not replayed is
dropped, and a job whose names form a cycle or repeat a number is skipped (all counted
in ``stats``), and so is a job of more than
``MAX_TRACE_JOB_TASKS`` instances (``oversized_jobs``: a garbled ``instance_num``
would otherwise take every byte of memory before the replay began).

The table is not in time order (rows come job by job), so it is sorted twice with
bounded memory (``workload.spill``): by job, to gather each job's tasks, then the jobs
by arrival.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.dag import CycleError, topological_order
from workload.spill import sorted_spilled
from workload.tracefiles import columns, csv_rows, integer, number

_DAG_NAME = re.compile(r"[A-Za-z]+([0-9]+)((?:_[0-9]+)*)").fullmatch

MAX_TRACE_JOB_TASKS = 1_000_000
"""Instances one replayed job may hold: ten times what a live job may (the wire's
``MAX_JOB_TASKS``; a replay takes the trace as written), and about 3 GB of simulated
tasks queued at once."""

Row = tuple[str, str, int, float, float]
"""``(job, task name, instances, start, end)``."""


@dataclass(frozen=True, slots=True)
class TraceStage:
    stage_id: int
    parents: tuple[int, ...]
    count: int
    duration: float


@dataclass(frozen=True, slots=True)
class TraceDag:
    """A job of the trace: its name, arrival and stages (in a topological order)."""

    name: str
    arrival: float
    stages: tuple[TraceStage, ...]


@dataclass
class AlibabaStats:
    rows: int = 0
    jobs: int = 0
    tasks: int = 0
    not_replayed: int = 0
    dropped_parents: int = 0
    skipped_jobs: int = 0
    oversized_jobs: int = 0
    duplicate_rows: int = 0
    """Rows repeating another of their job (name, instances, start, end): read once."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class AlibabaReplay:
    """The DAG jobs of ``batch_task`` files in arrival order (module docstring)."""

    def __init__(self, paths: Sequence[str | Path], *, chunk: int = 200_000) -> None:
        self.paths = list(paths)
        self.chunk = chunk
        self.stats = AlibabaStats()

    def __iter__(self) -> Iterator[TraceDag]:
        by_job = sorted_spilled(self._rows(), key=lambda r: r[0], chunk=self.chunk)
        jobs = (
            job
            for name, rows in itertools.groupby(by_job, key=lambda r: r[0])
            if (job := self._job(name, list(rows))) is not None
        )
        for job in sorted_spilled(jobs, key=lambda j: (j.arrival, j.name), chunk=self.chunk):
            self.stats.jobs += 1
            self.stats.tasks += sum(s.count for s in job.stages)
            yield job

    def _rows(self) -> Iterator[Row]:
        for where, row in csv_rows(self.paths):
            self.stats.rows += 1
            columns(row, 7, "batch_task", where)
            status = row[4]
            start = number(row[5], "start_time", where, empty=0.0)
            end = number(row[6], "end_time", where, empty=0.0)
            count = integer(row[1], "instance_num", where) if row[1] else 0
            if status != "Terminated" or not 0 < start <= end or count < 1:
                self.stats.not_replayed += 1
                continue
            yield row[2], row[0], count, start, end

    def _job(self, name: str, rows: list[Row]) -> TraceDag | None:
        """One job's stages from its tasks' names, or None (counted) if they cannot be."""
        unique = list(dict.fromkeys(rows))  # a task written twice is one task, not two
        self.stats.duplicate_rows += len(rows) - len(unique)
        rows = unique
        if sum(r[2] for r in rows) > MAX_TRACE_JOB_TASKS:
            self.stats.oversized_jobs += 1
            return None
        numbered: dict[int, tuple[tuple[int, ...], Row]] = {}
        loose: list[Row] = []
        for r in rows:
            m = _DAG_NAME(r[1])
            if m is None:
                loose.append(r)
                continue
            sid = int(m[1])
            if sid in numbered:
                self.stats.skipped_jobs += 1
                return None
            numbered[sid] = (tuple(int(p) for p in m[2].split("_")[1:]), r)
        parents: dict[int, tuple[int, ...]] = {}
        dropped = 0  # counted if the job is replayed, not for one skipped
        for sid, (ps, _) in numbered.items():
            kept = tuple(p for p in dict.fromkeys(ps) if p in numbered and p != sid)
            dropped += len(set(ps)) - len(kept)
            parents[sid] = kept
        try:
            order = topological_order(parents)
        except CycleError:
            self.stats.skipped_jobs += 1
            return None
        self.stats.dropped_parents += dropped
        stages = [TraceStage(sid, parents[sid], *_span(numbered[sid][1])) for sid in order]
        fresh = max(numbered, default=0) + 1
        stages += [TraceStage(fresh + k, (), *_span(r)) for k, r in enumerate(loose)]
        arrival = min(r[3] for r in rows)
        return TraceDag(name, arrival, tuple(stages))


def _span(r: Row) -> tuple[int, float]:
    return r[2], r[4] - r[3]
