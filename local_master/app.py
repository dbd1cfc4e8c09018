"""Local Master service: drives ``local_master.core.LocalMaster`` over HTTP and AMQP.

POST /v1/launch, /v1/preempt, /v1/snapshot, /v1/reserve, /v1/commit-gang,
/v1/release-gang (from GMs; the answer is the core's
reply), /v1/worker-report, /v1/worker-heartbeat (from its worker pool), /v1/ping;
GET /health, /v1/state, /metrics, and for operators /v1/inspect (partitions as
bit-vectors, repartitions: ``local_master.inspect``).  One gunicorn worker process: the core's state
lives here.  Starts and stops go to the worker pool batched per loop turn; task
events go to each GM batched per loop turn, each batch with a unique message id.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import signal
import time
from typing import Any

import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from aiohttp import web

from common import broker_names as names
from common import codec
from common.config import STATE_ENV, FederationConfig
from common.effects import Record, ToAllGms, ToGm, ToWorker
from common.ids import GmId, LmId, UserId
from common.messages import (
    CancelTasks,
    CheckWorkers,
    CommitGang,
    EventKind,
    Heartbeat,
    KeepEnds,
    LaunchRequest,
    PreemptRequest,
    Refused,
    RegisterWorkers,
    ReleaseGang,
    ReportKind,
    ReserveRequest,
    SnapshotRequest,
    StartTask,
    StartTasks,
    StopTask,
    StopTasks,
    StopUserTasks,
    TaskEvent,
    TaskEvents,
    WorkerHeartbeat,
    WorkerReports,
)
from common.reasons import RequestReason
from local_master import inspect
from local_master.core import LocalMaster
from runtime import broker as amqp
from runtime import faults, h1
from runtime.clock import steady
from runtime.driver import Batcher, CoreDriver, EndLag
from runtime.election import UNREACHABLE_ERRORS, Election, Outcome
from runtime.http import (
    Peer,
    PeerRefused,
    reply_response,
    service_app,
    service_identity,
    session,
)
from runtime.journal import DurableState, JournalBusy
from runtime.prometheus import ServiceMetrics
from runtime.retry import Backoff, GiveUp
from runtime.supervisor import Supervisor
from security.access import Access
from security.identity import Identity
from security.identity import gm as gm_identity
from security.identity import workers as workers_identity
from security.sealing import Sealer
from security.tokens import TokenStore

ONE_TRY = Backoff(deadline_s=0.0)
RETRIES = Backoff()
START_PATIENCE_S = 10.0
"""How long starts go on being sent to a pool that does not answer (then its nodes
time out and their tasks go back)."""
_RNG = random.Random()
_ENDS = (EventKind.FINISHED, EventKind.FAILED)
_REPORTED_ENDS = (ReportKind.FINISHED, ReportKind.FAILED)
_WAIT_FOR_EVENTS = (WorkerReports, RegisterWorkers)
"""Messages answered once their events are on the broker (a tuple made once)."""

log = logging.getLogger("megha.lm")


class LmService:
    """An LM core, its HTTP peers (the worker pool) and its broker side.

    Each incarnation takes a new epoch from the broker (``<name>.lm.<lm>.epoch``: the
    highest epoch any incarnation took, plus one, or the time in ms if later), so its
    state updates, placements and worker commands outrank every older incarnation's
    whatever the hosts' clocks say.  With a standby (``lm_standby``), the two
    processes of an LM contend for an exclusive queue ``<name>.lm.<lm>.leader``: the
    holder is the active LM; the other answers 503 ``not_ready`` (peers try the next
    address) and takes over when the holder's broker connection goes -- within a
    heartbeat when the holder dies.  An active LM that loses its broker connection, or
    hears from its pool that a newer epoch exists, steps down: it stops answering and
    exits, and gunicorn starts it again as a standby.
    """

    role = "lm"

    def __init__(self, cfg: FederationConfig, lm: LmId, access: Access) -> None:
        self.cfg = cfg
        self.lm = lm
        self.access = access
        self.sealer: Sealer | None = None
        state_root = os.environ.get(STATE_ENV)
        self.state: DurableState | None = None
        """This LM's journal (``$MEGHA_STATE_DIR/<lm>``, shared with its standby, which
        takes it over with the lead): what it holds outlives every process."""
        if state_root and cfg.journal:
            self.state = DurableState(os.path.join(state_root, lm), "lm", sync_s=cfg.journal_sync_s)
        self.sup = Supervisor(lm)
        faults.arm(lm)  # a chaos run may step its clock (runtime.clock)
        self.users = TokenStore(access.users_file) if access.users_file is not None else None
        self.owners: dict[UserId, GmId | None] = {}
        """Each user's GM: a launch for another GM's user is refused (``foreign_user``)."""
        self._read_owners()
        self.core = self._new_core(epoch=0)
        self.driver = CoreDriver(self.core, self.sup)
        self.broker = amqp.Broker(cfg, lm, urls=access.broker_urls())
        self.election = Election(lm, period_s=cfg.heartbeat_s / 2)
        self.http: h1.Client | None = None
        self.pool: Peer | None = None
        self._seq = itertools.count(1)
        self.to_pool: Batcher[str, StartTask | StopTask] = Batcher(
            self.sup, self._flush_pool, "starts and stops to the worker pool"
        )
        self._event_tickets: dict[GmId, int] = {}
        self._event_routes: dict[GmId, tuple[str, tuple[Identity], str]] = {}
        """Each GM's events: their stream, their receiver and their routing key."""
        self.events: Batcher[GmId, TaskEvent] = Batcher(
            self.sup, self._publish_events, "task events"
        )
        """Events leave in the loop turn that made them, never lingering: nearly all
        come of a pool's report, which the LM answers once they are on the broker, and
        the pool sends its next report only after that answer -- one report's events can
        never meet the next one's, so a linger would only add a timer wake-up per GM and
        hold up the report's answer, and the slots its ends freed, for nothing."""
        self.ends_got = EndLag()
        """Ends as their reports are taken from the pool; ``ends_sent``, as their events
        leave for the GM (benchmarks: where an end's way to its GM goes)."""
        self.ends_sent = EndLag()
        self.active = False
        self.stepped_down = ""
        self.worker_errors = 0
        self._lock: AbstractChannel | None = None

    @property
    def epoch(self) -> int:
        return self.core.epoch

    def _new_core(self, epoch: int) -> LocalMaster:
        cluster = self.cfg.clusters[self.cfg.lm_ids.index(self.lm)]
        return LocalMaster(
            self.lm, cluster.nodes, cluster.home, gms=self.cfg.gm_ids, epoch=epoch,
            awaiting_workers=True,
            victims_younger_than_wait=self.cfg.victims_younger_than_wait,
            reroute=self.cfg.reroute_at_lm, durable=self.state is not None,
            owners=self.owners,
        )  # fmt: skip

    def _read_owners(self) -> None:
        """The config's users and the users file's (``megha user add`` adds to it while
        the federation runs): who is whose GM."""
        owners: dict[UserId, GmId | None] = {
            UserId(u.user): GmId(u.gm) for u in self.cfg.user_configs
        }
        if self.users is not None:  # a revoked user is no GM's (``user_revoked``)
            owners |= {
                UserId(r.user): None if r.revoked else GmId(r.gm) for r in self.users.users()
            }
        if owners != self.owners:
            self.owners.clear()
            self.owners.update(owners)

    async def _watch_users(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.users is not None and self.users.reload_if_changed():
                self._read_owners()

    async def open(self) -> None:
        await self.sup.__aenter__()
        self.http = session()
        policy = Backoff(deadline_s=self.cfg.worker_timeout_s)
        self.pool = Peer(
            workers_identity(self.lm),
            self.cfg.worker_url(self.lm),
            self.access,
            self.http,
            policy=policy,
            max_answer=self.cfg.max_body,
        )
        self.sup.run_forever(self._watch_users(), "users file")
        await self.broker.open()
        self.broker.on_disconnect = self._broker_lost
        if self.cfg.lm_standby:
            self.sup.run_forever(self._contend(), "leadership")
        else:
            await self._activate()

    async def _contend(self) -> None:
        """Try for the leader queue until this process holds it, then lead: again soon
        after a lost race, after a growing back-off (logged) after a refusal."""
        while True:
            outcome, wait = self.election.tried(await self._acquire())
            if outcome is Outcome.LEADS:
                break
            await asyncio.sleep(wait)
        await self._activate()
        await asyncio.Event().wait()  # lead until the process ends (or steps down)

    async def _acquire(self) -> BaseException | None:
        """Declare the leader queue exclusively; None if this process holds it now, else
        why not (``runtime.election`` tells a lost race from a refusal)."""
        conn = self.broker.conn
        if conn is None or not self.broker.connected:
            return ConnectionError("no broker connection")
        try:
            ch = await conn.channel()
            await ch.declare_queue(self.cfg.lm_leader_queue(self.lm), exclusive=True)
        except (aiormq.exceptions.AMQPChannelError, *UNREACHABLE_ERRORS) as exc:
            return exc
        self._lock = ch
        return None

    async def _activate(self) -> None:
        """Become this LM's active incarnation, under a new epoch."""
        epoch = await self._next_epoch()
        self.sealer = self.access.sealer(epoch)
        self.core = self._new_core(epoch)
        if self.state is not None:
            self.core.restore(await self._take_journal(), steady())
            self.sup.run_forever(self.state.sync_forever(), "journal sync")
        self.driver = CoreDriver(self.core, self.sup)
        d = self.driver
        d.on(Record, self._record)
        d.on(ToWorker, lambda e: _ignore(self.to_pool.add("pool", e.msg)))
        d.on(ToGm, self._event_to_gm)
        d.on(ToAllGms, lambda e: self.sup.spawn(self._publish_state(e), "state update"))
        # no node is alive before the worker pool registers what it runs
        d.every(self.cfg.heartbeat_s, Heartbeat, "heartbeat")
        check = CheckWorkers(
            timeout=self.cfg.worker_timeout_s, lost_after=self.cfg.node_lost_after_s
        )
        d.every(self.cfg.heartbeat_s, lambda: check, "liveness")
        self.active = True
        log.info("%s active, epoch %d", self.lm, epoch)

    async def _take_journal(self) -> list[object]:
        """This LM's journal, once no other process of it holds it (a standby taking
        the lead waits for the former leader's process to be gone)."""
        assert self.state is not None
        for attempt in itertools.count():
            try:
                records = self.state.open()
            except JournalBusy:
                if attempt % 20 == 0:
                    log.warning("%s waits for its journal: another process holds it", self.lm)
                await asyncio.sleep(self.cfg.heartbeat_s / 2)
                continue
            log.info("%s read %d journal records", self.lm, len(records))
            return records
        raise AssertionError("unreachable")

    def _record(self, eff: Record) -> None:
        """Journal records go to disk before anything else of their message leaves."""
        assert self.state is not None
        self.state.record(eff)
        if self.state.needs_compaction:
            self.state.compact(self.core.records())

    async def _next_epoch(self) -> int:
        """One more than any incarnation of this LM took (or the time in ms, if later),
        recorded on the broker before it is used."""
        ch = self.broker.pub
        assert ch is not None
        q = await amqp.open_queue(ch, self.cfg.lm_epoch_queue(self.lm))
        seen: list[AbstractIncomingMessage] = []
        last = 0
        while (m := await q.get(no_ack=False, fail=False)) is not None:
            seen.append(m)
            with contextlib.suppress(ValueError):
                last = max(last, int(m.body))
        epoch = max(last + 1, int(time.time() * 1000))
        await self.broker.publish(
            "state", names.epoch_key(self.lm), amqp.persistent(str(epoch).encode())
        )
        for m in seen:
            await m.ack()
        return epoch

    def _broker_lost(self) -> None:
        if self.cfg.lm_standby and self.active:
            self._step_down("lost its broker connection (and with it the leader queue)")

    def _step_down(self, why: str) -> None:
        """Stop acting as the LM at once, and exit: gunicorn restarts the process, which
        contends again as a standby."""
        if self.stepped_down:
            return
        self.stepped_down = why
        self.active = False
        log.error("%s (epoch %d) steps down: %s", self.lm, self.epoch, why)
        os.kill(os.getpid(), signal.SIGTERM)

    async def close(self) -> None:
        await self.sup.__aexit__(None, None, None)
        if self.state is not None:
            self.state.close()
        await self.broker.close()
        if self.http is not None:
            await self.http.close()

    # ----------------------------------------------------------------- effects
    def _journal_out(self) -> None:
        """The journal's records of this loop turn to the page cache: called before
        anything that depends on them leaves (an answer, starts, events)."""
        if self.state is not None:
            self.state.flush()

    async def _flush_pool(self, _: str, items: list[StartTask | StopTask]) -> None:
        assert self.pool is not None
        self._journal_out()
        lm = self.core.lm_id
        stops = tuple(m for m in items if isinstance(m, StopTask))
        starts = tuple(m for m in items if isinstance(m, StartTask))
        try:
            if stops:  # confirmed stops send preempted tasks back to their GMs
                stopped = await self.pool.post(
                    "/v1/stop",
                    StopTasks(lm=lm, epoch=self.epoch, tasks=stops),
                    expect=WorkerReports,
                )
                if stopped is not None and stopped.reports:
                    self.driver.feed(stopped)
            if starts:
                await self._start_on_pool(starts)
        except (PeerRefused, GiveUp) as exc:
            if isinstance(exc, PeerRefused) and exc.reason == RequestReason.STALE_EPOCH:
                self._step_down(f"its worker pool follows a newer incarnation ({exc})")
                return
            # its nodes will time out and their tasks go back (relaunched or re-queued)
            self.worker_errors += 1
            log.error("worker pool did not take %d starts/stops: %s", len(items), exc)

    def _event_to_gm(self, eff: ToGm) -> None:
        self._event_tickets[eff.gm] = self.events.add(eff.gm, eff.msg)

    async def durable(self, msg: object) -> None:
        """A pool forgets the ends it reported once the LM answers: the events they
        produced are on the broker first (an LM that dies right after loses nothing).
        A launch is answered once its starts left for the pool."""
        self._journal_out()
        if type(msg) is WorkerReports:
            ends = (r.at for r in msg.reports if r.kind in _REPORTED_ENDS)
            self.ends_got.note(ends, self.driver.clock())
        if isinstance(msg, _WAIT_FOR_EVENTS) and self._event_tickets:
            await self.events.sent(dict(self._event_tickets))
        elif isinstance(msg, LaunchRequest):
            # the starts are what allocation time waits for, the answer is not: they
            # leave first (50% load: LM -> worker p50 1.9-2.2 -> 1.5-1.6 ms)
            await self.to_pool.handed("pool")

    async def _start_on_pool(self, starts: tuple[StartTask, ...]) -> None:
        """Send starts until the pool answers; before each try, only those this LM
        still holds as they were (a start sent again after its node was declared dead
        and its task placed elsewhere would run it twice)."""
        assert self.pool is not None
        deadline = time.monotonic() + START_PATIENCE_S
        attempt = 0
        while True:
            starts = tuple(s for s in starts if self.core.still_starts(s))
            if not starts:
                return
            try:
                reply = await self.pool.post(
                    "/v1/start",
                    StartTasks(
                        lm=self.core.lm_id, epoch=self.epoch, tasks=starts, sent=self.driver.clock()
                    ),
                    expect=WorkerReports,
                    policy=ONE_TRY,
                )
            except GiveUp:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RETRIES.delay(attempt, _RNG))
                attempt += 1
                continue
            if reply is not None and reply.reports:
                self.driver.feed(reply)
            return

    async def _publish_events(self, gm: GmId, events: list[TaskEvent]) -> None:
        self._journal_out()
        self.ends_sent.note((e.at for e in events if e.kind in _ENDS), self.driver.clock())
        epoch = self.core.epoch
        body = codec.encode(TaskEvents(lm=self.lm, epoch=epoch, events=tuple(events)))
        mid = f"{self.lm}.{epoch}.{next(self._seq)}"
        route = self._event_routes.get(gm)
        if route is None:
            route = self._event_routes[gm] = (
                f"events.{gm}",
                (gm_identity(gm),),
                names.gm_event_key(gm, self.lm),
            )
        assert self.sealer is not None
        seal = self.sealer.seal(body, route[0], to=route[1])
        msg = amqp.persistent(body, message_id=mid, headers=seal)
        await self.broker.publish("events", route[2], msg)

    async def _publish_state(self, eff: ToAllGms) -> None:
        once = Backoff(deadline_s=0.0)  # the next heartbeat carries the same nodes
        body = codec.encode(eff.msg)
        assert self.sealer is not None
        msg = amqp.transient(body, headers=self.sealer.seal(body, "state"))
        try:
            await self.broker.publish(
                "state", names.state_key(self.lm), msg, mandatory=False, policy=once
            )
        except GiveUp as exc:
            log.warning("state update not published: %s", exc)

    def ident(self) -> str:
        return self.lm

    def status(self) -> str:
        if self.active:
            return "ok"
        return "standby" if self.cfg.lm_standby and self.broker.connected else "starting"

    def refusal(self) -> Refused | None:
        if self.active:
            return None
        what = "a standby" if self.cfg.lm_standby else "starting"
        return Refused(
            reason=RequestReason.NOT_READY, detail=f"this process of {self.lm} is {what}"
        )

    def state_page(self) -> dict[str, Any]:
        core = self.core
        return {
            "lm": core.lm_id,
            "active": self.active,
            "standby": self.cfg.lm_standby and not self.active,
            "epoch": core.epoch,
            "version": core.version,
            "nodes": core.n_nodes,
            "nodes_alive": sum(core.alive),
            "running_tasks": len(core.active),
            "logical_nodes": len(core.logical_nodes()),
            "free": [list(f) for f in core.free],
            "capacity_total": [
                sum(c[r] for c in core.nodes.capacity) for r in range(core.nodes.n_resources)
            ],
            "free_total": [sum(f[r] for f in core.free) for r in range(core.nodes.n_resources)],
            "usage": {u: list(v) for u, v in core.nodes.usage.items()},
            "counters": core.counters.as_dict(),
            "retained_done": len(core.ends.done),
            "jobs_keeping_ends": len(core.ends.keep_ends),
            "kept_ends": sum(len(k) for k in core.ends.kept.values()),
            "publish_errors": self.broker.publish_errors,
            "broker": {"url": _no_password(self.broker.url), "reconnects": self.broker.reconnects},
            "leader": self.election.page(),
            "worker_errors": self.worker_errors,
            "batches": {"to_pool": self.to_pool.traffic(), "events": self.events.traffic()},
            "end_lag": {"lm_got": self.ends_got.as_dict(), "lm_sent": self.ends_sent.as_dict()},
            "background_failures": self.sup.failures,
        }


