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
  backlog  a heavy-tailed trace in Google's 2011 ``task_events`` format, written seeded
         beside the results (--trace-jobs jobs, one every 2 s, tasks per job and durations
         lognormal, 5% evicted and resubmitted, random priorities and constraints: ~180%
         of 2,000 workers, so queues stay deep), Megha alone via ``megha simulate
         --trace-format google2011``; with --tree, that checkout alternating with this
         one (--rounds pairs): CPU per task, wall, task CSVs compared.
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
    python benchmarks/bench_sim.py --scenario backlog --trace-jobs 3000 --tree /work/wt/base
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


def write_backlog_trace(path: Path, jobs: int, seed: int) -> int:
    """A heavy-tailed ``task_events`` file (gzip) of ``jobs`` jobs; returns its rows."""
    import gzip
    import random

    rng = random.Random(seed)
    rows: list[tuple[int, int, int, int]] = []
    t = 600 * 10**6  # the 2011 trace's first events are at 600 s (microseconds)
    for job in range(jobs):
        t += int(rng.expovariate(0.5) * 1e6)
        jid = 6_000_000_000 + job
        for i in range(min(20_000, max(1, int(rng.lognormvariate(1.5, 1.6))))):
            start = t + int(rng.expovariate(1.0) * 1e6)
            dur = int(min(rng.lognormvariate(4.5, 1.8), 200_000) * 1e6)
            rows += [(t, jid, i, 0), (start, jid, i, 1)]
            r = rng.random()
            if r < 0.05:  # evicted a third of the way, resubmitted, run whole again
                ev = start + dur // 3
                rows += [(ev, jid, i, 2), (ev, jid, i, 0), (ev + 10**6, jid, i, 1)]
                rows.append((ev + 10**6 + dur, jid, i, 4))
            else:  # FAIL, KILL or FINISH
                rows.append((start + dur, jid, i, 3 if r < 0.07 else 5 if r < 0.09 else 4))
    rows.sort()
    with gzip.open(path, "wt") as f:
        for ts, jid, i, kind in rows:
            machine = "" if kind == 0 else "4321"
            f.write(
                f"{ts},,{jid},{i},{machine},{kind},user{jid % 7}=,{rng.randrange(4)},"
                f"{rng.randrange(12)},0.0125,0.0159,0.0004,0\n"
            )
    return len(rows)


def _backlog(args: argparse.Namespace) -> dict[str, Any]:
    """Megha's CPU per task on a deep backlog, this tree (and ``--tree``'s, alternating)."""
    where = Path("results") / "bench_sim_backlog"
    where.mkdir(parents=True, exist_ok=True)
    trace = where / f"task_events_{args.trace_jobs}_{args.seed}.csv.gz"
    events = write_backlog_trace(trace, args.trace_jobs, args.seed)
    arms = {"this": None, **({"tree": args.tree} if args.tree else {})}
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for arm, tree in arms.items() if r % 2 == 0 else reversed(arms.items()):
            out = where / f"{arm}{r}"
            cmd = [
                "-m", "megha_cli.main", "simulate", "--trace-format", "google2011", str(trace),
                "--workers", "2000", "--gms", "4", "--lms", "10", "--baselines", "",
                "--cluster", "serial", "--quiet", "--seed", str(args.seed), "--out", str(out),
            ]  # fmt: skip
            figures = _own_child([sys.executable, *cmd], _tree_env(tree), args.timeout)
            summary = json.loads((out / "summary.json").read_text())
            figures["cpu_ms_per_task"] = round(figures["cpu_s"] * 1e3 / summary["tasks"], 3)
            figures["tasks"] = summary["tasks"]
            runs[arm].append(figures)
            print(arm, json.dumps(figures), flush=True)
    report: dict[str, Any] = {"scenario": "backlog", "jobs": args.trace_jobs, "events": events,
                              "tree": args.tree, "loadavg": os.getloadavg(), "runs": runs}  # fmt: skip
    medians = {a: sorted(x["cpu_ms_per_task"] for x in rs)[len(rs) // 2] for a, rs in runs.items()}
    report["median_cpu_ms_per_task"] = medians
    if args.tree:
        report["this_over_tree"] = round(medians["this"] / medians["tree"], 3)
        report["task_csvs_identical"] = all(
            (where / f"this{r}" / "tasks-megha.csv").read_bytes()
            == (where / f"tree{r}" / "tasks-megha.csv").read_bytes()
            for r in range(args.rounds)
        )
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--scenario",
        choices=("yh1", *SYNTHETIC, "memory", "10m", "backlog", "sweep", *fidelity.SCENARIOS),
        required=True,
    )
    ap.add_argument("--tasks", default="62500,250000", help="memory: the sizes (tasks)")
    ap.add_argument("--tree", default=None, help="memory, 10m, backlog: run this checkout's code")
    ap.add_argument("--timeout", type=float, default=None, help="memory, 10m, backlog: s per run")
    ap.add_argument("--trace-jobs", type=int, default=3000, help="backlog: jobs of the trace")
    ap.add_argument("--rounds", type=int, default=2, help="backlog: runs of each arm")
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
    if args.scenario in ("memory", "10m", "backlog"):
        report = {"memory": _scaled, "10m": _ten_million, "backlog": _backlog}[args.scenario](args)
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
