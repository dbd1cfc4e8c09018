"""Worker pool service: hosts the nodes of one LM (``MEGHA_ID`` = that LM).

POST /v1/start and /v1/stop take batches from the LM (the answer to a start carries
the "started" reports of synthetic tasks), once the LM has answered the pool's
registration (503 ``not_ready`` before); later reports go to the LM batched per loop
turn and are retried until it takes them.  GET /health, /v1/state, /metrics;
POST /v1/ping answers empty (the floor).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any

import msgspec
from aiohttp import web

from common.config import STATE_ENV, FederationConfig
from common.effects import After, KillCommand, Record, RunCommand, ToLm
from common.ids import LmId, NodeIndex
from common.messages import (
    CheckLease,
    LeaseRenewed,
    Refused,
    Registered,
    RegisterPool,
    RegisterWorkers,
    ReportKind,
    ReportsTaken,
    StartTasks,
    StopTasks,
    WorkerHeartbeat,
    WorkerReport,
    WorkerReports,
)
from common.reasons import RequestReason
from runtime import faults, h1
from runtime.driver import Batcher, CoreDriver, EndLag
from runtime.http import (
    MSGPACK,
    SERVICE_KEY,
    Peer,
    PeerRefused,
    service_app,
    service_identity,
    session,
)
from runtime.journal import DurableState
from runtime.prometheus import ServiceMetrics
from runtime.retry import Backoff, GiveUp
from runtime.supervisor import Supervisor
from security.access import Access
from security.identity import lm as lm_identity
from security.sandbox import Sandbox, SandboxPolicy
from worker.core import WorkerPool
from worker.runner import Runner
from worker.timers import DueTimers

log = logging.getLogger("megha.worker")

REPORTS = Backoff(first_s=0.05, cap_s=2.0, deadline_s=None)
LEASE_SHARE = 0.6
"""A pool's lease is this share of the LM's worker timeout: it stops its tasks before
its LM declares its nodes dead and places them elsewhere."""
_ENDS = (ReportKind.FINISHED, ReportKind.FAILED)
"""Reports are retried until the LM takes them: they are never dropped."""
TICK_SHARE = 0.2
"""Synthetic tasks' ends due within a tick of this share of ``linger_s`` share one loop
timer, a tick after the tick's end (``worker.timers``): 10 ms by default, a fifth of
what a busy pool's reports wait for their batch anyway.  An end is fed at the pool's
first wake-up after it is due (a start, a stop, its reports leaving or answered), 20 ms
after it at the latest.  A quiet pool (less than an end a tick), or ``linger_s`` 0: a
timer each, as before."""


class WorkerService:
    """A worker-pool core, the runner of its commands, and its LM as a peer."""

    role = "worker"

    def __init__(self, cfg: FederationConfig, lm: LmId, access: Access) -> None:
        self.cfg = cfg
        self.access = access
        index = cfg.lm_ids.index(lm)
        n_nodes = len(cfg.clusters[index].nodes)
        state_root = os.environ.get(STATE_ENV)
        self.state: DurableState | None = None
        """This pool's journal (``$MEGHA_STATE_DIR/<lm>-workers``): the ends it has not had
        taken outlive its process, so a task that ended is never run again."""
        if state_root and cfg.journal:
            self.state = DurableState(
                os.path.join(state_root, f"{lm}-workers"), "pool", sync_s=cfg.journal_sync_s
            )
        self.core = WorkerPool(
            lm, n_nodes, commands=cfg.task_commands, lease_s=LEASE_SHARE * cfg.worker_timeout_s,
            durable=self.state is not None,
        )  # fmt: skip
        self.sup = Supervisor(f"{lm}-workers")
        faults.arm(f"{lm}-workers")  # a chaos run may step its clock (runtime.clock)
        self.driver = CoreDriver(self.core, self.sup)
        policy = SandboxPolicy.from_mapping({**cfg.sandbox, "enabled": cfg.task_commands})
        self.sandbox = Sandbox(policy, pool=index)  # a range holding root or our uid: refused
        self.runner = Runner(self.driver, self.sandbox, cfg.task_env_allow)
        self.http: h1.Client | None = None
        self.lm: Peer | None = None
        self.registered = asyncio.Event()
        self.incarnation = uuid.uuid4().hex
        """This process: its launch log began with it, and its tasks end with it."""
        self.reports: Batcher[str, WorkerReport] = Batcher(
            self.sup, self._send_reports, "reports to the LM", max_items=2000,
            linger_s=cfg.linger_s, headroom=lambda: self.core.idle_nodes(),
        )  # fmt: skip
        self.ends_sent = EndLag()
        """Ends as their reports leave for the LM (first try): the pool's own wait."""
        tick = TICK_SHARE * cfg.linger_s
        self.timers = DueTimers(self.driver.feed, tick, grace_s=tick)
        """Synthetic tasks' ends: one loop timer per tick for all due in it, and those
        due by the time a start comes or the reports leave, then."""
        self._joining: list[WorkerReport] | None = None
        """Reports of ends fed as a batch of reports leaves: they join it."""
        self.joined = 0
        """Reports that joined a batch as it left (``_send_reports``)."""
        d = self.driver
        d.on(After, self.timers.after)
        d.on(ToLm, self._report)
        d.on(Record, self._record)
        d.on(RunCommand, self.runner.run)
        d.on(KillCommand, self.runner.kill)

    async def open(self) -> None:
        await self.sup.__aenter__()
        self.http = session()
        self.lm = Peer(
            lm_identity(self.core.lm), self.cfg.lm_urls(self.core.lm), self.access, self.http,
            policy=REPORTS,
        )  # fmt: skip
        if self.sandbox.policy.enabled:  # a dead incarnation's commands end before any start
            await self.sandbox.uids.open()
        if self.state is not None:  # a pool's journal has one writer: its LM's pool
            self.core.restore(self.state.open())
            self.sup.run_forever(self.state.sync_forever(), "journal sync")
        self.driver.feed(RegisterPool())
        self.sup.run_forever(self._heartbeats(), "heartbeats")
        lease = CheckLease(lease=LEASE_SHARE * self.cfg.worker_timeout_s)
        self.driver.every(self.cfg.heartbeat_s, lambda: lease, "lease")

    async def close(self) -> None:
        await self.runner.close()
        await self.sup.__aexit__(None, None, None)
        if self.state is not None:
            self.state.close()
        if self.http is not None:
            await self.http.close()

    def _record(self, eff: Record) -> None:
        """Journal records go to disk before the report they go with leaves."""
        assert self.state is not None
        self.state.record(eff)
        if self.state.needs_compaction:
            self.state.compact(self.core.records())

    def _report(self, eff: ToLm) -> None:
        msg = eff.msg
        if type(msg) is WorkerReport:  # (every task's end: checked first)
            if self._joining is not None:
                self._joining.append(msg)
            else:
                self.reports.add("lm", msg)
        elif isinstance(msg, RegisterWorkers):
            self.sup.spawn(self._register(msg), "registration with the LM")
        else:
            raise TypeError(f"a pool sends its LM no {type(msg).__name__}")

    def _journal_out(self) -> None:
        """The journal's records of this loop turn to the page cache: called before
        anything that depends on them leaves (an answer, reports, the registration)."""
        if self.state is not None:
            self.state.flush()

    async def _register(self, msg: RegisterWorkers) -> None:
        """Tell the LM what runs here (retried until it takes it)."""
        assert self.lm is not None
        self._journal_out()
        while True:
            try:
                reply = await self.lm.post("/v1/register", msg, expect=Registered)
            except PeerRefused as exc:
                log.error("LM refused the registration (%s); retrying", exc)
                await asyncio.sleep(1.0)
                continue
            if reply is not None:
                self.driver.feed(reply)
                # the LM settled the ends the registration told (their events are out)
                if msg.ended:
                    self.driver.feed(ReportsTaken(reports=tuple(e.report for e in msg.ended)))
                self.registered.set()
            return

    def _reregister(self) -> None:
        """The LM is a new incarnation (it asked): register again, once at a time."""
        if self.registered.is_set():
            self.registered.clear()
            self.driver.feed(RegisterPool())

    def _ends_due(self) -> list[WorkerReport]:
        """Feed the ends due by now whose tick has not come yet: their reports."""
        self._joining = []
        try:
            self.timers.run_due()
        finally:
            joining, self._joining = self._joining, None
        return joining

    async def _send_reports(self, _: str, reports: list[WorkerReport]) -> None:
        assert self.lm is not None
        if len(reports) < self.reports.max_items:  # ends due by now go with them
            joining = self._ends_due()
            if joining:
                reports = reports + joining
                self.joined += len(joining)
        self._journal_out()
        msg = WorkerReports(lm=self.core.lm, reports=tuple(reports))
        self.ends_sent.note((r.at for r in reports if r.kind in _ENDS), self.driver.clock())
        while True:
            await self.registered.wait()
            try:
                sent = self.driver.clock()  # the clock the lease is judged on
                await self.lm.post("/v1/worker-report", msg, expect=WorkerReports)
                # an answer of the LM, like a heartbeat's: the lease runs from when it left
                # (a pool back from a cut takes starts again without waiting a heartbeat)
                self.driver.feed(LeaseRenewed(sent=sent))
                self.driver.feed(ReportsTaken(reports=msg.reports))
                self.timers.run_due()  # awake: the ends due by now, journaled with it
                return
            except PeerRefused as exc:
                if exc.reason == RequestReason.REGISTER_FIRST:
                    self._reregister()
                    continue
                # an LM that refuses reports is misconfigured: keep them, never drop them
                log.error("LM refused %d reports (%s); retrying", len(reports), exc)
                await asyncio.sleep(2.0)

    async def _heartbeats(self) -> None:
        assert self.lm is not None
        nodes = tuple(NodeIndex(i) for i in range(self.core.n_nodes))
        policy = Backoff(deadline_s=self.cfg.heartbeat_s)
        while True:
            sent = self.driver.clock()  # the clock the lease is judged on
            hb = WorkerHeartbeat(lm=self.core.lm, nodes=nodes, at=sent)
            try:
                await self.lm.post("/v1/worker-heartbeat", hb, expect=WorkerReports, policy=policy)
                self.driver.feed(LeaseRenewed(sent=sent))
            except PeerRefused as exc:
                if exc.reason == RequestReason.REGISTER_FIRST:
                    self._reregister()
                else:
                    log.warning("heartbeat refused: %s", exc)
            except GiveUp as exc:
                log.debug("heartbeat not delivered: %s", exc)
            await asyncio.sleep(self.cfg.heartbeat_s)

    def counters(self) -> dict[str, float]:
        """The core's counters and the sandbox's (uid leases, refusals, orphans)."""
        return {**self.core.counters.as_dict(), **self.sandbox.uids.counters}

    def ident(self) -> str:
        return f"{self.core.lm}-workers"

    def status(self) -> str:
        return "ok"

    def refusal(self) -> Refused | None:
        """Starts and stops wait until the LM has answered this pool's registration
        (503: the LM sends them again).  A start taken before would run behind the
        registration's back: the LM, told nothing runs here, would run it again.

        Asked right before a start or a stop is fed: the ends due by now are fed first
        (``worker.timers``), so a stop finds ended what ended before it came."""
        if self.registered.is_set():
            self.timers.run_due()
            return None
        return Refused(
            reason=RequestReason.NOT_READY, detail=f"{self.ident()} awaits its LM's registration"
        )

    async def durable(self, msg: object) -> None:
        """Only the journal's records to write: a pool's answers carry nothing its LM
        keeps for it."""
        self._journal_out()

    def _timer_page(self) -> dict[str, float]:
        """Loop timers armed for ends so far, ends waiting for theirs, the tick and its
        grace, ends fed and how late they were in all."""
        t = self.timers
        return {"armed": t.timers, "waiting": t.pending(), "tick_s": t.tick_s,
                "grace_s": t.grace_s, "asked_per_s": round(t.rate, 3), "fed": t.fed,
                "late_s": round(t.late_s, 6)}  # fmt: skip

    def _report_traffic(self) -> dict[str, int]:
        """Report posts and the reports they carried (those that joined one too)."""
        traffic = self.reports.traffic()
        return {**traffic, "items": traffic["items"] + self.joined}

    def state_page(self) -> dict[str, Any]:
        return {
            "lm": self.core.lm,
            "nodes": self.core.n_nodes,
            "epoch": self.core.epoch,
            "running": len(self.core.running),
            "registered": self.registered.is_set(),
            "counters": self.counters(),
            "sandbox": self.sandbox.uids.gauges(),
            "reports_pending": self.reports.pending(),
            "timers": self._timer_page(),
            "batches": {"reports": self._report_traffic()},
            "end_lag": {"pool_sent": self.ends_sent.as_dict()},
            "at": time.time(),
        }


