"""Workloads: traces and synthetic jobs, with per-task placement constraints.

One place builds what both drivers consume: the simulator and ``megha bench``.
The clusters they run on (profiles, machines, partitions, users) are
``common.cluster``.

* **Traces** (``../shared/traces``): one job a line, ``arrival n mean d_1 .. d_n``.
  Replayed by default as the Sparrow and Megha simulators do: one slot per worker,
  one slot per task (profile ``slots``).  Profile ``paper`` gives the paper's nodes
  (64 cores, 16 GB) and multi-resource tasks.
* **Task constraints** (21, after the paper's reference [19]): a task is
  constrained with probability ``task_constraint_prob`` and then asks for one to
  three constraints, popular ones (met by most machines) more often.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import codec
from common.cluster import ResourceProfile, profile
from common.dag import DagJob, stage_layout
from common.errors import ConfigError, InvalidInput
from common.ids import JobId, TaskId, UserId
from common.messages import MAX_JOB_TASKS, StageSpec, SubmitJob
from common.model import N_CONSTRAINTS, Task, TaskSpec, UserConfig


@dataclass(frozen=True, slots=True)
class TraceJob:
    arrival: float
    durations: tuple[float, ...]


def read_trace(path: str | Path, *, limit_jobs: int | None = None) -> list[TraceJob]:
    """Parse a trace file: one job a line, ``arrival n mean d_1 .. d_n`` separated by
    blanks (exactly ``n`` durations; ``#`` starts a comment, blank lines are
    skipped).  Numbers are finite decimals as C's ``strtod`` reads them (ASCII digits,
    an optional exponent: not Python's ``1_000`` nor other scripts' digits),
    durations and the arrival non-negative, ``n`` a positive integer; ``mean`` is
    checked but not used (the durations are).  A file without a job is an error.  The first
    ``limit_jobs`` jobs of the file are kept, and the file is read no further (it is
    read a line at a time: a long trace is never held whole).  A malformed line is a
    ``ConfigError`` naming it and what is wrong (reason ``bad_trace``)."""
    if limit_jobs is not None and limit_jobs < 1:
        raise ConfigError(f"limit_jobs must be at least 1, got {limit_jobs}", reason="bad_trace")
    jobs: list[TraceJob] = []
    p = Path(path)
    lineno = 0
    try:
        with p.open("rb") as f:
            for k, raw in enumerate(f):
                try:
                    text = raw.decode("utf-8-sig" if k == 0 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigError(
                        f"{p}:{lineno + 1}: not UTF-8 text ({exc.reason})",
                        reason="trace_unreadable",
                    ) from None
                # the lines of str.splitlines: CRLF, CR, and \f, \x1c.. break lines too
                for line in text.splitlines():
                    lineno += 1
                    fields = line.split("#", 1)[0].split()
                    if not fields:
                        continue
                    try:
                        jobs.append(_trace_line(fields))
                    except ValueError as exc:
                        raise ConfigError(f"{p}:{lineno}: {exc}", reason="bad_trace") from None
                    if limit_jobs is not None and len(jobs) >= limit_jobs:
                        return sorted(jobs, key=lambda j: j.arrival)
    except OSError as exc:
        raise ConfigError(f"cannot read trace {p}: {exc}", reason="trace_unreadable") from exc
    if not jobs:
        raise ConfigError(
            f"{p}: no jobs ({lineno} line(s), each blank or a comment)", reason="bad_trace"
        )
    jobs.sort(key=lambda j: j.arrival)
    return jobs


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?").fullmatch
_WHOLE = re.compile(r"[+-]?[0-9]+").fullmatch
_NOT_FINITE = {"inf", "infinity", "nan"}


def _number(text: str, what: str) -> float:
    """A finite, non-negative number, or a ``ValueError`` saying which field is wrong.
    ``float`` alone also took ``1_000`` (1000) and digits of any script (``\u0661``)."""
    if _DECIMAL(text) is None:
        if text.lstrip("+-").lower() in _NOT_FINITE:
            raise ValueError(f"{what} {text!r} is not a finite non-negative number")
        raise ValueError(f"{what} {text!r} is not a number")
    x = float(text)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{what} {text!r} is not a finite non-negative number")
    return x


def _trace_line(fields: Sequence[str]) -> TraceJob:
    """One trace line's job (``fields``: the line split on blanks)."""
    if len(fields) < 3:
        raise ValueError(
            f"{len(fields)} field(s), expected 'arrival n mean d_1 .. d_n' separated by blanks"
        )
    arrival = _number(fields[0], "arrival")
    try:
        if _WHOLE(fields[1]) is None:
            raise ValueError
        n = int(fields[1])
    except ValueError:
        raise ValueError(f"task count {fields[1]!r} is not a whole number") from None
    if n < 1:
        raise ValueError(f"task count is {n}, a job needs at least one task")
    _number(fields[2], "mean duration")
    given = len(fields) - 3
    if given != n:
        raise ValueError(f"declares {n} task(s) but lists {given} duration(s)")
    durations = tuple(_number(x, f"duration {i}") for i, x in enumerate(fields[3:], 1))
    return TraceJob(arrival, durations)


TASK_CONSTRAINT_WEIGHTS: tuple[float, ...] = tuple(1.0 / (1 + c) for c in range(N_CONSTRAINTS))
"""Popular constraints (low numbers, met by most machines) are asked for more often."""


