"""Global Master service: drives ``global_master.core.GlobalMaster``.

Jobs come from the GM's users' RabbitMQ queues, LM state from the fan-out exchange,
task events from the GM's own queue; launch / preemption / snapshot requests go to
LMs over keep-alive HTTP.  Stateless: on start the GM asks every LM for a snapshot
before it consumes anything.  GET /health, /v1/state, /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aio_pika.abc import AbstractIncomingMessage
from aiohttp import web

from common import codec
from common.auth import check_user, internal_headers
from common.cluster import profile
from common.codec import SubmitJob
from common.config import FederationConfig
from common.dag import from_layout
from common.effects import Effect, Report, ToLm, stamp_sent
from common.errors import ConfigError, DecodeError, MeghaError, ValidationError
from common.ids import GmId, JobId, TaskId
from common.messages import (
    LaunchRequest,
    LaunchResponse,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    TaskEvent,
)
from common.metrics import ServiceMetrics
from common.model import WaitReason, fits
from common.service import (
    METRICS_KEY,
    base_app,
    require_internal,
    serve,
    service_identity,
)
from global_master.amqp import GmBroker
from global_master.core import GlobalMaster
from global_master.policy import make_policy

log = logging.getLogger("megha.gm")

KINDS = ("state_updated", "task_events", "launch_response", "preempt_response", "snapshot")
SETTLING_EVENTS = frozenset({"started", "finished", "failed"})


def handle_body(core: GlobalMaster, kind: str, body: bytes, now: float) -> list[Effect]:
    """Decode a body of ``kind`` (see ``KINDS``) and run the core on it.

    Pure: the live service and tests feed the same bytes.  Raises ``InvalidInput``.
    """
    if kind == "state_updated":
        msg = codec.decode(body, expect=StateUpdated)
        assert isinstance(msg, StateUpdated)
        return core.on_state_update(msg, now)
    if kind == "task_events":
        effects: list[Effect] = []
        for ev in codec.decode_batch(body, expect=TaskEvent):
            assert isinstance(ev, TaskEvent)
            effects.extend(core.on_task_event(ev, now))
        return effects
    if kind == "launch_response":
        resp = codec.decode(body, expect=LaunchResponse)
        assert isinstance(resp, LaunchResponse)
        return core.on_launch_response(resp, now)
    if kind == "preempt_response":
        pre = codec.decode(body, expect=PreemptResponse)
        assert isinstance(pre, PreemptResponse)
        return core.on_preempt_response(pre, now)
    if kind == "snapshot":
        snap = codec.decode(body, expect=StateSnapshot)
        assert isinstance(snap, StateSnapshot)
        return core.on_snapshot(snap, now)
    raise ValueError(f"unknown body kind {kind!r}")


def admit_job(
    core: GlobalMaster,
    cfg: FederationConfig,
    body: bytes,
    queue_user: str,
    outstanding: set[TaskId] | dict[TaskId, Any],
    *,
    redelivered: bool = False,
) -> tuple[SubmitJob, list[TaskId]]:
    """Validate a submission from ``queue_user``'s queue and queue its tasks in the core.

    Returns the job and the ids of tasks skipped because an LM already runs them for
    this GM (a redelivery after a restart).  Raises ``InvalidInput`` / ``Unauthorized``
    before anything is queued.
    """
    job = codec.decode(body, expect=SubmitJob, max_size=cfg.max_body)
    assert isinstance(job, SubmitJob)
    check_user(job.user, job.token, queue_user, cfg.secret)
    codec.check_ids_unique(job.tasks)
    n_res = len(profile(cfg.profile).names)
    capacities = {tuple(n.capacity) for c in cfg.clusters for n in c.nodes}
    for t in job.tasks:
        if t.user != job.user or t.job_id != job.job_id:
            raise ValidationError(
                f"task {t.task_id} belongs to {t.user}/{t.job_id}, not {job.user}/{job.job_id}",
                reason="wrong_job",
            )
        if len(t.demand) != n_res:
            raise ValidationError(
                f"task {t.task_id}: {len(t.demand)} resource amounts, the federation has {n_res}",
                reason="wrong_resources",
            )
        if not any(fits(cap, t.demand) for cap in capacities):
            raise ValidationError(
                f"task {t.task_id}: demand {t.demand} exceeds every node's capacity",
                reason="impossible_resources",
            )
        if t.task_id in outstanding:
            raise ValidationError(f"duplicate task id {t.task_id!r}", reason="duplicate_task_id")
    if redelivered:
        # After a restart this GM may already know some tasks: running (an LM's snapshot
        # said so) or finished (their events were waiting in its queue).  Only the rest
        # are queued again; a fresh delivery gets no such leniency.
        skipped = [t.task_id for t in job.tasks if core.knows(t.task_id)]
    else:
        skipped = [t.task_id for t in job.tasks if t.task_id in core.known_placed]
    fresh = [t for t in job.tasks if t.task_id not in skipped]
    for t in fresh:
        t.spent = [0.0] * len(t.spent)
        t.waits = [0] * len(t.waits)
        t.attempts = 0
    if job.stages is not None:
        # A DAG: its stages are released as their parents finish.  A redelivered DAG
        # whose tasks this GM already knows is refused (dead-lettered with the reason)
        # by submit_job: resuming a half-run DAG is not supported.
        try:
            dag = from_layout(job.job_id, job.user, job.submitted_at, job.tasks, job.stages)
        except ConfigError as exc:
            raise ValidationError(str(exc), reason="bad_dag") from None
        core.submit_job(dag, job.submitted_at)
        return job, []
    core.submit(fresh, job.submitted_at)
    return job, skipped


@dataclass
class Pending:
    """A delivered submission, acked once every task is accepted by an LM or failed."""

    message: AbstractIncomingMessage
    outstanding: set[TaskId] = field(default_factory=set)


PATHS: dict[type, str] = {
    LaunchRequest: "/v1/launch",
    PreemptRequest: "/v1/preempt",
    SnapshotRequest: "/v1/snapshot",
}
REPLIES: dict[type, str] = {
    LaunchRequest: "launch_response",
    PreemptRequest: "preempt_response",
    SnapshotRequest: "snapshot",
}


class GmService:
    """Carries out a GM core's effects and feeds it its inputs."""

    def __init__(self, cfg: FederationConfig, gm: GmId) -> None:
        self.cfg = cfg
        mine = [u.user for u in cfg.user_configs if u.gm == gm]
        queues = make_policy(
            cfg.queue_policy, cfg.user_configs, p_altruism=cfg.p_altruism, seed=cfg.seed
        )(gm, mine)
        self.core = GlobalMaster(gm, cfg.lm_ids, cfg.user_configs, queues=queues)
        self.broker = GmBroker(cfg, gm)
        self.headers = {**internal_headers(cfg.secret), "Content-Type": "application/x-msgpack"}
        self.session: aiohttp.ClientSession | None = None
        self.jobs: dict[JobId, Pending] = {}
        self.task_job: dict[TaskId, JobId] = {}
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._bg: set[asyncio.Task[None]] = set()
        self.consuming = False
        self.lm_rtts: deque[float] = deque(maxlen=2000)
        """Round trips of the latest requests to LMs (a diagnostic on /v1/state)."""
        self.counters = {
            "jobs_admitted": 0,
            "jobs_redelivered": 0,
            "jobs_acked": 0,
            "jobs_refused": 0,
            "redelivered_jobs": 0,
            "lm_errors": 0,
            "bad_broker_messages": 0,
        }

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.ensure_future(coro)
        self._bg.add(t)
        t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task[None]) -> None:
        self._bg.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.error("background task failed", exc_info=t.exception())

    # ------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, limit_per_host=16),
            timeout=aiohttp.ClientTimeout(total=10),
        )
        await self.broker.open()
        self._spawn(self._start())

    async def _start(self) -> None:
        """Snapshots from every LM first (so redelivered jobs are recognised), then consume."""
        self.carry_out(self.core.start(time.time()))
        await self._ready.wait()
        await self.broker.consume(self._on_state, self._on_events, self._on_job)
        self.consuming = True
        self._spawn(self._decide_loop())
        log.info("%s ready: views of %d LMs", self.core.gm_id, len(self.core.views))

    async def close(self) -> None:
        for t in list(self._bg):
            t.cancel()
        with contextlib.suppress(Exception):
            await self.broker.close()
        if self.session is not None:
            await self.session.close()

    # --------------------------------------------------------------- inputs
    def _feed(self, kind: str, body: bytes) -> list[Effect]:
        effects = handle_body(self.core, kind, body, time.time())
        self._wake.set()
        if self.core.ready:
            self._ready.set()
        return effects

    async def _on_state(self, msg: AbstractIncomingMessage) -> None:
        try:
            self.carry_out(self._feed("state_updated", msg.body))
        except MeghaError as exc:
            self.counters["bad_broker_messages"] += 1
            log.warning("bad state update dropped: %s", exc)

    async def _on_events(self, msg: AbstractIncomingMessage) -> None:
        try:
            evs = codec.decode_batch(msg.body, expect=TaskEvent)
        except MeghaError as exc:
            self.counters["bad_broker_messages"] += 1
            await self.broker.dead_letter(msg, self.cfg.gm_events_queue(self.core.gm_id), exc)
            return
        now = time.time()
        effects: list[Effect] = []
        for ev in evs:
            assert isinstance(ev, TaskEvent)
            effects.extend(self.core.on_task_event(ev, now))
            if ev.kind in SETTLING_EVENTS:
                self._settle(ev.task.task_id)
        self._wake.set()
        self.carry_out(effects)
        await msg.ack()

    async def _on_job(self, user: str, msg: AbstractIncomingMessage) -> None:
        try:
            job, skipped = admit_job(
                self.core,
                self.cfg,
                msg.body,
                user,
                self.task_job,
                redelivered=bool(msg.redelivered),
            )
        except ValidationError as exc:
            if exc.reason == "duplicate_task_id" and await self._redelivery(msg):
                return
            self.counters["jobs_refused"] += 1
            await self.broker.dead_letter(msg, self.cfg.user_queue(user), exc)
            return
        except MeghaError as exc:
            self.counters["jobs_refused"] += 1
            await self.broker.dead_letter(msg, self.cfg.user_queue(user), exc)
            return
        self.counters["jobs_admitted"] += 1
        if msg.redelivered:
            self.counters["jobs_redelivered"] += 1
        pending = Pending(msg, {t.task_id for t in job.tasks})
        self.jobs[job.job_id] = pending
        for t in job.tasks:
            self.task_job[t.task_id] = job.job_id
        for tid in skipped:
            self._settle(tid)
        self._wake.set()

    async def _redelivery(self, msg: AbstractIncomingMessage) -> bool:
        """The same job delivered again to this process (a channel came back)."""
        try:
            job = codec.decode(msg.body, expect=SubmitJob)
        except MeghaError:
            return False
        assert isinstance(job, SubmitJob)
        pending = self.jobs.get(job.job_id)
        if pending is not None and msg.redelivered:
            pending.message = msg
            self.counters["redelivered_jobs"] += 1
            return True
        if msg.redelivered and all(self.core.knows(t.task_id) for t in job.tasks):
            self.counters["redelivered_jobs"] += 1
            await msg.ack()
            return True
        return False

    def _settle(self, tid: TaskId) -> None:
        jid = self.task_job.pop(tid, None)
        if jid is None:
            return
        pending = self.jobs[jid]
        pending.outstanding.discard(tid)
        if not pending.outstanding:
            del self.jobs[jid]
            self.counters["jobs_acked"] += 1
            self._spawn(self._ack(pending.message))

    @staticmethod
    async def _ack(msg: AbstractIncomingMessage) -> None:
        try:
            await msg.ack()
        except Exception as exc:  # channel gone: the broker will redeliver; we skip it then
            log.warning("ack failed (%s): the job will be redelivered and recognised", exc)

    # -------------------------------------------------------------- effects
    def carry_out(self, effects: Sequence[Effect]) -> None:
        if not effects:
            return
        stamp_sent(list(effects), time.time())
        for eff in effects:
            if isinstance(eff, ToLm):
                self._spawn(self._send(eff))
            elif isinstance(eff, Report):
                self._settle(eff.msg.task.task_id)
                self._spawn(self._publish_failure(codec.encode(eff.msg)))

    async def _publish_failure(self, body: bytes) -> None:
        try:
            await self.broker.publish_failure(body)
        except Exception:
            log.exception("could not publish a task failure")

    async def _send(self, eff: ToLm) -> None:
        assert self.session is not None
        msg = eff.msg
        url = self.cfg.lm_url(eff.lm) + PATHS[type(msg)]
        body = codec.encode(msg)
        delay = 0.02
        reply: bytes | None = None
        while reply is None:
            try:
                t = time.perf_counter()
                async with self.session.post(url, data=body, headers=self.headers) as resp:
                    data = await resp.read()
                    if resp.status == 200:
                        self.lm_rtts.append(time.perf_counter() - t)
                        reply = data
                        break
                    self.counters["lm_errors"] += 1
                    log.error(
                        "%s refused %s: %s %s", eff.lm, PATHS[type(msg)], resp.status, data[:300]
                    )
                    if resp.status < 500:
                        reply = self._refusal(msg)
                        break
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.counters["lm_errors"] += 1
                log.warning("%s unreachable (%s); retrying", eff.lm, exc)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)
        try:
            effects = self._feed(REPLIES[type(msg)], reply)
        except MeghaError as exc:
            log.error("bad reply from %s: %s", eff.lm, exc)
            effects = self._feed(REPLIES[type(msg)], self._refusal(msg))
        self._settle_reply(reply, msg)
        self.carry_out(effects)

    def _settle_reply(self, reply: bytes, msg: object) -> None:
        if isinstance(msg, LaunchRequest):
            for p in msg.placements:
                if p.task.task_id in self.core.placed:
                    self._settle(p.task.task_id)
        elif isinstance(msg, PreemptRequest) and msg.task.task_id in self.core.placed:
            self._settle(msg.task.task_id)

    def _refusal(self, msg: object) -> bytes:
        """An LM that answers 4xx (a bug) is treated as refusing: the tasks are retried."""
        if isinstance(msg, SnapshotRequest):
            raise DecodeError("LM refused a snapshot request")
        now = time.time()
        assert isinstance(msg, LaunchRequest | PreemptRequest)
        delta = StateDelta(
            lm=msg.lm,
            version=msg.known_version,
            base_version=msg.known_version,
            nodes=(),
            free=(),
            node_versions=(),
        )
        if isinstance(msg, LaunchRequest):
            return codec.encode(
                LaunchResponse(
                    gm=msg.gm,
                    lm=msg.lm,
                    request_id=msg.request_id,
                    results=tuple(
                        PlacementResult(task_id=p.task.task_id, accepted=False, reason="lm_error")
                        for p in msg.placements
                    ),
                    delta=delta,
                    received_at=now,
                    sent_at=now,
                )
            )
        return codec.encode(
            PreemptResponse(
                gm=msg.gm,
                lm=msg.lm,
                request_id=msg.request_id,
                task_id=msg.task.task_id,
                accepted=False,
                reason="lm_error",
                node=None,
                preempted=(),
                delta=delta,
                received_at=now,
                sent_at=now,
            )
        )

    async def _decide_loop(self) -> None:
        """Decide while there is work; batches of decisions share one request per LM."""
        core = self.core
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=0.5)
            self._wake.clear()
            while core.has_work():
                self.carry_out(core.decide(time.time(), self.cfg.decide_batch))
                await asyncio.sleep(0)

    # ----------------------------------------------------------------- pages
    def state_page(self) -> dict[str, Any]:
        core = self.core
        return {
            "gm": core.gm_id,
            "ready": self.consuming,
            "queues": {u: len(q) for u, q in core.queues.queues.items()},
            "queued": len(core.queues),
            "inflight": len(core.inflight),
            "running_tasks": len(core.placed),
            "finished": len(core.finished),
            "failed": len(core.failed),
            "jobs_unacked": len(self.jobs),
            "views": {lm: v.version for lm, v in core.views.items()},
            "shares": core.dominant_shares(),
            "counters": {**core.counters, **self.counters},
            "dead_lettered": self.broker.dead_lettered,
            "wait_reasons": {r.name.lower(): core.wait_reasons[r] for r in WaitReason},
            "lm_request_rtt_s": _tails(self.lm_rtts),
        }


