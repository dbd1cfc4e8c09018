"""``megha bench``: drive a running federation and report allocation-time tails.

Replays a trace, a synthetic workload or a DAG job file into the users' queues (at
the workload's arrival times, scaled, or at a fixed rate), waits until every task
finished or failed, and measures the floor (an empty request's round trip to an LM
and to a worker over keep-alive HTTP) in the same run.  Writes ``tasks.csv`` as tasks
end, then ``summary.json``, the plots and the services' raw series into ``--out``
(``reporting.live``).

Times: a task's allocation time runs from its entry into its GM's queue (when the
GM takes the job from the broker) to its final start; ``submission_s`` is the time
from the generator's publish to that entry, and ``submit_to_start_s`` the whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import random
import sys
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop
from msgspec.structs import replace

from common import codec
from common.cluster import profile
from common.config import FederationConfig
from common.dag import DagJob, load_jobs
from common.errors import ConfigError, DecodeError, MeghaError
from common.ids import JobId, LmId, TaskId, UserId
from common.metrics import DuplicateLaunches, LaunchRow, percentiles
from common.model import Task, TaskKey, TaskSpec, new_task
from common.units import check_live
from reporting.fairness import Span
from reporting.files import output_dir
from reporting.live import (
    capacity,
    counters_between,
    job_metrics_of,
    service_pages,
    traffic_from,
    write_outputs,
)
from reporting.tally import FloatColumns, TaskTally
from reporting.tasks import TaskCsv, components_all
from request_generator.submitter import Outcomes, Submitter
from runtime import h1
from runtime.http import MSGPACK
from security.access import Access
from security.identity import Identity
from security.identity import gm as gm_identity
from security.identity import lm as lm_identity
from security.identity import workers as workers_identity
from workload.dags import scale_jobs
from workload.jobs import Job, check_submittable
from workload.published import published_jobs
from workload.synthetic import WorkloadSpec, jobs_from_trace, synthetic_jobs
from workload.traces import read_trace


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
    trace_format: str = "megha"
    """``megha``: ``trace`` is a ../shared/traces file; else a published trace's format
    (``workload.published.PUBLISHED``), its files in ``trace_files``."""
    trace_files: tuple[str, ...] = ()
    trace_lookahead: float = 86_400.0
    """Google's: a task still running this long after its job arrived is cut there."""
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
    check_live(names, profile(cfg.profile), path)  # the same units as `megha simulate`
    known = {u.user for u in cfg.user_configs}
    for j in jobs:
        if j.user not in known:
            raise ConfigError(
                f"{path}: job {j.job_id} is for user {j.user!r}; the federation's users are "
                f"{', '.join(sorted(known))}",
                reason="unknown_user",
            )
    return jobs


def build_workload(
    cfg: FederationConfig, opts: BenchOptions, read: dict[str, Any] | None = None
) -> list[Job | DagJob]:
    """The jobs of the run, checked and stamped; ``read``, if given, gets what a published
    trace's reader read, cut and dropped, and the jobs a federation could not take."""
    if opts.trace_format != "megha":
        return _published_workload(cfg, opts, {} if read is None else read)
    if opts.jobs_file:
        dags = scale_jobs(
            _dag_workload(cfg, opts.jobs_file),
            time_scale=opts.time_scale,
            duration_scale=opts.duration_scale,
            limit_jobs=opts.limit_jobs,
        )
        return _submittable(_stamp_run(list(dags), opts), cfg)
    spec, rng = _spec(cfg, opts), random.Random(opts.seed)
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
    return _submittable(_stamp_run(list(jobs), opts), cfg)


def _spec(cfg: FederationConfig, opts: BenchOptions) -> WorkloadSpec:
    """How a trace's or synthetic jobs become tasks on this federation."""
    return WorkloadSpec(
        profile=cfg.profile,
        constraints=cfg.constraints,
        time_scale=opts.time_scale,
        duration_scale=opts.duration_scale,
    )


