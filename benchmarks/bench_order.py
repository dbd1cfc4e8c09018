"""Job-aware ordering on overloaded traces: Megha FIFO and ``srpt`` beside Sparrow and
the centralized scheduler (an omniscient FIFO placer), with the ideal bound.

Per trace, one ``megha simulate`` run (every scheduler on the same jobs and machines:
10,000 workers, 4 GMs x 25 LMs by default), arrivals scaled to ``--load`` of the slots;
then from its files:

* mean JCT of each scheduler, and each as a factor of the centralized FIFO's (the goal:
  ``megha-srpt`` at most 0.6x);
* the p99 of allocation time to the final start (the goal: ``megha-srpt``'s no worse
  than FIFO Megha's);
* shares: per 10-minute window, each user that had a task waiting through the whole
  window against its configured share of the slots (the goal: none more than 0.05
  below it);
* the ideal single queue over the same slots (``benchmarks/srpt_bound.py``): FIFO,
  SRPT, and SRPT as a factor of FIFO -- what ordering alone can gain.

Traces: ``yh1`` (../shared/traces/YH1_sub.tr), ``fb`` (synthetic_FB_sub_2000jobs.tr) and
``google`` (a Google-like synthetic trace written beside the results: job sizes and
task durations heavy-tailed, ``google_like_trace``), or ``--trace FILE`` for any other.

    python benchmarks/bench_order.py --scenario yh1,google --load 1.3
    python benchmarks/bench_order.py --trace my.tr --load 1.5 --workers 3000 --gms 2 --lms 10

Writes ``<out>/<scenario>/`` (the run's files) and ``<out>/bench_order.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.srpt_bound import bound, jobs_of_trace, offered_load
from reporting.files import write_json

TRACES = {
    "yh1": "../shared/traces/YH1_sub.tr",
    "fb": "../shared/traces/synthetic_FB_sub_2000jobs.tr",
}
"""Relative to the project's root (``--traces DIR`` elsewhere)."""
WINDOW_S = 600.0
SHARE_SLACK = 0.05


