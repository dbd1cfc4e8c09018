"""The gunicorn worker of every service: aiohttp's uvloop worker, serving the app with
``runtime.http.ServiceRunner`` (``--worker-class runtime.gunicorn_worker.Worker``, as
``common.config.process_plan`` starts each GM, LM and worker pool).

aiohttp's worker serves an app with a plain ``web.AppRunner``, whose connections answer
a request the HTTP parser cannot read -- not HTTP at all, a bad request line or header,
a line too long, a bad chunk -- in plain text, before any middleware runs, and log a
traceback at ERROR for each.  This worker gives aiohttp a ``ServiceRunner`` instead, made
from gunicorn's settings exactly as aiohttp makes its own (``--keep-alive``,
``--graceful-timeout``, gunicorn's logger and access log); everything else (uvloop,
signals, sockets, the arbiter's heartbeat, ``--max-requests``) is aiohttp's worker.
"""

from __future__ import annotations

import inspect
from typing import Any

from aiohttp import web
from aiohttp.worker import GunicornUVLoopWebWorker

from runtime.http import ServiceRunner


class Worker(GunicornUVLoopWebWorker):
    wsgi: Any
    """What gunicorn loaded (``APP_MODULE``): an app, or an async function making one."""

    def load_wsgi(self) -> None:
        super().load_wsgi()
        loaded = self.wsgi
        if not (isinstance(loaded, web.Application) or inspect.iscoroutinefunction(loaded)):
            return  # aiohttp's worker refuses it, with its own message

        async def runner() -> web.AppRunner:
            app = loaded if isinstance(loaded, web.Application) else await loaded()
            return ServiceRunner(app, **self.runner_settings())

        # aiohttp's worker takes an async factory of an AppRunner as the app
        self.wsgi = runner

    def runner_settings(self) -> dict[str, Any]:
        """What aiohttp's worker gives the runner it makes (``GunicornWebWorker._run``),
        from gunicorn's config."""
        return {
            "logger": self.log,
            "keepalive_timeout": self.cfg.keepalive,
            "access_log": self.log.access_log if self.cfg.accesslog else None,
            "access_log_format": self._get_valid_log_format(self.cfg.access_log_format),
            "shutdown_timeout": self.cfg.graceful_timeout / 100 * 95,
        }
