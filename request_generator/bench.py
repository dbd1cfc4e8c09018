"""``megha bench``: drive a running federation and report allocation-time tails.

Replays a trace or a synthetic workload into the users' queues (at the workload's
arrival times, scaled, or at a fixed rate), waits until every task finished or
failed, and measures the floor (an empty request's round trip to an LM and to a
worker over keep-alive HTTP) in the same run.  Writes ``summary.json``,
``tasks.csv``, ``allocation_cdf.png`` and ``components.png`` into ``--out``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from common.auth import internal_headers
from common.cluster import profile
from common.config import FederationConfig
from common.dag import DagJob, load_jobs
from common.errors import ConfigError
from common.ids import JobId, TaskId, UserId
from common.model import Task
from request_generator.report import (
    format_table,
    percentiles,
    plot_cdfs,
    plot_components,
    summarize_tasks,
    write_records_csv,
)
from request_generator.submitter import Submitter
from request_generator.workload import (
    Job,
    WorkloadSpec,
    jobs_from_trace,
    read_trace,
    synthetic_jobs,
)


@dataclass(frozen=True)
class BenchOptions:
    trace: str | None = None
    limit_jobs: int | None = None
    jobs: int = 200
    tasks_per_job: int = 2
    mean_duration: float = 0.2
    job_rate: float = 50.0
    """Synthetic arrivals (Poisson, jobs/s)."""
    rate: float | None = None
    """Fixed submission rate (jobs/s), replacing the workload's arrival times."""
    time_scale: float = 1.0
    duration_scale: float = 1.0
    seed: int = 7
    timeout_s: float = 300.0
    floor_samples: int = 200
    out: str = "results/bench"
    progress: bool = True
    jobs_file: str | None = None
    """A DAG job file (common/dag.py format) to submit instead of a trace or synthetic jobs."""


def _dag_workload(cfg: FederationConfig, path: str) -> list[DagJob]:
    """DAG jobs from a file, checked against the federation before anything is sent."""
    names, jobs = load_jobs(path)
    width = len(profile(cfg.profile).names)
    if len(names) != width:
        raise ConfigError(
            f"{path}: jobs use {len(names)} resource types ({', '.join(names)}); the "
            f"federation's profile {cfg.profile!r} has {width}",
            reason="wrong_resources",
        )
    known = {u.user for u in cfg.user_configs}
    for j in jobs:
        if j.user not in known:
            raise ConfigError(
                f"{path}: job {j.job_id} is for user {j.user!r}; the federation's users are "
                f"{', '.join(sorted(known))}",
                reason="unknown_user",
            )
    return jobs


def build_workload(cfg: FederationConfig, opts: BenchOptions) -> list[Job | DagJob]:
    if opts.jobs_file:
        dags = _dag_workload(cfg, opts.jobs_file)
        return _stamp_run(list(dags), opts)
    spec = WorkloadSpec(
        profile=cfg.profile,
        constraints=cfg.constraints,
        time_scale=opts.time_scale,
        duration_scale=opts.duration_scale,
    )
    rng = random.Random(opts.seed)
    if opts.trace:
        trace = read_trace(opts.trace, limit_jobs=opts.limit_jobs)
        jobs = jobs_from_trace(trace, spec, cfg.user_configs, rng)
    else:
        jobs = synthetic_jobs(
            opts.jobs,
            rate=opts.job_rate,
            tasks_per_job=opts.tasks_per_job,
            mean_duration=opts.mean_duration,
            spec=spec,
            users=cfg.user_configs,
            rng=rng,
        )
    return _stamp_run(list(jobs), opts)


