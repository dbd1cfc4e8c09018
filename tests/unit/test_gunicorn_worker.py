"""The worker class the services run in: named by the process plan, it serves the app with
``ServiceRunner`` and keeps every setting aiohttp's worker takes from gunicorn."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from aiohttp import web
from gunicorn.config import Config
from gunicorn.glogging import Logger

from common.config import FederationConfig, process_plan
from runtime.gunicorn_worker import Worker
from runtime.http import ServiceRunner


def gunicorn_config(argv: list[str]) -> Config:
    """gunicorn's config from a command line, as ``gunicorn`` itself reads it."""
    cfg = Config()
    for k, v in vars(cfg.parser().parse_args(argv)).items():
        if v is not None and k != "args":
            cfg.set(k.lower(), v)
    return cfg


async def factory() -> web.Application:
    return web.Application()


def test_the_process_plan_runs_every_service_in_the_worker_with_its_settings() -> None:
    for spec in process_plan(FederationConfig(), "f.toml"):
        assert spec.argv[:3] == ["python3", "-m", "gunicorn"]
        cfg = gunicorn_config(spec.argv[3:])
        assert cfg.worker_class is Worker, spec.name  # what gunicorn loads from the argv
        assert (cfg.keepalive, cfg.graceful_timeout) == (300, 5)

    worker = Worker(1, os.getpid(), [], SimpleNamespace(wsgi=lambda: factory), 60, cfg, Logger(cfg))
    try:
        worker.load_wsgi()
        runner = asyncio.run(worker.wsgi())  # what aiohttp's worker then serves
    finally:
        worker.tmp.close()
    assert isinstance(runner, ServiceRunner)
    # what aiohttp's own worker would give its runner, from the same config
    assert runner._kwargs["keepalive_timeout"] == 300
    assert runner._kwargs["logger"] is worker.log
    assert runner._kwargs["access_log"] is None  # no --access-logfile
    assert runner._shutdown_timeout == 5 * 0.95
