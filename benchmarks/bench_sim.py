"""Simulator scale: wall time, CPU per simulated task and peak memory.

Scenarios (issue 2, "How fast and how big"; issue 11, "under overload"):
  yh1    YH1_sub (122,878 tasks) on 10,000 workers, 4 GMs x 25 LMs, with Sparrow and the
         centralized baseline, via `megha simulate` itself.
  big    a synthetic 300,000-task workload on 50,000 workers, 10 GMs x 50 LMs (Megha only).
  huge   a synthetic 1,000,000-task workload on 100,000 workers, 20 GMs x 100 LMs (Megha
         only; issue 35: 10,000 jobs of 100 tasks of 10 s at ~70% of the slots).
  sweep  offered load 50-150% on YH1 and synthetic_FB, Megha vs Sparrow vs centralized
         (benchmarks/bench_sweep.py; --quick: 150 jobs per trace on 3,000 workers).
Issue 12 (``benchmarks/sim_fidelity.py``): calibrate (live vs simulated allocation time),
fig8 (vs workers), fig9 (vs GMs).
Each of yh1 and big runs in a child process so its peak RSS is its own.  Writes JSON to --out.

    python benchmarks/bench_sim.py --scenario yh1 --trace ../shared/traces/YH1_sub.tr
    python benchmarks/bench_sim.py --scenario big
    python benchmarks/bench_sim.py --scenario huge
    python benchmarks/bench_sim.py --scenario sweep --quick
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import sim_fidelity as fidelity

SYNTHETIC = {
    # jobs of 100 tasks, arrivals per second, mean task s, workers, GMs, LMs
    "big": ("3000", "5", "60", "50000", "10", "50"),  # ~60% of 50,000 slots
    "huge": ("10000", "70", "10", "100000", "20", "100"),  # ~70% of 100,000 slots
}
"""The synthetic scenarios' ``megha simulate`` options (Megha alone)."""


def _child(cmd: list[str]) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    wall = time.perf_counter() - t0
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak_kb / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--scenario", choices=("yh1", *SYNTHETIC, "sweep", *fidelity.SCENARIOS), required=True
    )
    ap.add_argument("--trace", default="../shared/traces/YH1_sub.tr")
    ap.add_argument(
        "--out", default=None, help="JSON file (default results/bench_sim_<scenario>.json)"
    )
    ap.add_argument("--seed", type=int, default=1)
    fidelity.add_arguments(ap)
    args, rest = ap.parse_known_args()
    if args.scenario == "sweep":
        from benchmarks.bench_sweep import main as sweep

        sweep([*rest, "--out", args.out] if args.out else rest)
        return
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.scenario in fidelity.SCENARIOS:  # issue 12: does the simulator predict live?
        print(json.dumps(fidelity.SCENARIOS[args.scenario](args), indent=2, default=float))
        return
    results_dir = Path("results") / f"bench_sim_{args.scenario}"
    base = [sys.executable, "-m", "megha_cli.main", "simulate", "--seed", str(args.seed)]
    if args.scenario == "yh1":
        cmd = [
            *base,
            "--trace", args.trace, "--workers", "10000", "--gms", "4", "--lms", "25",
            "--baselines", "sparrow,centralized", "--out", str(results_dir),
        ]  # fmt: skip
    else:
        jobs, rate, mean, workers, gms, lms = SYNTHETIC[args.scenario]
        cmd = [
            *base,
            "--workload", "synthetic", "--jobs-count", jobs, "--tasks-per-job", "100",
            "--rate", rate, "--mean-duration", mean, "--workers", workers, "--gms", gms,
            "--lms", lms, "--baselines", "", "--out", str(results_dir),
        ]  # fmt: skip
    figures = _child(cmd)
    summary = json.loads((results_dir / "summary.json").read_text())
    report = {
        "scenario": args.scenario,
        "command": " ".join(cmd[2:]),
        **figures,
        "tasks": summary["tasks"],
        "timing": summary["timing"],
        "allocation_time_s": {
            name: s["allocation_time_s"] for name, s in summary["schedulers"].items()
        },
    }
    out = Path(args.out or f"results/bench_sim_{args.scenario}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
