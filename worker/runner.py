"""The only place in a worker pool that runs processes: a task's command, sandboxed.

The core asks (``RunCommand``, ``KillCommand``); the runner runs the command through
``security.sandbox.run_command`` -- only allow-listed executables, as the unprivileged
uid the operator configured, with rlimits, a timeout, a scrubbed environment and a
private work directory -- and tells the core what happened (``CommandStarted``,
``CommandExited``, with the sandbox's reason when it refused or stopped the command)
through the driver.  A stopped attempt's run is cancelled: its process group is
killed.
"""

from __future__ import annotations

import asyncio
import logging

from common.effects import KillCommand, RunCommand
from common.messages import CommandExited, CommandStarted
from common.model import TaskKey
from runtime.driver import CoreDriver
from security.sandbox import Outcome, SandboxPolicy, run_command

log = logging.getLogger("megha.worker.runner")


class Runner:
    """Sandboxed processes for the tasks that carry a command."""

    def __init__(self, driver: CoreDriver, policy: SandboxPolicy) -> None:
        self.driver = driver
        self.policy = policy
        self._runs: dict[tuple[TaskKey, int], asyncio.Task[None]] = {}

    def run(self, eff: RunCommand) -> None:
        key = ((eff.spec.user, eff.spec.task_id), eff.attempt)
        task = asyncio.get_running_loop().create_task(self._run(eff))
        self._runs[key] = task
        task.add_done_callback(lambda _: self._runs.pop(key, None))

    async def _run(self, eff: RunCommand) -> None:
        spec = eff.spec
        user, tid, attempt = spec.user, spec.task_id, eff.attempt

        def started() -> None:
            self.driver.feed(CommandStarted(user=user, task_id=tid, attempt=attempt))

        ok, detail = False, ""
        try:
            result = await run_command(spec.command, self.policy, on_start=started)
        except asyncio.CancelledError:  # stopped: the sandbox killed its process group
            raise
        except Exception as exc:  # the sandbox itself failed: the attempt fails, said so
            log.exception("command of %s/%s failed to run", user, tid)
            detail = f"spawn_failed: {type(exc).__name__}: {exc}"
        else:
            ok = result.ok
            if not ok:
                detail = f"{result.reason.value}: {result.detail}"
            if result.reason is Outcome.EXIT_STATUS and result.stderr_tail:
                detail += f" ({result.stderr_tail[-200:]!r})"
        self.driver.feed(
            CommandExited(user=user, task_id=tid, attempt=attempt, ok=ok, detail=detail)
        )

    def kill(self, eff: KillCommand) -> None:
        task = self._runs.pop(((eff.user, eff.task_id), eff.attempt), None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for task in self._runs.values():
            task.cancel()
        self._runs.clear()