def _published_workload(
    cfg: FederationConfig, opts: BenchOptions, read: dict[str, Any]
) -> list[Job | DagJob]:
    """A published trace's first ``limit_jobs`` jobs a federation can take, read as they
    are replayed.  A job it cannot take (more tasks than a job may hold, a body past
    ``max_body``: a production trace has some) is skipped and counted
    (``unsubmittable_jobs``), not the run refused; a run with none is an error saying
    what was read."""
    if not opts.trace_files:
        raise ConfigError(
            f"--trace-format {opts.trace_format} needs the trace's FILEs", reason="missing_trace"
        )
    jobs, reader = published_jobs(
        opts.trace_format,
        opts.trace_files,
        _spec(cfg, opts),
        cfg.user_configs,
        random.Random(opts.seed),
        opts.trace_lookahead,
    )
    taken: list[Job | DagJob] = []
    skipped = 0
    for job in jobs:
        try:
            check_submittable(job, cfg.max_body)
        except ConfigError:
            skipped += 1
            continue
        taken.append(job)
        if opts.limit_jobs and len(taken) >= opts.limit_jobs:
            break
    read.update(format=opts.trace_format, **reader.stats.as_dict(), unsubmittable_jobs=skipped)
    if not taken:
        counts = ", ".join(f"{k} {v}" for k, v in read.items() if v and k != "format")
        raise ConfigError(
            f"{', '.join(opts.trace_files)}: no job to submit (read: {counts or 'nothing'})",
            reason="empty_workload",
        )
    return _stamp_run(taken, opts)


def _submittable(jobs: list[Job | DagJob], cfg: FederationConfig) -> list[Job | DagJob]:
    """Every job, once checked whole against the wire before any is sent."""
    for j in jobs:
        check_submittable(j, cfg.max_body)
    return jobs


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
    client: h1.Client, url: str, access: Access, to: Identity, n: int
) -> list[float]:
    """Round trips of an empty signed request over one keep-alive connection, by the
    client the services' hops use (none if the service does not answer: a bench
    survives a service that is down)."""
    rtts: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        try:
            await client.post(url + "/v1/ping", b"", signed(access, to, "POST", "/v1/ping"))
        except (h1.BrokenHop, TimeoutError):
            return rtts
        rtts.append(time.perf_counter() - t)
    return rtts


class LaunchPage(msgspec.Struct, frozen=True, gc=False):
    """A worker pool's answer to ``GET /v1/launches`` (``worker.app``), the fields the
    bench reads: rows, typed as the check takes them (the pool's other fields are
    skipped), the cursor for the next call, the rows it no longer held, its process
    and its clock."""

    launches: list[LaunchRow]
    next: int
    missed: int
    at: float
    incarnation: str | None = None


_PAGE = msgspec.msgpack.Decoder(LaunchPage)


def read_page(body: bytes) -> LaunchPage:
    """A launch page, with the bounds of a message (``DecodeError``, a ``ValueError``,
    if it is not one)."""
    if len(body) > codec.MAX_BODY:
        raise DecodeError(f"body of {len(body)} bytes exceeds {codec.MAX_BODY}", reason="too_large")
    try:
        return _PAGE.decode(body)
    except msgspec.MsgspecError as exc:
        raise DecodeError(f"not a launch page: {exc}") from None


