"""``megha bench``: drive a running federation and report allocation-time tails.

Replays a trace, a synthetic workload or a DAG job file into the users' queues (at
the workload's arrival times, scaled, or at a fixed rate), waits until every task
finished or failed, and measures the floor (an empty request's round trip to an LM
and to a worker over keep-alive HTTP) in the same run.  Writes ``summary.json``,
``tasks.csv``, ``allocation_cdf.png`` and ``components.png`` into ``--out``.

Times: a task's allocation time runs from its entry into its GM's queue (when the
GM takes the job from the broker) to its final start; ``submission_s`` is the time
from the generator's publish to that entry, and ``submit_to_start_s`` the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from common.cluster import profile
from common.config import FederationConfig
from common.dag import DagJob, load_jobs
from common.errors import ConfigError
from common.ids import JobId, LmId, TaskId
from common.metrics import (
    DuplicateLaunches,
    jain_windows,
    jct_stats,
    percentiles,
    summarize_tasks,
    usage_from_tasks,
)
from common.model import Task, TaskKey, new_task
from request_generator.report import plot_cdfs, plot_components, write_records_csv
from request_generator.submitter import Submitter
from request_generator.workload import (
    Job,
    WorkloadSpec,
    jobs_from_trace,
    read_trace,
    specs_of,
    synthetic_jobs,
)
from security.access import Access
from security.identity import Identity
from security.identity import gm as gm_identity
from security.identity import lm as lm_identity
from security.identity import workers as workers_identity


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
    reporter: Callable[[BenchStatus], None] | None = None
    """Where progress goes instead of lines on stderr (a progress bar: ``megha bench``)."""


@dataclass(frozen=True, slots=True)
class BenchStatus:
    """Where a run is: tasks submitted, done (finished or failed) of ``total``; or a note."""

    submitted: int
    done: int
    total: int
    note: str = ""


# -------------------------------------------------------------------- workload
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
        return _stamp_run(list(_dag_workload(cfg, opts.jobs_file)), opts)
    spec = WorkloadSpec(
        profile=cfg.profile,
        constraints=cfg.constraints,
        time_scale=opts.time_scale,
        duration_scale=opts.duration_scale,
    )
    rng = random.Random(opts.seed)
    jobs: list[Job]
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
    run = f"r{int(time.time() * 1000) % 10**10:x}"
    jobs.sort(key=lambda j: j.arrival)
    for j in jobs:
        old = j.job_id
        j.job_id = JobId(f"{run}.{old}")

        def renamed(s: Any, old: str = old, new: JobId = j.job_id) -> Any:
            rest = s.task_id[len(old) :] if s.task_id.startswith(old) else f".{s.task_id}"
            return replace(s, job_id=new, task_id=TaskId(f"{new}{rest}"))

        if isinstance(j, DagJob):
            for t in j.tasks:
                t.spec = renamed(t.spec)
        else:
            j.tasks = [renamed(s) for s in j.tasks]
    if opts.rate is not None:
        for i, j in enumerate(jobs):
            j.arrival = i / opts.rate
    elif jobs:
        t0 = jobs[0].arrival
        for j in jobs:
            j.arrival -= t0
    return jobs


# --------------------------------------------------------------- measurement
def signed(access: Access, to: Identity, method: str, path: str) -> dict[str, str]:
    """Headers of an empty request from the operator to ``to``."""
    return access.sign(to, method, path, b"", time.time())


async def measure_floor(
    session: aiohttp.ClientSession, url: str, access: Access, to: Identity, n: int
) -> list[float]:
    """Round trips of an empty signed request over one keep-alive connection (none if
    the service does not answer: a bench survives a service that is down)."""
    rtts: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        try:
            headers = signed(access, to, "POST", "/v1/ping")
            async with session.post(url + "/v1/ping", data=b"", headers=headers) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError):
            return rtts
        rtts.append(time.perf_counter() - t)
    return rtts


class LaunchLog:
    """The worker pools' logs of starts, ends and stops, followed as they grow (each
    pool keeps only its latest rows): ``poll`` fetches what is new since the last
    call into ``check`` (or ``rows`` with ``keep``); ``missed`` counts rows a pool
    dropped before they were read."""

    def __init__(self, cfg: FederationConfig, access: Access, *, keep: bool = False) -> None:
        self.cfg, self.access = cfg, access
        self.keep = keep
        self.rows: list[dict[str, Any]] = []
        self.check = DuplicateLaunches()
        self.missed = 0
        self._after: dict[LmId, int] = {}

    async def poll(self, session: aiohttp.ClientSession, *, record: bool = True) -> None:
        """What each pool logged since the last poll (a pool that is down says nothing);
        ``record=False`` only moves the cursors (what ran before a run began)."""
        for lm in self.cfg.lm_ids:
            after = self._after.get(lm, 0)
            try:
                page = await self._page(session, lm, after)
                if int(page["next"]) < after:  # the pool restarted: its log began anew
                    page = await self._page(session, lm, 0)
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
                continue
            self._after[lm] = int(page["next"])
            if not record:
                continue
            self.missed += int(page["missed"])
            for row in page["launches"]:
                self.check.add(row)
            if self.keep:
                self.rows.extend(page["launches"])

    async def _page(self, session: aiohttp.ClientSession, lm: LmId, after: int) -> Any:
        path = f"/v1/launches?after={after}"
        headers = signed(self.access, workers_identity(lm), "GET", path)
        async with session.get(self.cfg.worker_url(lm) + path, headers=headers) as r:
            return await r.json()

    async def follow(self, session: aiohttp.ClientSession, every_s: float = 2.0) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            await self.poll(session)


async def fetch_launches(
    session: aiohttp.ClientSession, cfg: FederationConfig, access: Access
) -> list[dict[str, Any]]:
    """The worker pools' latest starts, ends and stops (what a pool that is down could
    not say is missing)."""
    log = LaunchLog(cfg, access, keep=True)
    await log.poll(session)
    return log.rows


async def fetch_states(
    session: aiohttp.ClientSession, cfg: FederationConfig, access: Access
) -> dict[str, Any]:
    """Every GM's and (active) LM's state page."""
    states: dict[str, Any] = {}
    targets: list[tuple[str, list[str], Identity]] = [
        (g, [cfg.gm_url(g)], gm_identity(g)) for g in cfg.gm_ids
    ]
    targets += [(x, cfg.lm_urls(x), lm_identity(x)) for x in cfg.lm_ids]
    for name, urls, who in targets:
        for url in urls:
            try:
                headers = signed(access, who, "GET", "/v1/state")
                async with session.get(url + "/v1/state", headers=headers) as resp:
                    page = await resp.json()
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                states.setdefault(name, {"error": str(exc)})
                continue
            if page.get("active", True):  # an LM's standby says so: ask the other
                states[name] = page
                break
    return states


COUNTERS_GM = ("internal_inconsistencies", "external_inconsistencies", "requeues", "failed")
COUNTERS_LM = (
    "preemptions",
    "repartitions",
    "refused_internal",
    "refused_external",
    "workers_lost",
)


def counters_from(states: dict[str, Any]) -> dict[str, int]:
    """The federation's counters, summed over the GMs' and LMs' state pages."""
    total: dict[str, int] = dict.fromkeys((*COUNTERS_GM, *COUNTERS_LM, "dead_lettered"), 0)
    for name, st in states.items():
        c = st.get("counters", {})
        for k in COUNTERS_GM if name.startswith("gm") else COUNTERS_LM:
            total[k] += int(c.get(k, 0))
        total["dead_lettered"] += int(st.get("dead_lettered", 0))
    total["inconsistencies"] = total["internal_inconsistencies"] + total["external_inconsistencies"]
    return total


