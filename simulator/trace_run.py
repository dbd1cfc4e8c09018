"""Trace and synthetic workloads under Megha and the baselines, side by side (``megha
simulate``; DAG workloads under queue policies are ``simulator.dag_run``).

Every scheduler sees the same jobs (made again from the same seed, as they arrive: a
workload is never held whole) on the same machines;
Megha and the centralized configuration (the same machines under one GM and one LM)
run the real GM/LM cores, Sparrow its own model (``simulator.sparrow``).  Megha runs
once per queue policy of ``--policies`` (``megha`` is FIFO, ``megha-<policy>`` the
others, e.g. ``megha-srpt``); the centralized scheduler is FIFO.
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from common.cluster import ClusterSpec, make_federation, parse_users, profile
from common.dag import DagJob
from common.errors import ConfigError
from common.ids import GmId, LmId
from common.model import UserConfig
from common.overload import OVERLOAD_DEFAULTS, OverloadPolicy
from global_master.policy import AGING_S, POLICIES, make_policy
from global_master.policy.srpt import SRPT_HALF_LIFE_S
from reporting.files import write_json
from reporting.plots import plot_cdfs, plot_components
from reporting.tally import Floats
from simulator.config import SimConfig, config_from_args
from simulator.megha_sim import MeghaSimulation, SimResult, timing_of
from simulator.records import RunRecords
from simulator.sparrow import SparrowConfig, SparrowSimulation
from workload import PUBLISHED
from workload.jobs import Job
from workload.priorities import iter_with_priorities, parse_classes
from workload.published import TraceReader, published_jobs
from workload.synthetic import (
    WorkloadSpec,
    iter_jobs_from_trace,
    iter_synthetic_jobs,
)
from workload.tracefiles import rereadable
from workload.traces import read_trace

Progress = Callable[[float], None]
"""Told the virtual time as a simulation goes."""

BASELINES = ("sparrow", "centralized")


STREAMED = PUBLISHED
"""Trace formats replayed as they are read (``stream_workload``)."""


def _spec(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        profile=args.profile,
        constraints=not args.no_constraints,
        time_scale=args.time_scale,
        duration_scale=args.duration_scale,
        task_constraint_prob=args.task_constraint_prob,
    )


def trace_files(args: argparse.Namespace) -> list[str]:
    """The trace's files: ``--trace`` and the positional ``FILE`` s."""
    return ([args.trace] if args.trace else []) + list(getattr(args, "files", None) or [])


def workload_jobs(
    args: argparse.Namespace, users: Sequence[UserConfig]
) -> tuple[Iterator[Job], int]:
    """The workload, made identically for every scheduler from the seed one job at a
    time as it is taken (a trace file of the ../shared/traces format is read whole,
    its jobs' tasks made as they are taken), and its tasks' count."""
    rng = random.Random(args.seed)
    spec = _spec(args)
    jobs: Iterator[Job]
    if args.workload == "trace":
        files = trace_files(args)
        if len(files) != 1:
            raise ConfigError(
                "--workload trace needs --trace FILE (one file of the ../shared/traces format)",
                reason="missing_trace",
            )
        rereadable(Path(files[0]))  # read again for each scheduler: not a pipe
        trace = read_trace(files[0], limit_jobs=args.limit_jobs)
        total = sum(len(tj.durations) for tj in trace)
        jobs = iter_jobs_from_trace(trace, spec, users, rng)
    else:
        jobs = _synthetic(args, spec, users, rng)
        total = args.jobs_count * args.tasks_per_job
    classes = getattr(args, "priorities", "")
    if classes:
        jobs = iter_with_priorities(jobs, parse_classes(classes), args.seed)
    return jobs, total


def _synthetic(
    args: argparse.Namespace, spec: WorkloadSpec, users: Sequence[UserConfig], rng: random.Random
) -> Iterator[Job]:
    return iter_synthetic_jobs(
        args.jobs_count,
        rate=args.rate,
        tasks_per_job=args.tasks_per_job,
        mean_duration=args.mean_duration,
        spec=spec,
        users=users,
        rng=rng,
    )


class Feed:
    """A workload's jobs as a simulation takes them, counted; ``reader``: a published
    trace's reader (None for a trace file or synthetic jobs)."""

    def __init__(self, jobs: Iterable[Job | DagJob], reader: TraceReader | None = None) -> None:
        self._jobs = jobs
        self.reader = reader
        self.jobs = 0
        self.tasks = 0

    def __iter__(self) -> Iterator[Job | DagJob]:
        for job in self._jobs:
            self.jobs += 1
            self.tasks += len(job.tasks)
            yield job


