"""``megha chaos``: a live federation under load, one fault per scenario, and a check.

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

import argparse
import asyncio
import contextlib
import csv
import json
import logging
import os
import random
import shutil
import signal
import statistics
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp

from common import codec
from common.cluster import profile
from common.config import FederationConfig
from common.dag import DagJob
from common.errors import ConfigError, MeghaError
from common.metrics import duplicate_launches
from common.model import TaskKey
from megha_cli.federation import (
    NETNS_FILE,
    broker_reachable,
    kill,
    restart,
    restart_service,
    signed_get,
    start_federation,
    stop_federation,
)
from megha_cli.secure import purge
from request_generator.bench import BenchOptions, bench, fetch_launches, fetch_states
from request_generator.dag_workload import DagShape, synthetic_dag
from request_generator.submitter import Submitter
from request_generator.workload import Job, WorkloadSpec, specs_of, synthetic_jobs, to_submission
from runtime import faults
from runtime.faults import FAULTS_DIR_ENV
from security import sealing
from security.access import Access
from security.identity import Identity
from testbed.netns import Testbed
from testbed.rabbit import RABBIT_BIN, RabbitCluster, RabbitNode, RabbitSandbox

DEFAULT_SCENARIOS = Path(__file__).resolve().parent.parent / "config" / "chaos.toml"
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}
ACTIONS = (
    *SIGNALS, "restart", "restart_clean", "broker_stop", "broker_start", "broker_kill",
    "broker_alarm", "broker_unalarm", "partition", "heal", "delay", "undelay",
    "duplicate_jobs", "replay_events", "replay_state", "consumer_error", "die_on_repartition",
)  # fmt: skip
FAULT_WAIT_S = 30.0
"""How long a step waits for the fault it armed to strike (else the scenario errs: a
fault that never struck proves nothing)."""
BROKERS = ("shared", "private", "cluster")


# ------------------------------------------------------------------ scenarios
@dataclass(frozen=True)
class Load:
    """What a scenario submits: synthetic jobs (Poisson at ``rate`` jobs/s) or DAG jobs."""

    jobs: int = 30
    rate: float = 15.0
    tasks_per_job: int = 3
    duration: float = 0.5
    """Mean task seconds (DAG jobs: the median stage duration)."""
    dag: bool = False
    users: list[str] = field(default_factory=list)
    """Only these users submit (empty: every user)."""
    seed: int = 1


@dataclass(frozen=True)
class Step:
    """One fault action at ``at`` seconds after the load starts (and, with ``when``,
    once the condition holds: ``unacked`` = ``target``'s GM holds an unacknowledged
    job whose tasks LMs accepted and run)."""

    at: float
    action: str
    target: str = ""
    value: float = 0.0
    when: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str
    """What goes wrong, in a few words (the table's second column)."""
    steps: list[Step]
    load: Load = Load()
    federation: dict[str, Any] = field(default_factory=dict)
    broker: str = "shared"
    netns: bool = False
    quick: bool = False
    timeout_s: float = 90.0
    expect: list[str] = field(default_factory=list)
    """Evidence counters that must be above 0 when the run ends: that the fault struck
    (``jobs_redelivered`` for a kill while a job is unacknowledged...)."""


def load_scenarios(path: Path) -> list[Scenario]:
    """The scenarios of a chaos TOML file (``[[scenario]]`` tables, each merged over
    ``[defaults.federation]`` and ``[defaults.load]``), checked."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    defaults = data.get("defaults", {})
    out: list[Scenario] = []
    for raw in data.get("scenario", []):
        raw = dict(raw)
        steps = [Step(**s) for s in raw.pop("step", [])]
        load = Load(**{**defaults.get("load", {}), **raw.pop("load", {})})
        fed = {**defaults.get("federation", {}), **raw.pop("federation", {})}
        sc = Scenario(steps=steps, load=load, federation=fed, **raw)
        bad = [s.action for s in sc.steps if s.action not in ACTIONS]
        if bad or sc.broker not in BROKERS or not sc.steps:
            raise ConfigError(f"{path}: scenario {sc.name!r}: bad action, broker or no step")
        FederationConfig(**sc.federation).validate()
        out.append(sc)
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: scenario names must be unique")
    return out


# ------------------------------------------------------------------ the stage
@dataclass
class Stage:
    """A running federation with what its faults act on."""

    cfg: FederationConfig
    home: Path
    access: Access
    node: RabbitNode | None = None
    cluster: RabbitCluster | None = None
    bed: Testbed | None = None

    def get(self, name: str, path: str = "/v1/state") -> Any:
        return signed_get(self.cfg, self.home, name, path)

    @property
    def faults(self) -> Path:
        """Where the federation's services look for injected faults (``runtime.faults``)."""
        return self.home / "faults"


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (what ``megha up`` and ``rabbitmqctl`` see)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _private_ctl(node: RabbitNode) -> dict[str, str]:
    """The environment in which ``rabbitmqctl`` (the one ``megha up`` runs to provision
    the federation's broker users) speaks to the private ``node``: its name and cookie,
    and the CLI that does not switch to the shared node's user."""
    return {**node.env(), "PATH": f"{RABBIT_BIN}:{os.environ.get('PATH', '')}"}


@contextlib.contextmanager
def stage(sc: Scenario, base: FederationConfig, root: Path, *, insecure: bool) -> Iterator[Stage]:
    """Start the scenario's broker (if private), hosts (if netns) and federation; stop
    and remove all of it afterwards."""
    cfg = replace(base, **sc.federation)
    name = f"{base.name}-{sc.name}-{uuid.uuid4().hex[:4]}"[:64]
    cfg = replace(cfg, name=name)
    home = root / name
    with contextlib.ExitStack() as stack:
        box = stack.enter_context(RabbitSandbox()) if sc.broker != "shared" or sc.netns else None
        bed = stack.enter_context(Testbed(cfg.process_names)) if sc.netns else None
        node = cluster = None
        if box is not None and sc.broker == "cluster":
            cluster = box.cluster(3, listen_ip=bed.gateway if bed else "127.0.0.1")
            cluster.start()
            cfg = replace(cfg, broker_url=",".join(cluster.urls), queue_type="quorum")
        elif box is not None:
            node = box.node("b0", listen_ip=bed.gateway if bed else "127.0.0.1")
            node.start()
            cfg = replace(cfg, broker_url=node.url)
        home.mkdir(mode=0o700, parents=True)
        cfg = replace(cfg, addresses=compact_addresses(cfg, bed))
        if bed is not None:
            spaces = {n: bed.host(n).netns for n in cfg.process_names}
            (home / NETNS_FILE).write_text(json.dumps(spaces))
        cfg = cfg.validate()
        private = box is not None
        stack.enter_context(_environment({FAULTS_DIR_ENV: str(home / "faults")}))
        # a private node's users are provisioned by rabbitmqctl pointed at that node; in a
        # test-bed the node listens on the bed's bridge, which `megha up` does not
        # provision (it runs rabbitmqctl only for a broker on this host's loopback)
        first = cluster.nodes[0] if cluster else node
        with _environment(_private_ctl(first) if first is not None else {}):
            start_federation(cfg, home, quiet=True, insecure_dev=insecure or sc.netns)
        try:
            yield Stage(cfg, home, Access.in_home(home, cfg), node, cluster, bed)
        finally:
            stop_federation(home, quiet=True)
            if not private:
                with contextlib.suppress(Exception):
                    purge(cfg, home)


def compact_addresses(cfg: FederationConfig, bed: Testbed | None) -> dict[str, str]:
    """Every process on a port within ``base_port .. base_port+99`` (the usual layout
    spreads over 400 ports), at its own host's address in a test-bed."""
    return {
        n: f"{bed.address(n) if bed else cfg.host}:{cfg.base_port + i}"
        for i, n in enumerate(cfg.process_names)
    }


# ------------------------------------------------------------------ the load
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


def _progress(msg: str, enabled: bool) -> None:
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
    if a == "duplicate_jobs":  # the very bytes published before, published again
        for job, at in list(run.sent):
            await sub.publish_raw(
                job.user, codec.encode(to_submission(job, sub.token(job.user), at))
            )
        return f"published {len(run.sent)} jobs again"
    n = await caps[a].replay()
    return f"{a}: {n} captured messages published again, newest first"


async def _faults(st: Stage, sc: Scenario, sub: Submitter, run: Run, caps: dict[str, Capture],
                  t0: float, progress: bool) -> None:  # fmt: skip
    for step in sc.steps:
        await asyncio.sleep(max(0.0, t0 + step.at - time.time()))
        if step.when == "unacked":
            await _until_unacked(st, step.target)
        at = time.time()
        run.first_fault = run.first_fault or at
        note = await _act(st, step, sub, run, caps)
        run.steps.append({"at_s": round(at - t0, 3), "action": step.action, "note": note})
        _progress(f"  t={at - t0:5.1f}s {note}", progress)


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
            _progress(
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
        for job in jobs:
            await asyncio.sleep(max(0.0, t0 + job.arrival - time.time()))
            at = await sub.submit(job)
            run.sent.append((job, at))
            for s in specs_of(job):
                run.published[(s.user, s.task_id)] = at
        await faults
        await _wait_finished(sub, run, sc.timeout_s, t0, progress)
        await asyncio.sleep(0.5)  # late duplicate outcomes or launches
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            launches = await fetch_launches(session, st.cfg, st.access)
            states = await fetch_states(session, st.cfg, st.access)
    finally:
        if conn is not None:
            await conn.close()
        await sub.close()
    row = measure(sc, run, sub, launches, time.time() - t0)
    row["evidence"] = evidence(states)
    row["expect"] = sc.expect
    return row


EVIDENCE = (
    "jobs_redelivered", "redelivered_skipped", "tasks_adopted", "lm_restarts_seen",
    "lost_with_lm", "requeues", "duplicate_events", "stale_updates", "stale_events",
    "recovered", "recovered_ends", "workers_lost", "held_through_silence", "nodes_given_up",
    "returned_to_gm", "pauses", "relaunched", "duplicates", "jobs_refused", "handler_errors",
    "poisoned", "repartitions",
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
    _progress(f"chaos: {sc.name}: {sc.fault}", progress)
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
    _progress(f"chaos: {sc.name}: {verdict(row)} ({row['total_s']} s)", progress)
    return row


def verdict(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"ERROR {row['error']}"
    ok = row["lost"] == 0 and row["duplicate_launches"] == 0
    unseen = [k for k in row.get("expect", []) if not row.get("evidence", {}).get(k)]
    if ok and unseen:
        return f"FAIL (no {', '.join(unseen)}: the fault did not show)"
    return "ok" if ok else "FAIL"


# ------------------------------------------------------------------ outputs
COLUMNS = ("scenario", "fault", "submitted", "completed", "lost", "duplicate_launches",
           "recovery_s")  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the rows (the results' and the README's)."""
    head = ["scenario", "fault", "submitted", "completed", "lost", "dup. launches",
            "recovery (s)", "verdict", "evidence (service counters)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        shown = ", ".join(f"{k} {v}" for k, v in r.get("evidence", {}).items())
        cells = [str(r.get(c, "-")) for c in COLUMNS] + [verdict(r), shown or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps({**meta, "scenarios": rows}, indent=2) + "\n")
    with (out / "chaos.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*COLUMNS, "wall_s", "failed", "duplicate_outcomes", "error"])
        for r in rows:
            w.writerow([r.get(c, "") for c in (*COLUMNS, "wall_s", "failed",
                                                "duplicate_outcomes", "error")])  # fmt: skip
    (out / "chaos.md").write_text(table(rows) + "\n")


# ------------------------------------------------------------------ netns bench
NETNS_LATENCIES_MS = (0.0, 1.0, 5.0, 10.0)


def netns_bench(
    base: FederationConfig, root: Path, out: Path, *, jobs: int, rounds: int, progress: bool,
    latencies: tuple[float, ...] = NETNS_LATENCIES_MS,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every GM, LM and worker pool in its own namespace, the broker a private node on
    the bed's gateway; allocation times at each added latency (``d`` ms between every
    two hosts: ``d/2`` on each host's egress, so a host and the broker get ``d/2``).
    ``rounds`` passes over the latencies, in alternating order; a row holds the median
    over the rounds of each round's p50 and p99 (every round is in the JSON)."""
    sc = Scenario(name="netns", fault="none", steps=[], netns=True)
    runs: dict[float, list[dict[str, Any]]] = {d: [] for d in latencies}
    with stage(sc, base, root, insecure=True) as st:
        bed = st.bed
        assert bed is not None
        for r in range(rounds):
            for d in latencies if r % 2 == 0 else tuple(reversed(latencies)):
                for host in st.cfg.process_names:
                    if d > 0:
                        bed.set_latency(host, d / 2)
                    else:
                        bed.clear_latency(host)
                rtt = bed.tcp_rtt(st.cfg.gm_ids[0], st.cfg.lm_ids[0], count=20)
                opts = BenchOptions(
                    jobs=jobs, tasks_per_job=3, mean_duration=0.2, job_rate=20.0, seed=7 + r,
                    timeout_s=120.0, floor_samples=50,
                    out=str(out / f"netns_{d:g}ms_round{r}"), progress=False,
                )  # fmt: skip
                _progress(f"netns bench: round {r + 1}/{rounds}, +{d:g} ms", progress)
                s = bench(st.cfg, opts, st.home)
                runs[d].append({
                    "gm_lm_rtt_ms_p50": sorted(rtt)[len(rtt) // 2],
                    "allocation_p50_ms": s["allocation_time_s"]["p50"] * 1e3,
                    "allocation_p99_ms": s["allocation_time_s"]["p99"] * 1e3,
                    "communication_p50_ms": s["components_s"]["communication"]["p50"] * 1e3,
                    "tasks": s["tasks"], "lost": s["lost_tasks"],
                    "duplicate_launches": s["duplicate_launches"],
                    "load_average": os.getloadavg()[0],
                })  # fmt: skip
    return [_median_row(d, rs) for d, rs in runs.items()]


def _median_row(d: float, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(k: str) -> float:
        return round(float(statistics.median(float(x[k]) for x in rounds)), 2)

    return {
        "added_ms": d,
        **{k: med(k) for k in ("gm_lm_rtt_ms_p50", "allocation_p50_ms", "allocation_p99_ms",
                               "communication_p50_ms", "load_average")},
        "tasks": sum(x["tasks"] for x in rounds),
        "lost": sum(x["lost"] for x in rounds),
        "duplicate_launches": sum(x["duplicate_launches"] for x in rounds),
        "rounds": rounds,
    }  # fmt: skip


def netns_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| added latency (ms, every host pair) | GM-LM RTT p50 (ms) | allocation p50 (ms) "
        "| allocation p99 (ms) | communication p50 (ms) | tasks | lost | dup. launches "
        "| load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['added_ms']:g} | {r['gm_lm_rtt_ms_p50']} | {r['allocation_p50_ms']} | "
            f"{r['allocation_p99_ms']} | {r['communication_p50_ms']} | {r['tasks']} | "
            f"{r['lost']} | {r['duplicate_launches']} | {r['load_average']} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ command
def base_config(args: argparse.Namespace) -> FederationConfig:
    return FederationConfig(name=args.name, base_port=args.base_port).validate()


def cmd_chaos(args: argparse.Namespace) -> int:
    for noisy in ("aiormq", "aio_pika"):  # reconnect chatter of faults meant to happen
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        scenarios = load_scenarios(Path(args.scenarios))
    except (ConfigError, TypeError) as exc:
        print(f"megha chaos: {exc}", file=sys.stderr)
        return 1
    if args.list:
        for sc in scenarios:
            flags = "".join(
                [" [quick]" if sc.quick else "", " [dag]" if sc.load.dag else "",
                 f" [{sc.broker} broker]" if sc.broker != "shared" else "",
                 " [netns]" if sc.netns else ""]
            )  # fmt: skip
            print(f"{sc.name:<24} {sc.fault}{flags}")
        return 0
    root = Path(args.state_dir or "/tmp/megha-chaos")
    out = Path(args.out)
    base = base_config(args)
    if args.netns_bench:
        rows = netns_bench(
            base, root, out, jobs=args.netns_jobs, rounds=args.netns_rounds, progress=not args.quiet
        )
        text = netns_table(rows)
        out.mkdir(parents=True, exist_ok=True)
        (out / "netns_bench.json").write_text(json.dumps(rows, indent=2) + "\n")
        (out / "netns_bench.md").write_text(text + "\n")
        print(text)
        print(f"wrote {out}/netns_bench.json, netns_bench.md")
        return 0
    chosen = [s for s in scenarios if (not args.only or s.name in args.only)
              and (not args.quick or s.quick)]  # fmt: skip
    unknown = set(args.only or ()) - {s.name for s in scenarios}
    if unknown:
        print(f"megha chaos: no such scenario: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 1
    if not chosen:
        print("megha chaos: no scenario named by --only is in the --quick subset", file=sys.stderr)
        return 1
    if not broker_reachable(base.broker_url):
        print(f"megha chaos: the shared broker {base.broker_url} is down", file=sys.stderr)
        return 1
    rows = []
    t0 = time.time()
    for i, sc in enumerate(chosen, 1):
        _progress(f"[{i}/{len(chosen)}]", not args.quiet)
        rows.append(
            run_scenario(sc, base, root, insecure=args.insecure_dev, progress=not args.quiet)
        )
        write_results(out, rows, {"started": t0, "insecure_dev": args.insecure_dev})
    print(table(rows))
    print(f"wrote {out}/chaos.json, chaos.csv, chaos.md ({time.time() - t0:.0f} s)")
    return 0 if all(verdict(r) == "ok" for r in rows) else 2


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chaos",
        help="fault-injection suite: a live federation per scenario, lost/duplicate checks",
        description=(
            "Run the scenarios of a chaos TOML file: each starts a federation, submits a "
            "load, injects its faults (kill -9, SIGSTOP, restarts, broker node loss, "
            "network partitions and delays, duplicated and reordered deliveries) and "
            "checks that no task is lost or launched twice. Needs root for private "
            "brokers and network namespaces. Exit status 2 if a scenario fails."
        ),
    )
    p.add_argument("--scenarios", default=str(DEFAULT_SCENARIOS), help="the scenario file")
    p.add_argument("--only", action="append", metavar="NAME", help="run this scenario (repeat)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--quick", action="store_true", help="only the quick subset")
    p.add_argument("--out", default="results/chaos", help="directory for the results")
    p.add_argument("--state-dir", help="federations' homes (default /tmp/megha-chaos)")
    p.add_argument("--name", default="chaos", help="prefix of the federations' names")
    p.add_argument("--base-port", type=int, default=19500, help="the federations' first port")
    p.add_argument(
        "--insecure-dev", action="store_true",
        help="no broker users per party on the shared broker (faster set-up); private "
        "brokers always run so",
    )  # fmt: skip
    p.add_argument(
        "--netns-bench", action="store_true",
        help="instead: allocation p50/p99 with every process in its own network namespace, "
        "against 0, 1, 5, 10 ms added latency (writes netns_bench.md)",
    )  # fmt: skip
    p.add_argument("--netns-jobs", type=int, default=200, help="jobs per latency (--netns-bench)")
    p.add_argument("--netns-rounds", type=int, default=3, help="passes over the latencies")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=cmd_chaos)
