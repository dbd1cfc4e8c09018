"""Local Master service: drives ``local_master.core.LocalMaster`` over HTTP and AMQP.

POST /v1/launch, /v1/preempt, /v1/snapshot (from GMs; the answer is the core's
reply), /v1/worker-report, /v1/worker-heartbeat (from its worker pool), /v1/ping;
GET /health, /v1/state, /metrics.  One gunicorn worker process: the core's state
lives here.  Starts and stops go to the worker pool batched per loop turn; task
events go to each GM batched per loop turn, each batch with a unique message id.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from common import codec
from common.config import FederationConfig
from common.effects import ToAllGms, ToGm, ToWorker
from common.ids import GmId, LmId
from common.messages import (
    CheckWorkers,
    Heartbeat,
    LaunchRequest,
    PreemptRequest,
    RegisterWorkers,
    SnapshotRequest,
    StartTask,
    StartTasks,
    StopTask,
    StopTasks,
    TaskEvent,
    TaskEvents,
    WorkerHeartbeat,
    WorkerReports,
)
from local_master.core import LocalMaster
from runtime import broker as amqp
from runtime.driver import Batcher, CoreDriver
from runtime.http import Peer, PeerRefused, service_app, service_identity, session
from runtime.prometheus import ServiceMetrics
from runtime.retry import Backoff, GiveUp
from runtime.supervisor import Supervisor

log = logging.getLogger("megha.lm")


class LmService:
    """An LM core, its HTTP peers (the worker pool) and its broker side."""

    role = "lm"

    def __init__(self, cfg: FederationConfig, lm: LmId, *, epoch: int | None = None) -> None:
        cluster = cfg.clusters[cfg.lm_ids.index(lm)]
        self.cfg = cfg
        self.epoch = epoch if epoch is not None else int(time.time() * 1000)
        self.core = LocalMaster(
            lm, cluster.nodes, cluster.home, gms=cfg.gm_ids, epoch=self.epoch,
            awaiting_workers=True,
        )  # fmt: skip
        self.sup = Supervisor(lm)
        self.driver = CoreDriver(self.core, self.sup)
        self.broker = amqp.Broker(cfg, lm)
        self.http: aiohttp.ClientSession | None = None
        self.pool: Peer | None = None
        self._seq = itertools.count(1)
        self.to_pool: Batcher[str, StartTask | StopTask] = Batcher(
            self.sup, self._flush_pool, "starts and stops to the worker pool"
        )
        self.events: Batcher[GmId, TaskEvent] = Batcher(
            self.sup, self._publish_events, "task events"
        )
        self.ready = False
        self.worker_errors = 0
        d = self.driver
        d.on(ToWorker, lambda e: _ignore(self.to_pool.add("pool", e.msg)))
        d.on(ToGm, lambda e: _ignore(self.events.add(e.gm, e.msg)))
        d.on(ToAllGms, lambda e: self.sup.spawn(self._publish_state(e), "state update"))

    async def open(self) -> None:
        await self.sup.__aenter__()
        self.http = session(32)
        policy = Backoff(deadline_s=self.cfg.worker_timeout_s)
        self.pool = Peer(
            f"{self.core.lm_id}-workers",
            self.cfg.worker_url(self.core.lm_id),
            self.cfg.secret,
            self.http,
            policy=policy,
            max_answer=self.cfg.max_body,
        )
        await self.broker.open()
        # no node is alive before the worker pool registers what it runs
        self.driver.every(self.cfg.heartbeat_s, Heartbeat, "heartbeat")
        timeout = self.cfg.worker_timeout_s
        self.driver.every(self.cfg.heartbeat_s, lambda: CheckWorkers(timeout=timeout), "liveness")
        self.ready = True

    async def close(self) -> None:
        await self.sup.__aexit__(None, None, None)
        await self.broker.close()
        if self.http is not None:
            await self.http.close()

    # ----------------------------------------------------------------- effects
    async def _flush_pool(self, _: str, items: list[StartTask | StopTask]) -> None:
        assert self.pool is not None
        lm = self.core.lm_id
        stops = tuple(m for m in items if isinstance(m, StopTask))
        starts = tuple(m for m in items if isinstance(m, StartTask))
        try:
            if stops:
                await self.pool.post(
                    "/v1/stop",
                    StopTasks(lm=lm, epoch=self.epoch, tasks=stops),
                    expect=WorkerReports,
                )
            if starts:
                reply = await self.pool.post(
                    "/v1/start",
                    StartTasks(lm=lm, epoch=self.epoch, tasks=starts),
                    expect=WorkerReports,
                )
                if reply is not None and reply.reports:
                    self.driver.feed(reply)
        except (PeerRefused, GiveUp) as exc:
            # its nodes will time out and their tasks go back (relaunched or re-queued)
            self.worker_errors += 1
            log.error("worker pool did not take %d starts/stops: %s", len(items), exc)

    async def _publish_events(self, gm: GmId, events: list[TaskEvent]) -> None:
        body = codec.encode(TaskEvents(lm=self.core.lm_id, epoch=self.epoch, events=tuple(events)))
        mid = f"{self.core.lm_id}.{self.epoch}.{next(self._seq)}"
        await self.broker.publish(
            self.broker.ex.events, f"gm.{gm}", amqp.persistent(body, message_id=mid)
        )

    async def _publish_state(self, eff: ToAllGms) -> None:
        try:
            await self.broker.ex.state.publish(
                amqp.transient(codec.encode(eff.msg)), routing_key="", mandatory=False
            )
        except amqp.PUBLISH_ERRORS as exc:  # the next heartbeat carries the same nodes
            self.broker.publish_errors += 1
            log.warning("state update not published: %s", exc)

    def ident(self) -> str:
        return self.core.lm_id

    def healthy(self) -> bool:
        return self.ready

    def state_page(self) -> dict[str, Any]:
        core = self.core
        return {
            "lm": core.lm_id,
            "epoch": core.epoch,
            "version": core.version,
            "nodes": core.n_nodes,
            "nodes_alive": sum(core.alive),
            "running_tasks": len(core.active),
            "logical_nodes": len(core.logical_nodes()),
            "free": [list(f) for f in core.free],
            "capacity_total": [sum(c[r] for c in core.capacity) for r in range(core.n_resources)],
            "free_total": [sum(f[r] for f in core.free) for r in range(core.n_resources)],
            "usage": {u: list(v) for u, v in core.usage.items()},
            "counters": core.counters.as_dict(),
            "retained_done": len(core.done),
            "publish_errors": self.broker.publish_errors,
            "worker_errors": self.worker_errors,
            "background_failures": self.sup.failures,
        }


def _ignore(_: object) -> None:
    """Drop a value (a batcher's ticket nobody waits for)."""


def build_app(cfg: FederationConfig, lm: LmId) -> web.Application:
    svc = LmService(cfg, lm)
    core = svc.core
    metrics = ServiceMetrics(
        "megha_lm",
        lambda: core.counters,
        lambda: {
            "running_tasks": len(core.active),
            "nodes_alive": sum(core.alive),
            "version": core.version,
        },
    )
    routes: dict[str, type | tuple[type, ...]] = {
        "/v1/launch": LaunchRequest,
        "/v1/preempt": PreemptRequest,
        "/v1/snapshot": SnapshotRequest,
        "/v1/worker-report": WorkerReports,
        "/v1/worker-heartbeat": WorkerHeartbeat,
        "/v1/register": RegisterWorkers,
    }
    return service_app(cfg, svc, metrics, routes)


async def create_app() -> web.Application:
    """gunicorn entry point (``local_master.app:create_app``)."""
    cfg, ident = service_identity("lm")
    return build_app(cfg, LmId(ident))
