"""A chaos scenario driven: a live federation under load, one fault per scenario, and a check
(``megha chaos``).

Each scenario of ``config/chaos.toml`` starts a fresh federation (on the shared broker,
a private RabbitMQ node or a private 3-node cluster, ``testbed.rabbit``; optionally
with every process in its own network namespace, ``testbed.netns``), submits a load
(synthetic jobs or DAG jobs), applies its fault steps at their times and waits until
every task finished.  Per scenario it records:

* ``submitted``: tasks published; ``completed``: tasks whose outcome says finished;
* ``lost``: submitted tasks that never finished (must be 0);
* ``duplicate_launches``: tasks the worker pools' launch logs show running twice
  (``common.metrics.duplicate_launches``; must be 0);
* ``recovery_s``: from the fault's first step to the end of the last task that was
  outstanding (published, not finished) when it struck.

Results go to ``--out`` as ``chaos.json``, ``chaos.csv`` and ``chaos.md`` (the table
that is also printed).  ``--netns-bench`` instead measures allocation times of a
federation whose every process runs in its own namespace, against added latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp

from chaos.results import verdict
from chaos.scenarios import FAULT_WAIT_S, SIGNALS, Load, Scenario, Step
from chaos.stage import Stage, stage
from common import codec
from common.cluster import profile
from common.config import FederationConfig
from common.dag import DagJob
from common.errors import ConfigError, MeghaError
from common.metrics import duplicate_launches
from common.model import TaskKey
from federation.operator import find_everywhere
from federation.processes import (
    kill,
    kill_all,
    restart,
    restart_service,
    stop_federation,
)
from request_generator.bench import fetch_launches, fetch_states
from request_generator.submitter import Submitter
from runtime import faults
from runtime.clock import CLOCK_STEP
from security import sealing
from security.access import Access
from security.identity import Identity
from testbed.rabbit import RabbitNode
from workload.dags import DagShape, synthetic_dag
from workload.jobs import Job, specs_of, to_submission
from workload.synthetic import WorkloadSpec, synthetic_jobs


def build_jobs(cfg: FederationConfig, load: Load) -> list[Job | DagJob]:
    users = [u for u in cfg.user_configs if not load.users or u.user in load.users]
    rng = random.Random(load.seed)
    if not load.dag:
        spec = WorkloadSpec(profile=cfg.profile, constraints=False)
        plain = synthetic_jobs(
            load.jobs, rate=load.rate, tasks_per_job=load.tasks_per_job,
            mean_duration=load.duration, spec=spec, users=users, rng=rng,
        )  # fmt: skip
        return list(plain)
    shape = DagShape(
        median_stages=4.0, p95_stages=6.0, max_stages=6, median_depth=3.0,
        median_tasks=2.0, max_tasks=4, median_duration=load.duration,
    )  # fmt: skip
    capacity = profile(cfg.profile).node_capacity
    jobs: list[Job | DagJob] = []
    t = 0.0
    for i in range(load.jobs):
        t += rng.expovariate(load.rate)
        user = users[i % len(users)].user
        jobs.append(synthetic_dag(f"c{load.seed}d{i}", user, t, capacity, rng, shape))
    return jobs


class Capture:
    """Copies of the federation's broker messages on one exchange (``replay_*``): a
    private queue bound next to the real consumers', to publish again later, each as
    the party that sealed it (logged in as that party: the broker's permissions hold)."""

    def __init__(
        self, conn: aio_pika.abc.AbstractRobustConnection, exchange: str, key: str,
        url_of: Callable[[str], str],
    ):  # fmt: skip
        self.conn, self.exchange, self.key = conn, exchange, key
        self.url_of = url_of
        """The broker URL of the party a seal names (``lm:lm0``)."""
        self.messages: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def open(self) -> None:
        ch = await self.conn.channel()
        q = await ch.declare_queue(exclusive=True, auto_delete=True)
        await q.bind(self.exchange, routing_key=self.key)
        await q.consume(self._keep, no_ack=True)

    async def _keep(self, msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.messages.append(msg)

    async def replay(self) -> int:
        """Publish every captured message again, newest first (duplicated and reordered),
        each over a connection of the party that sent it."""
        taken, self.messages = self.messages, []
        conns: dict[str, aio_pika.abc.AbstractConnection] = {}
        try:
            for m in reversed(taken):
                sender = str((m.headers or {}).get(sealing.HEADER_SENDER, ""))
                if sender not in conns:
                    conns[sender] = await aio_pika.connect(self.url_of(sender))
                ch = await conns[sender].channel()
                ex = await ch.get_exchange(self.exchange, ensure=False)
                again = aio_pika.Message(
                    m.body, headers=m.headers, message_id=m.message_id,
                    delivery_mode=m.delivery_mode or aio_pika.DeliveryMode.NOT_PERSISTENT,
                )  # fmt: skip
                await ex.publish(again, routing_key=m.routing_key or "")
                await ch.close()
        finally:
            for c in conns.values():
                await c.close()
        return len(taken)


@dataclass
class Run:
    """What happened during one scenario."""

    published: dict[TaskKey, float] = field(default_factory=dict)
    sent: list[tuple[Job | DagJob, float]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    first_fault: float = 0.0
    launched_before: list[dict[str, Any]] = field(default_factory=list)
    """The pools' logs read just before every process went (``kill_all``, ``stop_all``):
    those logs go with their processes."""


def progress_line(msg: str, enabled: bool) -> None:
    if enabled:
        print(msg, file=sys.stderr, flush=True)


async def _until_unacked(st: Stage, gm: str, limit_s: float = 20.0) -> None:
    """Wait until ``gm`` holds a job that LMs accepted (tasks run) but it has not
    acknowledged to the broker: the moment a GM crash hurts most.  ``MeghaError`` if that
    moment does not come within ``limit_s`` (a step at another moment tests less)."""
    loop = asyncio.get_running_loop()
    deadline = time.time() + limit_s
    while time.time() < deadline:
        s = await loop.run_in_executor(None, st.get, gm)
        if s["jobs_unacked"] > 0 and s["running_tasks"] > 0:
            return
        await asyncio.sleep(0.02)
    raise MeghaError(f"{gm} held no unacknowledged job with running tasks in {limit_s:g} s")


async def _until_struck(st: Stage, party: str, fault: str) -> float:
    """Seconds until every strike of ``fault`` armed in ``party`` was used;
    ``MeghaError`` if they were not within ``FAULT_WAIT_S``."""
    t0 = time.time()
    while faults.left(st.faults, party, fault) > 0:
        if time.time() - t0 > FAULT_WAIT_S:
            left = faults.left(st.faults, party, fault)
            raise MeghaError(f"{fault} in {party}: {left} strikes unused after {FAULT_WAIT_S:g} s")
        await asyncio.sleep(0.05)
    return time.time() - t0


BLOCKED_STATES = ("blocked", "blocking")
"""What ``rabbitmqctl list_connections state`` says of a connection whose publishes wait
for an alarm to clear."""


async def _alarm(node: RabbitNode, raise_it: bool) -> str:
    """Raise a memory alarm on a private node (its high watermark near 0) and wait until
    a publisher is blocked; or clear it (the default watermark) and wait until none is."""
    loop = asyncio.get_running_loop()
    mark = "0.000001" if raise_it else "0.4"
    await loop.run_in_executor(None, node.ctl, "set_vm_memory_high_watermark", mark)
    t0 = time.time()
    while time.time() - t0 < FAULT_WAIT_S:
        states = await loop.run_in_executor(None, node.ctl, "list_connections", "state")
        blocked = sum(states.split().count(b) for b in BLOCKED_STATES)
        if (blocked > 0) == raise_it:
            what = f"{blocked} connections blocked" if raise_it else "no connection blocked"
            return f"{what} after {time.time() - t0:.1f} s"
        await asyncio.sleep(0.1)
    raise MeghaError(
        f"{node.nodename}: the alarm did not {'block' if raise_it else 'free'} publishers"
    )


async def _act(st: Stage, step: Step, sub: Submitter, run: Run, caps: dict[str, Capture]) -> str:
    """Apply one step; a short note of what it did."""
    loop = asyncio.get_running_loop()

    def blocking(fn: Callable[[], object]) -> Any:
        return loop.run_in_executor(None, fn)

    a, target = step.action, step.target
    if a in SIGNALS:
        pid = kill(st.home, target, SIGNALS[a])
        return f"{a} {target} (pid {pid})"
    if a == "restart":
        return (
            f"restarted {target} (pid {await blocking(lambda: restart(st.home, st.cfg, target))})"
        )
    if a == "restart_clean":
        pid = await blocking(lambda: restart_service(st.home, st.cfg, target))
        return f"stopped and restarted {target} (pid {pid})"
    if a.startswith("broker_"):
        nodes = st.cluster.nodes if st.cluster else [st.node] if st.node else []
        node = nodes[int(step.value)]
        if a in ("broker_alarm", "broker_unalarm"):
            return f"{a} {node.nodename}: {await _alarm(node, a == 'broker_alarm')}"
        await blocking(getattr(node, a.removeprefix("broker_")))
        return f"{a} {node.nodename}"
    if a in ("consumer_error", "die_on_repartition"):
        count = max(1, int(step.value))
        faults.inject(st.faults, target, a, count)
        took = await _until_struck(st, target, a)
        return f"{a} x{count} in {target}: struck within {took:.1f} s"
    if a in ("partition", "heal", "delay", "undelay"):
        if st.bed is None:
            raise ConfigError(f"{a} needs netns = true")
        bed = st.bed
        fns: dict[str, Callable[[], None]] = {
            "partition": lambda: bed.partition(target),
            "heal": lambda: bed.heal(target),
            "delay": lambda: bed.set_latency(target, step.value),
            "undelay": lambda: bed.clear_latency(target),
        }
        await blocking(fns[a])
        return f"{a} {target}" + (f" {step.value:g} ms" if a == "delay" else "")
    if a in ("kill_all", "stop_all", "start_all"):
        return await _whole(st, a, run)
    if a == "clock_step":  # the service's wall clock, as runtime.clock.wall reads it
        faults.set_value(st.faults, target, CLOCK_STEP, step.value)
        return f"{target}'s wall clock stepped to {step.value:+g} s off"
    if a == "duplicate_jobs":  # the very bytes published before, published again
        for job, at in list(run.sent):
            await sub.publish_raw(
                job.user, codec.encode(to_submission(job, sub.token(job.user), at))
            )
        return f"published {len(run.sent)} jobs again"
    n = await caps[a].replay()
    return f"{a}: {n} captured messages published again, newest first"


async def _whole(st: Stage, a: str, run: Run) -> str:
    """Every process of the federation at once: SIGKILLed (a host losing power), stopped
    cleanly (``megha down``), or started again (``megha up`` with the same state)."""
    loop = asyncio.get_running_loop()
    if a == "start_all":
        await loop.run_in_executor(None, st.start_again)
        return "started every process again (megha up, same state directory)"
    # a pool cut off (a partition step) answers no connection: it is given 1 s, not the
    # 10 a slow answer may take, so the fault strikes near its moment
    timeout = aiohttp.ClientTimeout(total=10, sock_connect=1)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        run.launched_before.extend(await fetch_launches(session, st.cfg, st.access))
    if a == "kill_all":
        struck = await loop.run_in_executor(None, kill_all, st.home)
        return f"SIGKILLed every process at once ({len(struck)} process groups)"
    await loop.run_in_executor(None, lambda: stop_federation(st.home, quiet=True))
    return "stopped every process (megha down)"


async def _faults(st: Stage, sc: Scenario, sub: Submitter, run: Run, caps: dict[str, Capture],
                  t0: float, progress: bool) -> None:  # fmt: skip
    async def one(step: Step, at: float) -> None:
        note = await _act(st, step, sub, run, caps)
        run.steps.append({"at_s": round(at - t0, 3), "action": step.action, "note": note})
        progress_line(f"  t={at - t0:5.1f}s {note}", progress)

    behind: list[asyncio.Task[None]] = []  # background steps, awaited before the checks
    try:
        for step in sc.steps:
            await asyncio.sleep(max(0.0, t0 + step.at - time.time()))
            if step.when == "unacked":
                await _until_unacked(st, step.target)
            at = time.time()
            run.first_fault = run.first_fault or at
            if step.background:
                behind.append(asyncio.create_task(one(step, at)))
            else:
                await one(step, at)
    finally:  # even when a step failed: no restart may outlive the stage's teardown
        done = await asyncio.gather(*behind, return_exceptions=True)
    for failed in (d for d in done if isinstance(d, BaseException)):
        raise failed  # (after the loop: a step's own error is never masked by one of these)


async def _wait_finished(sub: Submitter, run: Run, timeout_s: float, t0: float, progress: bool) -> None:  # fmt: skip
    """Until every task finished (or failed for another reason than a refused duplicate
    job), at most ``timeout_s``; a progress line every second."""
    out = sub.outcomes
    deadline = time.time() + timeout_s
    next_line = time.time() + 1.0

    def settled(k: TaskKey) -> bool:
        return k in out.finished or (k in out.failed and "duplicate_job_id" not in out.failed[k])

    while time.time() < deadline and not all(settled(k) for k in run.published):
        out.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(out.changed.wait(), timeout=0.5)
        if progress and time.time() >= next_line:
            next_line = time.time() + 1.0
            progress_line(
                f"  t={time.time() - t0:5.1f}s submitted {len(run.published)} "
                f"finished {len(out.finished)}",
                progress,
            )


async def drive(st: Stage, sc: Scenario, progress: bool) -> dict[str, Any]:
    """Submit the load, run the faults, wait, and measure."""
    sub = Submitter.operator(st.cfg, st.home)
    await sub.open()
    replays = {s.action for s in sc.steps if s.action.startswith("replay_")}
    conn = await aio_pika.connect_robust(st.access.broker_urls()[0]) if replays else None
    run = Run()

    def url_of(party: str) -> str:
        who = Identity.parse(party)
        return Access.in_home(st.home, st.cfg, who).broker_urls()[0]

    try:
        caps: dict[str, Capture] = {}
        if conn is not None:
            caps["replay_events"] = Capture(conn, st.cfg.events_exchange, "gm.#", url_of)
            caps["replay_state"] = Capture(conn, st.cfg.state_exchange, "lm.*", url_of)
        for c in caps.values():
            await c.open()
        jobs = build_jobs(st.cfg, sc.load)
        t0 = time.time()
        faults = asyncio.ensure_future(_faults(st, sc, sub, run, caps, t0, progress))

        async def load() -> None:
            for job in jobs:
                await asyncio.sleep(max(0.0, t0 + job.arrival - time.time()))
                at = await sub.submit(job)
                run.sent.append((job, at))
                for s in specs_of(job):
                    run.published[(s.user, s.task_id)] = at

        submitting = asyncio.ensure_future(load())
        await asyncio.wait((submitting, faults), return_when=asyncio.FIRST_EXCEPTION)
        if faults.done() and faults.exception() is not None:
            submitting.cancel()  # a step failed: the run is over
        # both to their end (no step outlives the stage); a step's error first: it is
        # the scenario's error, not the submissions its fault then held up
        loaded, struck = await asyncio.gather(submitting, faults, return_exceptions=True)
        for err in (struck, loaded):
            if isinstance(err, BaseException):
                raise err
        await _wait_finished(sub, run, sc.timeout_s, t0, progress)
        await asyncio.sleep(0.5)  # late duplicate outcomes or launches
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            launches = await fetch_launches(session, st.cfg, st.access)
            states = await fetch_states(session, st.cfg, st.access)
    finally:
        if conn is not None:
            await conn.close()
        await sub.close()
    row = measure(sc, run, sub, run.launched_before + launches, time.time() - t0)
    if row["lost_ids"]:  # what the GMs still say of the first few, for a diagnosis
        lost = [str(k).split("/", 1)[1] for k in row["lost_ids"][:5]]
        row["lost_found"] = await asyncio.get_running_loop().run_in_executor(
            None, lambda: {t: find_everywhere(st.cfg, st.access, t) for t in lost}
        )
    row["evidence"] = evidence(states)
    row["expect"] = sc.expect
    return row


EVIDENCE = (
    "jobs_redelivered", "redelivered_skipped", "tasks_adopted", "lm_restarts_seen",
    "lost_with_lm", "requeues", "duplicate_events", "stale_updates", "stale_events",
    "recovered", "recovered_ends", "workers_lost", "held_through_silence", "nodes_given_up",
    "returned_to_gm", "pauses", "relaunched", "duplicates", "jobs_refused", "handler_errors",
    "poisoned", "repartitions", "journal_restored", "orphans_queued", "fenced",
)  # fmt: skip


def evidence(states: dict[str, Any]) -> dict[str, int]:
    """The services' counters that show the fault struck and how it was absorbed
    (summed over GMs and LMs; zeros left out), and the sealed messages they dropped."""
    total: dict[str, int] = {}
    for st in states.values():
        for k in EVIDENCE:
            total[k] = total.get(k, 0) + int(st.get("counters", {}).get(k, 0))
        for kind, drops in st.get("dropped", {}).items():
            if isinstance(drops, dict):
                total[f"dropped_{kind}"] = total.get(f"dropped_{kind}", 0) + sum(drops.values())
        steps = int(st.get("clock", {}).get("steps", 0))  # its wall clock stepped
        total["clock_steps"] = total.get("clock_steps", 0) + steps
        if "broker" in st:
            total["broker_reconnects"] = total.get("broker_reconnects", 0) + int(
                st["broker"].get("reconnects", 0)
            )
    return {k: v for k, v in total.items() if v}


def measure(
    sc: Scenario, run: Run, sub: Submitter, launches: list[dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """The scenario's row: submitted, completed, lost, duplicate launches, recovery."""
    out = sub.outcomes
    mine = set(run.published)
    dup = duplicate_launches(r for r in launches if (str(r["user"]), str(r["task_id"])) in mine)
    lost = [k for k in run.published if k not in out.finished]
    t = run.first_fault
    outstanding = [
        out.finished[k].finished_at
        for k, at in run.published.items()
        if at < t and k in out.finished and out.finished[k].finished_at > t
    ]
    other_failures = {k: v for k, v in out.failed.items() if "duplicate_job_id" not in v}
    return {
        "scenario": sc.name,
        "fault": sc.fault,
        "dag": sc.load.dag,
        "submitted": len(run.published),
        "completed": len(mine & out.finished.keys()),
        "lost": len(lost),
        "duplicate_launches": dup["count"],
        "recovery_s": round(max(outstanding) - t, 3) if outstanding else 0.0,
        "wall_s": round(wall_s, 1),
        "failed": len(other_failures.keys() - out.finished.keys()),
        "duplicate_outcomes": out.duplicates,
        "refused_duplicates": sum(1 for r in sub.refused.values() if r == "duplicate_job_id"),
        "lost_ids": [f"{u}/{i}" for u, i in lost[:20]],
        "duplicate_ids": dup["tasks"][:20],
        "duplicate_log": [  # what the pools logged about those tasks, for a diagnosis
            r for r in launches if f"{r['user']}/{r['task_id']}" in dup["tasks"][:5]
        ],
        "steps": run.steps,
    }


def run_scenario(
    sc: Scenario, base: FederationConfig, root: Path, *, insecure: bool, progress: bool
) -> dict[str, Any]:
    """One scenario from start to teardown; a row with ``error`` if it could not run."""
    progress_line(f"chaos: {sc.name}: {sc.fault}", progress)
    t = time.time()
    try:
        with stage(sc, base, root, insecure=insecure) as st:
            row = asyncio.run(drive(st, sc, progress))
        if verdict(row) == "ok":
            shutil.rmtree(st.home, ignore_errors=True)
        else:
            row["logs"] = str(st.home / "logs")  # kept for a diagnosis
    except (MeghaError, OSError, RuntimeError, ValueError, KeyError) as exc:
        row = {"scenario": sc.name, "fault": sc.fault, "error": f"{type(exc).__name__}: {exc}"}
    row["total_s"] = round(time.time() - t, 1)
    progress_line(f"chaos: {sc.name}: {verdict(row)} ({row['total_s']} s)", progress)
    return row