# ------------------------------------------------------------------- the run
REPORT_EVERY_S = 0.5


@dataclass
class _Run:
    """What a run gathered, before it becomes a summary."""

    jobs: list[Job | DagJob]
    published: dict[TaskKey, float]
    submit_span: float
    floor_lm: list[float]
    floor_worker: list[float]
    busy_floor: list[float]
    states: dict[str, Any]
    launches: LaunchLog


def _report(opts: BenchOptions, sub: Submitter, n: int, t0: float, note: str = "") -> None:
    """Progress: to ``opts.reporter``, else (``opts.progress``) a line on stderr."""
    o = sub.outcomes
    if opts.reporter is not None:
        opts.reporter(BenchStatus(len(sub.submitted), o.n_done, n, note))
    elif opts.progress:
        line = note or (
            f"bench: t={time.time() - t0:6.1f}s submitted {len(sub.submitted)}/{n} "
            f"finished {len(o.finished)} failed {len(o.failed)}"
        )
        print(line, file=sys.stderr, flush=True)


async def _submit_all(
    sub: Submitter, jobs: list[Job | DagJob], opts: BenchOptions, n_tasks: int
) -> tuple[dict[TaskKey, float], float]:
    """Publish every job at its arrival time; returns publish times and the span."""
    t0 = time.time()
    published: dict[TaskKey, float] = {}
    sem = asyncio.Semaphore(256)
    next_report = t0 + REPORT_EVERY_S

    async def submit(job: Job | DagJob) -> None:
        async with sem:
            at = await sub.submit(job)
            job.arrival = at  # wall clock from here on: JCT and fairness windows
            for s in specs_of(job):
                published[(s.user, s.task_id)] = at

    async with asyncio.TaskGroup() as tg:
        for job in jobs:
            delay = t0 + job.arrival - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tg.create_task(submit(job))
            if time.time() >= next_report:
                next_report += REPORT_EVERY_S
                _report(opts, sub, n_tasks, t0)
    return published, time.time() - t0


