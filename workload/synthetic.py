"""How a workload's jobs become tasks: a trace's jobs, or synthetic ones (Poisson
arrivals, exponential durations), with demands from a resource profile and placement
constraints.  One place builds what both drivers consume: the simulator and ``megha
bench``.  The clusters they run on (profiles, machines, partitions, users) are
``common.cluster``.

* Traces (``workload.traces``) are replayed by default as the Sparrow and Megha
  simulators do: one slot per worker, one slot per task (profile ``slots``).  Profile
  ``paper`` gives the paper's nodes (64 cores, 16 GB) and multi-resource tasks.
* **Task constraints** (21, after the paper's reference [19]): a task is
  constrained with probability ``task_constraint_prob`` and then asks for one to
  three constraints, popular ones (met by most machines) more often.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from msgspec.structs import replace

from common.cluster import ResourceProfile, profile
from common.dag import DagJob, from_layout
from common.errors import ConfigError
from common.ids import JobId, TaskId, UserId
from common.model import N_CONSTRAINTS, Task, TaskSpec, UserConfig
from workload.alibaba import TraceDag
from workload.jobs import Job
from workload.traces import TraceJob

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
    trace: Iterable[TraceJob],
    spec: WorkloadSpec,
    users: Sequence[UserConfig],
    rng: random.Random,
) -> list[Job]:
    """Trace jobs as tasks; users take jobs round-robin (a job's tasks share its user)."""
    return list(iter_jobs_from_trace(trace, spec, users, rng))


def iter_jobs_from_trace(
    trace: Iterable[TraceJob],
    spec: WorkloadSpec,
    users: Sequence[UserConfig],
    rng: random.Random,
) -> Iterator[Job]:
    """``jobs_from_trace`` one job at a time, as ``trace`` yields them (a streamed trace
    is never held whole)."""
    if not users:
        raise ConfigError("a workload needs at least one user", reason="no_users")
    prof = profile(spec.profile)
    for k, tj in enumerate(trace):
        user = users[k % len(users)].user
        job_id = JobId(f"j{k}")
        yield Job(
            job_id,
            user,
            tj.arrival * spec.time_scale,
            _tasks(job_id, user, tj.durations, spec, prof, rng),
        )


def dags_from_trace(
    trace: Iterable[TraceDag],
    spec: WorkloadSpec,
    users: Sequence[UserConfig],
    rng: random.Random,
) -> Iterator[DagJob]:
    """A DAG trace's jobs (``workload.alibaba``) as DAG jobs, one at a time: users
    round-robin, each stage's tasks with demands and constraints as a trace's tasks."""
    if not users:
        raise ConfigError("a workload needs at least one user", reason="no_users")
    prof = profile(spec.profile)
    for k, tj in enumerate(trace):
        user = users[k % len(users)].user
        job_id = JobId(f"j{k}")
        tasks: list[Task] = []
        for st in tj.stages:
            specs = _tasks(job_id, user, [st.duration] * st.count, spec, prof, rng)
            tasks += [
                Task(spec=replace(t, task_id=TaskId(f"{job_id}.s{st.stage_id}.t{i}")))
                for i, t in enumerate(specs)
            ]
        layout = tuple((st.stage_id, st.parents, st.count) for st in tj.stages)
        yield from_layout(job_id, user, tj.arrival * spec.time_scale, tasks, layout)


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
    return list(
        iter_synthetic_jobs(
            n_jobs,
            rate=rate,
            tasks_per_job=tasks_per_job,
            mean_duration=mean_duration,
            spec=spec,
            users=users,
            rng=rng,
        )
    )


def iter_synthetic_jobs(
    n_jobs: int,
    *,
    rate: float,
    tasks_per_job: int,
    mean_duration: float,
    spec: WorkloadSpec,
    users: Sequence[UserConfig],
    rng: random.Random,
) -> Iterator[Job]:
    """``synthetic_jobs`` one job at a time, made as it is taken: the same jobs, from
    the same draws, never held whole.

    The list draws every arrival and duration first, then every task's constraints and
    demand; made lazily, the arrivals and durations come from ``rng`` and the rest from
    a copy of it moved past those draws (one ``random()`` each), so each job is the
    one the list holds.  ``rng`` is left where the arrivals left it."""
    if rate <= 0 or tasks_per_job <= 0 or mean_duration < 0:
        raise ConfigError("rate and tasks per job must be positive", reason="bad_workload")
    rest = random.Random()
    rest.setstate(rng.getstate())
    draws = n_jobs * (1 + (tasks_per_job if mean_duration > 0 else 0))
    for _ in range(draws):  # each expovariate of the arrivals and durations is one random()
        rest.random()
    return iter_jobs_from_trace(
        _synthetic_trace(n_jobs, rate, tasks_per_job, mean_duration, rng), spec, users, rest
    )


def _synthetic_trace(
    n_jobs: int, rate: float, tasks_per_job: int, mean_duration: float, rng: random.Random
) -> Iterator[TraceJob]:
    """Poisson arrivals and exponential durations, one job at a time."""
    t = 0.0
    for _ in range(n_jobs):
        t += rng.expovariate(rate)
        durations = tuple(
            rng.expovariate(1.0 / mean_duration) if mean_duration > 0 else 0.0
            for _ in range(tasks_per_job)
        )
        yield TraceJob(t, durations)
