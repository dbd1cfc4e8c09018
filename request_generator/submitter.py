"""Submits jobs into users' queues and listens to what becomes of their tasks.

Publishes are persistent, mandatory (an unroutable job, e.g. an unknown user,
raises instead of vanishing) and confirmed.  A result listener bound to every task
event of the federation records each task's final ledger.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from common import broker, codec
from common.auth import user_token
from common.codec import SubmitJob
from common.config import FederationConfig
from common.dag import DagJob, stage_layout
from common.errors import MeghaError
from common.ids import TaskId
from common.messages import TaskEvent, TaskFailed
from common.model import Task
from request_generator.workload import Job


class SubmissionRefused(MeghaError):
    """The broker did not take a job (unroutable: no such user queue; or nacked)."""

    reason = "submission_refused"


@dataclass
class Outcomes:
    """What the listener learnt, by task id."""

    started: dict[TaskId, Task] = field(default_factory=dict)
    finished: dict[TaskId, Task] = field(default_factory=dict)
    failed: dict[TaskId, str] = field(default_factory=dict)
    failed_tasks: dict[TaskId, Task] = field(default_factory=dict)
    starts: dict[TaskId, int] = field(default_factory=dict)
    """How many times each task started (more than once only if preempted or relaunched)."""
    events: int = 0
    bad_events: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def done(self, tid: TaskId) -> bool:
        return tid in self.finished or tid in self.failed

    @property
    def n_done(self) -> int:
        """Tasks finished or failed (a task that failed, re-ran and finished counts once)."""
        return len(self.finished) + len(self.failed.keys() - self.finished.keys())


class Submitter:
    def __init__(self, cfg: FederationConfig) -> None:
        self.cfg = cfg
        self.conn: AbstractRobustConnection | None = None
        self.ch: AbstractChannel | None = None
        self.ex: broker.Exchanges | None = None
        self.outcomes = Outcomes()
        self.submitted: dict[TaskId, Task] = {}
        self._tokens: dict[str, str] = {}
        self.refused: dict[str, str] = {}

    async def open(self, *, listen: bool = True) -> None:
        self.conn = await broker.connect(self.cfg)
        self.ch = await broker.channel(self.conn)
        self.ex = await broker.declare_exchanges(self.ch, self.cfg)
        await broker.declare_user_queues(self.ch, self.cfg, self.ex)
        if listen:
            sub = await self.conn.channel()
            await sub.set_qos(prefetch_count=1000)
            q = await sub.declare_queue(exclusive=True, auto_delete=True)
            await q.bind(self.cfg.events_exchange, routing_key="#")
            await q.consume(self._on_event, no_ack=True)
            dq = await sub.declare_queue(exclusive=True, auto_delete=True)
            await dq.bind(self.cfg.dead_letter_exchange, routing_key="")
            await dq.consume(self._on_dead, no_ack=True)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    def token(self, user: str) -> str:
        tok = self._tokens.get(user)
        if tok is None:
            tok = self._tokens[user] = user_token(self.cfg.secret, user)
        return tok

    async def submit(self, job: Job | DagJob, *, token: str | None = None) -> float:
        """Publish one job now; returns its submission time."""
        now = time.time()
        msg = SubmitJob(
            job_id=job.job_id,
            user=job.user,
            token=self.token(job.user) if token is None else token,
            submitted_at=now,
            tasks=tuple(job.tasks),
            stages=stage_layout(job) if isinstance(job, DagJob) else None,
        )
        await self.publish_raw(job.user, codec.encode(msg))
        for t in job.tasks:
            t.submitted_at = now
            self.submitted[t.task_id] = t
        return now

    async def publish_raw(self, routing_key: str, body: bytes) -> None:
        assert self.ex is not None
        try:
            await self.ex.submit.publish(
                broker.persistent(body), routing_key=routing_key, mandatory=True
            )
        except aio_pika.exceptions.DeliveryError as exc:
            raise SubmissionRefused(f"broker refused the job for {routing_key!r}: {exc}") from None
        except aio_pika.exceptions.PublishError as exc:
            raise SubmissionRefused(f"job for {routing_key!r} not published: {exc}") from None

    async def _on_dead(self, msg: AbstractIncomingMessage) -> None:
        """A refused submission: its tasks end as failed, with the GM's reason."""
        reason = str((msg.headers or {}).get(broker.REASON_HEADER, "dead-lettered"))
        try:
            job = codec.decode(msg.body, expect=SubmitJob)
        except MeghaError:
            return
        assert isinstance(job, SubmitJob)
        out = self.outcomes
        for t in job.tasks:
            if t.task_id in self.submitted:
                out.failed[t.task_id] = f"refused: {reason}"
                out.failed_tasks[t.task_id] = self.submitted[t.task_id]
        self.refused[job.job_id] = reason
        out.changed.set()

    async def _on_event(self, msg: AbstractIncomingMessage) -> None:
        try:
            items = codec.decode_batch(msg.body, expect=(TaskEvent, TaskFailed))
        except MeghaError as exc:
            self.outcomes.bad_events.append(f"{exc.reason}: {exc}")
            return
        out = self.outcomes
        for m in items:
            out.events += 1
            if isinstance(m, TaskFailed):
                out.failed[m.task.task_id] = m.reason
                out.failed_tasks[m.task.task_id] = m.task
                continue
            assert isinstance(m, TaskEvent)
            tid = m.task.task_id
            if m.kind == "started":
                out.started[tid] = m.task
                out.starts[tid] = out.starts.get(tid, 0) + 1
            elif m.kind == "finished":
                out.finished[tid] = m.task
                out.started.setdefault(tid, m.task)
            elif m.kind == "failed":
                out.failed[tid] = "failed on worker"
                out.failed_tasks[tid] = m.task
        out.changed.set()