def stream_workload(args: argparse.Namespace, users: Sequence[UserConfig]) -> Feed:
    """A published trace (``--trace-format``, ``STREAMED``) read as it is replayed:
    the same jobs for every scheduler from the seed, never held whole."""
    rng = random.Random(args.seed)
    spec = _spec(args)
    files = trace_files(args)
    if not files:
        raise ConfigError(
            f"--trace-format {args.trace_format} needs the trace's FILEs", reason="missing_trace"
        )
    jobs, reader = published_jobs(
        args.trace_format, files, spec, users, rng, lookahead=args.trace_lookahead
    )
    if args.limit_jobs:
        jobs = itertools.islice(jobs, args.limit_jobs)
    return Feed(jobs, reader)


def scheduler_summary(result: SimResult) -> dict[str, Any]:
    """One scheduler's figures: every task of the workload (``tasks``; failed ones in
    ``failed_tasks``), JCTs of the jobs that completed (no task failed), each priority
    class's tails when there are several (``RunRecords.summary``)."""
    s = result.records.summary()
    s["makespan_s"] = result.makespan_s
    s["counters"] = dict(sorted(result.counters.items()))
    s["stuck_tasks"] = result.stuck
    return s


def allocation_series(results: dict[str, SimResult]) -> dict[str, Floats]:
    """Per scheduler, allocation time to the final start (the start that ran to
    completion); beside it, to the first start where preemption restarted tasks."""
    series: dict[str, Floats] = {}
    for name, r in results.items():
        series[name] = r.records.allocation_times()
        first = r.records.first_allocation_times()
        if first is not None:
            series[f"{name} (first start)"] = first
    return series


def centralized_cluster(clusters: Sequence[ClusterSpec], gm: GmId) -> list[ClusterSpec]:
    """The same machines as one cluster under one LM, all in one GM's partition."""
    nodes = [n for c in clusters for n in c.nodes]
    return [ClusterSpec(LmId("lm0"), nodes, [gm] * len(nodes), "mixed")]


Runner = Callable[[str, int, Callable[[], int], Callable[[Progress], SimResult]], SimResult]
"""Runs one scheduler's simulation: ``runner(label, tasks, outstanding, run)``, where
``outstanding()`` counts the tasks not done yet and ``run(progress)`` is the
simulation's own (``progress(virtual_s)`` as it goes): ``megha simulate`` shows a
progress bar.  A streamed trace's size is not known before it is read: ``tasks`` is
then 0 and ``outstanding()`` minus the tasks done (``tasks - outstanding()`` is what
is done either way)."""


def plain(
    label: str, total: int, outstanding: Callable[[], int], run: Callable[[Progress], SimResult]
) -> SimResult:
    """A ``Runner`` without progress."""
    return run(lambda _: None)


