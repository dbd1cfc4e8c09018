"""Submits jobs into users' queues and listens to what becomes of their tasks.

Publishes are persistent, mandatory (an unroutable job, e.g. an unknown user,
raises instead of vanishing) and confirmed; each job carries its user's token.  A
listener on the users' outcome queues records each task's final ledger, believing
only outcomes sealed by the user's own GM (``security.outcomes``; others are counted
in ``Outcomes.forged`` and dropped); the
operator's submitter also listens to the dead letters (refused jobs, with the
reason).  It logs into the broker as its party: the operator (``megha bench``), or a
user, whom the broker lets publish only its own jobs and read only its own outcomes.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika

from common import broker_names as names
from common import codec
from common.config import FederationConfig
from common.dag import DagJob
from common.errors import MeghaError
from common.messages import JobRefusal, SubmitJob, TaskOutcome, TaskOutcomes
from common.model import Task, TaskKey, TaskSpec
from runtime import broker as amqp
from runtime.retry import Backoff, GiveUp
from security import outcomes as sealed_outcomes
from security.access import Access, load_tokens
from security.identity import OPERATOR
from security.sealing import Dropped
from security.tokens import TokenStore
from workload.jobs import Job, to_submission

DEAD_LETTER_QUEUE_HEADER = "x-megha-queue"
"""The queue a service took a message from, set by the service on its dead letter
(``runtime.broker.Broker.dead_letter``)."""
PUBLISH_PATIENCE = Backoff(first_s=0.05, cap_s=2.0, deadline_s=30.0)
"""How long a submission is retried while the broker cannot take it (a failover, a
quorum queue electing its leader) before it counts as refused."""


class SubmissionRefused(MeghaError):
    """The broker did not take a job (unroutable: no such user queue; or nacked)."""

    reason = "submission_refused"


@dataclass
class Outcomes:
    """What the listener learnt, by task.

    ``outstanding`` holds each task submitted and not yet done (its spec and submission
    time), only until its outcome comes.  Keeping (``keep``), every finished task's
    ledger stays in ``finished``; without (a long benchmark), a finished task goes to
    ``sink`` and only counts remain.  A failed task stays in ``failed`` and
    ``failed_tasks`` (its submission time in ``failed_at``) as it may still finish;
    ``settle`` hands them to ``sink`` at the end."""

    keep: bool = True
    sink: Callable[[Task, float], None] | None = None
    """Where a task goes once finished (or, at ``settle``, failed), with its submission time."""
    sink_many: Callable[[list[tuple[Task, float]]], None] | None = None
    """Where the tasks of a message of outcomes that finished go together, each with its
    submission time, instead of one by one to ``sink`` (``record_all``)."""
    owns: Callable[[TaskKey], bool] | None = None
    """Not keeping: which tasks not outstanding are this submitter's (an outcome for one
    is a duplicate; for another, someone else's); None: all."""
    outstanding: dict[TaskKey, tuple[TaskSpec, float]] = field(default_factory=dict)
    finished: dict[TaskKey, Task] = field(default_factory=dict)
    failed: dict[TaskKey, str] = field(default_factory=dict)
    failed_tasks: dict[TaskKey, Task] = field(default_factory=dict)
    failed_at: dict[TaskKey, float] = field(default_factory=dict)
    n_finished: int = 0
    duplicates: int = 0
    """Outcomes received twice for one task (a GM restart may re-report one)."""
    events: int = 0
    forged: int = 0
    """Outcome messages not sealed by their user's GM: dropped (``bad_events`` says why)."""
    bad_events: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def done(self, key: TaskKey) -> bool:
        if not self.keep:
            return key not in self.outstanding
        return key in self.finished or key in self.failed

    @property
    def n_done(self) -> int:
        if self.keep:
            return len(self.finished) + len(self.failed.keys() - self.finished.keys())
        return self.n_finished + len(self.failed)

    def submitted(self, specs: Iterable[TaskSpec], at: float) -> None:
        for s in specs:
            self.outstanding[(s.user, s.task_id)] = (s, at)

    def withdraw(self, specs: Iterable[TaskSpec]) -> None:
        """Tasks whose submission did not go through."""
        for s in specs:
            self.outstanding.pop((s.user, s.task_id), None)

    def _mine(self, key: TaskKey) -> bool:
        return self.owns is None or self.owns(key)

    def record(self, task: Task, finished: bool, reason: str = "") -> None:
        """One task's outcome: finished, or failed for ``reason``."""
        at = self._take(task, finished, reason)
        if at is not None and self.sink is not None:
            self.sink(task, at)

    def record_all(self, outcomes: Iterable[TaskOutcome]) -> None:
        """A message's outcomes, in order, each as ``record`` takes it; the tasks that
        finished go to ``sink_many`` together, if it is set."""
        many = self.sink_many
        if many is None:
            for o in outcomes:
                self.record(o.task, o.finished, o.reason)
            return
        done: list[tuple[Task, float]] = []
        take = self._take
        for o in outcomes:
            task = o.task
            at = take(task, o.finished, o.reason)
            if at is not None:
                done.append((task, at))
        if done:
            many(done)

    def _take(self, task: Task, finished: bool, reason: str) -> float | None:
        """``record`` but for the sink: its submission time if the task goes there now."""
        spec = task.spec
        key = (spec.user, spec.task_id)
        if key in self.finished:
            self.duplicates += 1
            return None
        entry = self.outstanding.pop(key, None)
        if entry is None and key not in self.failed and not self.keep:
            if self._mine(key):  # done already
                self.duplicates += 1
            return None
        at = entry[1] if entry is not None else self.failed_at.get(key)
        if not finished:
            self.failed[key] = reason
            self.failed_tasks[key] = task
            if at is not None:
                self.failed_at[key] = at
            return None
        if self.failed or self.failed_tasks or self.failed_at:
            self.failed.pop(key, None)
            self.failed_tasks.pop(key, None)
            self.failed_at.pop(key, None)
        self.n_finished += 1
        if self.keep:
            self.finished[key] = task
        return at

    def settle(self) -> None:
        """The failed tasks to ``sink``: they will not finish now."""
        if self.sink is None:
            return
        for key, task in self.failed_tasks.items():
            at = self.failed_at.get(key)
            if at is not None:
                self.sink(task, at)