def task_constraints(rng: random.Random, prob: float) -> int:
    if rng.random() >= prob:
        return 0
    k = 1 if rng.random() < 0.7 else (2 if rng.random() < 0.83 else 3)
    mask = 0
    for c in rng.choices(range(N_CONSTRAINTS), weights=TASK_CONSTRAINT_WEIGHTS, k=k):
        mask |= 1 << c
    return mask


@dataclass
class Job:
    """A job of independent tasks (one stage), as a trace or generator makes it."""

    job_id: JobId
    user: UserId
    arrival: float
    tasks: list[TaskSpec] = field(default_factory=list)


def specs_of(job: Job | DagJob) -> list[TaskSpec]:
    """The task specs of a plain or DAG job, in submission order."""
    return [t.spec if isinstance(t, Task) else t for t in job.tasks]


def to_submission(job: Job | DagJob, token: str, submitted_at: float) -> SubmitJob:
    """The message that submits ``job`` into its user's queue."""
    stages = None
    if isinstance(job, DagJob):
        stages = tuple(
            StageSpec(stage_id=sid, parents=parents, count=n)
            for sid, parents, n in stage_layout(job)
        )
    return SubmitJob(
        job_id=job.job_id,
        user=job.user,
        token=token,
        submitted_at=submitted_at,
        tasks=tuple(specs_of(job)),
        stages=stages,
    )


def check_submittable(job: Job | DagJob, max_body: int) -> None:
    """``ConfigError`` naming the job and field unless a live GM can decode its
    submission: ids of ``[A-Za-z0-9._:@+-]``, 1..200 characters; at most
    ``MAX_JOB_TASKS`` tasks and ``MAX_STAGES`` stages (``common.messages``), in at most
    ``max_body`` bytes.  A simulation runs such a job; a GM dead-letters it,
    undecodable, and the submitter cannot read it back to fail its tasks: ``megha
    bench`` waited out its timeout and called them unfinished."""
    n = len(job.tasks)
    if n > MAX_JOB_TASKS:  # before encoding them all
        raise ConfigError(
            f"job {job.job_id} cannot be submitted to a federation: {n:,} tasks, "
            f"a job holds at most {MAX_JOB_TASKS:,}",
            reason="unsubmittable",
        )
    body = codec.encode(to_submission(job, "-", 0.0))
    try:
        codec.decode(body, expect=SubmitJob, max_size=max_body)
    except InvalidInput as exc:
        raise ConfigError(
            f"job {job.job_id} cannot be submitted to a federation: {exc}",
            reason="unsubmittable",
        ) from None


@dataclass(frozen=True)
class WorkloadSpec:
    """How trace or synthetic jobs become tasks."""

    profile: str = "slots"
    constraints: bool = True
    time_scale: float = 1.0
    """Arrival times are multiplied by this (0.5 = twice the load)."""
    duration_scale: float = 1.0
    task_constraint_prob: float = 0.5


def _tasks(
    job_id: JobId,
    user: UserId,
    durations: Sequence[float],
    spec: WorkloadSpec,
    prof: ResourceProfile,
    rng: random.Random,
) -> list[TaskSpec]:
    tasks = []
    for i, d in enumerate(durations):
        mask = task_constraints(rng, spec.task_constraint_prob) if spec.constraints else 0
        tasks.append(
            TaskSpec(
                task_id=TaskId(f"{job_id}.t{i}"),
                job_id=job_id,
                user=user,
                demand=prof.task_demand(rng),
                duration=d * spec.duration_scale,
                constraints=mask,
            )
        )
    return tasks


def jobs_from_trace(
    trace: Sequence[TraceJob],
    spec: WorkloadSpec,
    users: Sequence[UserConfig],
    rng: random.Random,
) -> list[Job]:
    """Trace jobs as tasks; users take jobs round-robin (a job's tasks share its user)."""
    if not users:
        raise ConfigError("a workload needs at least one user", reason="no_users")
    prof = profile(spec.profile)
    jobs = []
    for k, tj in enumerate(trace):
        user = users[k % len(users)].user
        job_id = JobId(f"j{k}")
        jobs.append(
            Job(
                job_id,
                user,
                tj.arrival * spec.time_scale,
                _tasks(job_id, user, tj.durations, spec, prof, rng),
            )
        )
    return jobs


def synthetic_jobs(
    n_jobs: int,
    *,
    rate: float,
    tasks_per_job: int,
    mean_duration: float,
    spec: WorkloadSpec,
    users: Sequence[UserConfig],
    rng: random.Random,
) -> list[Job]:
    """Poisson arrivals at ``rate`` jobs/s; exponential task durations (seeded)."""
    if rate <= 0 or tasks_per_job <= 0 or mean_duration < 0:
        raise ConfigError("rate and tasks per job must be positive", reason="bad_workload")
    trace = []
    t = 0.0
    for _ in range(n_jobs):
        t += rng.expovariate(rate)
        durations = tuple(
            rng.expovariate(1.0 / mean_duration) if mean_duration > 0 else 0.0
            for _ in range(tasks_per_job)
        )
        trace.append(TraceJob(t, durations))
    return jobs_from_trace(trace, spec, users, rng)
