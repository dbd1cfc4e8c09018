"""Local Master service: drives ``local_master.core.LocalMaster`` over HTTP and AMQP.

POST /v1/launch, /v1/preempt, /v1/snapshot (from GMs), /v1/worker-report,
/v1/worker-heartbeat (from its worker pool), /v1/ping; GET /health, /v1/state,
/metrics.  One gunicorn worker process: the core's state lives here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from common import codec
from common.auth import internal_headers
from common.codec import TaskReport, WorkerHeartbeat
from common.config import FederationConfig
from common.effects import Effect, ToAllGms, ToGm, ToWorker
from common.errors import MeghaError, ValidationError
from common.ids import LmId, NodeIndex
from common.messages import (
    LaunchRequest,
    PreemptRequest,
    SnapshotRequest,
    StartTask,
    StopTask,
    TaskEvent,
)
from common.metrics import ServiceMetrics
from common.model import Task
from common.service import (
    METRICS_KEY,
    base_app,
    msgpack_response,
    read_body,
    require_internal,
    serve,
    service_identity,
)
from local_master.amqp import LmPublisher
from local_master.core import LocalMaster

log = logging.getLogger("megha.lm")

KINDS = ("launch", "preempt", "snapshot", "worker-report", "worker-heartbeat")


def _check_task(core: LocalMaster, task: Task, node: int | None) -> None:
    if len(task.demand) != core.n_resources:
        raise ValidationError(
            f"task {task.task_id}: {len(task.demand)} resource amounts, this cluster has "
            f"{core.n_resources}",
            reason="wrong_resources",
        )
    if node is not None and not 0 <= node < core.n_nodes:
        raise ValidationError(f"node {node} is not in {core.lm_id}", reason="unknown_node")


def _check_lm(core: LocalMaster, lm: str) -> None:
    if lm != core.lm_id:
        raise ValidationError(f"this is {core.lm_id}, not {lm}", reason="wrong_lm")


def handle_body(
    core: LocalMaster, kind: str, body: bytes, now: float, *, received_at: float | None = None
) -> list[Effect]:
    """Decode one request body of ``kind`` (see ``KINDS``), validate it, run the core.

    Pure: the live handlers and tests feed the same bytes.  Raises ``InvalidInput``.
    """
    if kind == "launch":
        req = codec.decode(body, expect=LaunchRequest)
        assert isinstance(req, LaunchRequest)
        _check_lm(core, req.lm)
        seen: set[str] = set()
        for p in req.placements:
            _check_task(core, p.task, p.node)
            if p.task.task_id in seen:
                raise ValidationError(
                    f"task {p.task.task_id} twice in one request", reason="duplicate_task_id"
                )
            seen.add(p.task.task_id)
        return core.on_launch(req, now, received_at=received_at)
    if kind == "preempt":
        pre = codec.decode(body, expect=PreemptRequest)
        assert isinstance(pre, PreemptRequest)
        _check_lm(core, pre.lm)
        _check_task(core, pre.task, None)
        return core.on_preempt(pre, now, received_at=received_at)
    if kind == "snapshot":
        snap = codec.decode(body, expect=SnapshotRequest)
        assert isinstance(snap, SnapshotRequest)
        _check_lm(core, snap.lm)
        return core.on_snapshot_request(snap, now)
    if kind == "worker-report":
        effects: list[Effect] = []
        reports = codec.decode_batch(body, expect=TaskReport)
        for r in reports:
            assert isinstance(r, TaskReport)
            _check_lm(core, r.report.lm)
            if not 0 <= r.report.node < core.n_nodes:
                raise ValidationError(f"node {r.report.node} unknown", reason="unknown_node")
        for r in reports:
            assert isinstance(r, TaskReport)
            effects.extend(core.on_worker_report(r.report, now, task=r.task))
        return effects
    if kind == "worker-heartbeat":
        hb = codec.decode(body, expect=WorkerHeartbeat)
        assert isinstance(hb, WorkerHeartbeat)
        _check_lm(core, hb.lm)
        for n in hb.nodes:
            if not 0 <= n < core.n_nodes:
                raise ValidationError(f"node {n} unknown", reason="unknown_node")
        for n in hb.nodes:
            core.on_worker_heartbeat(n, now)
        return []
    raise ValueError(f"unknown request kind {kind!r}")


class LmService:
    """Carries out the core's effects: HTTP to the worker pool, AMQP to GMs."""

    def __init__(self, cfg: FederationConfig, core: LocalMaster) -> None:
        self.cfg = cfg
        self.core = core
        self.worker_url = cfg.worker_url(core.lm_id)
        self.headers = {**internal_headers(cfg.secret), "Content-Type": "application/x-msgpack"}
        self.publisher = LmPublisher(cfg)
        self.session: aiohttp.ClientSession | None = None
        self._to_workers: list[StartTask | StopTask] = []
        self._flushing = False
        self._bg: set[asyncio.Task[None]] = set()
        self.amqp_ready = False
        self.worker_errors = 0

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.ensure_future(coro)
        self._bg.add(t)
        t.add_done_callback(self._bg.discard)

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=32), timeout=aiohttp.ClientTimeout(total=10)
        )
        await self.publisher.open()
        self.amqp_ready = True
        now = time.time()
        for n in range(self.core.n_nodes):  # a grace period before the first liveness check
            self.core.on_worker_heartbeat(NodeIndex(n), now)
        self._spawn(self._periodic())

    async def close(self) -> None:
        for t in list(self._bg):
            t.cancel()
        await self.publisher.close()
        if self.session is not None:
            await self.session.close()

    def carry_out(self, effects: Sequence[Effect]) -> None:
        for eff in effects:
            if isinstance(eff, ToWorker):
                self._to_workers.append(eff.msg)
            elif isinstance(eff, ToGm):
                if isinstance(eff.msg, TaskEvent):
                    self.publisher.event(eff.msg)
                else:  # responses travel in HTTP bodies; anything else is a bug
                    log.error("unexpected message to %s: %s", eff.gm, type(eff.msg).__name__)
            elif isinstance(eff, ToAllGms):
                self._spawn(self.publisher.publish_state(eff.msg))
        if self._to_workers and not self._flushing:
            self._flushing = True
            self._spawn(self._flush_workers())

    async def _flush_workers(self) -> None:
        try:
            await asyncio.sleep(0)
            while self._to_workers:
                batch, self._to_workers = self._to_workers, []
                starts = [m for m in batch if isinstance(m, StartTask)]
                stops = [m for m in batch if isinstance(m, StopTask)]
                if starts:
                    await self._post_worker("/v1/start", codec.encode_batch(starts))
                if stops:
                    await self._post_worker("/v1/stop", codec.encode_batch(stops))
        finally:
            self._flushing = False

    async def _post_worker(self, path: str, body: bytes) -> None:
        """Retried: the worker pool ignores repeats; if it stays away its nodes time out."""
        assert self.session is not None
        delay = 0.05
        deadline = time.monotonic() + self.cfg.worker_timeout_s
        while True:
            try:
                async with self.session.post(
                    self.worker_url + path, data=body, headers=self.headers
                ) as resp:
                    if resp.status < 300:
                        reports = await resp.read()
                        if path == "/v1/start" and reports:
                            self._started(reports)
                        return
                    log.error("worker pool refused %s: %s %s", path, resp.status, await resp.text())
                    self.worker_errors += 1
                    return
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.worker_errors += 1
                if time.monotonic() > deadline:
                    log.error("worker pool unreachable for %s: %s", path, exc)
                    return
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    def _started(self, body: bytes) -> None:
        """The worker pool's answer to a start request: the tasks that started."""
        try:
            self.carry_out(handle_body(self.core, "worker-report", body, time.time()))
        except MeghaError as exc:
            log.error("bad start reports from the worker pool: %s", exc)

    async def _periodic(self) -> None:
        """Heartbeat (state update to all GMs) and the dead-worker check."""
        while True:
            await asyncio.sleep(self.cfg.heartbeat_s)
            now = time.time()
            self.carry_out(self.core.check_workers(now, self.cfg.worker_timeout_s))
            self.carry_out(self.core.heartbeat(now))