class Submitter:
    """A request generator's connection to the federation's broker."""

    def __init__(
        self,
        cfg: FederationConfig,
        access: Access,
        tokens: Mapping[str, str],
        users: Iterable[str] | None = None,
        *,
        keep: bool = True,
    ) -> None:
        self.cfg = cfg
        self.access = access
        self.broker = amqp.Broker(cfg, "submitter", urls=access.broker_urls())
        self.users = list(users) if users is not None else [u.user for u in cfg.user_configs]
        self.outcomes = Outcomes(keep=keep)
        self.submitted: dict[TaskKey, TaskSpec] = {}
        """Every task submitted (keeping outcomes; else only ``n_submitted`` counts them)."""
        self.n_submitted = 0
        self._tokens = dict(tokens)
        self.refused: dict[str, str] = {}
        self._listen = True

    @classmethod
    def operator(cls, cfg: FederationConfig, home: Path, *, keep: bool = True) -> Submitter:
        """The operator's submitter for the federation in ``home``: every user's token."""
        return cls(cfg, Access.in_home(home, cfg), load_tokens(home), keep=keep)

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
            gm = self.gm_of(user)
            key = self.access.outcome_key(gm, user)
            on_outcomes = functools.partial(self._on_outcomes, gm, key)
            await b.consume(q, on_outcomes, no_ack=True, guard=False)
        if self.access.me == OPERATOR:
            dq = await b.sub.declare_queue(exclusive=True, auto_delete=True)
            await dq.bind(self.cfg.dead_letter_exchange, routing_key="")
            await b.consume(dq, self._on_dead, no_ack=True, guard=False)

    def gm_of(self, user: str) -> str:
        """``user``'s GM: the config's, else the users file's (a user added later)."""
        for u in self.cfg.user_configs:
            if u.user == user:
                return u.gm
        rec = TokenStore(self.access.users_file).get(user) if self.access.users_file else None
        if rec is None:
            raise SubmissionRefused(f"no GM known for user {user!r}")
        return rec.gm

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
        self.outcomes.submitted(msg.tasks, now)  # before: an outcome may come before the confirm
        try:
            await self.publish_raw(job.user, codec.encode(msg))
        except BaseException:
            self.outcomes.withdraw(msg.tasks)
            raise
        self.n_submitted += len(msg.tasks)
        if self.outcomes.keep:
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

    def _job_refused(self, notice: JobRefusal) -> None:
        """A GM refused one of this submitter's jobs whole (on the user's own stream: a
        user who cannot read the dead letters learns it too): its tasks still waiting
        end as failed, with the reason."""
        out = self.outcomes
        why = f"refused: {notice.reason}"
        waiting = [  # of that job, not of a later one of the same id
            (spec, at)
            for spec, at in out.outstanding.values()
            if spec.user == notice.user and spec.job_id == notice.job_id
            and at == notice.submitted_at
        ]  # fmt: skip
        for spec, at in waiting:
            out.record(Task(spec=spec, submitted_at=at), False, why)
        if waiting:
            self.refused[notice.job_id] = notice.reason
            out.changed.set()

    def _refused_by_a_service(self, headers: Mapping[str, object], user: str) -> bool:
        """A dead letter a GM made of a job it took from ``user``'s own queue.

        Its body is what the publisher sent, and so are headers the broker dead-lettered
        on its own (a message that expired in the queue -- a user sets its TTL --, or a
        rejected one): a user could name another user's job in the body and forge any
        ``x-megha-*`` header.  A service's dead letter sets ``x-megha-queue`` itself to the
        queue it took the job from, and the broker's own dead-lettering always adds
        ``x-death`` (which a service's never gets unless its publisher forged one)."""
        queue = headers.get(DEAD_LETTER_QUEUE_HEADER)
        if isinstance(queue, bytes):
            queue = queue.decode("utf-8", "replace")
        return queue == self.cfg.user_queue(user) and "x-death" not in headers

    async def _on_dead(self, msg: amqp.Delivery) -> None:
        """A refused submission of this submitter: its tasks end as failed, with the GM's
        reason.  Only a GM's refusal of a job from its own user's queue counts: anyone
        can have a message of any body dead-lettered (see ``_refused_by_a_service``)."""
        headers = msg.headers or {}
        reason = str(headers.get(amqp.REASON_HEADER, "dead-lettered"))[:200]
        try:
            job = codec.decode(msg.body, expect=SubmitJob)
        except MeghaError:
            return
        if not self._refused_by_a_service(headers, job.user):
            return
        out = self.outcomes
        mine = False
        for s in job.tasks:
            key = (s.user, s.task_id)
            task = Task(spec=s, submitted_at=job.submitted_at)
            if out.keep and key in self.submitted:  # even one that ran (a refused repeat)
                out.failed[key] = f"refused: {reason}"
                out.failed_tasks[key] = task
                out.outstanding.pop(key, None)
                mine = True
            elif not out.keep and key in out.outstanding:
                out.record(task, False, f"refused: {reason}")
                mine = True
        if mine:  # (not every job anyone had refused: the list would grow without end)
            self.refused[job.job_id] = reason
            out.changed.set()

    async def _on_outcomes(self, gm: str, key: bytes, msg: amqp.Delivery) -> None:
        self.take_outcomes(gm, key, msg.headers, msg.body)

    def take_outcomes(
        self, gm: str, key: bytes, headers: Mapping[str, object] | None, body: bytes
    ) -> None:
        """One message of a user's outcome stream, believed only if sealed by ``gm``."""
        out = self.outcomes
        seal = sealed_outcomes.check(headers, body, gm, key)
        if isinstance(seal, Dropped):
            out.forged += 1
            out.bad_events.append(f"{seal.reason}: {seal.detail}")
            return
        try:
            batch = codec.decode(body, expect=(TaskOutcomes, JobRefusal))
        except MeghaError as exc:
            out.bad_events.append(f"{exc.reason}: {exc}")
            return
        if batch.gm != gm:
            out.forged += 1
            out.bad_events.append(f"unknown_sender: sealed by gm:{gm}, names {batch.gm}")
            return
        if isinstance(batch, JobRefusal):
            self._job_refused(batch)
            return
        out.events += len(batch.outcomes)
        out.record_all(batch.outcomes)
        out.changed.set()
