"""``megha simulate``: Megha, Sparrow and a centralized scheduler on one workload, or
DAG jobs under queue policies: the options, progress bars and tables.

The runs are the simulator's (``simulator.trace_run``, ``simulator.dag_run``, over
every federation size by ``simulator.sweep``), their files ``reporting``'s.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.cluster import PROFILES
from common.errors import ConfigError
from common.metrics import PERCENTILE_KEYS
from global_master.policy import AGING_S
from global_master.policy.srpt import SRPT_HALF_LIFE_S
from megha_cli.arguments import (
    check_trace_files,
    positive_float,
    positive_int,
    published_trace_arguments,
)
from megha_cli.arguments import ranged as _ranged
from megha_cli.progress import Progress
from megha_cli.terminal import Section, percentile_cells, show
from reporting.sweep import sweep_table
from simulator import dag_run
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation, SimResult
from simulator.sweep import PointRun, PointsFailed, SweepWatch, run_points
from simulator.trace_run import Runner, run_point


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


def _half_life(text: str) -> float:
    """``--srpt-half-life``: > 0 seconds, or ``inf`` (no aging)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds or inf, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text!r}")
    return value


_count = _ranged(int, "an integer", zero=True)
_non_negative = _ranged(float, "a finite number", zero=True)
_probability = _ranged(float, "a probability", zero=True, most=1.0)


def _cluster(text: str) -> str:
    if text in ("serial", "local") or re.fullmatch(r"(tcp|tls)://[^\s/]+:[0-9]+", text):
        return text
    raise argparse.ArgumentTypeError(
        f"expected serial, local or a scheduler address tcp://HOST:PORT, got {text!r}"
    )


def _workload_args(p: argparse.ArgumentParser) -> None:
    """``megha simulate``'s workload: a trace, synthetic jobs or DAG jobs, scaled."""
    src = p.add_argument_group("workload")
    src.add_argument("--trace", help="trace file (../shared/traces format)")
    published_trace_arguments(src)
    src.add_argument(
        "--workload",
        choices=("trace", "synthetic", "dag"),
        default=None,
        help="workload kind (default: trace if --trace is given, else synthetic)",
    )
    src.add_argument(
        "--jobs",
        help="a job file, implies --workload dag: megha-dag/1 (many users' DAG jobs, see "
        "README) or megha-job/1 (one job, as `megha submit` takes it: its demands in "
        "--profile's units as live, run for the first of --users from time 0)",
    )
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


def _federation_args(p: argparse.ArgumentParser) -> None:
    """The federation simulated: its sizes (a sweep), users and baselines."""
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


def _model_args(p: argparse.ArgumentParser) -> None:
    """The simulator's model: delays, the cores' costs, batching, overload."""
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


def _dag_args(p: argparse.ArgumentParser) -> None:
    """DAG workloads: the queue policies compared, Carbyne's altruism, arrivals."""
    dag = p.add_argument_group("DAG jobs (Carbyne)")
    dag.add_argument(
        "--policies",
        default=None,
        help="queue policies to compare (fifo, srpt, drf, drf-wc, tetris, sjf, carbyne, "
        "carbyne-pack); traces and synthetic jobs: Megha once per policy beside the "
        "baselines (default fifo; results megha, megha-<policy>); DAG workloads: "
        f"default {dag_run.DAG_POLICIES}",
    )
    dag.add_argument(
        "--p-altruism", type=_probability, default=1.0, help="Carbyne P(altruism), 0..1"
    )
    dag.add_argument(
        "--arrivals",
        choices=("online", "offline"),
        default="online",
        help="DAG workloads: online = each job at its arrival time; "
        "offline = every job at time 0 (the Carbyne paper's offline case)",
    )


def _order_args(p: argparse.ArgumentParser) -> None:
    """Priority classes of the jobs replayed, and their aging (issue 34)."""
    order = p.add_argument_group("priority classes")
    order.add_argument(
        "--priorities",
        default="",
        help="traces and synthetic jobs: CLASS:FRACTION,... e.g. '2:0.1,1:0.2' makes each "
        "job class 2 with probability 0.1, class 1 with 0.2, else class 0 (seeded); a "
        "higher class is served first and preempts lower ones (fifo and srpt policies)",
    )
    order.add_argument(
        "--priority-aging",
        type=_positive_float,
        default=None,
        help=f"s of waiting that raise a task's class by one (default {AGING_S:.0f}; the "
        "aging bound that keeps low classes from starving)",
    )
    order.add_argument(
        "--srpt-half-life",
        type=_half_life,
        default=None,
        help=f"srpt: a waiting job's remaining work counts half per this many s since it "
        f"arrived (default {SRPT_HALF_LIFE_S:.0f}; a job k times larger goes first after "
        "log2(k) half-lives; inf: plain SRPT)",
    )


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
    _workload_args(p)
    _federation_args(p)
    _model_args(p)
    _dag_args(p)
    _order_args(p)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--cluster",
        type=_cluster,
        default="local",
        help="where a sweep's points run: local (a Dask LocalCluster of this machine's cores), "
        "tcp://HOST:8786 (a running dask scheduler), or serial (one after another here)",
    )
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
        done = total - outstanding()
        bar.update(done, total=total or done, virtual_s=result.virtual_s)
    return result


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
    except PointsFailed as exc:
        print(f"megha simulate: {exc} (see {Path(args.out)}/sweep-failures.json)", file=sys.stderr)
        return 1