LAUNCH_FIELDS = ("what", "user", "task_id", "attempt", "node", "at")


class LaunchRow(msgspec.Struct, frozen=True):
    """A row of the launch log as the msgpack page carries it: a map of
    ``LAUNCH_FIELDS``, encoded by msgspec.  (Each row a dict, packed by msgpack, was
    ~7 us per row: two rows per task, the benchmark polls every pool every 2 s.)"""

    what: str
    user: str
    task_id: str
    attempt: int
    node: int
    at: float


_PAGE = msgspec.msgpack.Encoder()


async def launches_handler(request: web.Request) -> web.Response:
    """The pool's latest starts, ends and stops (operators; the fault suite):
    ``?after=N`` for the rows numbered above N; ``next`` is the cursor for the next
    call, ``missed`` the rows above N the bounded log no longer holds; ``incarnation``
    names this process (a restarted pool's log begins anew, and what ran in the old
    one ended with it), ``at`` is its clock as it answers."""
    svc = request.app[SERVICE_KEY]
    assert isinstance(svc, WorkerService)
    try:
        after = int(request.query.get("after", "0"))
    except ValueError:
        after = -1
    if after < 0:  # (far below zero, ``missed`` was more than msgpack holds: a 500)
        detail = "after: an integer >= 0"
        return web.json_response({"error": "bad_query", "detail": detail}, status=400)
    rows, missed = svc.core.launches_after(after)
    page: dict[str, Any] = {
        "lm": svc.core.lm,
        "launches": None,
        "next": svc.core.launch_seq,
        "missed": missed,
        "incarnation": svc.incarnation,
        "at": svc.driver.clock(),  # the clock its rows' times are on
    }
    if request.headers.get("Accept") == MSGPACK:  # the bench polls it while it measures
        page["launches"] = [LaunchRow(*row) for row in rows]
        return web.Response(body=_PAGE.encode(page), content_type=MSGPACK)
    page["launches"] = [dict(zip(LAUNCH_FIELDS, row, strict=True)) for row in rows]
    return web.json_response(page)


def build_app(cfg: FederationConfig, lm: LmId, access: Access) -> web.Application:
    svc = WorkerService(cfg, lm, access)
    metrics = ServiceMetrics(
        "megha_worker",
        svc.counters,
        lambda: {"running_tasks": len(svc.core.running), **svc.sandbox.uids.gauges()},
    )
    app = service_app(cfg, svc, metrics, access, {"/v1/start": StartTasks, "/v1/stop": StopTasks})
    app.router.add_get("/v1/launches", launches_handler)
    return app


async def create_app() -> web.Application:
    """gunicorn entry point (``worker.app:create_app``)."""
    cfg, ident, access = service_identity("worker")
    return build_app(cfg, LmId(ident), access)
