"""``megha simulate`` at one federation size or several (every product of ``--workers``,
``--gms`` and ``--lms``): each point into its own directory, then ``sweep.json`` and
``sweep.png``; a single point's ``summary.json`` gets the run's wall and CPU seconds.

A sweep's points run one after another (``--cluster serial``) or each as a task on a
Dask distributed cluster (``simulator.dask_sweep``): a ``LocalCluster`` of the
machine's cores (``local``, the default) or a running scheduler (``tcp://HOST:8786``).
Either way a point that fails is reported and run once more; a point that fails twice
is written to ``sweep-failures.json`` and ends the sweep with ``PointsFailed`` once
every other point is done.  A bad input (``ConfigError``) is never retried.
"""

from __future__ import annotations

import argparse
import itertools
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from reporting.files import output_dir, read_json, write_json
from reporting.sweep import sweep_table, write_sweep

PointRun = Callable[[argparse.Namespace, int, int, int, Path], dict[str, Any]]
"""Runs one federation size (workers, GMs, LMs) into a directory; returns its summary."""

Point = tuple[int, int, int]
"""A federation size: workers, GMs, LMs."""

ATTEMPTS = 2
"""A point that fails is run once more."""


class PointsFailed(Exception):
    """Some points of a sweep failed twice; the others' files are written."""

    def __init__(self, failures: list[dict[str, Any]]) -> None:
        names = ", ".join(f["point"] for f in failures)
        super().__init__(f"{len(failures)} point(s) failed twice: {names}")
        self.failures = failures


@dataclass
class SweepWatch:
    """What a sweep tells as it goes: ``done(k, n)`` points finished of ``n``;
    ``failed(point, error, again)`` a point failed (``again``: it is run once more)."""

    done: Callable[[int, int], None] = lambda k, n: None
    failed: Callable[[str, str, bool], None] = lambda point, error, again: None
    failures: list[dict[str, Any]] = field(default_factory=list)


def point_name(p: Point) -> str:
    return f"w{p[0]}_g{p[1]}_l{p[2]}"


def error_text(exc: BaseException) -> str:
    """An exception as one line: its type and message."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _serial(
    args: argparse.Namespace, point: PointRun, points: list[Point], out: Path, watch: SweepWatch
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each point in this process, in order; a failure reported and retried once."""
    for k, p in enumerate(points):
        target = out if len(points) == 1 else out / point_name(p)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                yield k, point(args, *p, target)
                break
            except ConfigError:
                raise
            except Exception as exc:
                again = attempt < ATTEMPTS
                watch.failed(point_name(p), error_text(exc), again)
                if not again:
                    watch.failures.append(
                        {"point": point_name(p), "error": error_text(exc), "attempts": attempt}
                    )


def run_points(
    args: argparse.Namespace,
    point: PointRun,
    report: Callable[[dict[str, Any]], None],
    watch: SweepWatch | None = None,
) -> list[dict[str, Any]]:
    """Every point of ``args`` by ``point`` into ``args.out`` (made first, before any
    work), each summary handed to ``report`` as it is done; the summaries, in the
    order of the points.  ``args.cluster`` (``serial`` if absent) says where a sweep's
    points run; a single point always runs here."""
    out = output_dir(args.out)
    watch = watch or SweepWatch()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    points = list(itertools.product(args.workers, args.gms, args.lms))
    where = getattr(args, "cluster", "serial")
    if len(points) > 1 and where != "serial":
        from simulator.dask_sweep import distributed_points

        results = distributed_points(args, point, points, out, where, watch)
    else:
        results = _serial(args, point, points, out, watch)
    done: dict[int, dict[str, Any]] = {}
    for k, s in results:
        report(s)
        done[k] = s
        watch.done(len(done), len(points))
    summaries = [done[k] for k in sorted(done)]
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if len(points) > 1:
        write_sweep(out, sweep_table(summaries))
    elif summaries:
        data = read_json(out / "summary.json")
        data["wall_s"], data["cpu_s"] = round(wall, 3), round(cpu, 3)
        data["timing"] = summaries[0]["timing"]
        write_json(out / "summary.json", data)
    if watch.failures:
        write_json(out / "sweep-failures.json", watch.failures)
        raise PointsFailed(watch.failures)
    return summaries
