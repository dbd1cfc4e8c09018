"""The only place in a worker pool that spawns processes: runs a task's command.

The core asks (``RunCommand``, ``KillCommand``); the runner starts or kills the
process and tells the core what happened (``CommandStarted``, ``CommandExited``)
through the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from common.effects import KillCommand, RunCommand
from common.messages import CommandExited, CommandStarted
from common.model import TaskKey
from runtime.driver import CoreDriver

log = logging.getLogger("megha.worker.runner")


class Runner:
    """Real processes for the tasks that carry a command."""

    def __init__(self, driver: CoreDriver) -> None:
        self.driver = driver
        self._procs: dict[tuple[TaskKey, int], asyncio.subprocess.Process] = {}

    def run(self, eff: RunCommand) -> None:
        self.driver.sup.spawn(self._run(eff), f"command of {eff.spec.task_id}")

    async def _run(self, eff: RunCommand) -> None:
        spec = eff.spec
        key = ((spec.user, spec.task_id), eff.attempt)
        user, tid, attempt = spec.user, spec.task_id, eff.attempt
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.command,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self.driver.feed(
                CommandExited(
                    user=user, task_id=tid, attempt=attempt, ok=False, detail=f"spawn failed: {exc}"
                )
            )
            return
        self._procs[key] = proc
        self.driver.feed(CommandStarted(user=user, task_id=tid, attempt=attempt))
        try:
            _, err = await proc.communicate()
        finally:
            self._procs.pop(key, None)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        ok = proc.returncode == 0
        detail = "" if ok else f"exit {proc.returncode}: {err[-200:]!r}"
        self.driver.feed(
            CommandExited(user=user, task_id=tid, attempt=attempt, ok=ok, detail=detail)
        )

    def kill(self, eff: KillCommand) -> None:
        proc = self._procs.pop(((eff.user, eff.task_id), eff.attempt), None)
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    def close(self) -> None:
        for proc in self._procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        self._procs.clear()