class LaunchLog:
    """The worker pools' logs of starts, ends and stops, followed as they grow (each
    pool keeps only its latest rows): ``poll`` fetches what is new since the last
    call into ``check`` (and, with ``keep``, into ``rows`` as the pool wrote them,
    each row with its ``pool`` and that pool process's ``incarnation``); ``missed``
    counts rows a pool dropped before they were read."""

    def __init__(
        self,
        cfg: FederationConfig,
        access: Access,
        *,
        keep: bool = False,
        horizon_s: float | None = None,
    ) -> None:
        self.cfg, self.access = cfg, access
        self.keep = keep
        self.rows: list[dict[str, Any]] = []
        self.check = DuplicateLaunches(horizon_s)
        self.missed = 0
        self._after: dict[LmId, int] = {}
        self._incarnation: dict[LmId, object] = {}

    async def poll(self, session: aiohttp.ClientSession, *, record: bool = True) -> None:
        """What each pool logged since the last poll (a pool that is down says nothing);
        ``record=False`` only moves the cursors (what ran before a run began)."""
        for lm in self.cfg.lm_ids:
            after = self._after.get(lm, 0)
            try:
                body = await self._fetch(session, lm, after)
                page = read_page(body)
                if after and self._restarted(lm, page, after):  # its log began anew
                    body = await self._fetch(session, lm, 0)
                    page = read_page(body)
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, DecodeError):
                continue
            self._after[lm] = page.next
            pool, incarnation = f"{lm}-workers", page.incarnation
            self._incarnation[lm] = incarnation
            if incarnation is not None:
                self.check.heard(pool, incarnation, page.at)
            if not record:
                continue
            self.missed += page.missed
            self.check.add_rows(page.launches, pool, incarnation)
            if self.keep:
                rows = codec.unpack_plain(body)["launches"]
                for row in rows:
                    row["pool"], row["incarnation"] = pool, incarnation
                self.rows.extend(rows)

    def _restarted(self, lm: LmId, page: LaunchPage, after: int) -> bool:
        """Another process of the pool answered (or, from a pool that does not name
        its incarnation, one whose log is shorter than what was read)."""
        if page.incarnation is not None and lm in self._incarnation:
            return page.incarnation != self._incarnation[lm]
        return page.next < after

    async def _fetch(self, session: aiohttp.ClientSession, lm: LmId, after: int) -> bytes:
        """The pool's page of rows above ``after``, as it sent it."""
        path = f"/v1/launches?after={after}"
        headers = signed(self.access, workers_identity(lm), "GET", path)
        headers["Accept"] = MSGPACK  # cheaper than JSON for the pool it polls while it runs
        async with session.get(self.cfg.worker_url(lm) + path, headers=headers) as r:
            r.raise_for_status()
            return await r.read()

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
    """Every GM's, (active) LM's and worker pool's state page."""
    states: dict[str, Any] = {}
    targets: list[tuple[str, list[str], Identity]] = [
        (g, [cfg.gm_url(g)], gm_identity(g)) for g in cfg.gm_ids
    ]
    targets += [(x, cfg.lm_urls(x), lm_identity(x)) for x in cfg.lm_ids]
    targets += [(f"{x}-workers", [cfg.worker_url(x)], workers_identity(x)) for x in cfg.lm_ids]
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


# ------------------------------------------------------------------- the run
REPORT_EVERY_S = 0.5
LAUNCH_HORIZON_S = 120.0
"""A task that ended is checked for a second run until its pools said nothing of it
for this long (``DuplicateLaunches``), then forgotten: a soak's memory stays flat."""