async def _wait_done(sub: Submitter, keys: list[TaskKey], opts: BenchOptions) -> None:
    out = sub.outcomes
    t0 = time.time()
    deadline = t0 + opts.timeout_s
    next_report = t0 + REPORT_EVERY_S
    while time.time() < deadline:
        if out.n_done >= len(keys) and all(out.done(k) for k in keys):
            break
        out.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(out.changed.wait(), timeout=REPORT_EVERY_S)
        if time.time() >= next_report:
            next_report = time.time() + REPORT_EVERY_S
            _report(opts, sub, len(keys), t0)
    _report(opts, sub, len(keys), t0)


async def _ping_during_run(
    session: aiohttp.ClientSession, url: str, access: Access, to: Identity, out: list[float]
) -> None:
    """The same empty round trip, every 20 ms while the workload runs."""
    while True:
        out.extend(await measure_floor(session, url, access, to, 1))
        await asyncio.sleep(0.02)
        if len(out) > 100_000:  # bounded: a soak keeps the latest
            del out[:50_000]


async def _drive(cfg: FederationConfig, opts: BenchOptions, sub: Submitter) -> _Run:
    jobs = build_workload(cfg, opts)
    n_tasks = sum(len(j.tasks) for j in jobs)
    access = sub.access
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=4), timeout=aiohttp.ClientTimeout(total=30)
    ) as session:
        lm0 = cfg.lm_ids[0]
        floor_lm = await measure_floor(
            session, cfg.lm_url(lm0), access, lm_identity(lm0), opts.floor_samples
        )
        floor_worker = await measure_floor(
            session, cfg.worker_url(lm0), access, workers_identity(lm0), opts.floor_samples
        )
        _report(
            opts, sub, n_tasks, time.time(),
            f"bench: {len(jobs)} jobs, {n_tasks} tasks; floor p50 LM "
            f"{percentiles(floor_lm)['p50'] * 1e3:.3f} ms, worker "
            f"{percentiles(floor_worker)['p50'] * 1e3:.3f} ms",
        )  # fmt: skip
        busy: list[float] = []
        log = LaunchLog(cfg, access)
        await log.poll(session, record=False)  # from here on: what this run launches
        followers = [
            asyncio.ensure_future(
                _ping_during_run(session, cfg.lm_url(lm0), access, lm_identity(lm0), busy)
            ),
            asyncio.ensure_future(log.follow(session)),
        ]
        try:
            published, span = await _submit_all(sub, jobs, opts, n_tasks)
            await _wait_done(sub, list(published), opts)
        finally:
            for f in followers:
                f.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await f
        states = await fetch_states(session, cfg, access)
        await log.poll(session)
    return _Run(jobs, published, span, floor_lm, floor_worker, busy, states, log)


async def run_bench(cfg: FederationConfig, opts: BenchOptions, home: Path) -> dict[str, Any]:
    """Replay, wait, measure, as the operator of the federation in ``home``; returns the
    summary (also written to ``opts.out``)."""
    sub = Submitter.operator(cfg, home)
    await sub.open()
    try:
        run = await _drive(cfg, opts, sub)
    finally:
        await sub.close()
    summary, tasks = summarize_run(cfg, opts, run, sub)
    write_outputs(Path(opts.out), summary, tasks)
    return summary