def _stamp_run(jobs: list[Job | DagJob], opts: BenchOptions) -> list[Job | DagJob]:
    """Make ids unique across runs; arrivals relative to the first (or at a fixed rate)."""
    run = f"r{int(time.time() * 1000) % 10**10:x}"  # task ids are unique across runs
    jobs.sort(key=lambda j: j.arrival)
    for j in jobs:
        old = j.job_id
        j.job_id = JobId(f"{run}.{old}")
        for t in j.tasks:
            t.job_id = j.job_id
            rest = t.task_id[len(old) :] if t.task_id.startswith(old) else f".{t.task_id}"
            t.task_id = TaskId(f"{j.job_id}{rest}")
    if opts.rate is not None:
        for i, j in enumerate(jobs):
            j.arrival = i / opts.rate
    elif jobs:
        t0 = jobs[0].arrival
        for j in jobs:
            j.arrival -= t0
    return jobs


async def measure_floor(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], n: int
) -> list[float]:
    """Round trips of an empty authenticated request over one keep-alive connection."""
    rtts = []
    for _ in range(n):
        t = time.perf_counter()
        async with session.post(url + "/v1/ping", data=b"", headers=headers) as resp:
            await resp.read()
        rtts.append(time.perf_counter() - t)
    return rtts


async def fetch_states(
    session: aiohttp.ClientSession, cfg: FederationConfig, headers: dict[str, str]
) -> dict[str, Any]:
    states: dict[str, Any] = {}
    for name, url in [(g, cfg.gm_url(g)) for g in cfg.gm_ids] + [
        (lm, cfg.lm_url(lm)) for lm in cfg.lm_ids
    ]:
        try:
            async with session.get(url + "/v1/state", headers=headers) as resp:
                states[name] = await resp.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            states[name] = {"error": str(exc)}
    return states


def counters_from(states: dict[str, Any]) -> dict[str, int]:
    total: dict[str, int] = {
        "internal_inconsistencies": 0,
        "external_inconsistencies": 0,
        "inconsistencies": 0,
        "repartitions": 0,
        "preemptions": 0,
        "requeues": 0,
        "gm_failed_tasks": 0,
        "dead_lettered": 0,
        "lm_refused_internal": 0,
        "lm_refused_external": 0,
        "workers_lost": 0,
    }
    for name, st in states.items():
        c = st.get("counters", {})
        if name.startswith("gm"):
            total["internal_inconsistencies"] += c.get("internal_inconsistencies", 0)
            total["external_inconsistencies"] += c.get("external_inconsistencies", 0)
            total["requeues"] += c.get("requeues", 0)
            total["gm_failed_tasks"] += c.get("failed", 0)
            total["dead_lettered"] += st.get("dead_lettered", 0)
        else:
            total["preemptions"] += c.get("preemptions", 0)
            total["repartitions"] += c.get("repartitions", 0)  # accepted by the LM
            total["lm_refused_internal"] += c.get("refused_internal", 0)
            total["lm_refused_external"] += c.get("refused_external", 0)
            total["workers_lost"] += c.get("workers_lost", 0)
    total["inconsistencies"] = total["internal_inconsistencies"] + total["external_inconsistencies"]
    return total


def _progress(msg: str, enabled: bool) -> None:
    if enabled:
        print(msg, file=sys.stderr, flush=True)


