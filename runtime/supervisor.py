"""Every background task of a service process, under one ``asyncio.TaskGroup``.

``spawn`` runs short jobs (a request, a publish, a flush): their failures are
logged and counted, never allowed to cancel their siblings.  ``run_forever`` runs the
process's long-lived loops (deciding, heartbeats): if one of them dies the group is
cancelled, and the process exits for its supervisor (gunicorn) to restart it rather
than limp on without it.  Closing cancels everything and waits for it to finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

log = logging.getLogger("megha.runtime")


class Supervisor:
    """A service's structured concurrency: enter once at start-up, exit at shutdown."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.failures = 0

    async def __aenter__(self) -> Supervisor:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._tg is not None
        for t in list(self._tasks):
            t.cancel()
        try:
            await self._tg.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:  # a loop died before shutdown: already logged
            log.debug("%s: background errors at shutdown: %s", self.name, group)
        self._tg = None

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, coro: Coroutine[Any, Any, Any], what: str, fatal: bool = False) -> None:
        """``coro``, its failure logged; ``fatal``: raised again, for the group to take
        the process down (a loop it cannot live without)."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            self.failures += 1
            if not fatal:
                log.exception("%s: %s failed", self.name, what)
                return
            log.critical("%s: %s died; the process exits to be restarted", self.name, what,
                         exc_info=True)  # fmt: skip
            raise

    def spawn(self, coro: Coroutine[Any, Any, Any], what: str = "background job") -> None:
        """Run a short job; its failure is logged, never propagated."""
        if self._tg is None:
            coro.close()
            return
        self._track(self._tg.create_task(self._guard(coro, what)))

    def run_forever(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        """Run a loop the process cannot live without (its death is logged, with its
        traceback, before the group takes the process down)."""
        assert self._tg is not None, "the supervisor is not running"
        self._track(
            self._tg.create_task(self._guard(coro, what, fatal=True), name=f"{self.name}:{what}")
        )

    @property
    def running(self) -> int:
        return len(self._tasks)
