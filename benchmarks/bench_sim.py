"""Simulator scale: wall time, CPU per simulated task and peak memory.

Scenarios (issue 2, "How fast and how big"; issue 11, "under overload"):
  yh1    YH1_sub (122,878 tasks) on 10,000 workers, 4 GMs x 25 LMs, with Sparrow and the
         centralized baseline, via `megha simulate` itself.
  big    a synthetic 300,000-task workload on 50,000 workers, 10 GMs x 50 LMs (Megha only).
  huge   a synthetic 1,000,000-task workload on 100,000 workers, 20 GMs x 100 LMs (Megha
         only; issue 35: 10,000 jobs of 100 tasks of 10 s at ~70% of the slots).
  memory peak RSS as the trace grows 4x on one federation (issue 35: bounded by what is in
         flight): 4,000 workers, 4 GMs x 8 LMs, jobs of 100 tasks of 10 s at ~70% load,
         --tasks (default 62,500 and 250,000), Megha alone, each size in its own child;
         --tree DIR runs another checkout's code (the old arm) with the same commands.
  10m    a synthetic 10,000,000-task replay on 100,000 workers, 20 GMs x 100 LMs (100,000
         jobs of 100 tasks of 10 s at ~70% load), Megha alone; --timeout S bounds it.
  sweep  offered load 50-150% on YH1 and synthetic_FB, Megha vs Sparrow vs centralized
         (benchmarks/bench_sweep.py; --quick: 150 jobs per trace on 3,000 workers).
Issue 12 (``benchmarks/sim_fidelity.py``): calibrate (live vs simulated allocation time),
fig8 (vs workers), fig9 (vs GMs).
Each of yh1 and big runs in a child process so its peak RSS is its own.  Writes JSON to --out.

    python benchmarks/bench_sim.py --scenario yh1 --trace ../shared/traces/YH1_sub.tr
    python benchmarks/bench_sim.py --scenario big
    python benchmarks/bench_sim.py --scenario huge
    python benchmarks/bench_sim.py --scenario memory [--tasks 62500,250000] [--tree DIR]
    python benchmarks/bench_sim.py --scenario 10m --timeout 36000
    python benchmarks/bench_sim.py --scenario sweep --quick
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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


def _own_child(cmd: list[str], env: dict[str, str], timeout: float | None) -> dict[str, Any]:
    """``cmd`` in a child of its own: its wall and CPU time, its own peak RSS (``wait4``:
    this child's, not the largest of every child so far) and its exit code (-9: killed
    at ``timeout`` s)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    timer = threading.Timer(timeout, proc.kill) if timeout else None
    if timer is not None:
        timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    if timer is not None:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": round(time.perf_counter() - t0, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "exit": proc.returncode,
    }


SYNTH_JOB = 100
"""Tasks per job of the memory and 10m scenarios (10 s each on average)."""


def _synthetic_cmd(
    tasks: int, workers: int, gms: int, lms: int, out: Path, seed: int, *, quiet: bool = True
) -> list[str]:
    """``megha simulate`` on ``tasks`` synthetic tasks at ~70% of ``workers`` slots
    (``quiet=False``: its progress on stderr)."""
    rate = 0.7 * workers / 10.0 / SYNTH_JOB
    return [
        "-m", "megha_cli.main", "simulate", "--seed", str(seed), "--workload", "synthetic",
        "--jobs-count", str(tasks // SYNTH_JOB), "--tasks-per-job", str(SYNTH_JOB),
        "--rate", f"{rate:g}", "--mean-duration", "10", "--workers", str(workers),
        "--gms", str(gms), "--lms", str(lms), "--baselines", "", "--cluster", "serial",
        *(["--quiet"] if quiet else []), "--out", str(out),
    ]  # fmt: skip


def _tree_env(tree: str | None) -> dict[str, str]:
    env = os.environ.copy()
    if tree:
        env["PYTHONPATH"] = str(Path(tree).resolve())
    return env


def _scaled(args: argparse.Namespace) -> dict[str, Any]:
    """Peak RSS of the same federation at each size of ``--tasks`` (issue 35)."""
    env = _tree_env(args.tree)
    rows = []
    for n in [int(x) for x in args.tasks.split(",")]:
        out = Path("results") / f"bench_sim_memory_{n}"
        cmd = _synthetic_cmd(n, 4000, 4, 8, out, args.seed)
        figures = _own_child([sys.executable, *cmd], env, args.timeout)
        summary = json.loads((out / "summary.json").read_text())
        rows.append({"tasks": n, "command": " ".join(cmd[2:]), **figures,
                     "timing": summary["timing"]["megha"]})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    first, last = rows[0], rows[-1]
    return {
        "scenario": "memory",
        "tree": str(Path(args.tree).resolve()) if args.tree else str(Path.cwd()),
        "sizes": rows,
        "rss_ratio_last_to_first": round(last["peak_rss_mb"] / first["peak_rss_mb"], 3),
    }


def _ten_million(args: argparse.Namespace) -> dict[str, Any]:
    """10,000,000 tasks on 100,000 workers, bounded by ``--timeout``."""
    out = Path("results") / "bench_sim_10m"
    cmd = _synthetic_cmd(10_000_000, 100_000, 20, 100, out, args.seed, quiet=False)
    figures = _own_child([sys.executable, *cmd], _tree_env(args.tree), args.timeout)
    report: dict[str, Any] = {"scenario": "10m", "command": " ".join(cmd[2:]), **figures}
    if figures["exit"] == 0:
        summary = json.loads((out / "summary.json").read_text())
        report["timing"] = summary["timing"]["megha"]
        report["allocation_time_s"] = summary["schedulers"]["megha"]["allocation_time_s"]
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--scenario",
        choices=("yh1", *SYNTHETIC, "memory", "10m", "sweep", *fidelity.SCENARIOS),
        required=True,
    )
    ap.add_argument("--tasks", default="62500,250000", help="memory: the sizes (tasks)")
    ap.add_argument("--tree", default=None, help="memory, 10m: run this checkout's code")
    ap.add_argument("--timeout", type=float, default=None, help="memory, 10m: s per run")
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
    if args.scenario in ("memory", "10m"):
        report = _scaled(args) if args.scenario == "memory" else _ten_million(args)
        out = Path(args.out or f"results/bench_sim_{args.scenario}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
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
