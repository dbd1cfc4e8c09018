"""The overload sweep (issue 11): offered load 50-150% of capacity on public traces.

Each trace is scaled in time so that its work over its span of arrivals is the given
fraction of the federation's capacity; every point runs Megha (``megha simulate``'s
tuned overload policy), Sparrow and the centralized configuration on the same jobs,
with and without placement constraints.  Per point and scheduler: allocation time to
the final start (p50/p99), to the first start (p99), the re-allocation delay caused
by preemption (p99), mean job completion time, preemptions, work thrown away
(CPU-seconds) and CPU per simulated task.  Written as JSON, CSV and a PNG plot.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

from megha_cli.main import build_parser
from megha_cli.simulate import progress_runner
from simulator.trace_run import run_point
from workload.traces import read_trace

LOADS = (0.5, 0.7, 0.9, 1.1, 1.3, 1.5)
TRACES = {"YH1": "YH1_sub.tr", "synthetic_FB": "synthetic_FB_sub_2000jobs.tr"}
COLUMNS = (
    "trace", "workers", "constraints", "load", "scheduler", "tasks",
    "alloc_p50_s", "alloc_p99_s", "first_start_p99_s", "realloc_p99_s", "alloc_mean_s",
    "jct_mean_s", "preemptions", "work_thrown_away_cpu_s", "tasks_restarted",
    "repartition_messages", "cpu_ms_per_task", "failed", "stuck",
)  # fmt: skip


def time_scale(path: str, jobs: int | None, workers: int, load: float) -> float:
    """The factor on arrival times that makes the trace offer ``load`` x capacity
    (1 slot per worker and task: the ``slots`` profile)."""
    trace = read_trace(path, limit_jobs=jobs)
    work = sum(sum(j.durations) for j in trace)
    span = max(j.arrival for j in trace) - min(j.arrival for j in trace)
    if span <= 0:
        raise SystemExit(f"{path}: its jobs arrive at one instant; cannot scale in time")
    return work / (span * workers * load)


def row(point: dict[str, Any], name: str, summary: dict[str, Any]) -> dict[str, Any]:
    s = summary["schedulers"][name]
    c = s["counters"]
    return {
        **point,
        "scheduler": name,
        "tasks": summary["tasks"],
        "alloc_p50_s": s["allocation_time_s"]["p50"],
        "alloc_p99_s": s["allocation_time_s"]["p99"],
        "first_start_p99_s": s["first_start_s"]["p99"],
        "realloc_p99_s": s["reallocation_s"]["p99"],
        "alloc_mean_s": s["allocation_time_s"]["mean"],
        "jct_mean_s": s["jct_s"]["mean"],
        "preemptions": c.get("preemptions", 0),
        "work_thrown_away_cpu_s": round(c.get("preempted_work_s", 0.0), 3),
        "tasks_restarted": s["tasks_restarted"],
        "repartition_messages": c.get("repartition_messages", 0),
        "cpu_ms_per_task": summary["timing"][name]["cpu_ms_per_task"],
        "failed": s["failed_tasks"],
        "stuck": s["stuck_tasks"],
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The sweep as a Markdown table (docs/overload.md)."""
    head = (
        "| trace | constr. | load | scheduler | alloc p50 s | alloc p99 s | first-start p99 s "
        "| realloc p99 s | mean JCT s | preemptions | work thrown away CPU-s | CPU ms/task |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r['trace']} | {'on' if r['constraints'] else 'off'} | {r['load']:.0%} "
            f"| {r['scheduler']} | {r['alloc_p50_s']:.3g} | {r['alloc_p99_s']:.3g} "
            f"| {r['first_start_p99_s']:.3g} | {r['realloc_p99_s']:.3g} | {r['jct_mean_s']:.4g} "
            f"| {r['preemptions']:.0f} | {r['work_thrown_away_cpu_s']:,.0f} "
            f"| {r['cpu_ms_per_task']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = sorted({(r["trace"], r["constraints"]) for r in rows})
    panels = (
        ("alloc_p99_s", "allocation p99 to final start (s)"),
        ("first_start_p99_s", "allocation p99 to first start (s)"),
        ("jct_mean_s", "mean JCT (s)"),
        ("cpu_ms_per_task", "CPU per simulated task (ms)"),
    )
    fig, axes = plt.subplots(
        len(series), len(panels), figsize=(4 * len(panels), 3 * len(series)), squeeze=False
    )
    styles = {"megha": "o-", "sparrow": "s--", "centralized": "^:"}
    for i, (trace, cons) in enumerate(series):
        for j, (key, label) in enumerate(panels):
            ax = axes[i][j]
            for sched, style in styles.items():
                pts = [
                    r
                    for r in rows
                    if r["trace"] == trace and r["constraints"] == cons and r["scheduler"] == sched
                ]
                if pts:
                    xs = [100 * r["load"] for r in pts]
                    ax.plot(xs, [max(r[key], 1e-4) for r in pts], style, label=sched)
            ax.set_yscale("log")
            ax.set_xlabel("offered load (% of capacity)")
            ax.set_title(f"{trace}, {'constraints' if cons else 'no constraints'}", fontsize=9)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="bench_sim.py --scenario sweep",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="first 150 jobs, 3,000 workers")
    ap.add_argument("--workers", type=int, default=None, help="default 10,000 (3,000 quick)")
    ap.add_argument("--jobs", type=int, default=None, help="first N jobs of each trace")
    ap.add_argument("--loads", default=",".join(str(x) for x in LOADS))
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--trace-dir", default="../shared/traces")
    ap.add_argument("--constraints", default="off,on", help="off, on or both (off,on)")
    ap.add_argument("--baselines", default="sparrow,centralized")
    ap.add_argument("--gms", type=int, default=4)
    ap.add_argument("--lms", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/bench_sweep")
    ap.add_argument(
        "--merge",
        nargs="+",
        metavar="DIR",
        help="only combine the sweep.json of earlier runs (e.g. one per trace) into --out",
    )
    return ap


def _point(
    args: argparse.Namespace, trace: str, cons: str, load: float, workers: int, jobs: int | None,
    scale: float,
) -> list[dict[str, Any]]:  # fmt: skip
    """One trace at one load (arrivals times ``scale``), with or without constraints:
    ``megha simulate``'s point (its files under ``--out``), a row per scheduler."""
    parser = build_parser()
    path = str(Path(args.trace_dir) / TRACES[trace])
    argv = [
        "simulate", "--trace", path, "--time-scale", f"{scale:.6g}",
        "--workers", str(workers), "--gms", str(args.gms), "--lms", str(args.lms),
        "--baselines", args.baselines, "--seed", str(args.seed),
        "--out", str(Path(args.out) / f"{trace}_{cons}_{round(100 * load)}"),
    ]  # fmt: skip
    if jobs:
        argv += ["--limit-jobs", str(jobs)]
    if cons == "off":
        argv.append("--no-constraints")
    sim_args = parser.parse_args(argv)
    sim_args.workload = "trace"
    summary = run_point(
        sim_args, workers, args.gms, args.lms, Path(sim_args.out), progress_runner(False)
    )
    point = {"trace": trace, "workers": workers, "constraints": cons == "on", "load": load}
    rows = []
    for name in summary["schedulers"]:
        r = row(point, name, summary)
        rows.append(r)
        sys.stderr.write(
            f"    {name:<12} p99 {r['alloc_p99_s']:.4g} s, JCT {r['jct_mean_s']:.4g} s, "
            f"preemptions {r['preemptions']}, CPU {r['cpu_ms_per_task']:.3f} ms/task\n"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.merge:
        merged = [r for d in args.merge for r in json.loads((Path(d) / "sweep.json").read_text())]
        write(Path(args.out), merged)
        return
    workers = args.workers or (3000 if args.quick else 10_000)
    jobs = args.jobs if args.jobs is not None else (150 if args.quick else None)
    loads = [float(x) for x in args.loads.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    points = [
        (t, c, load)
        for t in args.traces.split(",")
        for c in args.constraints.split(",")
        for load in loads
    ]
    t0 = time.perf_counter()
    for k, (trace, cons, load) in enumerate(points, 1):
        scale = time_scale(str(Path(args.trace_dir) / TRACES[trace]), jobs, workers, load)
        sys.stderr.write(
            f"[{k}/{len(points)}] {trace} constraints={cons} load={load:.0%} "
            f"(time scale {scale:.3f}), {time.perf_counter() - t0:,.0f} s so far\n"
        )
        rows += _point(args, trace, cons, load, workers, jobs, scale)
        (out / "sweep.json").write_text(json.dumps(rows, indent=2))  # partial results too
    write(out, rows)
    print(f"({time.perf_counter() - t0:,.0f} s)")


def write(out: Path, rows: list[dict[str, Any]]) -> None:
    """sweep.json, sweep.csv, sweep.md and sweep.png in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(rows, indent=2))
    with (out / "sweep.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    plot(out / "sweep.png", rows)
    (out / "sweep.md").write_text(markdown(rows))
    print(f"wrote {out}/sweep.json, sweep.csv, sweep.md, sweep.png")


if __name__ == "__main__":
    main()