SERVICE_KEY = web.AppKey("service", LmService)


async def _gm_request(request: web.Request, kind: str) -> web.Response:
    received_at = time.time()
    svc = request.app[SERVICE_KEY]
    body = await read_body(request)
    effects = handle_body(svc.core, kind, body, time.time(), received_at=received_at)
    head = effects[0]
    assert isinstance(head, ToGm)
    svc.carry_out(effects[1:])
    return msgpack_response(codec.encode(head.msg))


async def launch_handler(request: web.Request) -> web.Response:
    return await _gm_request(request, "launch")


async def preempt_handler(request: web.Request) -> web.Response:
    return await _gm_request(request, "preempt")


async def snapshot_handler(request: web.Request) -> web.Response:
    return await _gm_request(request, "snapshot")


async def worker_report_handler(request: web.Request) -> web.Response:
    svc = request.app[SERVICE_KEY]
    body = await read_body(request)
    svc.carry_out(handle_body(svc.core, "worker-report", body, time.time()))
    return web.Response(status=204)


async def worker_heartbeat_handler(request: web.Request) -> web.Response:
    svc = request.app[SERVICE_KEY]
    body = await read_body(request)
    svc.carry_out(handle_body(svc.core, "worker-heartbeat", body, time.time()))
    return web.Response(status=204)


