"""The only place that waits or spawns: runs tasks (synthetic timers or real
commands), batches reports to the LM, and heartbeats the hosted nodes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp

from common import codec
from common.auth import internal_headers
from common.codec import TaskReport, WorkerHeartbeat
from common.ids import NodeIndex, TaskId
from common.messages import StartTask, StopTask
from worker.core import WorkerPool

log = logging.getLogger("megha.worker")


class Runner:
    """Drives a ``WorkerPool`` on the event loop."""

    def __init__(self, pool: WorkerPool, lm_url: str, secret: str, heartbeat_s: float) -> None:
        self.pool = pool
        self.lm_url = lm_url
        self.headers = {**internal_headers(secret), "Content-Type": "application/x-msgpack"}
        self.heartbeat_s = heartbeat_s
        self.session: aiohttp.ClientSession | None = None
        self._outbox: list[TaskReport] = []
        self._flushing = False
        self._handles: dict[TaskId, asyncio.TimerHandle | asyncio.Task[None]] = {}
        self._bg: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=16), timeout=aiohttp.ClientTimeout(total=10)
        )
        self._spawn(self._heartbeats())

    async def close(self) -> None:
        for t in list(self._bg):
            t.cancel()
        for h in self._handles.values():
            h.cancel()
        if self.session is not None:
            await self.session.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # ---------------------------------------------------------------- tasks
    def start(self, msg: StartTask) -> TaskReport | None:
        """Start a task; a synthetic one starts at once and its report is returned, to
        travel back in the response to the LM's request (one hop fewer per task)."""
        task = self.pool.accept(msg, time.time())
        if task is None:
            return None
        if task.command:
            self._handles[task.task_id] = asyncio.ensure_future(self._run_command(task.task_id))
            return None
        rep = self.pool.started(task.task_id, time.time())
        loop = asyncio.get_running_loop()
        self._handles[task.task_id] = loop.call_later(task.duration, self._finish, task.task_id)
        return rep

    def _finish(self, task_id: TaskId, ok: bool = True, detail: str = "") -> None:
        self._handles.pop(task_id, None)
        self._report(self.pool.ended(task_id, time.time(), ok, detail))

    async def _run_command(self, task_id: TaskId) -> None:
        r = self.pool.running[task_id]
        try:
            proc = await asyncio.create_subprocess_exec(
                *r.task.command,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            self._report(self.pool.started(task_id, time.time()))
            self._finish(task_id, False, f"spawn failed: {exc}")
            return
        self._report(self.pool.started(task_id, time.time()))
        try:
            _, err = await proc.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        detail = "" if proc.returncode == 0 else f"exit {proc.returncode}: {err[-200:]!r}"
        self._finish(task_id, proc.returncode == 0, detail)

    def stop(self, msg: StopTask) -> None:
        if self.pool.stop(msg):
            h = self._handles.pop(msg.task_id, None)
            if h is not None:
                h.cancel()

    # -------------------------------------------------------------- reports
    def _report(self, rep: TaskReport | None) -> None:
        if rep is None:
            return
        self._outbox.append(rep)
        if not self._flushing:
            self._flushing = True
            self._spawn(self._flush())

    async def _flush(self) -> None:
        """One POST per loop turn carries every report made meanwhile."""
        try:
            await asyncio.sleep(0)
            delay = 0.05
            while self._outbox:
                batch, self._outbox = self._outbox, []
                if await self._post("/v1/worker-report", codec.encode_batch(batch)):
                    delay = 0.05
                    continue
                self._outbox[:0] = batch
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        finally:
            self._flushing = False

    async def _post(self, path: str, body: bytes) -> bool:
        assert self.session is not None
        try:
            async with self.session.post(
                self.lm_url + path, data=body, headers=self.headers
            ) as resp:
                if resp.status >= 400:
                    log.warning("LM refused %s: %s %s", path, resp.status, await resp.text())
                    return resp.status < 500  # a refused report will never be accepted
                return True
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.debug("LM unreachable for %s: %s", path, exc)
            return False

    async def _heartbeats(self) -> None:
        nodes = tuple(NodeIndex(i) for i in range(self.pool.n_nodes))
        while True:
            hb = WorkerHeartbeat(lm=self.pool.lm, nodes=nodes, at=time.time())
            await self._post("/v1/worker-heartbeat", codec.encode(hb))
            await asyncio.sleep(self.heartbeat_s)