class RunTally:
    """What becomes of a run's tasks, taken as each task ends and not kept: its row goes
    to ``tasks.csv`` and its figures into compact columns (``TaskTally``; the publish ->
    GM-queue and publish -> start times; the runs for the users' shares); a job, while
    some of its tasks run, is a count and the latest end, then only that end."""

    def __init__(
        self,
        cfg: FederationConfig,
        jobs: Sequence[Job | DagJob],
        csv_path: Path,
        *,
        spill_rows: int = 16384,
    ) -> None:
        self.cfg = cfg
        self.width = len(capacity(cfg))
        self.tasks = TaskTally(spill_rows=spill_rows)
        self.publish = FloatColumns(("submission", "submit_to_start"), spill_rows=spill_rows)
        self.runs = FloatColumns(
            ("started", "finished", "user", *(f"d{r}" for r in range(self.width))),
            spill_rows=spill_rows,
        )
        self.csv = TaskCsv(csv_path)
        self.users: dict[str, int] = {}
        self.first = math.inf
        """Earliest GM-queue entry of a task that started."""
        self.last = -math.inf
        """Latest final start."""
        self._job_at = {j.job_id: i for i, j in enumerate(jobs)}
        self._job_size = array("l", (len(j.tasks) for j in jobs))
        self.job_end = array("d", [math.nan]) * len(jobs)
        """Each job's latest task end once every task of it ended (NaN: not all did)."""
        self._open: dict[int, list[float]] = {}  # job -> [tasks left, latest end, all ended]

    def add(self, task: Task, published_at: float, failure: str | None = None) -> None:
        """A task that ended (or never will), submitted at ``published_at``;
        ``failure``: why it failed, None unless it did."""
        self.add_many([(task, published_at)], [failure])

    def add_many(
        self, ended: Sequence[tuple[Task, float]], failures: Sequence[str | None] | None = None
    ) -> None:
        """Tasks that ended, each with its publication time, as ``add`` takes them one
        after the other (``failures``: each one's, None: none failed): their rows
        written at once, their figures added to the columns at once."""
        tasks = [task for task, _ in ended]
        components = components_all(tasks)
        self.csv.write_many(tasks, failures, components)
        self.tasks.add_many(tasks, components)
        publish: list[float] = []
        runs: list[float] = []
        width, users = self.width, self.users
        zeros = (0,) * width
        first, last = self.first, self.last
        job_at, job_size, job_end, jobs_open = (
            self._job_at,
            self._job_size,
            self.job_end,
            self._open,
        )
        try:
            for task, published_at in ended:
                start, end = task.started_at, task.finished_at
                spec = task.spec
                if start >= 0:
                    sub = task.submitted_at
                    publish += (sub - published_at, start - published_at)
                    if sub < first:  # min(first, sub), max(last, start), as they compare
                        first = sub
                    if start > last:
                        last = start
                    if end >= start:
                        user = users.get(spec.user)
                        if user is None:
                            user = users[spec.user] = len(users)
                        demand = spec.demand
                        if len(demand) > width:
                            raise ValueError(f"a demand of {len(demand)} resources, not {width}")
                        runs += (start, end, float(user), *demand, *zeros[len(demand) :])
                j = job_at.get(spec.job_id)
                if j is None:
                    continue
                rec = jobs_open.get(j)
                if rec is None:  # tasks left, latest end, whether every task so far ended
                    rec = jobs_open[j] = [float(job_size[j]), -math.inf, 1.0]
                rec[0] -= 1
                if end >= 0:
                    if end > rec[1]:
                        rec[1] = end
                else:
                    rec[2] = 0.0
                if rec[0] <= 0:
                    del jobs_open[j]
                    if rec[2]:
                        job_end[j] = rec[1]
        finally:
            self.first, self.last = first, last
            self.publish.extend(publish)
            self.runs.extend(runs)

    def spans(self) -> Iterator[Span]:
        """The runs of the tasks that started and ended, for ``usage_samples``."""
        cols = self.runs.columns()
        names = {float(i): UserId(u) for u, i in self.users.items()}
        demand = [cols[f"d{r}"] for r in range(self.width)]
        for k, (a, b, u) in enumerate(
            zip(cols["started"], cols["finished"], cols["user"], strict=True)
        ):
            yield a, b, names[u], [int(d[k]) for d in demand]

    def close(self) -> None:
        self.csv.close()
        self.tasks.close()
        self.publish.close()
        self.runs.close()


@dataclass
class _Run:
    """What a run gathered, before it becomes a summary."""

    jobs: list[Job | DagJob]
    tally: RunTally
    prefix: str
    """Every task id of the run begins so."""
    unfinished: list[tuple[TaskKey, TaskSpec, float]]
    """Submitted, and neither finished nor failed within the timeout (still queued or
    running, maybe: not known to be lost)."""
    n_tasks: int
    submit_span: float
    floor_lm: list[float]
    floor_worker: list[float]
    busy_floor: list[float]
    states: dict[str, Any]
    launches: LaunchLog
    states_before: dict[str, Any] = field(default_factory=dict)
    """The state pages as the run began: its counters are the difference."""
    read: dict[str, Any] = field(default_factory=dict)
    """A published trace's: what its reader read, cut and dropped (``build_workload``)."""


