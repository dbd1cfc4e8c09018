"""Allocation-time reports: tails, components, per-user figures, CSV rows and PNG plots.

Shared by ``megha simulate`` and ``megha bench`` so both speak the same keys:
``p50 p90 p99 p999 max mean`` for allocation time and each of its components
(SPEC §3: queueing, processing, worker queueing, communication).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common.model import COMPONENTS, Task, WaitReason

PERCENTILE_KEYS = ("p50", "p90", "p99", "p999", "max", "mean")


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """Nearest-rank percentiles (no interpolation: every figure is a measured value)."""
    if not values:
        return dict.fromkeys(PERCENTILE_KEYS, 0.0)
    xs = sorted(values)
    n = len(xs)

    def rank(q: float) -> float:
        return xs[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return {
        "p50": rank(0.5),
        "p90": rank(0.9),
        "p99": rank(0.99),
        "p999": rank(0.999),
        "max": xs[-1],
        "mean": math.fsum(xs) / n,
    }


def task_record(task: Task) -> dict[str, Any]:
    """One row per task: identity, timestamps, allocation time and its split."""
    row: dict[str, Any] = {
        "task_id": task.task_id,
        "job_id": task.job_id,
        "user": task.user,
        "gm": task.gm or "",
        "submitted_at": round(task.submitted_at, 9),
        "started_at": round(task.started_at, 9),
        "finished_at": round(task.finished_at, 9),
        "allocation_s": round(task.allocation_time, 9),
    }
    for name, value in zip(COMPONENTS, task.spent, strict=False):
        row[f"{name}_s"] = round(value, 9)
    row["attempts"] = task.attempts
    for reason in WaitReason:
        row[f"waits_{reason.name.lower()}"] = task.waits[reason]
    return row


def summarize_tasks(tasks: Sequence[Task]) -> dict[str, Any]:
    """Tails of the tasks that started, per component and per user."""
    started = [t for t in tasks if t.started_at >= 0]
    alloc = [t.allocation_time for t in started]
    per_user: dict[str, list[float]] = {}
    for t in started:
        per_user.setdefault(t.user, []).append(t.allocation_time)
    waits = {r.name.lower(): sum(t.waits[r] for t in tasks) for r in WaitReason}
    waited = {r.name.lower(): sum(1 for t in tasks if t.waits[r]) for r in WaitReason}
    return {
        "allocation_time_s": percentiles(alloc),
        "components_s": {
            name: percentiles([t.spent[i] for t in started]) for i, name in enumerate(COMPONENTS)
        },
        "per_user": {u: percentiles(v) for u, v in sorted(per_user.items())},
        "tasks": len(tasks),
        "tasks_started": len(started),
        "wait_reasons": {"decisions": waits, "tasks": waited},
    }


def write_records_csv(path: Path, tasks: Sequence[Task]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer: csv.DictWriter[str] | None = None
        for t in tasks:
            row = task_record(t)
            if writer is None:
                writer = csv.DictWriter(fh, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdfs(path: Path, series: Mapping[str, Sequence[float]], title: str) -> None:
    """Allocation-time CDFs of several schedulers on one log-x plot."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, values in series.items():
        xs = sorted(max(v, 1e-6) for v in values)
        if not xs:
            continue
        n = len(xs)
        step = max(1, n // 4000)  # a few thousand points draw the same curve
        pts = [*xs[::step], xs[-1]]
        ys = [*(min(1.0, (i * step + 1) / n) for i in range(len(pts) - 1)), 1.0]
        ax.plot(pts, ys, label=f"{label} (p99 {percentiles(values)['p99']:.3g} s)")
    ax.set_xscale("log")
    ax.set_xlabel("allocation time (s, log scale)")
    ax.set_ylabel("fraction of tasks")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_components(path: Path, components: Mapping[str, Mapping[str, Any]], title: str) -> None:
    """Mean and p99 of each allocation-time component, per scheduler (grouped bars)."""
    plt = _pyplot()
    labels = list(components)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(1, len(COMPONENTS))
    for ax, stat in zip(axes, ("mean", "p99"), strict=True):
        for k, comp in enumerate(COMPONENTS):
            vals = [float(components[lb][comp][stat]) for lb in labels]
            ax.bar([i + k * width for i in range(len(labels))], vals, width, label=comp)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels)
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.set_ylabel(f"{stat} (s)")
        ax.set_title(f"{title}: {stat}")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) < 1e-3:
        return f"{x * 1e6:.0f}us"
    if abs(x) < 1:
        return f"{x * 1e3:.2f}ms"
    return f"{x:.2f}s"


def format_table(rows: Mapping[str, Mapping[str, float]]) -> str:
    """A printable table: one row per scheduler, one column per percentile."""
    header = f"{'':<14}" + "".join(f"{k:>11}" for k in PERCENTILE_KEYS)
    lines = [header]
    for label, p in rows.items():
        lines.append(f"{label:<14}" + "".join(f"{_fmt(p[k]):>11}" for k in PERCENTILE_KEYS))
    return "\n".join(lines)
