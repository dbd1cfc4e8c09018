"""``megha simulate``: Megha, Sparrow and a centralized scheduler on one workload.

Every scheduler sees the same jobs (rebuilt from the same seed) on the same
machines; Megha and the centralized configuration run the real GM/LM cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.cluster import PROFILES, ClusterSpec, make_federation, parse_users, profile
from common.errors import ConfigError
from common.ids import GmId, LmId
from common.metrics import PERCENTILE_KEYS, jct_stats, summarize_tasks
from common.model import UserConfig
from common.overload import OVERLOAD_DEFAULTS, OverloadPolicy
from megha_cli.arguments import positive_float, positive_int
from megha_cli.arguments import ranged as _ranged
from megha_cli.progress import Progress
from megha_cli.terminal import Section, percentile_cells, show
from request_generator.report import output_dir, plot_cdfs, plot_components, write_records_csv
from simulator.config import SimConfig, config_from_args
from simulator.megha_sim import MeghaSimulation, SimResult, timing_of
from simulator.sparrow import SparrowConfig, SparrowSimulation
from workload.jobs import Job
from workload.synthetic import WorkloadSpec, jobs_from_trace, synthetic_jobs
from workload.traces import read_trace

BASELINES = ("sparrow", "centralized")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("values must be positive")
    return values


_positive_int = positive_int
_positive_float = positive_float
_count = _ranged(int, "an integer", zero=True)
_non_negative = _ranged(float, "a finite number", zero=True)
_probability = _ranged(float, "a probability", zero=True, most=1.0)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate Megha beside Sparrow and a centralized scheduler",
        description=(
            "Replay a trace or a synthetic workload in virtual time on 1,000-50,000 workers. "
            "Megha (and the centralized 1-GM/1-LM configuration) run the same GM/LM code as "
            "the live services. A trace is replayed as written: the live GM's admission cap on "
            "task duration (max_task_duration_s) does not apply. "
            "Writes summary.json, tasks-<scheduler>.csv (DAG workloads: tasks-<policy>.csv) "
            "and PNG plots to --out."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_argument_group("workload")
    src.add_argument("--trace", help="trace file (../shared/traces format)")
    src.add_argument(
        "--workload",
        choices=("trace", "synthetic", "dag"),
        default=None,
        help="workload kind (default: trace if --trace is given, else synthetic)",
    )
    src.add_argument("--jobs", help="DAG job file (JSON, see README); implies --workload dag")
    src.add_argument(
        "--limit-jobs",
        type=_positive_int,
        help="replay only the first N (>= 1) jobs: a trace's first N lines, a job file's N "
        "earliest arrivals (default: all)",
    )
    src.add_argument(
        "--jobs-count", type=_count, default=200, help="synthetic / DAG: number of jobs"
    )
    src.add_argument(
        "--tasks-per-job", type=_positive_int, default=20, help="synthetic: tasks per job"
    )
    src.add_argument(
        "--rate", type=_positive_float, default=5.0, help="synthetic: job arrivals per second"
    )
    src.add_argument(
        "--mean-duration", type=_non_negative, default=2.0, help="synthetic: mean task s"
    )
    src.add_argument(
        "--time-scale", type=_positive_float, default=1.0, help="multiply arrival times (> 0)"
    )
    src.add_argument(
        "--duration-scale", type=_positive_float, default=1.0, help="multiply durations (> 0)"
    )
    src.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="slots",
        help="slots: 1 slot per worker and task (Sparrow/Megha simulators); "
        "paper: 64-core/16 GB nodes, multi-resource tasks",
    )
    src.add_argument(
        "--no-constraints", action="store_true", help="no placement constraints at all"
    )
    src.add_argument(
        "--task-constraint-prob",
        type=_probability,
        default=0.5,
        help="probability that a task asks for placement constraints",
    )
    fed = p.add_argument_group("federation")
    fed.add_argument("--workers", type=_ints, default=[10_000], help="e.g. 1000,10000,50000")
    fed.add_argument("--gms", type=_ints, default=[4], help="GMs (comma list sweeps)")
    fed.add_argument("--lms", type=_ints, default=[25], help="LMs (comma list sweeps)")
    fed.add_argument(
        "--users",
        default="",
        help="NAME:SHARE@GM,... e.g. 'q1:0.1@gm0,q2:0.25@gm1,q3:0.15@gm1,q4:0.5@gm2' "
        "(default: one user per GM, equal shares)",
    )
    fed.add_argument(
        "--baselines",
        default="sparrow,centralized",
        help="comma list of baselines to run beside Megha (sparrow, centralized; '' for none)",
    )
    model = p.add_argument_group("model")
    model.add_argument("--network-delay", type=_non_negative, default=0.0005, help="s per message")
    model.add_argument(
        "--update-period", type=_positive_float, default=10.0, help="LM heartbeat s (> 0)"
    )
    model.add_argument("--gm-decision-cost", type=_non_negative, default=SimConfig.gm_decision_s)
    model.add_argument(
        "--lm-validation-cost", type=_non_negative, default=SimConfig.lm_validation_s
    )
    model.add_argument(
        "--batch", type=_positive_int, default=1, help="GM decisions per request batch"
    )
    model.add_argument(
        "--overload",
        choices=("tuned", "paper"),
        default="tuned",
        help="overload policy: tuned = waiting index, preemption grace and rate limit, "
        "batched repartitions, one launch request per LM unanswered, LMs rerouting "
        "placements whose node has no room "
        "(docs/overload.md); paper = Alg. 1-2 as published",
    )
    dag = p.add_argument_group("DAG jobs (Carbyne)")
    dag.add_argument(
        "--policies",
        default="drf,tetris,sjf,carbyne",
        help="DAG workloads: queue policies to compare "
        "(fifo, drf, drf-wc, tetris, sjf, carbyne, carbyne-pack)",
    )
    dag.add_argument("--p-altruism", type=float, default=1.0, help="Carbyne P(altruism)")
    dag.add_argument(
        "--arrivals",
        choices=("online", "offline"),
        default="online",
        help="DAG workloads: online = each job at its arrival time; "
        "offline = every job at time 0 (the Carbyne paper's offline case)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="results/simulate", help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=run)


# ---------------------------------------------------------------------------- run
def _with_progress(
    label: str,
    total: int,
    outstanding: Callable[[], int],
    run: Callable[[Callable[[float], None]], SimResult],
    quiet: bool,
) -> SimResult:
    """Run one simulation with a progress bar (tasks done, virtual and wall time)."""
    with Progress(label, total, quiet=quiet) as bar:
        result = run(lambda t: bar.update(total - outstanding(), virtual_s=t))
        bar.update(total - outstanding(), virtual_s=result.virtual_s)
    return result


def build_jobs(args: argparse.Namespace, users: Sequence[UserConfig]) -> list[Job]:
    """The workload, rebuilt identically for every scheduler from the seed."""
    rng = random.Random(args.seed)
    spec = WorkloadSpec(
        profile=args.profile,
        constraints=not args.no_constraints,
        time_scale=args.time_scale,
        duration_scale=args.duration_scale,
        task_constraint_prob=args.task_constraint_prob,
    )
    if args.workload == "trace":
        if not args.trace:
            raise ConfigError("--workload trace needs --trace FILE", reason="missing_trace")
        return jobs_from_trace(read_trace(args.trace, limit_jobs=args.limit_jobs), spec, users, rng)
    return synthetic_jobs(
        args.jobs_count,
        rate=args.rate,
        tasks_per_job=args.tasks_per_job,
        mean_duration=args.mean_duration,
        spec=spec,
        users=users,
        rng=rng,
    )


def scheduler_summary(result: SimResult) -> dict[str, Any]:
    """One scheduler's figures: every task of the workload (``tasks``; failed ones in
    ``failed_tasks``), JCTs of the jobs that completed (no task failed)."""
    s = summarize_tasks(result.tasks)
    s["jct_s"] = jct_stats(result.job_completion)
    s["makespan_s"] = result.makespan_s
    s["counters"] = dict(sorted(result.counters.items()))
    s["failed_tasks"] = len(result.failed)
    s["stuck_tasks"] = result.stuck
    s["jobs_completed"] = len(result.job_completion)
    s["jobs_failed"] = len(result.failed_jobs)
    return s


def allocation_series(results: dict[str, SimResult]) -> dict[str, list[float]]:
    """Per scheduler, allocation time to the final start (the start that ran to
    completion); beside it, to the first start where preemption restarted tasks."""
    series: dict[str, list[float]] = {}
    for name, r in results.items():
        started = [t for t in r.tasks if t.started_at >= 0]
        series[name] = [t.allocation_time for t in started]
        if any(t.started_at > t.first_started_at for t in started):
            series[f"{name} (first start)"] = [t.first_allocation_time for t in started]
    return series


def centralized_cluster(clusters: Sequence[ClusterSpec], gm: GmId) -> list[ClusterSpec]:
    """The same machines as one cluster under one LM, all in one GM's partition."""
    nodes = [n for c in clusters for n in c.nodes]
    return [ClusterSpec(LmId("lm0"), nodes, [gm] * len(nodes), "mixed")]


