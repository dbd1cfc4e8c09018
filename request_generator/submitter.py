"""Submits jobs into users' queues and listens to what becomes of their tasks.

Publishes are persistent, mandatory (an unroutable job, e.g. an unknown user,
raises instead of vanishing) and confirmed; each job carries its user's token.  A
listener on the users' outcome queues records each task's final ledger; the
operator's submitter also listens to the dead letters (refused jobs, with the
reason).  It logs into the broker as its party: the operator (``megha bench``), or a
user, whom the broker lets publish only its own jobs and read only its own outcomes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from common import broker_names as names
from common import codec
from common.config import FederationConfig
from common.dag import DagJob
from common.errors import MeghaError
from common.messages import SubmitJob, TaskOutcomes
from common.model import Task, TaskKey, TaskSpec
from request_generator.workload import Job, to_submission
from runtime import broker as amqp
from runtime.retry import Backoff, GiveUp
from security.access import Access, load_tokens
from security.identity import OPERATOR

PUBLISH_PATIENCE = Backoff(first_s=0.05, cap_s=2.0, deadline_s=30.0)
"""How long a submission is retried while the broker cannot take it (a failover, a
quorum queue electing its leader) before it counts as refused."""


class SubmissionRefused(MeghaError):
    """The broker did not take a job (unroutable: no such user queue; or nacked)."""

    reason = "submission_refused"


@dataclass
class Outcomes:
    """What the listener learnt, by task."""

    finished: dict[TaskKey, Task] = field(default_factory=dict)
    failed: dict[TaskKey, str] = field(default_factory=dict)
    failed_tasks: dict[TaskKey, Task] = field(default_factory=dict)
    duplicates: int = 0
    """Outcomes received twice for one task (a GM restart may re-report one)."""
    events: int = 0
    bad_events: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def done(self, key: TaskKey) -> bool:
        return key in self.finished or key in self.failed

    @property
    def n_done(self) -> int:
        return len(self.finished) + len(self.failed.keys() - self.finished.keys())


class Submitter:
    """A request generator's connection to the federation's broker."""

    def __init__(
        self,
        cfg: FederationConfig,
        access: Access,
        tokens: Mapping[str, str],
        users: Iterable[str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.access = access
        self.broker = amqp.Broker(cfg, "submitter", urls=access.broker_urls())
        self.users = list(users) if users is not None else [u.user for u in cfg.user_configs]
        self.outcomes = Outcomes()
        self.submitted: dict[TaskKey, TaskSpec] = {}
        self._tokens = dict(tokens)
        self.refused: dict[str, str] = {}
        self._listen = True

    @classmethod
    def operator(cls, cfg: FederationConfig, home: Path) -> Submitter:
        """The operator's submitter for the federation in ``home``: every user's token."""
        return cls(cfg, Access.in_home(home, cfg), load_tokens(home))

    async def open(self, *, listen: bool = True) -> None:
        self._listen = listen
        await self.broker.open(prefetch=1000)
        await self.broker.add_setup(self._declare)

    async def _declare(self) -> None:
        """The users' queues, and (listening) their outcomes and the dead letters; again
        after a failover to another broker node."""
        b = self.broker
        assert b.sub is not None
        if not self._listen:
            return
        for user in self.users:
            q = await amqp.open_queue(b.sub, self.cfg.user_events_queue(user))
            await q.consume(self._on_outcomes, no_ack=True)
        if self.access.me == OPERATOR:
            dq = await b.sub.declare_queue(exclusive=True, auto_delete=True)
            await dq.bind(self.cfg.dead_letter_exchange, routing_key="")
            await dq.consume(self._on_dead, no_ack=True)

    async def close(self) -> None:
        await self.broker.close()

    def token(self, user: str) -> str:
        tok = self._tokens.get(user)
        if tok is None:
            raise SubmissionRefused(f"no token for user {user!r} (`megha user add {user}`)")
        return tok

    async def submit(self, job: Job | DagJob, *, token: str | None = None) -> float:
        """Publish one job now; returns its submission time."""
        now = time.time()
        msg = to_submission(job, self.token(job.user) if token is None else token, now)
        await self.publish_raw(job.user, codec.encode(msg))
        for s in msg.tasks:
            self.submitted[(s.user, s.task_id)] = s
        return now

    async def publish_raw(self, routing_key: str, body: bytes) -> None:
        """Publish one submission; ``SubmissionRefused`` if the broker returns it (no such
        user) or keeps refusing it (a full queue) for ``PUBLISH_PATIENCE``."""
        try:
            await self.broker.publish(
                "submit",
                names.submit_key(routing_key),
                amqp.persistent(body),
                mandatory=True,
                policy=PUBLISH_PATIENCE,
            )
        except aio_pika.exceptions.DeliveryError as exc:
            raise SubmissionRefused(f"broker refused the job for {routing_key!r}: {exc}") from None
        except GiveUp as exc:
            raise SubmissionRefused(f"job for {routing_key!r} not taken: {exc}") from None
        except aio_pika.exceptions.PublishError as exc:
            raise SubmissionRefused(f"job for {routing_key!r} not published: {exc}") from None

    async def _on_dead(self, msg: AbstractIncomingMessage) -> None:
        """A refused submission: its tasks end as failed, with the GM's reason."""
        reason = str((msg.headers or {}).get(amqp.REASON_HEADER, "dead-lettered"))
        try:
            job = codec.decode(msg.body, expect=SubmitJob)
        except MeghaError:
            return
        out = self.outcomes
        for s in job.tasks:
            key = (s.user, s.task_id)
            if key in self.submitted:
                out.failed[key] = f"refused: {reason}"
                out.failed_tasks[key] = Task(spec=s, submitted_at=job.submitted_at)
        self.refused[job.job_id] = reason
        out.changed.set()

    async def _on_outcomes(self, msg: AbstractIncomingMessage) -> None:
        out = self.outcomes
        try:
            batch = codec.decode(msg.body, expect=TaskOutcomes)
        except MeghaError as exc:
            out.bad_events.append(f"{exc.reason}: {exc}")
            return
        for o in batch.outcomes:
            out.events += 1
            key = o.task.key
            if key in out.finished:
                out.duplicates += 1
                continue
            if o.finished:
                out.finished[key] = o.task
                out.failed.pop(key, None)
            else:
                out.failed[key] = o.reason
                out.failed_tasks[key] = o.task
        out.changed.set()
