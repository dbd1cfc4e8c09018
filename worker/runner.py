"""The only place in a worker pool that runs processes: a task's command, sandboxed.

The core asks (``RunCommand``, ``KillCommand``); the runner runs the command through
``security.sandbox.Sandbox.run`` -- only allow-listed executables, each running task as
a uid of its own from the pool's slice of the configured range, in namespaces of its
own (private scratch, no network unless allowed), with rlimits, a timeout and a
scrubbed environment (plus the task's ``env`` the operator allows) -- and tells the core what happened (``CommandStarted``,
``CommandExited``, with the sandbox's reason when it refused or stopped the command)
through the driver.  A stopped attempt's run is cancelled: its process group and every
process of its uid are killed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from common import taskenv
from common.effects import KillCommand, RunCommand
from common.messages import OUTPUT_BYTES, CommandExited, CommandStarted
from common.model import TaskKey
from runtime.driver import CoreDriver
from security.sandbox import Outcome, Sandbox

log = logging.getLogger("megha.worker.runner")


class Runner:
    """Sandboxed processes for the tasks that carry a command."""

    def __init__(self, driver: CoreDriver, sandbox: Sandbox, env_allow: Sequence[str] = ()) -> None:
        self.driver = driver
        self.sandbox = sandbox
        self.env_allow = tuple(env_allow)
        """The variables a task's command may be given (``task_env_allow``): the others
        of its ``env`` are dropped here, whatever the GM admitted."""
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
        out: tuple[int | None, bytes, bytes] = (None, b"", b"")
        try:
            env = taskenv.allowed(spec.env, self.env_allow)
            result = await self.sandbox.run(spec.command, on_start=started, env=env)
        except asyncio.CancelledError:  # stopped: the sandbox killed its processes
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
            cut = OUTPUT_BYTES
            out = (result.exit_code, result.stdout[-cut:], result.stderr_tail[-cut:])
        self.driver.feed(
            CommandExited(
                user=user,
                task_id=tid,
                attempt=attempt,
                ok=ok,
                detail=detail,
                exit_code=out[0],
                stdout=out[1],
                stderr=out[2],
            )
        )

    def kill(self, eff: KillCommand) -> None:
        task = self._runs.pop(((eff.user, eff.task_id), eff.attempt), None)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        """Stop every run and wait (a few seconds at most) until each has killed its
        processes and given its uid back."""
        runs = list(self._runs.values())
        self._runs.clear()
        for task in runs:
            task.cancel()
        if runs:
            await asyncio.wait(runs, timeout=5.0)
