"""The published production traces -- Google's 2011 ``task_events`` and 2019
``instance_events``, Alibaba's 2018 ``batch_task`` -- as jobs, read as they are
replayed: the one entry point of ``megha simulate`` and ``megha bench``
(``--trace-format``), so a trace makes the same jobs from the same seed in both."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from common.dag import DagJob
from common.model import UserConfig
from workload import PUBLISHED
from workload.alibaba import AlibabaReplay
from workload.google import GoogleReplay, read_google
from workload.jobs import Job
from workload.synthetic import WorkloadSpec, dags_from_trace, iter_jobs_from_trace

TraceReader = GoogleReplay | AlibabaReplay


def published_jobs(
    fmt: str,
    files: Sequence[str | Path],
    spec: WorkloadSpec,
    users: Sequence[UserConfig],
    rng: random.Random,
    lookahead: float = math.inf,
) -> tuple[Iterator[Job | DagJob], TraceReader]:
    """The jobs of trace ``files`` in format ``fmt`` (``PUBLISHED``), in arrival order,
    made as they are taken, and the reader (its ``stats``: what was read, cut, dropped).
    ``lookahead``: Google's; a task still running this long after its job arrived is
    cut there."""
    jobs: Iterator[Job | DagJob]
    reader: TraceReader
    if fmt == "alibaba2018":
        reader = AlibabaReplay(files)
        jobs = dags_from_trace(reader, spec, users, rng)
    elif fmt in PUBLISHED:
        reader = read_google(fmt, files, lookahead)
        jobs = iter_jobs_from_trace(reader, spec, users, rng)
    else:
        raise ValueError(f"not a published trace format: {fmt!r}")
    return jobs, reader