def _ignore(_: object) -> None:
    """Drop a value (a batcher's ticket nobody waits for)."""


def _no_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    return f"{scheme}{sep}{creds.split(':')[0]}@{host}" if at else url


def build_app(cfg: FederationConfig, lm: LmId, access: Access) -> web.Application:
    svc = LmService(cfg, lm, access)
    metrics = ServiceMetrics(
        "megha_lm",
        lambda: svc.core.counters,
        lambda: {
            "running_tasks": len(svc.core.active),
            "nodes_alive": sum(svc.core.alive),
            "version": svc.core.version,
            "epoch": svc.core.epoch,
            "active": int(svc.active),
        },
    )
    routes: dict[str, type | tuple[type, ...]] = {
        "/v1/launch": LaunchRequest,
        "/v1/preempt": PreemptRequest,
        "/v1/snapshot": SnapshotRequest,
        "/v1/keep-ends": KeepEnds,
        "/v1/cancel": CancelTasks,
        "/v1/reserve": ReserveRequest,
        "/v1/commit-gang": CommitGang,
        "/v1/release-gang": ReleaseGang,
        "/v1/worker-report": WorkerReports,
        "/v1/worker-heartbeat": WorkerHeartbeat,
        "/v1/register": RegisterWorkers,
        "/v1/stop-user": StopUserTasks,
    }
    app = service_app(cfg, svc, metrics, access, routes)

    async def overview(request: web.Request) -> web.Response:
        refused = svc.refusal()
        if refused is not None:  # a standby holds no state: ask the active process
            return reply_response(refused)
        return web.json_response(inspect.overview(svc.core))

    app.router.add_get("/v1/inspect", overview)
    return app


async def create_app() -> web.Application:
    """gunicorn entry point (``local_master.app:create_app``)."""
    cfg, ident, access = service_identity("lm")
    return build_app(cfg, LmId(ident), access)
