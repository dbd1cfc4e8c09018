"""The runs' plots as PNG files: allocation-time CDFs, their components, each user's
dominant share over time, and a sweep's tails by federation size (matplotlib, Agg).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.ids import UserId
from common.model import COMPONENTS, UserConfig
from reporting.tally import Floats, tails

_RENDERERS: dict[tuple[int, float, float, float], Any] = {}
"""Agg renderers by thread, size in pixels and dpi, shared by the figures drawn here
(``_figure``): each draw clears its renderer first, and the sizes of a figure's texts,
which matplotlib keeps by renderer, need not be measured again for the next figure."""
_KEEP_RENDERERS = 8


@functools.cache
def _canvas_class() -> Any:
    """An Agg canvas that draws into the shared renderer of its size (``_RENDERERS``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg

    class SharedCanvas(FigureCanvasAgg):
        def get_renderer(self) -> RendererAgg:
            w, h = self.get_width_height(physical=True)
            key = (threading.get_ident(), w, h, self.figure.dpi)
            renderer = _RENDERERS.get(key)
            if renderer is None:
                while len(_RENDERERS) >= _KEEP_RENDERERS:
                    del _RENDERERS[next(iter(_RENDERERS))]
                renderer = RendererAgg(w, h, self.figure.dpi)  # type: ignore[no-untyped-call]
                _RENDERERS[key] = renderer
            self.renderer, self._lastKey = renderer, key[1:]
            return renderer

    return SharedCanvas


def _figure(figsize: tuple[float, float], *grid: int) -> tuple[Any, Any]:
    """A figure of ``figsize`` inches and its axes (``Figure.subplots(*grid)``), drawn by
    Agg into a shared renderer, without pyplot's bookkeeping (a figure manager, the
    list of open figures): the same pixels as ``pyplot.subplots``, in less time."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    _canvas_class()(fig)
    return fig, fig.subplots(*grid)


def plot_cdfs(path: Path, series: Mapping[str, Sequence[float] | Floats], title: str) -> None:
    """Allocation-time CDFs of several schedulers on one log-x plot (each series a list
    or an array of 8-byte floats, in any order)."""
    fig, ax = _figure((7, 4.5))
    drawn = 0
    for label, values in series.items():
        xs = np.sort(np.maximum(np.asarray(values, dtype=np.float64), 1e-6))
        if not len(xs):
            continue
        drawn += 1
        n = len(xs)
        step = max(1, n // 4000)  # a few thousand points draw the same curve
        pts = [*xs[::step].tolist(), float(xs[-1])]
        ys = [*(min(1.0, (i * step + 1) / n) for i in range(len(pts) - 1)), 1.0]
        ax.plot(pts, ys, label=f"{label} (p99 {tails(values)['p99']:.3g} s)")
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


def plot_components(path: Path, components: Mapping[str, Mapping[str, Any]], title: str) -> None:
    """Mean and p99 of each allocation-time component, per scheduler (grouped bars)."""
    labels = list(components)
    fig, axes = _figure((10, 4), 1, 2)
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


def plot_shares(
    path: Path,
    samples: Iterable[tuple[float, Mapping[UserId, float]]],
    users: Sequence[UserConfig],
    title: str,
) -> None:
    """Each user's dominant share over time (solid) and configured share (dashed);
    ``samples`` may be a step function's corners (``UsageSeries.corners``): the same
    line, held in memory as many points as the usage changed, not one per sample."""
    fig, ax = _figure((8, 4.5))
    samples = list(samples)
    ts = [t for t, _ in samples]
    for k, u in enumerate(users):
        color = f"C{k % 10}"
        ax.plot(ts, [s.get(u.user, 0.0) for _, s in samples], color=color,
                label=f"{u.user} (share {u.share:g})", linewidth=1)  # fmt: skip
        ax.axhline(u.share, color=color, linestyle="--", linewidth=0.8)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("dominant share of the federation")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_sweep(path: Path, table: Sequence[Mapping[str, Any]]) -> None:
    """p50 and p99 allocation time of each scheduler at each federation size of a sweep."""
    fig, ax = _figure((8, 4.5))
    by_sched: dict[str, list[Mapping[str, Any]]] = {}
    for row in table:
        by_sched.setdefault(row["scheduler"], []).append(row)
    for name, rows in by_sched.items():
        labels = [f"{r['workers']}/{r['gms']}/{r['lms']}" for r in rows]
        for stat, style in (("p50", "o--"), ("p99", "s-")):
            ax.plot(labels, [max(r[stat], 1e-6) for r in rows], style, label=f"{name} {stat}")
    ax.set_yscale("log")
    ax.set_xlabel("workers / GMs / LMs")
    ax.set_ylabel("allocation time (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
