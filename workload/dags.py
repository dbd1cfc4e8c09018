"""Seeded synthetic DAG jobs shaped like Carbyne's workload analysis (seed §2.2).

The paper's TPC-DS / TPC-H / BigBench / production DAGs have about 7 stages at the
median and 20+ at the 95th percentile, several barriers (stages with more than one
parent), and a critical path of about 5 stages.  ``DagShape`` holds those targets:

* stages per job: log-normal with the given median and 95th percentile;
* critical path (in stages): log-normal around ``median_depth``, at most the stages;
  the first ``depth`` stages form a chain, the others hang at random levels;
* each stage past level 0 has one parent on the level above and, with probability
  ``barrier_prob``, one or two more from earlier levels (a barrier);
* tasks per stage: log-normal (median ``median_tasks``); every task of a stage has
  the stage's demand; durations vary by +-20% around the stage's log-normal one;
* demands are integer vectors drawn as fractions of one node's capacity.

Arrivals are Poisson at ``rate`` jobs/s; jobs go to users round-robin.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from msgspec.structs import replace

from common.dag import DagJob, levels, make_job
from common.errors import ConfigError
from common.metrics import nearest_rank
from common.model import Resources, UserConfig

Z95 = 1.6449


@dataclass(frozen=True)
class DagShape:
    """Targets of the synthetic DAGs (defaults: the paper's Table 1-2 medians)."""

    median_stages: float = 7.0
    p95_stages: float = 22.0
    max_stages: int = 40
    median_depth: float = 5.0
    barrier_prob: float = 0.5
    median_tasks: float = 4.0
    tasks_sigma: float = 0.9
    max_tasks: int = 40
    median_duration: float = 10.0
    duration_sigma: float = 0.7
    demand_range: tuple[float, float] = (0.05, 0.35)
    """Fraction of one node's capacity a task asks for, per resource."""


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def synthetic_dag(
    job_id: str,
    user: str,
    arrival: float,
    node_capacity: Resources,
    rng: random.Random,
    shape: DagShape = DagShape(),
) -> DagJob:
    """One DAG job drawn from ``shape``."""
    sigma = math.log(shape.p95_stages / shape.median_stages) / Z95
    n = max(1, min(shape.max_stages, round(_lognormal(rng, shape.median_stages, sigma))))
    depth = max(1, min(n, round(_lognormal(rng, shape.median_depth, 0.35))))
    level = list(range(depth)) + [rng.randrange(depth) for _ in range(n - depth)]
    level.sort()
    by_level: dict[int, list[int]] = {}
    for s, lv in enumerate(level):
        by_level.setdefault(lv, []).append(s)
    lo, hi = shape.demand_range
    stages: list[tuple[int, list[tuple[Resources, float]], list[int]]] = []
    for s, lv in enumerate(level):
        parents: list[int] = []
        if lv > 0:
            parents.append(rng.choice(by_level[lv - 1]))
            if rng.random() < shape.barrier_prob:
                earlier = [p for p in range(s) if level[p] < lv and p not in parents]
                for p in rng.sample(earlier, min(len(earlier), rng.randint(1, 2))):
                    parents.append(p)
        count = max(
            1, min(shape.max_tasks, round(_lognormal(rng, shape.median_tasks, shape.tasks_sigma)))
        )
        if len(node_capacity) == 1 and node_capacity[0] == 1:
            demand: Resources = (1,)
        else:
            demand = tuple(max(1, round(c * rng.uniform(lo, hi))) for c in node_capacity)
        base = _lognormal(rng, shape.median_duration, shape.duration_sigma)
        tasks = [(demand, round(base * rng.uniform(0.8, 1.2), 3)) for _ in range(count)]
        stages.append((s, tasks, sorted(parents)))
    return make_job(job_id, user, arrival, stages)


def synthetic_dag_jobs(
    n_jobs: int,
    *,
    rate: float,
    users: Sequence[UserConfig],
    node_capacity: Resources,
    rng: random.Random,
    shape: DagShape = DagShape(),
) -> list[DagJob]:
    """``n_jobs`` DAG jobs with Poisson arrivals at ``rate`` jobs/s (seeded by ``rng``)."""
    if n_jobs < 0 or rate <= 0:
        raise ConfigError("DAG workload: need n_jobs >= 0 and rate > 0", reason="bad_workload")
    if not users:
        raise ConfigError("a workload needs at least one user", reason="no_users")
    jobs: list[DagJob] = []
    t = 0.0
    for k in range(n_jobs):
        t += rng.expovariate(rate)
        user = users[k % len(users)].user
        jobs.append(synthetic_dag(f"d{k}", user, round(t, 6), node_capacity, rng, shape))
    return jobs


def scale_jobs(
    jobs: Sequence[DagJob],
    *,
    time_scale: float = 1.0,
    duration_scale: float = 1.0,
    limit_jobs: int | None = None,
) -> list[DagJob]:
    """The first ``limit_jobs`` of ``jobs`` (all: None), arrivals multiplied by
    ``time_scale`` and task durations by ``duration_scale``, in place: what
    ``--time-scale``, ``--duration-scale`` and ``--limit-jobs`` do to a trace, for DAG
    jobs (synthetic or from a job file)."""
    if limit_jobs is not None and limit_jobs < 1:
        raise ConfigError(f"limit_jobs must be at least 1, got {limit_jobs}", reason="bad_workload")
    kept = list(jobs if limit_jobs is None else jobs[:limit_jobs])
    for j in kept:
        j.arrival *= time_scale
        if duration_scale != 1.0:
            for t in j.tasks:
                t.spec = replace(t.spec, duration=t.spec.duration * duration_scale)
    return kept


def carbyne_fig2_jobs() -> list[DagJob]:
    """The Carbyne paper's Fig. 2: two jobs on one resource (1.0 = 100 units), both at
    time 0.  J1: S0 (2 tasks of 0.04), S1 (3 of 0.21), S2 (1 of 0.10, 0.1 s) after both;
    J2: S0 (2 tasks of 0.29).  Average JCT 2.05 under DRF, 1.55 with altruism."""
    j1 = make_job(
        "J1",
        "u1",
        0.0,
        [
            (0, [((4,), 1.0)] * 2, []),
            (1, [((21,), 1.0)] * 3, []),
            (2, [((10,), 0.1)], [0, 1]),
        ],
    )
    j2 = make_job("J2", "u2", 0.0, [(0, [((29,), 1.0)] * 2, [])])
    return [j1, j2]


def dag_stats(jobs: Sequence[DagJob]) -> dict[str, float]:
    """Median / p95 of stages, barriers and critical path (in stages) of ``jobs``."""

    def pct(xs: list[int], q: float) -> float:
        return float(nearest_rank(sorted(xs), q))

    stages, barriers, depths, tasks = [], [], [], []
    for j in jobs:
        stages.append(len(j.stages))
        barriers.append(sum(1 for s in j.stages if len(s.parents) > 1))
        depths.append(1 + max(levels({s.stage_id: s.parents for s in j.stages}).values()))
        tasks.append(len(j.tasks))
    return {
        "stages_p50": pct(stages, 0.5),
        "stages_p95": pct(stages, 0.95),
        "barriers_p50": pct(barriers, 0.5),
        "critical_path_p50": pct(depths, 0.5),
        "tasks_p50": pct(tasks, 0.5),
        "tasks_total": float(sum(tasks)),
    }