async def run_bench(cfg: FederationConfig, opts: BenchOptions) -> dict[str, Any]:
    """Replay, wait, measure; returns the summary (also written to ``opts.out``)."""
    jobs = build_workload(cfg, opts)
    n_tasks = sum(len(j.tasks) for j in jobs)
    headers = internal_headers(cfg.secret)
    sub = Submitter(cfg)
    await sub.open()
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=4), timeout=aiohttp.ClientTimeout(total=30)
    )
    try:
        lm0 = cfg.lm_ids[0]
        floor_lm = await measure_floor(session, cfg.lm_url(lm0), headers, opts.floor_samples)
        floor_worker = await measure_floor(
            session, cfg.worker_url(lm0), headers, opts.floor_samples
        )
        _progress(
            f"bench: {len(jobs)} jobs, {n_tasks} tasks; floor p50 LM "
            f"{percentiles(floor_lm)['p50'] * 1e3:.3f} ms, worker "
            f"{percentiles(floor_worker)['p50'] * 1e3:.3f} ms",
            opts.progress,
        )
        out = sub.outcomes
        busy_floor: list[float] = []
        pinger = asyncio.ensure_future(
            _ping_during_run(session, cfg.lm_url(lm0), headers, busy_floor)
        )
        t0 = time.time()
        inflight: set[asyncio.Task[float]] = set()
        sem = asyncio.Semaphore(256)
        next_report = t0 + 1.0

        async def submit(job: Job | DagJob) -> float:
            async with sem:
                at = await sub.submit(job)
                job.arrival = at  # wall clock from here on: JCT and fairness windows
                return at

        for job in jobs:
            delay = t0 + job.arrival - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            fut = asyncio.ensure_future(submit(job))
            inflight.add(fut)
            fut.add_done_callback(inflight.discard)
            if time.time() >= next_report:
                next_report += 1.0
                _progress(_line(sub, n_tasks, t0), opts.progress)
        for fut in list(inflight):
            await fut
        submit_span = time.time() - t0
        deadline = time.time() + opts.timeout_s
        ids = [t.task_id for j in jobs for t in j.tasks]
        while time.time() < deadline:
            if out.n_done >= len(ids) and all(out.done(i) for i in ids):
                break
            out.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.changed.wait(), timeout=1.0)
            if time.time() >= next_report:
                next_report = time.time() + 1.0
                _progress(_line(sub, n_tasks, t0), opts.progress)
        _progress(_line(sub, n_tasks, t0), opts.progress)
        pinger.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pinger
        states = await fetch_states(session, cfg, headers)
    finally:
        await session.close()
        await sub.close()

    tasks: list[Task] = []
    for i in ids:
        task = out.finished.get(i) or out.started.get(i) or out.failed_tasks.get(i)
        if task is not None:
            tasks.append(task)
    started = [t for t in tasks if t.started_at >= 0]
    lost = [i for i in ids if not out.done(i)]
    summary = summarize_tasks(tasks)
    first = min((t.submitted_at for t in started), default=0.0)
    last = max((t.started_at for t in started), default=0.0)
    summary.update(
        {
            "tasks": n_tasks,
            "tasks_finished": len(out.finished),
            "tasks_failed": len(out.failed),
            "jobs_refused": dict(sub.refused),
            "lost_tasks": len(lost),
            "lost_task_ids": lost[:50],
            "throughput_tasks_per_s": len(started) / (last - first) if last > first else 0.0,
            "offered_tasks_per_s": n_tasks / submit_span if submit_span > 0 else 0.0,
            "floor_rtt_s": percentiles(floor_lm)["p50"],
            "floor": {
                "lm_s": percentiles(floor_lm),
                "worker_s": percentiles(floor_worker),
                "lm_during_run_s": percentiles(busy_floor),
            },
            "counters": counters_from(states),
            "services": states,
            "federation": {
                "gms": cfg.gms,
                "lms": cfg.lms,
                "nodes": cfg.lms * cfg.nodes_per_lm,
                "profile": cfg.profile,
            },
            "workload": {
                "trace": opts.trace,
                "jobs": len(jobs),
                "rate": opts.rate,
                "time_scale": opts.time_scale,
                "seed": opts.seed,
            },
        }
    )
    summary.update(job_metrics(cfg, jobs, tasks))
    floor = summary["floor_rtt_s"]
    if floor > 0:
        summary["allocation_p50_in_floors"] = summary["allocation_time_s"]["p50"] / floor
    write_outputs(Path(opts.out), summary, tasks)
    return summary


