"""Workloads and clusters: traces, synthetic jobs, resource profiles, constraints.

One place builds what both drivers consume: the simulator and ``megha bench``.

* **Traces** (``../shared/traces``): one job a line, ``arrival n mean d_1 .. d_n``.
  Replayed by default as the Sparrow and Megha simulators do: one slot per worker,
  one slot per task (profile ``slots``).  Profile ``paper`` gives the paper's nodes
  (64 cores, 16 GB) and multi-resource tasks.
* **Placement constraints** (21, after the paper's reference [19]): each LM's
  cluster draws one of three cluster profiles (A, B, C); every machine meets
  constraint *c* with that profile's probability.  A task is constrained with
  probability ``task_constraint_prob`` and then asks for one to three constraints,
  popular ones more often.  [19]'s own tables are not among our sources: the
  probabilities below are our synthetic defaults, shaped as [19] describes (some
  constraints almost universal, a few rare, clusters differing), and every figure
  is a parameter.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.model import N_CONSTRAINTS, NodeSpec, Resources, Task, UserConfig


@dataclass(frozen=True, slots=True)
class TraceJob:
    arrival: float
    durations: tuple[float, ...]


def read_trace(path: str | Path, *, limit_jobs: int | None = None) -> list[TraceJob]:
    """Parse a trace file; a malformed line is a ``ConfigError`` naming it."""
    jobs: list[TraceJob] = []
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read trace {p}: {exc}", reason="trace_unreadable") from exc
    for lineno, line in enumerate(lines, 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            arrival, n = float(fields[0]), int(fields[1])
            durations = tuple(float(x) for x in fields[3 : 3 + n])
        except (ValueError, IndexError) as exc:
            raise ConfigError(
                f"{p}:{lineno}: not 'arrival n mean d1..dn'", reason="bad_trace"
            ) from exc
        if len(durations) != n or n <= 0 or arrival < 0 or any(d < 0 for d in durations):
            raise ConfigError(
                f"{p}:{lineno}: expected {n} non-negative durations, got {len(durations)}",
                reason="bad_trace",
            )
        jobs.append(TraceJob(arrival, durations))
        if limit_jobs is not None and len(jobs) >= limit_jobs:
            break
    jobs.sort(key=lambda j: j.arrival)
    return jobs


@dataclass(frozen=True)
class ResourceProfile:
    """Resource types, node capacity and how task demands are drawn."""

    name: str
    names: tuple[str, ...]
    node_capacity: Resources
    demand_choices: tuple[Resources, ...] = ()

    def task_demand(self, rng: random.Random) -> Resources:
        if len(self.demand_choices) == 1:
            return self.demand_choices[0]
        return rng.choice(self.demand_choices)


PROFILES: dict[str, ResourceProfile] = {
    "slots": ResourceProfile("slots", ("slots",), (1,), ((1,),)),
    # The paper's simulated nodes: 64 cores, 16 GB.  Task demands: millicores x MB.
    "paper": ResourceProfile(
        "paper",
        ("cpu_m", "mem_mb"),
        (64_000, 16_384),
        tuple((c, m) for c in (500, 1000, 2000, 4000, 8000) for m in (256, 512, 1024, 2048)),
    ),
}


def profile(name: str) -> ResourceProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"unknown resource profile {name!r} (known: {', '.join(PROFILES)})",
            reason="unknown_profile",
        ) from None


# Probability that a machine meets each constraint, per cluster profile (see module doc).
CLUSTER_PROFILES: dict[str, tuple[float, ...]] = {
    "A": (0.95, 0.9, 0.9, 0.85, 0.8, 0.75, 0.7, 0.7, 0.6, 0.6, 0.5,
          0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05),
    "B": (0.9, 0.95, 0.8, 0.9, 0.7, 0.8, 0.6, 0.75, 0.55, 0.65, 0.45,
          0.55, 0.4, 0.45, 0.3, 0.35, 0.2, 0.25, 0.1, 0.15, 0.08),
    "C": (0.98, 0.85, 0.95, 0.75, 0.85, 0.65, 0.75, 0.6, 0.7, 0.5, 0.6,
          0.4, 0.5, 0.35, 0.4, 0.25, 0.3, 0.15, 0.2, 0.05, 0.12),
}  # fmt: skip
TASK_CONSTRAINT_WEIGHTS: tuple[float, ...] = tuple(1.0 / (1 + c) for c in range(N_CONSTRAINTS))
"""Popular constraints (low numbers, met by most machines) are asked for more often."""


def machine_constraints(probs: Sequence[float], rng: random.Random) -> int:
    mask = 0
    for c, p in enumerate(probs):
        if rng.random() < p:
            mask |= 1 << c
    return mask


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
    job_id: JobId
    user: UserId
    arrival: float
    tasks: list[Task] = field(default_factory=list)


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
) -> list[Task]:
    tasks = []
    for i, d in enumerate(durations):
        mask = task_constraints(rng, spec.task_constraint_prob) if spec.constraints else 0
        tasks.append(
            Task(
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


@dataclass
class ClusterSpec:
    """One LM's cluster: its nodes and the GM whose partition each belongs to."""

    lm: LmId
    nodes: list[NodeSpec]
    home: list[GmId]
    profile: str = "A"