def summarize_run(
    cfg: FederationConfig, opts: BenchOptions, run: _Run, sub: Submitter
) -> tuple[dict[str, Any], list[Task]]:
    out = sub.outcomes
    mine = set(run.published)
    dup = run.launches.check.result(mine)
    tasks: list[Task] = []
    lost: list[TaskKey] = []
    for key, at in run.published.items():
        task = out.finished.get(key) or out.failed_tasks.get(key)
        if task is None:
            lost.append(key)
            task = new_task(sub.submitted[key], at)
        tasks.append(task)
    started = [t for t in tasks if t.started_at >= 0]
    summary = summarize_tasks(tasks)
    first = min((t.submitted_at for t in started), default=0.0)
    last = max((t.started_at for t in started), default=0.0)
    summary.update(
        {
            "submission_s": percentiles(
                [t.submitted_at - run.published[t.key] for t in started if t.key in run.published]
            ),
            "submit_to_start_s": percentiles(
                [t.started_at - run.published[t.key] for t in started if t.key in run.published]
            ),
            "tasks_finished": len(out.finished),
            "tasks_failed": len(out.failed.keys() - out.finished.keys()),
            "failure_reasons": _reasons(out.failed),
            "jobs_refused": dict(sub.refused),
            "lost_tasks": len(lost),
            "lost_task_ids": [f"{u}/{t}" for u, t in lost[:50]],
            "duplicate_launches": dup["count"],
            "duplicate_launch_ids": dup["tasks"],
            "launch_log_rows_missed": run.launches.missed,
            "duplicate_outcomes": out.duplicates,
            "throughput_tasks_per_s": len(started) / (last - first) if last > first else 0.0,
            "offered_tasks_per_s": len(tasks) / run.submit_span if run.submit_span > 0 else 0.0,
            "floor_rtt_s": percentiles(run.floor_lm or run.floor_worker)["p50"],
            "floor": {
                "lm_s": percentiles(run.floor_lm),
                "worker_s": percentiles(run.floor_worker),
                "lm_during_run_s": percentiles(run.busy_floor),
            },
            "counters": counters_from(run.states),
            "services": run.states,
            "federation": {
                "gms": cfg.gms,
                "lms": cfg.lms,
                "nodes": cfg.lms * cfg.nodes_per_lm,
                "profile": cfg.profile,
            },
            "workload": {
                "trace": opts.trace,
                "jobs_file": opts.jobs_file,
                "jobs": len(run.jobs),
                "rate": opts.rate,
                "time_scale": opts.time_scale,
                "seed": opts.seed,
            },
        }
    )
    summary.update(job_metrics(cfg, run.jobs, tasks))
    floor = summary["floor_rtt_s"]
    if floor > 0:
        summary["allocation_p50_in_floors"] = summary["allocation_time_s"]["p50"] / floor
    return summary, tasks


def _reasons(failed: dict[TaskKey, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for why in failed.values():
        out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:20])


def job_metrics(
    cfg: FederationConfig, jobs: list[Job | DagJob], tasks: list[Task]
) -> dict[str, Any]:
    """Job completion times, makespan and Jain's index over 60-s windows, from the
    tasks' measured start and finish times."""
    by_key = {t.key: t for t in tasks}
    jct: dict[JobId, float] = {}
    spans: dict[Any, list[tuple[float, float]]] = {}
    last = 0.0
    for j in jobs:
        ends = [by_key[(s.user, s.task_id)].finished_at for s in specs_of(j)]
        if ends and all(e >= 0 for e in ends):
            jct[j.job_id] = max(ends) - j.arrival
            last = max(last, max(ends))
        spans.setdefault(j.user, []).append((j.arrival, j.arrival + jct.get(j.job_id, 1e18)))
    first = min((j.arrival for j in jobs), default=0.0)
    capacity = [
        sum(col) for col in zip(*(n.capacity for c in cfg.clusters for n in c.nodes), strict=True)
    ]
    samples = usage_from_tasks(tasks, capacity, first, last)
    shares = {u.user: u.share for u in cfg.user_configs}
    return {
        "jct_s": jct_stats(jct),
        "makespan_s": last - first if jct else 0.0,
        "jobs_completed": len(jct),
        "jain": jain_windows(samples, spans, shares),
    }


# ------------------------------------------------------------------- outputs
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