def run_point(
    args: argparse.Namespace, workers: int, n_gms: int, n_lms: int, out: Path
) -> dict[str, Any]:
    """One federation size: Megha and the chosen baselines, side by side."""
    gm_ids = [GmId(f"gm{i}") for i in range(n_gms)]
    users = parse_users(args.users, gm_ids)
    prof = profile(args.profile)
    clusters = make_federation(
        workers, gm_ids, n_lms, prof, not args.no_constraints, random.Random(args.seed + 7919)
    )
    cfg = config_from_args(
        args, overload=OVERLOAD_DEFAULTS if args.overload == "tuned" else OverloadPolicy()
    )
    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    for b in baselines:
        if b not in BASELINES:
            raise ConfigError(f"unknown baseline {b!r} (known: {', '.join(BASELINES)})")
    results: dict[str, SimResult] = {}
    timing: dict[str, dict[str, float]] = {}

    def record(name: str, result: SimResult) -> None:
        results[name] = result
        timing[name] = timing_of(result)

    # Megha
    jobs = build_jobs(args, users)
    total = sum(len(j.tasks) for j in jobs)
    sim = MeghaSimulation(clusters, gm_ids, users, cfg)
    sim.add_jobs(jobs)
    record("megha", _with_progress("megha", total, lambda: sim.outstanding, sim.run, args.quiet))
    if "sparrow" in baselines:
        jobs = build_jobs(args, users)
        sp = SparrowSimulation(
            clusters, SparrowConfig(network_delay_s=args.network_delay), random.Random(args.seed)
        )
        sp.add_jobs(jobs)
        left = lambda: sp.book.outstanding  # noqa: E731
        record("sparrow", _with_progress("sparrow", total, left, sp.run, args.quiet))
    if "centralized" in baselines:
        gm0 = GmId("gm0")
        c_users = [UserConfig(u.user, gm0, u.share) for u in users]
        jobs = build_jobs(args, c_users)
        csim = MeghaSimulation(centralized_cluster(clusters, gm0), [gm0], c_users, cfg)
        csim.add_jobs(jobs)
        c_left = lambda: csim.outstanding  # noqa: E731
        record("centralized", _with_progress("centralized", total, c_left, csim.run, args.quiet))

    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "workers": workers,
        "gms": n_gms,
        "lms": n_lms,
        "seed": args.seed,
        "profile": args.profile,
        "constraints": not args.no_constraints,
        "tasks": total,
        "jobs": len(jobs),
        "users": {u.user: {"gm": u.gm, "share": u.share} for u in users},
        "schedulers": {name: scheduler_summary(r) for name, r in results.items()},
    }
    for name, r in results.items():
        write_records_csv(out / f"tasks-{name}.csv", r.tasks, r.failed)
    title = f"{workers} workers, {n_gms} GMs x {n_lms} LMs"
    plot_cdfs(out / "allocation_cdf.png", allocation_series(results), f"Allocation time: {title}")
    plot_components(
        out / "components.png",
        {n: s["components_s"] for n, s in summary["schedulers"].items()},
        "Allocation-time components",
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    (out / "timing.json").write_text(json.dumps(timing, indent=2, sort_keys=True))
    summary["timing"] = timing
    return summary


def point_sections(summary: dict[str, Any]) -> list[Section]:
    """One federation size's summary: allocation-time percentiles, then per scheduler
    jobs, JCT, failures and what the run cost."""
    schedulers = summary["schedulers"]
    alloc = Section(
        f"{summary['workers']} workers, {summary['gms']} GMs x {summary['lms']} LMs, "
        f"{summary['tasks']} tasks: allocation time",
        ["scheduler", *PERCENTILE_KEYS],
        percentile_cells({n: s["allocation_time_s"] for n, s in schedulers.items()}),
    )
    rows = []
    for n, s in schedulers.items():
        t = summary["timing"][n]
        c = s["counters"]
        restarted = bool(s["tasks_restarted"])
        rows.append(
            [
                n, str(s["jobs_completed"]), str(s["jobs_failed"]),
                f"{s['jct_s']['mean']:.2f}", f"{s['jct_s']['p50']:.2f}",
                str(s["failed_tasks"]), str(s["stuck_tasks"]),
                f"{s['first_start_s']['p99']:.3g}" if restarted else "-",
                f"{s['reallocation_s']['p99']:.3g}" if restarted else "-",
                f"{c.get('preemptions', 0):.0f}", f"{c.get('preempted_work_s', 0.0):,.0f}",
                f"{t['wall_s']:.1f}", f"{t['cpu_ms_per_task']:.3f}",
            ]
        )  # fmt: skip
    runs = Section(
        "",
        ["scheduler", "jobs", "jobs failed", "JCT mean s", "JCT p50 s", "tasks failed", "stuck",
         "p99 to first start s", "re-allocation p99 s", "preemptions",
         "work thrown away CPU-s", "wall s", "CPU ms/task"],
        rows,
    )  # fmt: skip
    return [alloc, runs]


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"megha simulate: {exc}", file=sys.stderr)
        return 2


