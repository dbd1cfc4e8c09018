"""An aiohttp app served in-process as gunicorn serves it (``runtime.http.ServiceRunner``,
the runner of ``runtime.gunicorn_worker``), and the refusals it counted."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from runtime import http


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[int]:
    """``app`` served on 127.0.0.1: its port."""
    runner = http.ServiceRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def refused(app: web.Application, reason: str, role: str = "lm") -> float:
    """How many requests ``app`` (with ``ServiceMetrics`` of ``megha_<role>``) refused
    for ``reason``."""
    metrics = app[http.METRICS_KEY]
    name = f"megha_{role}_refused_total"
    return metrics.registry.get_sample_value(name, {"reason": reason}) or 0.0
