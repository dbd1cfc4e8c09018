"""Worker pool service: hosts the nodes of one LM (``MEGHA_ID`` = that LM).

POST /v1/start and /v1/stop take batches of StartTask / StopTask from the LM (the
start response carries the "started" reports of synthetic tasks);
GET /health, /v1/state, /metrics; POST /v1/ping answers empty (the floor).
"""

from __future__ import annotations

import time

from aiohttp import web

from common import codec
from common.config import FederationConfig
from common.errors import ValidationError
from common.ids import LmId
from common.messages import StartTask, StopTask
from common.metrics import ServiceMetrics
from common.service import (
    METRICS_KEY,
    base_app,
    msgpack_response,
    read_body,
    require_internal,
    serve,
    service_identity,
)
from worker.core import WorkerPool
from worker.runner import Runner

RUNNER_KEY = web.AppKey("runner", Runner)


def _batch(body: bytes, pool: WorkerPool, kind: type) -> list[StartTask | StopTask]:
    msgs = codec.decode_batch(body, expect=kind)
    out: list[StartTask | StopTask] = []
    for m in msgs:
        assert isinstance(m, StartTask | StopTask)
        if m.lm != pool.lm:
            raise ValidationError(
                f"this pool hosts {pool.lm}'s nodes, not {m.lm}'s", reason="wrong_lm"
            )
        if not 0 <= m.node < pool.n_nodes:
            raise ValidationError(f"node {m.node} is not hosted here", reason="unknown_node")
        out.append(m)
    return out


async def start_handler(request: web.Request) -> web.Response:
    runner = request.app[RUNNER_KEY]
    started = []
    for m in _batch(await read_body(request), runner.pool, StartTask):
        assert isinstance(m, StartTask)
        rep = runner.start(m)
        if rep is not None:
            started.append(rep)
    return msgpack_response(codec.encode_batch(started))


async def stop_handler(request: web.Request) -> web.Response:
    runner = request.app[RUNNER_KEY]
    for m in _batch(await read_body(request), runner.pool, StopTask):
        assert isinstance(m, StopTask)
        runner.stop(m)
    return web.Response(status=204)


async def health_handler(request: web.Request) -> web.Response:
    return web.json_response(
        {"status": "ok", "role": "worker", "lm": request.app[RUNNER_KEY].pool.lm}
    )


async def state_handler(request: web.Request) -> web.Response:
    require_internal(request)
    pool = request.app[RUNNER_KEY].pool
    return web.json_response(
        {
            "lm": pool.lm,
            "nodes": pool.n_nodes,
            "running": len(pool.running),
            "counters": pool.counters,
            "at": time.time(),
        }
    )


def build_app(cfg: FederationConfig, lm: LmId) -> web.Application:
    app = base_app(cfg)
    n_nodes = len(cfg.clusters[cfg.lm_ids.index(lm)].nodes)
    pool = WorkerPool(lm, n_nodes)
    runner = Runner(pool, cfg.lm_url(lm), cfg.secret, cfg.heartbeat_s)
    app[RUNNER_KEY] = runner
    app[METRICS_KEY] = ServiceMetrics(
        "megha_worker", lambda: pool.counters, lambda: {"running_tasks": len(pool.running)}
    )

    app.router.add_post("/v1/start", start_handler)
    app.router.add_post("/v1/stop", stop_handler)
    return serve(app, runner, health=health_handler, state=state_handler)


async def create_app() -> web.Application:
    """gunicorn entry point (``worker.app:create_app``)."""
    cfg, ident = service_identity("worker")
    return build_app(cfg, LmId(ident))