def _baselines(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    for b in names:
        if b not in BASELINES:
            raise ConfigError(f"unknown baseline {b!r} (known: {', '.join(BASELINES)})")
    return names


def trace_policies(text: str | None) -> list[str]:
    """The queue policies Megha runs a trace under (``--policies``; default FIFO)."""
    names = [p.strip() for p in (text or "fifo").split(",") if p.strip()] or ["fifo"]
    for p in names:
        if p not in POLICIES:
            raise ConfigError(
                f"unknown queue policy {p!r} (known: {', '.join(POLICIES)})",
                reason="unknown_policy",
            )
    return list(dict.fromkeys(names))


def megha_label(policy: str) -> str:
    """A Megha run's name in the results: ``megha`` (FIFO), ``megha-<policy>``."""
    return "megha" if policy == "fifo" else f"megha-{policy}"


def _aging(args: argparse.Namespace) -> float:
    aging: float | None = getattr(args, "priority_aging", None)
    return AGING_S if aging is None else aging


def _half_life(args: argparse.Namespace) -> float:
    half_life: float | None = getattr(args, "srpt_half_life", None)
    return SRPT_HALF_LIFE_S if half_life is None else half_life


def _outstanding(sim: MeghaSimulation) -> Callable[[], int]:
    return lambda: sim.outstanding


def _jobs_of(
    args: argparse.Namespace, users: Sequence[UserConfig]
) -> tuple[Feed, int, Callable[[MeghaSimulation | SparrowSimulation], int]]:
    """The workload for one scheduler, streamed; how many tasks it has (0: a published
    trace, not known before it is read) and its ``outstanding`` for a ``Runner`` (the
    tasks still to come, or minus the tasks done when the total is not known)."""
    if getattr(args, "trace_format", "megha") in STREAMED:
        feed = stream_workload(args, users)
        total = 0
    else:
        jobs, total = workload_jobs(args, users)
        feed = Feed(jobs)
    return feed, total, lambda sim: total + sim_outstanding(sim) - feed.tasks


def sim_outstanding(sim: MeghaSimulation | SparrowSimulation) -> int:
    return sim.outstanding if isinstance(sim, MeghaSimulation) else sim.book.outstanding


def _counting(
    sim: MeghaSimulation, outstanding: Callable[[MeghaSimulation | SparrowSimulation], int]
) -> Callable[[], int]:
    """``outstanding`` of this run's ``sim`` (bound now, not at the loop's end)."""
    return lambda: outstanding(sim)


def run_schedulers(
    args: argparse.Namespace,
    clusters: Sequence[ClusterSpec],
    gm_ids: Sequence[GmId],
    users: Sequence[UserConfig],
    runner: Runner,
) -> tuple[dict[str, SimResult], dict[str, Any]]:
    """Megha and the baselines of ``--baselines`` on the same jobs (made again from the
    seed for each as they arrive, or a streamed trace read again) and machines; the
    results by scheduler (each run's records keep the task CSV's rows: ``close_results``
    drops them), and the workload's size (``jobs``, ``tasks``; a streamed trace's
    reader's counts under ``trace``)."""
    cfg = config_from_args(
        args, overload=OVERLOAD_DEFAULTS if args.overload == "tuned" else OverloadPolicy()
    )
    baselines = _baselines(args.baselines)
    if "sparrow" in baselines and getattr(args, "trace_format", "") == "alibaba2018":
        raise ConfigError(
            "Sparrow's model runs jobs of independent tasks; alibaba2018 jobs are DAGs: "
            "--baselines centralized (or '')",
            reason="bad_baseline",
        )
    results: dict[str, SimResult] = {}
    first: Feed | None = None
    try:
        for policy in trace_policies(getattr(args, "policies", None)):
            jobs, total, outstanding = _jobs_of(args, users)
            first = jobs if first is None else first
            factory = make_policy(
                policy, users, seed=args.seed, aging_s=_aging(args),
                srpt_half_life_s=_half_life(args),
            )  # fmt: skip
            sim = MeghaSimulation(
                clusters, gm_ids, users, cfg, queues_factory=factory, **_streamed()
            )
            sim.stream_jobs(jobs)
            label = megha_label(policy)
            results[label] = runner(label, total, _counting(sim, outstanding), sim.run)
            if not first.tasks:
                raise ConfigError(_empty_workload(args, first), reason="empty_workload")
        assert first is not None
        if "sparrow" in baselines:
            results["sparrow"] = _sparrow(args, clusters, users, runner)
        if "centralized" in baselines:
            results["centralized"] = _centralized(args, clusters, users, cfg, runner)
    except BaseException:
        close_results(results)
        raise
    size: dict[str, Any] = {"jobs": first.jobs, "tasks": first.tasks}
    if first.reader is not None:
        size["trace"] = {"format": args.trace_format, **first.reader.stats.as_dict()}
    return results, size


def _empty_workload(args: argparse.Namespace, feed: Feed) -> str:
    """Why a run had nothing to schedule: tails of no task would be zeros that read as
    figures, so the run stops instead (what was read, for a trace)."""
    where = ", ".join(str(f) for f in trace_files(args)) or "the workload"
    read = ""
    if feed.reader is not None:
        counts = [f"{k} {v}" for k, v in feed.reader.stats.as_dict().items() if v]
        read = f" (read: {', '.join(counts) or 'nothing'})"
    limit = f" within --limit-jobs {args.limit_jobs}" if args.limit_jobs else ""
    return f"{where}: no task to replay{limit}{read}"


def _streamed() -> dict[str, Any]:
    """A run that keeps what is in flight, not the trace: its tasks' figures and CSV
    rows as they end (``simulator.records``)."""
    return {"records": RunRecords(rows=True), "keep_tasks": False}


def _sparrow(
    args: argparse.Namespace,
    clusters: Sequence[ClusterSpec],
    users: Sequence[UserConfig],
    runner: Runner,
) -> SimResult:
    jobs, total, outstanding = _jobs_of(args, users)
    sp = SparrowSimulation(
        clusters,
        SparrowConfig(network_delay_s=args.network_delay),
        random.Random(args.seed),
        **_streamed(),
    )
    sp.stream_jobs(jobs)  # type: ignore[arg-type]
    return runner("sparrow", total, lambda: outstanding(sp), sp.run)


def _centralized(
    args: argparse.Namespace,
    clusters: Sequence[ClusterSpec],
    users: Sequence[UserConfig],
    cfg: SimConfig,
    runner: Runner,
) -> SimResult:
    """The same machines under one GM and one LM (FIFO)."""
    gm0 = GmId("gm0")
    c_users = [UserConfig(u.user, gm0, u.share) for u in users]
    jobs, total, outstanding = _jobs_of(args, c_users)
    factory = make_policy("fifo", c_users, seed=args.seed, aging_s=_aging(args))
    csim = MeghaSimulation(
        centralized_cluster(clusters, gm0), [gm0], c_users, cfg, queues_factory=factory,
        **_streamed(),
    )  # fmt: skip
    csim.stream_jobs(jobs)
    return runner("centralized", total, lambda: outstanding(csim), csim.run)


def close_results(results: dict[str, SimResult]) -> None:
    """Drops the results' scratch files (their records' rows and columns)."""
    for r in results.values():
        r.records.close()


def write_point(out: Path, summary: dict[str, Any], results: dict[str, SimResult]) -> None:
    """A point's files: ``summary.json``, ``timing.json``, ``tasks-<scheduler>.csv``, the
    allocation-time CDFs and components."""
    out.mkdir(parents=True, exist_ok=True)
    for name, r in results.items():
        r.records.write_csv(out / f"tasks-{name}.csv")
    title = f"{summary['workers']} workers, {summary['gms']} GMs x {summary['lms']} LMs"
    plot_cdfs(out / "allocation_cdf.png", allocation_series(results), f"Allocation time: {title}")
    plot_components(
        out / "components.png",
        {n: s["components_s"] for n, s in summary["schedulers"].items()},
        "Allocation-time components",
    )
    write_json(out / "summary.json", summary)
    write_json(out / "timing.json", {n: timing_of(r) for n, r in results.items()})


def run_point(
    args: argparse.Namespace,
    workers: int,
    n_gms: int,
    n_lms: int,
    out: Path,
    runner: Runner = plain,
) -> dict[str, Any]:
    """One federation size: Megha and the chosen baselines, side by side, each run by
    ``runner``; writes ``out`` (``write_point``), returns the summary with each
    scheduler's ``timing``."""
    gm_ids = [GmId(f"gm{i}") for i in range(n_gms)]
    users = parse_users(args.users, gm_ids)
    clusters = make_federation(
        workers, gm_ids, n_lms, profile(args.profile), not args.no_constraints,
        random.Random(args.seed + 7919),
    )  # fmt: skip
    results, size = run_schedulers(args, clusters, gm_ids, users, runner)
    try:
        return _point_files(args, workers, n_gms, n_lms, out, users, results, size)
    finally:
        close_results(results)


def _point_files(
    args: argparse.Namespace,
    workers: int,
    n_gms: int,
    n_lms: int,
    out: Path,
    users: Sequence[UserConfig],
    results: dict[str, SimResult],
    size: dict[str, Any],
) -> dict[str, Any]:
    """A point's summary, written with its files (``write_point``)."""
    summary: dict[str, Any] = {
        "workers": workers,
        "gms": n_gms,
        "lms": n_lms,
        "seed": args.seed,
        "profile": args.profile,
        "constraints": not args.no_constraints,
        "tasks": size["tasks"],
        "jobs": size["jobs"],
        **({"trace": size["trace"]} if "trace" in size else {}),
        "users": {u.user: {"gm": u.gm, "share": u.share} for u in users},
        "schedulers": {name: scheduler_summary(r) for name, r in results.items()},
    }
    write_point(out, summary, results)
    summary["timing"] = {n: timing_of(r) for n, r in results.items()}
    return summary
