"""A sweep's files (``megha simulate`` over several federation sizes): ``sweep.json``,
one row per scheduler and point with its allocation-time tails and what the run cost,
and ``sweep.png``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reporting.files import write_json
from reporting.plots import plot_sweep


def sweep_table(summaries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per point and scheduler: the point, its allocation time's percentiles
    and its ``timing``."""
    return [
        {
            "scheduler": name,
            "workers": s["workers"],
            "gms": s["gms"],
            "lms": s["lms"],
            **sch["allocation_time_s"],
            **s["timing"][name],
        }
        for s in summaries
        for name, sch in s["schedulers"].items()
    ]


def write_sweep(out: Path, table: Sequence[Mapping[str, Any]]) -> None:
    """``sweep.json`` and ``sweep.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "sweep.json", list(table))
    plot_sweep(out / "sweep.png", table)
