"""``megha simulate`` at one federation size or several (every product of ``--workers``,
``--gms`` and ``--lms``): each point into its own directory, then ``sweep.json`` and
``sweep.png``; a single point's ``summary.json`` gets the run's wall and CPU seconds."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reporting.files import output_dir, read_json, write_json
from reporting.sweep import sweep_table, write_sweep

PointRun = Callable[[argparse.Namespace, int, int, int, Path], dict[str, Any]]
"""Runs one federation size (workers, GMs, LMs) into a directory; returns its summary."""


def run_points(
    args: argparse.Namespace, point: PointRun, report: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Every point of ``args`` by ``point`` into ``args.out`` (made first, before any
    work), each summary handed to ``report`` as it is done; the summaries."""
    out = output_dir(args.out)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    points = list(itertools.product(args.workers, args.gms, args.lms))
    summaries = []
    for workers, g, lm in points:
        target = out if len(points) == 1 else out / f"w{workers}_g{g}_l{lm}"
        s = point(args, workers, g, lm, target)
        report(s)
        summaries.append(s)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if len(points) > 1:
        write_sweep(out, sweep_table(summaries))
    else:
        data = read_json(out / "summary.json")
        data["wall_s"], data["cpu_s"] = round(wall, 3), round(cpu, 3)
        data["timing"] = summaries[0]["timing"]
        write_json(out / "summary.json", data)
    return summaries
