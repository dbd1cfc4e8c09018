"""Priority classes for a replayed workload: which jobs are of which class.

``--priorities 2:0.1,1:0.2`` makes each job class 2 with probability 0.1, class 1 with
0.2, else class 0 (drawn per job from its own seeded generator, so the jobs, their
tasks and constraints are the same with and without classes).  Pure.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence

from msgspec.structs import replace

from common.errors import ConfigError
from common.model import MAX_PRIORITY
from workload.jobs import Job


def parse_classes(text: str) -> dict[int, float]:
    """``CLASS:FRACTION,...`` -> {class: fraction of the jobs}; the rest are class 0."""
    out: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        cls, sep, frac = part.partition(":")
        try:
            c, f = int(cls), float(frac)
        except ValueError:
            c, f = -1, -1.0
        if not sep or not 1 <= c <= MAX_PRIORITY or not 0.0 < f <= 1.0 or c in out:
            raise ConfigError(
                f"priority classes are CLASS:FRACTION with CLASS 1-{MAX_PRIORITY}, each once, "
                f"and FRACTION in (0, 1]; got {part!r}",
                reason="bad_priorities",
            )
        out[c] = f
    if sum(out.values()) > 1.0 + 1e-9:
        raise ConfigError(
            f"priority class fractions add up to more than 1: {text!r}", reason="bad_priorities"
        )
    return out


def with_priorities(jobs: Sequence[Job], classes: dict[int, float], seed: int) -> list[Job]:
    """``jobs`` with each job's tasks in the class drawn for it."""
    return list(iter_with_priorities(jobs, classes, seed))


def iter_with_priorities(
    jobs: Iterable[Job], classes: dict[int, float], seed: int
) -> Iterator[Job]:
    """``with_priorities`` one job at a time, as ``jobs`` yields them."""
    rng = random.Random(f"{seed}:priorities")
    ranked = sorted(classes.items(), reverse=True)
    for job in jobs:
        x, cls = rng.random(), 0
        for c, f in ranked:
            if x < f:
                cls = c
                break
            x -= f
        tasks = [replace(t, priority=cls) for t in job.tasks] if cls else list(job.tasks)
        yield Job(job.job_id, job.user, job.arrival, tasks)