async def health_handler(request: web.Request) -> web.Response:
    svc = request.app[SERVICE_KEY]
    ok = svc.amqp_ready
    return web.json_response(
        {"status": "ok" if ok else "starting", "role": "lm", "lm": svc.core.lm_id},
        status=200 if ok else 503,
    )


def state_page(core: LocalMaster) -> dict[str, Any]:
    return {
        "lm": core.lm_id,
        "version": core.version,
        "nodes": core.n_nodes,
        "nodes_alive": sum(core.alive),
        "running_tasks": len(core.active),
        "logical_nodes": len(core.logical_nodes()),
        "free": [list(f) for f in core.free],
        "capacity_total": [sum(c[r] for c in core.capacity) for r in range(core.n_resources)],
        "free_total": [sum(f[r] for f in core.free) for r in range(core.n_resources)],
        "usage": {u: list(v) for u, v in core.usage.items()},
        "counters": dict(core.counters),
    }


async def state_handler(request: web.Request) -> web.Response:
    require_internal(request)
    svc = request.app[SERVICE_KEY]
    page = state_page(svc.core)
    page["publish_errors"] = svc.publisher.publish_errors
    page["worker_errors"] = svc.worker_errors
    return web.json_response(page)


def build_app(cfg: FederationConfig, lm: LmId) -> web.Application:
    cluster = cfg.clusters[cfg.lm_ids.index(lm)]
    core = LocalMaster(lm, cluster.nodes, cluster.home)
    svc = LmService(cfg, core)
    app = base_app(cfg)
    app[SERVICE_KEY] = svc
    app[METRICS_KEY] = ServiceMetrics(
        "megha_lm",
        lambda: core.counters,
        lambda: {
            "running_tasks": len(core.active),
            "nodes_alive": sum(core.alive),
            "version": core.version,
        },
    )

    app.router.add_post("/v1/launch", launch_handler)
    app.router.add_post("/v1/preempt", preempt_handler)
    app.router.add_post("/v1/snapshot", snapshot_handler)
    app.router.add_post("/v1/worker-report", worker_report_handler)
    app.router.add_post("/v1/worker-heartbeat", worker_heartbeat_handler)
    return serve(app, svc, health=health_handler, state=state_handler)


async def create_app() -> web.Application:
    """gunicorn entry point (``local_master.app:create_app``)."""
    cfg, ident = service_identity("lm")
    return build_app(cfg, LmId(ident))
