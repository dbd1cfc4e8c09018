"""Soak: a live federation at 70% load for a long time; does any process keep growing?

Starts 3 GMs x 3 LMs x 120 nodes (as ``bench_live.py``), drives ``megha bench`` at 70%
of capacity for ``--minutes``, samples the resident memory of every service process
(and of this client) every ``--every`` seconds, and fits each process's growth after
the warm-up (least squares, MB/min).  Finished tasks must leave no per-task state
behind: the goal is <= 1 MB/min per process.

    python benchmarks/bench_soak.py --minutes 30 --out results/soak

Writes ``soak.json`` (growth per process, the bench summary's lost/duplicate counts),
``rss.csv`` (every sample) and ``rss.png``.  Needs RabbitMQ on 127.0.0.1:5672.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig
from federation.processes import service_pids, start_federation, stop_federation
from federation.provision import purge
from request_generator.bench import BenchOptions, bench

NODES = 120
MEAN_S = 0.5
TASKS_PER_JOB = 4
GOAL_MB_PER_MIN = 1.0


def rss_mb(pid: int) -> float | None:
    """Resident set size of ``pid`` in MB (None once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per minute."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mm = sum(m for _, m in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return 60 * sum((t - mt) * (m - mm) for t, m in points) / var


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the load runs")
    ap.add_argument("--load", type=float, default=0.7, help="offered load, share of capacity")
    ap.add_argument("--every", type=float, default=15.0, help="seconds between RSS samples")
    ap.add_argument("--warmup", type=float, default=5.0, help="minutes left out of the fit")
    ap.add_argument("--base-port", type=int, default=18850)
    ap.add_argument("--name", default=f"soak-{os.getpid()}", help="the federation's name")
    ap.add_argument("--out", default="results/soak")
    return ap


def _sample_while(
    cfg: FederationConfig, home: Path, opts: BenchOptions, every_s: float, minutes: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the bench in a thread and sample every process's resident memory every
    ``every_s`` until it ends: the samples and the bench's summary."""
    samples: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    procs = {**service_pids(home), "bench-client": os.getpid()}

    def drive() -> None:
        summary.update(bench(cfg, opts, home))

    runner = threading.Thread(target=drive, name="bench", daemon=True)
    t0 = time.monotonic()
    runner.start()
    while runner.is_alive():
        now = time.monotonic() - t0
        for name, pid in procs.items():
            mb = rss_mb(pid)
            if mb is not None:
                samples.append({"t_s": round(now, 1), "process": name, "rss_mb": round(mb, 2)})
        print(f"\r{now / 60:5.1f} / {minutes:.0f} min", end="", flush=True)
        runner.join(timeout=every_s)
    print()
    return samples, summary


def _growth(samples: list[dict[str, Any]], warmup_min: float) -> dict[str, Any]:
    """Per process: its first and last sample and its growth per minute after the warm-up."""
    growth: dict[str, Any] = {}
    for name in sorted({s["process"] for s in samples}):
        pts = [(s["t_s"], s["rss_mb"]) for s in samples if s["process"] == name]
        fit = [(t, m) for t, m in pts if t >= warmup_min * 60]
        growth[name] = {
            "rss_start_mb": pts[0][1],
            "rss_end_mb": pts[-1][1],
            "mb_per_min": round(slope_per_min(fit or pts), 3),
        }
    return growth


def _write(out: Path, result: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    """``soak.json``, ``rss.csv`` (every sample) and ``rss.png``."""
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    with (out / "rss.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["t_s", "process", "rss_mb"])
        w.writeheader()
        w.writerows(samples)
    _plot(samples, out / "rss.png")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = replace(
        FederationConfig(),
        name=args.name,
        gms=3,
        lms=3,
        nodes_per_lm=NODES // 3,
        base_port=args.base_port,
    ).validate()
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    tasks_per_s = args.load * NODES / MEAN_S
    jobs = int(tasks_per_s * args.minutes * 60 / TASKS_PER_JOB)
    opts = BenchOptions(
        out=str(out / "bench"), progress=False, jobs=jobs, tasks_per_job=TASKS_PER_JOB,
        mean_duration=MEAN_S, rate=tasks_per_s / TASKS_PER_JOB,
        timeout_s=args.minutes * 60 + 600, floor_samples=50,
    )  # fmt: skip
    start_federation(cfg, home)
    try:
        samples, summary = _sample_while(cfg, home, opts, args.every, args.minutes)
    finally:
        stop_federation(home)
        purge(cfg, home)
    growth = _growth(samples, args.warmup)
    result = {
        "minutes": args.minutes,
        "offered_tasks_per_s": round(tasks_per_s, 1),
        "load": args.load,
        "warmup_min": args.warmup,
        "goal_mb_per_min": GOAL_MB_PER_MIN,
        **{k: summary.get(k) for k in ("tasks", "unfinished_tasks", "duplicate_launches",
                                        "throughput_tasks_per_s", "allocation_time_s")},
        "growth": growth,
        "worst_service_mb_per_min": max(
            (g["mb_per_min"] for n, g in growth.items() if n != "bench-client"), default=0.0
        ),
    }  # fmt: skip
    _write(out, result, samples)
    for name, g in growth.items():
        print(f"{name:>14}: {g['rss_start_mb']:7.1f} -> {g['rss_end_mb']:7.1f} MB  "
              f"{g['mb_per_min']:+.3f} MB/min")  # fmt: skip
    print(f"wrote {out / 'soak.json'}; unfinished {result['unfinished_tasks']}, "
          f"duplicates {result['duplicate_launches']}")  # fmt: skip
    return 0


def _plot(samples: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name in sorted({s["process"] for s in samples}):
        pts = [(s["t_s"] / 60, s["rss_mb"]) for s in samples if s["process"] == name]
        ax.plot([t for t, _ in pts], [m for _, m in pts], label=name)
    ax.set_xlabel("minutes")
    ax.set_ylabel("resident memory (MB)")
    ax.set_title("Soak at 70% load: memory of every process")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