def _tails(xs: deque[float]) -> dict[str, float]:
    v = sorted(xs)
    if not v:
        return {}
    return {"p50": v[len(v) // 2], "p99": v[int(len(v) * 0.99)], "max": v[-1], "n": len(v)}


SERVICE_KEY = web.AppKey("service", GmService)


async def health_handler(request: web.Request) -> web.Response:
    svc = request.app[SERVICE_KEY]
    ok = svc.consuming
    return web.json_response(
        {"status": "ok" if ok else "starting", "role": "gm", "gm": svc.core.gm_id},
        status=200 if ok else 503,
    )


async def state_handler(request: web.Request) -> web.Response:
    require_internal(request)
    return web.json_response(request.app[SERVICE_KEY].state_page())


def build_app(cfg: FederationConfig, gm: GmId) -> web.Application:
    svc = GmService(cfg, gm)
    app = base_app(cfg)
    app[SERVICE_KEY] = svc
    core = svc.core
    app[METRICS_KEY] = ServiceMetrics(
        "megha_gm",
        lambda: {**core.counters, **svc.counters},
        lambda: {
            "queued_tasks": len(core.queues),
            "inflight_tasks": len(core.inflight),
            "running_tasks": len(core.placed),
            "jobs_unacked": len(svc.jobs),
        },
    )

    return serve(app, svc, health=health_handler, state=state_handler)


async def create_app() -> web.Application:
    """gunicorn entry point (``global_master.app:create_app``)."""
    cfg, ident = service_identity("gm")
    if ident not in cfg.gm_ids:
        raise MeghaError(f"{ident} is not a GM of this federation ({cfg.gm_ids})")
    return build_app(cfg, GmId(ident))