class _OfRun:
    """The tasks of one run (a container of task keys, by their ids' prefix)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and str(key[1]).startswith(self.prefix)


def _run_prefix(jobs: Sequence[Job | DagJob]) -> str:
    """What ``_stamp_run`` put before every job id (and so every task id)."""
    return jobs[0].job_id.split(".", 1)[0] + "." if jobs else "\0"


def _report(opts: BenchOptions, sub: Submitter, n: int, t0: float, note: str = "") -> None:
    """Progress: to ``opts.reporter``, else (``opts.progress``) a line on stderr."""
    o = sub.outcomes
    if opts.reporter is not None:
        opts.reporter(BenchStatus(sub.n_submitted, o.n_done, n, note))
    elif opts.progress:
        line = note or (
            f"bench: t={time.time() - t0:6.1f}s submitted {sub.n_submitted}/{n} "
            f"finished {o.n_finished} failed {len(o.failed)}"
        )
        print(line, file=sys.stderr, flush=True)


async def _submit_all(
    sub: Submitter, jobs: list[Job | DagJob], opts: BenchOptions, n_tasks: int
) -> float:
    """Publish every job at its arrival time; returns the span."""
    t0 = time.time()
    sem = asyncio.Semaphore(256)
    next_report = t0 + REPORT_EVERY_S

    async def submit(job: Job | DagJob) -> None:
        async with sem:
            job.arrival = await sub.submit(job)  # wall clock from here on: JCT, fairness

    try:
        async with asyncio.TaskGroup() as tg:
            for job in jobs:
                delay = t0 + job.arrival - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tg.create_task(submit(job))
                if time.time() >= next_report:
                    next_report += REPORT_EVERY_S
                    _report(opts, sub, n_tasks, t0)
    except ExceptionGroup as group:  # a refused submission: the error itself, not its group
        refused = group.subgroup(MeghaError)
        if refused is None:
            raise
        raise _first(refused) from None
    return time.time() - t0


def _first(group: BaseExceptionGroup[MeghaError]) -> MeghaError:
    """The first error of a (nested) group."""
    exc = group.exceptions[0]
    return _first(exc) if isinstance(exc, BaseExceptionGroup) else exc


def check_tokens(sub: Submitter, jobs: Iterable[Job | DagJob]) -> None:
    """Every user of the workload has a token (``SubmissionRefused`` naming the first
    who has none), before anything is sent."""
    for user in dict.fromkeys(j.user for j in jobs):
        sub.token(user)


async def _wait_done(sub: Submitter, n_tasks: int, opts: BenchOptions) -> None:
    """Until no submitted task is outstanding, at most ``opts.timeout_s``."""
    out = sub.outcomes
    t0 = time.time()
    deadline = t0 + opts.timeout_s
    next_report = t0 + REPORT_EVERY_S
    while time.time() < deadline:
        if not out.outstanding:
            break
        out.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(out.changed.wait(), timeout=REPORT_EVERY_S)
        if time.time() >= next_report:
            next_report = time.time() + REPORT_EVERY_S
            _report(opts, sub, n_tasks, t0)
    _report(opts, sub, n_tasks, t0)


async def _ping_during_run(
    client: h1.Client, url: str, access: Access, to: Identity, out: list[float]
) -> None:
    """The same empty round trip, every 20 ms while the workload runs."""
    while True:
        out.extend(await measure_floor(client, url, access, to, 1))
        await asyncio.sleep(0.02)
        if len(out) > 100_000:  # bounded: a soak keeps the latest
            del out[:50_000]


def sink_into(tally: RunTally, outcomes: Outcomes) -> Callable[[Task, float], None]:
    """What ``outcomes`` hands ``tally``: each task that ended, with why it failed if it
    did (``outcomes.failed`` holds a failed task's reason until it finishes after all);
    also, as ``outcomes.sink_many``, the tasks of a message that finished, together."""
    failed = outcomes.failed
    outcomes.sink_many = tally.add_many
    return lambda task, at: tally.add(task, at, failed.get(task.key))


def close_tally(outcomes: Outcomes, tally: RunTally) -> list[tuple[TaskKey, TaskSpec, float]]:
    """The run's end: the failed tasks, then those not done in time (as they were
    submitted), to ``tasks.csv``, which closes; an outcome that comes later (a task
    done after the timeout, until the submitter closes) goes to no file.  Returns
    those not done."""
    outcomes.settle()
    unfinished = [(key, spec, at) for key, (spec, at) in outcomes.outstanding.items()]
    for _, spec, at in unfinished:
        tally.add(new_task(spec, at), at)
    outcomes.sink = outcomes.sink_many = None
    tally.csv.close()
    return unfinished


async def _drive(
    cfg: FederationConfig, opts: BenchOptions, sub: Submitter, jobs: list[Job | DagJob]
) -> _Run:
    n_tasks = sum(len(j.tasks) for j in jobs)
    prefix = _run_prefix(jobs)
    tally = RunTally(cfg, jobs, Path(opts.out) / "tasks.csv")
    sub.outcomes.sink = sink_into(tally, sub.outcomes)
    sub.outcomes.owns = _OfRun(prefix).__contains__
    access = sub.access
    floor = h1.Client(limit_per_host=1, timeout_s=30.0)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4), timeout=aiohttp.ClientTimeout(total=30)
        ) as session:
            lm0 = cfg.lm_ids[0]
            floor_lm = await measure_floor(
                floor, cfg.lm_url(lm0), access, lm_identity(lm0), opts.floor_samples
            )
            floor_worker = await measure_floor(
                floor, cfg.worker_url(lm0), access, workers_identity(lm0), opts.floor_samples
            )
            _report(
                opts, sub, n_tasks, time.time(),
                f"bench: {len(jobs)} jobs, {n_tasks} tasks; floor p50 LM "
                f"{percentiles(floor_lm)['p50'] * 1e3:.3f} ms, worker "
                f"{percentiles(floor_worker)['p50'] * 1e3:.3f} ms",
            )  # fmt: skip
            busy: list[float] = []
            before = await fetch_states(session, cfg, access)  # the counters' baseline
            log = LaunchLog(cfg, access, horizon_s=LAUNCH_HORIZON_S)
            await log.poll(session, record=False)  # from here on: what this run launches
            followers = [
                asyncio.ensure_future(
                    _ping_during_run(floor, cfg.lm_url(lm0), access, lm_identity(lm0), busy)
                ),
                asyncio.ensure_future(log.follow(session)),
            ]
            gc.freeze()  # the workload and what set it up: no collection walks them again
            try:
                span = await _submit_all(sub, jobs, opts, n_tasks)
                await _wait_done(sub, n_tasks, opts)
            finally:
                gc.unfreeze()
                for f in followers:
                    f.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await f
            states = await fetch_states(session, cfg, access)
            await log.poll(session)
    except BaseException:  # (Ctrl-C) outcomes still come until the submitter closes
        sub.outcomes.sink = sub.outcomes.sink_many = None
        tally.close()
        raise
    finally:
        await floor.close()
    unfinished = close_tally(sub.outcomes, tally)
    return _Run(
        jobs, tally, prefix, unfinished, n_tasks, span, floor_lm, floor_worker, busy, states, log,
        before,
    )  # fmt: skip


async def run_bench(cfg: FederationConfig, opts: BenchOptions, home: Path) -> dict[str, Any]:
    """Replay, wait, measure, as the operator of the federation in ``home``; returns the
    summary (also written to ``opts.out``)."""
    output_dir(opts.out)
    sub = Submitter.operator(cfg, home, keep=False)
    read: dict[str, Any] = {}
    jobs = build_workload(cfg, opts, read)
    check_tokens(sub, jobs)
    await sub.open()
    try:
        run = await _drive(cfg, opts, sub, jobs)
    finally:
        await sub.close()
    run.read = read
    try:
        summary = summarize_run(cfg, opts, run, sub)
        write_outputs(Path(opts.out), summary, run.tally.tasks.allocation_times(), run.states)
    finally:
        run.tally.close()
    return summary


def bench(cfg: FederationConfig, opts: BenchOptions, home: Path) -> dict[str, Any]:
    """``run_bench`` on its own uvloop event loop, as the services run: the request
    generator usually shares the machine with the federation it measures (on uvloop
    it spent 0.20-0.21 instead of 0.22 ms of CPU per task at 1,000 tasks/s)."""
    return uvloop.run(run_bench(cfg, opts, home))


def _fate(opts: BenchOptions, run: _Run, sub: Submitter) -> dict[str, Any]:
    """What became of the run's tasks: finished, failed (and why), not done within the
    timeout, launched twice."""
    out = sub.outcomes
    dup = run.launches.check.result(_OfRun(run.prefix))
    unfinished = [key for key, _, _ in run.unfinished]
    by_user: dict[str, int] = {}
    for user, _ in unfinished:
        by_user[user] = by_user.get(user, 0) + 1
    return {
        "tasks_finished": out.n_finished,
        "tasks_failed": len(out.failed),
        "failure_reasons": _reasons(out.failed),
        "jobs_refused": dict(sub.refused),
        # not finished (nor failed) within the timeout: not lost, as far as a bench
        # can tell (a GM that was down runs them once it is back)
        "unfinished_tasks": len(unfinished),
        "unfinished_task_ids": [f"{u}/{t}" for u, t in unfinished[:50]],
        "unfinished_by_user": dict(sorted(by_user.items())),
        "timeout_s": opts.timeout_s,
        "lost_tasks": len(unfinished),  # the older name of unfinished_tasks
        "duplicate_launches": dup["count"],
        "duplicate_launch_ids": dup["tasks"],
        "duplicate_launch_reasons": dup.get("why", {}),
        "launch_log_rows": run.launches.check.rows,
        "launch_log_rows_missed": run.launches.missed,
        "launch_log_pool_restarts": run.launches.check.restarts,
        "duplicate_outcomes": out.duplicates,
        "forged_outcomes": out.forged,
    }


def summarize_run(
    cfg: FederationConfig, opts: BenchOptions, run: _Run, sub: Submitter
) -> dict[str, Any]:
    tally = run.tally
    summary = tally.tasks.summary()
    counters, counter_notes = counters_between(run.states_before, run.states)
    publish = tally.publish.columns()
    started = tally.tasks.started
    first, last = (tally.first, tally.last) if started else (0.0, 0.0)
    summary.update(
        {
            "submission_s": percentiles(publish["submission"]),
            "submit_to_start_s": percentiles(publish["submit_to_start"]),
            **_fate(opts, run, sub),
            "throughput_tasks_per_s": started / (last - first) if last > first else 0.0,
            "offered_tasks_per_s": tally.tasks.tasks / run.submit_span
            if run.submit_span > 0
            else 0.0,
            "floor_rtt_s": percentiles(run.floor_lm or run.floor_worker)["p50"],
            "floor": {
                "lm_s": percentiles(run.floor_lm),
                "worker_s": percentiles(run.floor_worker),
                "lm_during_run_s": percentiles(run.busy_floor),
            },
            "counters": counters,
            "counters_are": "this run's: each service's counters at its end less at its start",
            "counters_notes": counter_notes,
            "traffic": traffic_from(run.states),
            "services": service_pages(run.states),
            "federation": {
                "gms": cfg.gms,
                "lms": cfg.lms,
                "nodes": cfg.lms * cfg.nodes_per_lm,
                "profile": cfg.profile,
            },
            "workload": {
                "trace": opts.trace,
                **_published_of(opts, run),
                "jobs_file": opts.jobs_file,
                "jobs": len(run.jobs),
                "rate": opts.rate,
                "time_scale": opts.time_scale,
                "seed": opts.seed,
            },
        }
    )
    summary.update(job_metrics_of(cfg, run.jobs, tally.job_end, tally.spans()))
    floor = summary["floor_rtt_s"]
    if floor > 0:
        summary["allocation_p50_in_floors"] = summary["allocation_time_s"]["p50"] / floor
    return summary


def _published_of(opts: BenchOptions, run: _Run) -> dict[str, Any]:
    """A published trace's files and what its reader made of them, for the summary."""
    if opts.trace_format == "megha":
        return {}
    return {"trace_files": list(opts.trace_files), "trace_read": run.read}


def _reasons(failed: dict[TaskKey, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for why in failed.values():
        out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:20])
