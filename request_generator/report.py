"""Allocation-time reports as files: CSV rows and PNG plots.

Shared by ``megha simulate`` and ``megha bench``; the figures themselves
(percentiles, summaries, one definition each) are ``common.metrics``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from common.errors import ConfigError
from common.metrics import TASK_COLUMNS, percentiles, task_row
from common.model import COMPONENTS, Task, TaskKey


def output_dir(path: str | Path) -> Path:
    """The directory of a run's files, made now (before any work) and writable; a
    ``ConfigError`` saying why not (an existing file of that name, no such parent, no
    permission)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise ConfigError(
            f"--out {path}: cannot make the directory ({why}); choose another --out",
            reason="bad_output_dir",
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--out {path}: the directory is not writable; choose another --out",
            reason="bad_output_dir",
        )
    return out


class TaskCsv:
    """``tasks.csv`` written as tasks end: a header (``TASK_COLUMNS``), then one
    ``task_row`` per task, flushed every ``flush_every`` rows and on ``close``."""

    def __init__(self, path: Path, *, flush_every: int = 1000) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.rows = 0
        self._fh: IO[str] = path.open("w", newline="")
        self._writer = csv.writer(self._fh)
        self._writer.writerow(TASK_COLUMNS)
        self._flush_every = max(1, flush_every)

    def write(self, task: Task, failure: str | None = None) -> None:
        """``task``'s row; ``failure``: why it failed, None unless it did."""
        self._writer.writerow(task_row(task, failure))
        self.rows += 1
        if self.rows % self._flush_every == 0:
            self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> TaskCsv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_records_csv(
    path: Path, tasks: Iterable[Task], failed: Mapping[TaskKey, str] | None = None
) -> None:
    """``tasks`` to ``path``; ``failed``: why each task that failed did."""
    why = failed or {}
    with TaskCsv(path) as out:
        for t in tasks:
            out.write(t, why.get(t.key))


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdfs(path: Path, series: Mapping[str, Sequence[float]], title: str) -> None:
    """Allocation-time CDFs of several schedulers on one log-x plot."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = 0
    for label, values in series.items():
        xs = sorted(max(v, 1e-6) for v in values)
        if not xs:
            continue
        drawn += 1
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
    if drawn:
        ax.legend(loc="lower right")
    else:  # (an empty workload, or every task refused): say so rather than an empty frame
        ax.text(0.5, 0.5, "no task started", ha="center", va="center", transform=ax.transAxes)
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
