"""Priority classes under overload: the top class's allocation time at 50% and 150%
offered load (the goal: its p99 at 150% within 2x its p99 at 50%).

Per load, one ``megha simulate`` run of Megha (``--policies``, default fifo) on a trace
whose jobs are drawn into classes (``--priorities``, default 10% of jobs class 1), arrivals
scaled to the load; from its ``summary.json``, per class, allocation time to the final
start and to the first start, and the preemptions made.  ``--aging`` sets the aging
bound (``megha simulate --priority-aging``).

    python benchmarks/bench_priorities.py --loads 0.5,1.5
    python benchmarks/bench_priorities.py --trace ../shared/traces/synthetic_FB_sub_2000jobs.tr

Writes ``<out>/load-<L>/`` (the runs' files) and ``<out>/bench_priorities.json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_order import TRACES, simulate, time_scale_for
from reporting.files import write_json


def load_point(args: argparse.Namespace, trace: Path, load: float) -> dict[str, Any]:
    """One load: per class, allocation time percentiles; the run's preemptions."""
    out = Path(args.out) / f"load-{load:g}"
    extra = ["--priorities", args.priorities]
    if args.aging is not None:
        extra += ["--priority-aging", str(args.aging)]
    scale = time_scale_for(trace, load, args.workers, args.limit_jobs)
    wall = simulate(args, trace, scale, out, extra)
    summary = json.loads((out / "summary.json").read_text())
    s = summary["schedulers"]["megha" if args.policies == "fifo" else f"megha-{args.policies}"]
    return {
        "load": load,
        "wall_s": round(wall, 1),
        "classes": s.get("classes", {}),
        "preemptions": s["counters"].get("preemptions", 0),
        "preemption_attempts": s["counters"].get("preemption_attempts", 0),
        "jct_mean_s": s["jct_s"]["mean"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", default=TRACES["yh1"])
    ap.add_argument("--loads", default="0.5,1.5")
    ap.add_argument("--priorities", default="1:0.1")
    ap.add_argument("--aging", type=float, default=None, help="s (default: the policy's)")
    ap.add_argument("--policies", default="fifo", help="one policy: fifo or srpt")
    ap.add_argument("--workers", type=int, default=10_000)
    ap.add_argument("--gms", type=int, default=4)
    ap.add_argument("--lms", type=int, default=25)
    ap.add_argument("--limit-jobs", type=int, default=None, help="the trace's first N jobs")
    ap.add_argument("--reuse", action="store_true", help="read runs already in --out again")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/bench_priorities")
    args = ap.parse_args(argv)
    args.baselines = ""
    trace = Path(args.trace)
    points = [load_point(args, trace, float(x)) for x in args.loads.split(",") if x.strip()]
    top = max(int(c) for c in points[0]["classes"])
    p99 = {p["load"]: p["classes"][str(top)]["allocation_time_s"]["p99"] for p in points}
    lo, hi = min(p99), max(p99)
    result = {
        "trace": str(trace),
        "limit_jobs": args.limit_jobs,
        "workers": args.workers,
        "priorities": args.priorities,
        "points": points,
        "top_class": top,
        "top_p99_s": p99,
        "top_p99_ratio": p99[hi] / p99[lo] if p99[lo] > 0 else None,
    }
    result["goal_2x_met"] = result["top_p99_ratio"] is not None and result["top_p99_ratio"] <= 2.0
    write_json(Path(args.out) / "bench_priorities.json", result)
    for p in points:
        cells = ", ".join(
            f"class {c}: p50 {v['allocation_time_s']['p50']:.4g} s p99 {v['allocation_time_s']['p99']:.4g} s"
            for c, v in sorted(p["classes"].items())
        )
        print(f"load {p['load']}: {cells}; preemptions {p['preemptions']:.0f}")
    print(f"top class {top}: p99 {p99[hi]:.4g} s at {hi} vs {p99[lo]:.4g} s at {lo} "
          f"({result['top_p99_ratio']:.2f}x)\nwrote {args.out}/bench_priorities.json")  # fmt: skip


if __name__ == "__main__":
    main()