def sweep_watch(quiet: bool) -> SweepWatch:
    """A sweep's progress on stderr: points done, and every failure (even when quiet)."""
    t0 = time.perf_counter()

    def done(k: int, n: int) -> None:
        if not quiet and n > 1:
            print(f"sweep: {k}/{n} points done, wall {time.perf_counter() - t0:,.1f} s",
                  file=sys.stderr, flush=True)  # fmt: skip

    def failed(point: str, error: str, again: bool) -> None:
        then = "running it once more" if again else "it failed twice, giving up on it"
        print(f"sweep: point {point} failed: {error}; {then}", file=sys.stderr, flush=True)

    return SweepWatch(done=done, failed=failed)


def _trace_report(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """Shows a trace or synthetic point's tables."""

    def report(summary: dict[str, Any]) -> None:
        print()
        show(point_sections(summary), quiet=quiet)

    return report


def _workload_kind(args: argparse.Namespace) -> str:
    """The workload ``--workload``, ``--trace`` and ``--jobs`` name together; a source
    given beside another kind is an error (it was dropped without a word)."""
    trace = args.trace or args.files
    if trace and args.jobs:
        raise ConfigError("give --trace or --jobs, not both", reason="two_workloads")
    check_trace_files(args.trace_format, args.files, args.trace)
    implied = "dag" if args.jobs else "trace" if trace else None
    if implied and args.workload not in (None, implied):
        flag = "--jobs" if args.jobs else "--trace"
        raise ConfigError(
            f"{flag} is a {implied} workload: it does not go with --workload {args.workload}",
            reason="two_workloads",
        )
    kind: str = args.workload or implied or "synthetic"
    return kind


def progress_runner(quiet: bool) -> Runner:
    """A ``simulator.trace_run.Runner`` that shows each run's progress bar."""

    def runner(
        label: str, total: int, outstanding: Callable[[], int], go: Callable[..., SimResult]
    ) -> SimResult:
        return _with_progress(label, total, outstanding, go, quiet)

    return runner


def _trace_point(
    args: argparse.Namespace, workers: int, n_gms: int, n_lms: int, out: Path
) -> dict[str, Any]:
    """Megha and the baselines at one federation size, each with a progress bar."""
    return run_point(args, workers, n_gms, n_lms, out, progress_runner(args.quiet))


def _run(args: argparse.Namespace) -> int:
    args.workload = _workload_kind(args)
    point: PointRun = _trace_point
    report = _trace_report(args.quiet)
    files = "summary.json, tasks-*.csv, allocation_cdf.png, components.png"
    if args.workload == "dag":
        point, report = _dag_point, _dag_report(args.quiet)
        files = "summary.json, tasks-*.csv, shares-*.png"
    summaries = run_points(args, point, report, sweep_watch(args.quiet))
    if len(summaries) > 1:
        table = sweep_table(summaries)
        rows = {f"{r['scheduler']} w{r['workers']} g{r['gms']} l{r['lms']}": r for r in table}
        print()
        show([Section("Sweep: allocation time", ["run", *PERCENTILE_KEYS], percentile_cells(rows))],
             quiet=args.quiet)  # fmt: skip
    print(f"\nwrote {Path(args.out)}/ ({files})")
    return 0


def _dag_point(
    args: argparse.Namespace, workers: int, n_gms: int, n_lms: int, out: Path
) -> dict[str, Any]:
    """DAG jobs under the queue policies (Carbyne and its baselines), with progress."""

    def runner(policy: str, sim: MeghaSimulation) -> SimResult:
        total = sim.book.outstanding
        return _with_progress(policy, total, lambda: sim.outstanding, sim.run, args.quiet)

    summary: dict[str, Any] = dag_run.run_point(args, workers, n_gms, n_lms, out, runner)
    return summary


def _dag_report(quiet: bool) -> Callable[[dict[str, Any]], None]:
    """Prints a DAG point's policies against the best (the paper's Fig. 4/5 table)."""

    def report(summary: dict[str, Any]) -> None:
        print()
        if not quiet:
            title = f"{summary['workers']} workers, {summary['gms']} GMs x {summary['lms']} LMs"
            print(
                f"{title}\n{dag_run.format_versus_best({summary['arrivals']: summary['schedulers']})}"
            )

    return report