def job_metrics(
    cfg: FederationConfig, jobs: list[Job | DagJob], tasks: list[Task]
) -> dict[str, Any]:
    """Job completion times, makespan and Jain's index over 60-s windows (issue 4),
    from the tasks' measured start and finish times."""
    from simulator.dag_run import jain_windows, jct_stats
    from simulator.megha_sim import SimResult

    by_id = {t.task_id: t for t in tasks}
    jct: dict[JobId, float] = {}
    last = 0.0
    for j in jobs:
        ends = [by_id[t.task_id].finished_at for t in j.tasks if t.task_id in by_id]
        if len(ends) == len(j.tasks) and all(e >= 0 for e in ends):
            jct[j.job_id] = max(ends) - j.arrival
            last = max(last, max(ends))
    first = min((j.arrival for j in jobs), default=0.0)
    capacity = [
        sum(col) for col in zip(*(n.capacity for c in cfg.clusters for n in c.nodes), strict=True)
    ]
    samples = usage_samples(tasks, capacity, first, last)
    result = SimResult(
        tasks=tasks,
        job_completion=jct,
        job_arrival={j.job_id: j.arrival for j in jobs},
        counters={},
        makespan_s=last - first if jct else 0.0,
        usage_samples=samples,
    )
    return {
        "jct_s": jct_stats(jct),
        "makespan_s": result.makespan_s,
        "jobs_completed": len(jct),
        "jain": jain_windows(result, cfg.user_configs, jobs),  # type: ignore[arg-type]
    }


def usage_samples(
    tasks: list[Task], capacity: list[int], first: float, last: float, step: float = 1.0
) -> list[tuple[float, dict[UserId, float]]]:
    """Each user's dominant share of the federation, sampled every ``step`` seconds."""
    edges: list[tuple[float, int, Task]] = []
    for t in tasks:
        if t.started_at >= 0 and t.finished_at >= t.started_at:
            edges.append((t.started_at, 1, t))
            edges.append((t.finished_at, -1, t))
    edges.sort(key=lambda e: (e[0], e[1]))
    used: dict[UserId, list[int]] = {}
    out: list[tuple[float, dict[UserId, float]]] = []
    k = 0
    now = first
    while now <= last:
        while k < len(edges) and edges[k][0] <= now:
            _, sign, t = edges[k]
            acc = used.setdefault(t.user, [0] * len(capacity))
            for r, x in enumerate(t.demand):
                acc[r] += sign * x
            k += 1
        out.append(
            (
                now,
                {u: max(x / c for x, c in zip(v, capacity, strict=True)) for u, v in used.items()},
            )
        )
        now += step
    return out


async def _ping_during_run(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], out: list[float]
) -> None:
    """The same empty round trip, every 20 ms while the workload runs."""
    while True:
        out.extend(await measure_floor(session, url, headers, 1))
        await asyncio.sleep(0.02)


def _line(sub: Submitter, n: int, t0: float) -> str:
    o = sub.outcomes
    return (
        f"bench: t={time.time() - t0:6.1f}s submitted {len(sub.submitted)}/{n} "
        f"started {len(o.started)} finished {len(o.finished)} failed {len(o.failed)}"
    )


def write_outputs(out: Path, summary: dict[str, Any], tasks: list[Task]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    write_records_csv(out / "tasks.csv", tasks)
    started = [t for t in tasks if t.started_at >= 0]
    plot_cdfs(
        out / "allocation_cdf.png",
        {"allocation time": [t.allocation_time for t in started]},
        "Allocation time (live federation)",
    )
    plot_components(
        out / "components.png", {"live": summary["components_s"]}, "Allocation-time components"
    )


def report_text(summary: dict[str, Any]) -> str:
    rows = {"allocation": summary["allocation_time_s"], **summary["components_s"]}
    lines = [
        format_table(rows),
        f"tasks {summary['tasks']}  finished {summary['tasks_finished']}  failed "
        f"{summary['tasks_failed']}  lost {summary['lost_tasks']}",
        f"throughput {summary['throughput_tasks_per_s']:.1f} tasks/s; floor (empty LM round "
        f"trip, p50) {summary['floor_rtt_s'] * 1e3:.3f} ms idle, "
        f"{summary['floor']['lm_during_run_s']['p50'] * 1e3:.3f} ms during the run",
        "counters: " + ", ".join(f"{k}={v}" for k, v in summary["counters"].items() if v),
    ]
    return "\n".join(lines)