def google_like_trace(path: Path, jobs: int, seed: int) -> Path:
    """A synthetic trace shaped as the Google cluster traces' batch jobs are described
    (Reiss et al., SoCC 2012): most jobs small and short, a heavy tail of large, long
    ones.  Tasks per job: Pareto (alpha 1.1) rounded down, 1-2,000; a job's task
    durations: lognormal around a per-job median (itself lognormal, median 60 s,
    sigma 1.2), sigma 0.3 within the job, 1 s - 6 h; Poisson arrivals, 1 job/s (the
    load is set by ``--load``)."""
    rng = random.Random(seed)
    lines, t = [], 0.0
    for _ in range(jobs):
        t += rng.expovariate(1.0)
        n = min(2000, int(rng.paretovariate(1.1)))
        median = min(21_600.0, max(1.0, rng.lognormvariate(math.log(60.0), 1.2)))
        ds = [min(21_600.0, max(1.0, rng.lognormvariate(math.log(median), 0.3))) for _ in range(n)]
        lines.append(f"{t:.3f} {n} {sum(ds) / n:.3f} " + " ".join(f"{d:.3f}" for d in ds))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def share_deficits(tasks_csv: Path, shares: dict[str, float], slots: int) -> dict[str, float | int]:
    """Per 10-minute window, each user waiting through it (a task of it queued from
    before the window's start to after its end): its configured share minus its share
    of the slots used in the window.  The largest such deficit and how many
    (window, user) pairs were more than ``SHARE_SLACK`` below."""
    used: dict[tuple[str, int], float] = {}
    waits: list[tuple[str, float, float]] = []
    horizon = 0.0
    with tasks_csv.open() as f:
        for row in csv.DictReader(f):
            user, sub = row["user"], float(row["submitted_at"])
            start, end = float(row["started_at"]), float(row["finished_at"])
            start = math.inf if start < 0 else start
            horizon = max(horizon, sub)
            if start < math.inf:
                end = end if end >= start else start
                horizon = max(horizon, end)
                for w in range(int(start // WINDOW_S), int(end // WINDOW_S) + 1):
                    overlap = min(end, (w + 1) * WINDOW_S) - max(start, w * WINDOW_S)
                    if overlap > 0:
                        used[(user, w)] = used.get((user, w), 0.0) + overlap
            if start - sub >= WINDOW_S:
                waits.append((user, sub, start))
    waiting: set[tuple[str, int]] = set()
    for user, sub, start in waits:
        last = int(min(start, horizon) // WINDOW_S)
        waiting.update((user, w) for w in range(math.ceil(sub / WINDOW_S), last))
    deficits = [
        shares[u] - used.get((u, w), 0.0) / (slots * WINDOW_S) for u, w in waiting if u in shares
    ]
    return {
        "windows_waiting": len(waiting),
        "max_below_share": max(deficits, default=0.0),
        "windows_below_by_more_than_5pct": sum(d > SHARE_SLACK for d in deficits),
    }


def time_scale_for(trace: Path, load: float, slots: int, limit_jobs: int | None = None) -> float:
    """The arrival scale that offers ``load`` of ``slots`` (work over the arrivals' span)."""
    return offered_load(jobs_of_trace(trace, limit_jobs=limit_jobs), slots) / load


def simulate(
    args: argparse.Namespace, trace: Path, scale: float, out: Path, extra: Sequence[str] = ()
) -> float:
    """One ``megha simulate`` run of every scheduler; its wall seconds (0 with ``--reuse``
    and a finished run in ``out``: its files are read again)."""
    if getattr(args, "reuse", False) and (out / "summary.json").exists():
        return 0.0
    cmd = [
        sys.executable, "-m", "megha_cli.main", "simulate", "--trace", str(trace),
        "--time-scale", f"{scale:.6g}", "--workers", str(args.workers), "--gms", str(args.gms),
        "--lms", str(args.lms), "--policies", args.policies, "--baselines", args.baselines,
        "--seed", str(args.seed), "--out", str(out), "--quiet", *extra,
    ]  # fmt: skip
    if args.limit_jobs:
        cmd += ["--limit-jobs", str(args.limit_jobs)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
    return time.perf_counter() - t0


def figures(out: Path, slots: int) -> dict[str, Any]:
    """Per scheduler: mean JCT and as a factor of the centralized FIFO's, p99 to the
    final start, the share deficits."""
    summary = json.loads((out / "summary.json").read_text())
    shares = {u: v["share"] for u, v in summary["users"].items()}
    sched = summary["schedulers"]
    central = sched.get("centralized", {}).get("jct_s", {}).get("mean")
    rows: dict[str, Any] = {}
    for name, s in sched.items():
        jct = s["jct_s"]["mean"]
        rows[name] = {
            "jct_mean_s": jct,
            "jct_vs_centralized": jct / central if central else None,
            "jobs_completed": s["jobs_completed"],
            "alloc_p99_s": s["allocation_time_s"]["p99"],
            "alloc_p50_s": s["allocation_time_s"]["p50"],
            "shares": share_deficits(out / f"tasks-{name}.csv", shares, slots),
        }
    return rows


def run_scenario(args: argparse.Namespace, name: str, trace: Path) -> dict[str, Any]:
    """One trace: its run, its figures, the ideal bound and the goals' verdicts."""
    slots = args.workers
    scale = time_scale_for(trace, args.load, slots, args.limit_jobs)
    out = Path(args.out) / name
    wall = simulate(args, trace, scale, out)
    rows = figures(out, slots)
    jobs = jobs_of_trace(trace, time_scale=scale, limit_jobs=args.limit_jobs)
    ideal = bound(jobs, slots, queues=args.gms)
    srpt, fifo = rows.get("megha-srpt"), rows.get("megha")
    goals: dict[str, Any] = {}
    if srpt and fifo:
        goals = {
            "srpt_jct_vs_centralized": srpt["jct_vs_centralized"],
            "jct_goal_0.6x_met": (srpt["jct_vs_centralized"] or 9.0) <= 0.6,
            "p99_srpt_over_fifo": srpt["alloc_p99_s"] / max(fifo["alloc_p99_s"], 1e-12),
            "p99_goal_met": srpt["alloc_p99_s"] <= fifo["alloc_p99_s"],
            "shares_goal_met": srpt["shares"]["max_below_share"] <= SHARE_SLACK,
        }
    return {
        "trace": str(trace),
        "limit_jobs": args.limit_jobs,
        "workers": slots,
        "gms": args.gms,
        "lms": args.lms,
        "time_scale": scale,
        "load": args.load,
        "wall_s": round(wall, 1),
        "schedulers": rows,
        "ideal_single_queue": ideal,
        "goals": goals,
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", default="yh1,google", help="comma list of yh1, fb, google")
    ap.add_argument("--trace", help="a trace file instead of the scenarios")
    ap.add_argument("--traces", default="../shared/traces", help="where yh1 and fb are")
    ap.add_argument("--load", type=float, default=1.3, help="offered load (1.3 = 130%%)")
    ap.add_argument("--workers", type=int, default=10_000)
    ap.add_argument("--gms", type=int, default=4)
    ap.add_argument("--lms", type=int, default=25)
    ap.add_argument("--policies", default="fifo,srpt")
    ap.add_argument("--baselines", default="sparrow,centralized")
    ap.add_argument("--google-jobs", type=int, default=30_000)
    ap.add_argument("--limit-jobs", type=int, default=None, help="each trace's first N jobs")
    ap.add_argument("--reuse", action="store_true", help="read runs already in --out again")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/bench_order")
    args = ap.parse_args(argv)
    picks: dict[str, Path] = {}
    if args.trace:
        picks[Path(args.trace).stem] = Path(args.trace)
    else:
        for name in [x.strip() for x in args.scenario.split(",") if x.strip()]:
            if name == "google":
                path = Path(args.out) / "google_like.tr"
                picks[name] = google_like_trace(path, args.google_jobs, args.seed)
            elif name in TRACES:
                picks[name] = Path(args.traces) / Path(TRACES[name]).name
            else:
                ap.error(f"unknown scenario {name!r} (yh1, fb, google)")
    result = {name: run_scenario(args, name, path) for name, path in picks.items()}
    write_json(Path(args.out) / "bench_order.json", result)
    for name, r in result.items():
        print(
            f"{name}: load {r['load']}, ideal srpt/fifo {r['ideal_single_queue']['srpt_over_fifo']:.3f}"
        )
        for s, row in r["schedulers"].items():
            vs = row["jct_vs_centralized"]
            print(
                f"  {s:14} JCT {row['jct_mean_s']:10.1f} s ({vs:.3f}x central)  "
                f"p99 {row['alloc_p99_s']:9.2f} s  max below share {row['shares']['max_below_share']:.3f}"
            )
        print(f"  goals: {r['goals']}")
    print(f"wrote {args.out}/bench_order.json")


if __name__ == "__main__":
    main()