def make_federation(
    n_workers: int,
    gm_ids: Sequence[GmId],
    n_lms: int,
    prof: ResourceProfile,
    constraints: bool,
    rng: random.Random,
) -> list[ClusterSpec]:
    """Split ``n_workers`` evenly over ``n_lms`` clusters, each into one partition per GM."""
    if n_lms <= 0 or not gm_ids or n_workers < n_lms:
        raise ConfigError(
            f"need at least one worker per LM and one GM ({n_workers} workers, {n_lms} LMs)",
            reason="bad_federation",
        )
    clusters = []
    all_met = (1 << N_CONSTRAINTS) - 1
    for k in range(n_lms):
        size = n_workers // n_lms + (1 if k < n_workers % n_lms else 0)
        name = rng.choice(sorted(CLUSTER_PROFILES))
        probs = CLUSTER_PROFILES[name]
        nodes = [
            NodeSpec(
                prof.node_capacity, machine_constraints(probs, rng) if constraints else all_met
            )
            for _ in range(size)
        ]
        per = math.ceil(size / len(gm_ids))
        home = [gm_ids[min(i // per, len(gm_ids) - 1)] for i in range(size)]
        clusters.append(ClusterSpec(LmId(f"lm{k}"), nodes, home, name))
    return clusters


def default_users(gm_ids: Sequence[GmId]) -> list[UserConfig]:
    """One user per GM with equal shares."""
    share = 1.0 / len(gm_ids)
    return [UserConfig(UserId(f"u{i}"), g, share) for i, g in enumerate(gm_ids)]


def parse_users(text: str, gm_ids: Sequence[GmId]) -> list[UserConfig]:
    """``"alice:0.1@gm0,bob:0.25@gm1"``; empty means :func:`default_users`."""
    if not text.strip():
        return default_users(gm_ids)
    users = []
    for item in text.split(","):
        try:
            name, rest = item.strip().split(":")
            share_s, gm = rest.split("@")
            share = float(share_s)
        except ValueError:
            raise ConfigError(
                f"bad user spec {item!r}: expected NAME:SHARE@GM", reason="bad_users"
            ) from None
        if gm not in gm_ids:
            raise ConfigError(f"user {name!r} maps to unknown GM {gm!r}", reason="bad_users")
        if not 0 < share <= 1:
            raise ConfigError(f"user {name!r}: share must be in (0, 1]", reason="bad_users")
        users.append(UserConfig(UserId(name), GmId(gm), share))
    if len({u.user for u in users}) != len(users):
        raise ConfigError("a user may appear once", reason="bad_users")
    if sum(u.share for u in users) > 1.0 + 1e-9:
        raise ConfigError("user shares add up to more than 1", reason="bad_users")
    return users