PointRun = Callable[[argparse.Namespace, int, int, int, Path], dict[str, Any]]
"""Runs one federation size (workers, GMs, LMs) into a directory; returns its summary."""


def _trace_report(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """Shows a trace or synthetic point's tables."""

    def report(summary: dict[str, Any]) -> None:
        show(point_sections(summary), quiet=quiet)

    return report


def _workload_kind(args: argparse.Namespace) -> str:
    """The workload ``--workload``, ``--trace`` and ``--jobs`` name together; a source
    given beside another kind is an error (it was dropped without a word)."""
    if args.trace and args.jobs:
        raise ConfigError("give --trace or --jobs, not both", reason="two_workloads")
    implied = "dag" if args.jobs else "trace" if args.trace else None
    if implied and args.workload not in (None, implied):
        flag = "--jobs" if args.jobs else "--trace"
        raise ConfigError(
            f"{flag} is a {implied} workload: it does not go with --workload {args.workload}",
            reason="two_workloads",
        )
    kind: str = args.workload or implied or "synthetic"
    return kind


def _run(args: argparse.Namespace) -> int:
    args.workload = _workload_kind(args)
    out = output_dir(args.out)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    point: PointRun = run_point
    report = _trace_report(args.quiet)
    files = "summary.json, tasks-*.csv, allocation_cdf.png, components.png"
    if args.workload == "dag":
        point, report = _dag_point, _dag_report(args.quiet)
        files = "summary.json, tasks-*.csv, shares-*.png"
    points = list(itertools.product(args.workers, args.gms, args.lms))
    summaries = []
    for workers, g, lm in points:
        target = out if len(points) == 1 else out / f"w{workers}_g{g}_l{lm}"
        s = point(args, workers, g, lm, target)
        print()
        report(s)
        summaries.append(s)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if len(points) > 1:
        _write_sweep(out, summaries, args.quiet)
    else:
        data = json.loads((out / "summary.json").read_text())
        data["wall_s"], data["cpu_s"] = round(wall, 3), round(cpu, 3)
        data["timing"] = summaries[0]["timing"]
        (out / "summary.json").write_text(json.dumps(data, indent=2, sort_keys=True))
    print(f"\nwrote {out}/ ({files})")
    return 0


def _write_sweep(out: Path, summaries: list[dict[str, Any]], quiet: bool) -> None:
    rows = {}
    table: list[dict[str, Any]] = []
    for s in summaries:
        for name, sch in s["schedulers"].items():
            label = f"{name} w{s['workers']} g{s['gms']} l{s['lms']}"
            rows[label] = sch["allocation_time_s"]
            table.append(
                {
                    "scheduler": name,
                    "workers": s["workers"],
                    "gms": s["gms"],
                    "lms": s["lms"],
                    **sch["allocation_time_s"],
                    **s["timing"][name],
                }
            )
    print()
    show([Section("Sweep: allocation time", ["run", *PERCENTILE_KEYS], percentile_cells(rows))],
         quiet=quiet)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(table, indent=2, sort_keys=True))
    _plot_sweep(out / "sweep.png", table)


def _plot_sweep(path: Path, table: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    by_sched: dict[str, list[dict[str, Any]]] = {}
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
    plt.close(fig)


def _dag_point(
    args: argparse.Namespace, workers: int, n_gms: int, n_lms: int, out: Path
) -> dict[str, Any]:
    """DAG jobs under the queue policies (Carbyne and its baselines), with progress."""
    from simulator import dag_run  # the Carbyne comparison, same simulator and cores

    def runner(policy: str, sim: MeghaSimulation) -> SimResult:
        total = sim.book.outstanding
        return _with_progress(policy, total, lambda: sim.outstanding, sim.run, args.quiet)

    summary: dict[str, Any] = dag_run.run_point(args, workers, n_gms, n_lms, out, runner)
    return summary


def _dag_report(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """Prints a DAG point's policies against the best (the paper's Fig. 4/5 table)."""
    from simulator import dag_run

    def report(summary: dict[str, Any]) -> None:
        if not quiet:
            title = f"{summary['workers']} workers, {summary['gms']} GMs x {summary['lms']} LMs"
            print(
                f"{title}\n{dag_run.format_versus_best({summary['arrivals']: summary['schedulers']})}"
            )

    return report
