"""Global Master service: drives ``global_master.core.GlobalMaster``.

Jobs come from the GM's users' RabbitMQ queues, LM state from the fan-out exchange,
task events from the GM's own durable queue (de-duplicated by message id); launch,
preemption and snapshot requests go to LMs over keep-alive HTTP; task outcomes go
to their users.  A job's delivery is acknowledged when the core says it is settled
(every task accepted by an LM or failed), so a GM killed before that loses nothing:
the broker redelivers the job and LM snapshots say which of its tasks already run.
Stateless: on start (and after the broker connection recovers) the GM asks every LM
for a snapshot; it consumes jobs once it has a view of every LM.
GET /health, /v1/state, /metrics; for operators GET /v1/inspect (users' queues,
shares, wait reasons), /v1/tasks/{user}/{task_id} (one task's timeline and why it
waits) and /v1/find/{id} (the tasks and jobs of that id, of any user), answered by
``global_master.pages``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from functools import partial
from typing import Any

from aiohttp import web
from msgspec.structs import replace

from common import broker_names as names
from common import codec
from common.config import FederationConfig
from common.effects import After, JobRefused, JobSettled, Persist, Record, ToLm, ToUser
from common.errors import ConfigError, DecodeError, MeghaError, Unauthorized
from common.ids import GmId, JobId, LmId, UserId
from common.messages import (
    MAX_KEEPS,
    AdmitJob,
    CancelTasks,
    CommitGang,
    Decide,
    JobKeep,
    KeepEnds,
    LaunchRequest,
    LaunchResponse,
    PreemptRequest,
    PreemptResponse,
    Refused,
    ReleaseGang,
    RequestFailed,
    RequestSnapshots,
    ReserveRequest,
    ReserveResponse,
    SnapshotRequest,
    StateSnapshot,
    StateUpdated,
    StopUserTasks,
    SubmitJob,
    TaskEvents,
    TaskOutcome,
    TaskOutcomes,
    UserTasksStopped,
)
from global_master import frontdoor, history, intake, pages, watch
from global_master.backlog import UnreadJobs
from global_master.core import AdmissionLimits, GlobalMaster
from global_master.held import Held, SettledJobs, published, unpublished
from global_master.journal import Journal
from global_master.lifecycle import JobBook
from global_master.policy import make_policy
from global_master.refusals import Refusals, job_taken
from runtime import broker as amqp
from runtime import faults, h1, poison
from runtime.dedup import Dedup
from runtime.driver import Batcher, CoreDriver, Traffic
from runtime.http import Peer, PeerRefused, service_app, service_identity, session
from runtime.prometheus import ServiceMetrics
from runtime.retry import Backoff, GiveUp
from runtime.supervisor import Supervisor
from security import sealing
from security.access import Access
from security.broker_acl import USER_QUEUE_JOBS_OF_MAX_SIZE
from security.identity import lm as lm_identity
from security.outcomes import OutcomeSealer
from security.tokens import TokenStore

RECENT_ALLOCATIONS = 4096
"""How many of the latest finished tasks' allocation times the state page keeps."""
DECODE_OFF_LOOP = 1 << 20
"""A job body of this many bytes or more is decoded in a thread: a 100,000-task job
(8.5 MB) takes 0.5-1.5 s to decode, which would hold every other request that long;
off the loop, only msgpack's C part (about a third) holds the interpreter."""

log = logging.getLogger("megha.gm")

ROUTES: dict[type, tuple[str, type]] = {
    LaunchRequest: ("/v1/launch", LaunchResponse),
    PreemptRequest: ("/v1/preempt", PreemptResponse),
    SnapshotRequest: ("/v1/snapshot", StateSnapshot),
    KeepEnds: ("/v1/keep-ends", Refused),  # answered 204 (a refusal is a 4xx)
    CancelTasks: ("/v1/cancel", Refused),  # answered 204
    StopUserTasks: ("/v1/stop-user", UserTasksStopped),
    ReserveRequest: ("/v1/reserve", ReserveResponse),
    CommitGang: ("/v1/commit-gang", LaunchResponse),
    ReleaseGang: ("/v1/release-gang", Refused),  # answered 204
}
Asked = LaunchRequest | PreemptRequest | ReserveRequest | CommitGang
"""Requests sent until their LM answers (``_ask_until_answered``)."""
SNAPSHOTS = Backoff(first_s=0.1, cap_s=2.0, deadline_s=None)
"""A GM cannot decide without a view of every LM: it asks until the LM answers."""
KEEPS_LINGER_S = 0.5
"""To an LM busy with them (4 or more in this span), a GM's keeps and let-gos leave no
sooner than this after its previous ones (``Batcher``): they are in no hurry, a job's
keep going 30 s into its hold for ends the LM keeps 120 s anyway, and a let-go late by
this keeps a settled job's ends that much longer.  Per loop turn only (``linger_s``),
an overloaded run sent 4.3 jobs per message."""
DECIDE_TICK_S = 0.5
"""While tasks are queued, the decide loop is woken this often without any input
(``GmService._tick``)."""
EVENTS_WINDOW = 4096
"""Sequence numbers of one LM's event batches that may arrive out of order, each once
(``sealing.Opener``): a batch put back on the queue after a failure comes back behind
later ones, and must still be taken."""


def _nothing() -> None:
    pass


def _make_core(cfg: FederationConfig, gm: GmId) -> GlobalMaster:
    mine = [u.user for u in cfg.user_configs if u.gm == gm]
    queues = make_policy(
        cfg.queue_policy,
        cfg.user_configs,
        p_altruism=cfg.p_altruism,
        seed=cfg.seed,
        aging_s=cfg.priority_aging_s,
        srpt_half_life_s=cfg.srpt_half_life_s,
    )(gm, mine)
    return GlobalMaster(
        gm,
        cfg.lm_ids,
        cfg.user_configs,
        queues=queues,
        limits=AdmissionLimits(
            max_task_duration_s=cfg.max_task_duration_s,
            commands=cfg.task_commands,
            max_user_tasks=cfg.max_user_tasks,
            env_allow=tuple(cfg.task_env_allow),
        ),
        journal=Journal(),
        overload=cfg.overload,
        book=JobBook(per_user=cfg.job_history_per_user, keep_s=cfg.job_history_s),
    )


class GmService:
    """Carries out a GM core's effects and feeds it its inputs."""

    role = "gm"

    def __init__(self, cfg: FederationConfig, gm: GmId, access: Access) -> None:
        self.cfg = cfg
        self.access = access
        self._open_keys(access, gm)
        self.core = _make_core(cfg, gm)
        self.token_watch = watch.TokenWatch(self.tokens, self.core, self.feed)
        self.sup = Supervisor(gm)
        self.driver = CoreDriver(self.core, self.sup)
        self.broker = amqp.Broker(cfg, gm, urls=access.broker_urls())
        self.poison = poison.PoisonGuard(poison.run_dir(cfg.name, gm))
        """Records of the jobs in hand, so that one that kills this process is not handled
        blindly again by the next."""
        faults.arm(gm)
        self.http: h1.Client | None = None
        self.lms: dict[LmId, Peer] = {}
        self._cancel_order: dict[LmId, asyncio.Lock] = {}
        """``CancelTasks`` to one LM leave in the order the core made them (FIFO lock)."""
        self.keeps: Batcher[LmId, JobKeep] = Batcher(
            self.sup, self._send_keeps, "kept ends", max_items=MAX_KEEPS, linger_s=KEEPS_LINGER_S
        )  # (``_send_keeps``)
        self.deliveries: dict[tuple[UserId, JobId, bool], amqp.Delivery] = {}
        """Jobs taken from the users' queues, until settled: by user, job id, and
        whether they are tasks this GM returned (their ids may be a user's job's)."""
        self._admission_order: dict[UserId, asyncio.Lock] = {}
        """Per user: a job decoded in a thread keeps the later ones behind it."""
        self.unread = UnreadJobs(USER_QUEUE_JOBS_OF_MAX_SIZE * cfg.max_body)
        """Bytes of one user's deliveries this GM holds before reading them (bodies and
        headers): past it (a flood of large jobs arriving faster than they are decoded)
        a job is refused (``user_backlog``), so the broker's prefetch cannot fill the
        GM's memory.  The same bound as the user's queue at the broker."""
        self.events_seen = Dedup()
        self.requests_in_doubt = 0
        """Launches and preemptions an LM did not answer in time, asked again."""
        self.recent_allocations: deque[tuple[float, float]] = deque(maxlen=RECENT_ALLOCATIONS)
        """(when it finished, allocation time) of the latest finished tasks: the
        operators' last-minute tails (``/v1/state`` ``allocations``)."""
        self.outcomes: Batcher[UserId, tuple[TaskOutcome, Held | None]] = Batcher(
            self.sup, self._publish_outcomes, "task outcomes", linger_s=cfg.linger_s
        )
        self.persists: Batcher[UserId, tuple[SubmitJob, Held | None]] = Batcher(
            self.sup, self._publish_persists, "returned tasks made durable"
        )
        self._wake = asyncio.Event()
        self._ticker: asyncio.TimerHandle | None = None  # (``_tick``)
        self._ready = asyncio.Event()
        self._holding: Held | None = None  # the event delivery being fed (``_on_events``)
        self.consuming = False
        self.refused_jobs = 0
        self.redelivered_jobs = 0
        self.events_in = Traffic()
        """Task-event deliveries taken from the broker, and the events they carried."""
        self.history = history.for_gm(cfg, gm, self.core.book)
        self.journal_out = self.history.flush if self.history is not None else _nothing
        """The job history's records of this loop turn to the page cache, before what may
        depend on them leaves (but a task made after them: the turn's flush runs first)."""
        self.settled = SettledJobs(self.journal_out, self.sup)
        self.refusals = Refusals(gm, self.broker, self.sup, self._feed_and_record,
                                 self.outcome_seal, self.tokens, self.resume_keys,
                                 partial(job_taken, self.core))  # fmt: skip
        self._carry_out_effects()

    def _carry_out_effects(self) -> None:
        """What carrying out each of the core's effects means here."""
        d = self.driver
        d.on(After, self._after)
        d.on(ToLm, self._to_lm)
        d.on(ToUser, self._to_user)
        d.on(JobSettled, self._ack)
        d.on(JobRefused, self._dead_letter)
        d.on(Persist, self._persist)
        if self.history is not None:
            d.on(Record, self.history.record)

    def _open_keys(self, access: Access, gm: GmId) -> None:
        """The users' tokens, the LMs' seals, and this GM's own seal on returned tasks."""
        if access.users_file is None:
            raise ConfigError(
                "a GM needs the users file (MEGHA_USERS_FILE; `megha up` sets it)",
                reason="no_users_file",
            )
        self.tokens = TokenStore(access.users_file)
        lms = access.lm_identities()
        self.state_seals = access.opener("state", lms)
        self.event_seals = access.opener(f"events.{gm}", lms, window=EVENTS_WINDOW)
        self.resume_keys = sealing.keyring_for(access.secret, [access.me])
        self.resume_seal = access.sealer(epoch=int(time.time() * 1000))
        self.outcome_seal = OutcomeSealer(access.secret, gm, epoch=int(time.time() * 1000))
        self.forged = 0

    # ------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        await self.sup.__aenter__()
        if self.history is not None:  # before any job is taken
            await self.history.open()
            self.sup.run_forever(self.history.sync_forever(), "job history sync")
        self.http = session()
        for lm in self.cfg.lm_ids:
            self.lms[lm] = Peer(
                lm_identity(lm), self.cfg.lm_urls(lm), self.access, self.http,
                max_answer=self.cfg.max_body,
            )  # fmt: skip
        await self.broker.open()
        self.broker.on_reconnect = lambda: self.feed(RequestSnapshots())
        self.sup.spawn(self._start(), "start-up")

    async def _start(self) -> None:
        """Views of every LM first (so redelivered jobs are recognised), then consume."""
        await self.broker.add_setup(self._consume_state)
        self.feed(RequestSnapshots())
        await self._ready.wait()
        await self.broker.add_setup(self._consume_jobs_and_events)
        self.consuming = True
        self.sup.run_forever(self._decide_loop(), "decide loop")
        self.sup.run_forever(self.token_watch.forever(), "revocations")
        log.info("%s ready: views of %d LMs", self.core.gm_id, len(self.core.views))

    async def _consume_state(self) -> None:
        """LM state updates (this GM's queue of them)."""
        assert self.broker.sub is not None
        q = await amqp.open_queue(self.broker.sub, self.cfg.gm_state_queue(self.core.gm_id))
        await self.broker.consume(q, self._on_state, no_ack=True)

    async def _consume_jobs_and_events(self) -> None:
        sub, cfg, gm = self.broker.sub, self.cfg, self.core.gm_id
        assert sub is not None
        await self.broker.consume(
            await amqp.open_queue(sub, cfg.gm_events_queue(gm)), self._on_events
        )
        for u in cfg.user_configs:
            if u.gm != gm:
                continue
            q = await amqp.open_queue(sub, cfg.user_queue(u.user))

            async def job(msg: amqp.Delivery, user: UserId = u.user) -> None:
                await self._on_job(user, msg)

            await self.broker.consume(q, job)

    async def close(self) -> None:
        await self.sup.__aexit__(None, None, None)
        with contextlib.suppress(Exception):
            await self.broker.close()
        if self.http is not None:
            await self.http.close()
        if self.history is not None:
            self.history.close()

    # --------------------------------------------------------------- inputs
    def feed(self, msg: object) -> None:
        self.driver.feed(msg)
        self._wake.set()
        if not self._ready.is_set() and self.core.ready:
            self._ready.set()

    async def _on_state(self, msg: amqp.Delivery) -> None:
        """A state update, if an LM sealed it and it is newer than what that LM sent
        before (anything else is dropped and counted: see ``state_seals.drops``)."""
        seal = self.state_seals.check(msg.headers, msg.body)
        if isinstance(seal, sealing.Dropped):
            log.debug("state update dropped: %s", seal.detail)
            return
        update = codec.decode(msg.body, expect=StateUpdated, max_size=self.cfg.max_body)
        if update.delta.lm != seal.sender.name:  # taken as no position of that LM's
            self.forged += 1
            log.warning("%s sent a state update about %s: dropped", seal.sender, update.delta.lm)
            return
        self.state_seals.commit(seal)
        self.feed(update)
        if self.consuming:  # (``global_master.watch``)
            self.token_watch.look(time.monotonic())

    def _to_user(self, eff: ToUser) -> None:
        held = self._holding
        if held is not None:
            held.left += 1
        msg = eff.msg
        self.outcomes.add(eff.user, (msg, held))
        if msg.finished:
            self.recent_allocations.append((time.time(), msg.task.allocation_time))

    def _persist(self, eff: Persist) -> None:
        held = self._holding
        if held is not None:
            held.left += 1
        self.persists.add(eff.job.user, (eff.job, held))

    async def _on_events(self, msg: amqp.Delivery) -> None:
        """Task events; acknowledged once what they produced is on the broker (outcomes
        to users, returned tasks made durable), so a GM killed in between gets them
        again (outcomes are at least once; a returned task is never lost).  A batch
        whose handling fails before the core took it is released (its seal and id), so
        it is taken when the consumer's guard puts it back."""
        seal = self.event_seals.check(msg.headers, msg.body)
        if isinstance(seal, sealing.Dropped):
            if seal.reason in (sealing.DropReason.STALE_SEQ, sealing.DropReason.STALE_EPOCH):
                await msg.ack()  # seen already (redelivered), or from a replaced incarnation
                return
            raise Unauthorized(f"task events: {seal.detail}", reason=seal.reason.value)
        events = codec.decode(msg.body, expect=TaskEvents, max_size=self.cfg.max_body)
        if events.lm != seal.sender.name:  # refused without moving that LM's position
            raise Unauthorized(
                f"{seal.sender} sent events as {events.lm}", reason="sender_mismatch"
            )
        self.event_seals.commit(seal)
        first = False
        held = Held(msg)
        try:
            first = self.events_seen.first_time(msg.message_id)
            if first:
                faults.strike("consumer_error")
                self.events_in.note(len(events.events))
                self._holding = held
                self.feed(events)
        except Exception as exc:
            held.failed = True  # what it produced is published, never acked for it
            if not isinstance(exc, MeghaError):  # it comes back: take it then
                self.event_seals.release(seal)
                if first:
                    self.events_seen.forget(msg.message_id)
            raise
        finally:
            self._holding = None
        if not held.left:  # nothing to wait for
            self.journal_out()  # (the channel's acks of this turn may leave before)
            await msg.ack()
        # else acked by the flush publishing the last of it (``held.published``): no wait
        # here, no wake-up of every waiting delivery at each flush

    async def _on_job(self, user: UserId, msg: amqp.Delivery) -> None:
        size = len(msg.body) + amqp.properties_bytes(msg)  # its headers are held too
        shed = self.unread.take(user, size, redelivered=bool(msg.redelivered))
        if shed is not None:
            self.refused_jobs += 1
            await self.broker.dead_letter(msg, self.cfg.user_queue(user), "user_backlog", shed)
            self.refusals.unread(user, msg, "user_backlog", shed)
            return
        try:
            # deliveries come in order, each its own task: the lock keeps them in it
            order = self._admission_order.get(user)
            if order is None:
                order = self._admission_order[user] = asyncio.Lock()
            async with order:
                await self._read_job(user, msg)
        finally:
            self.unread.done(user, size)

    async def _read_job(self, user: UserId, msg: amqp.Delivery) -> None:
        """Who sent it, before anything is decoded; then its shape; then the job itself,
        with a record of it on local disk (``runtime.poison``) while it is handled."""
        queue = self.cfg.user_queue(user)
        key = poison.delivery_key(queue, msg.body)
        verdict = self.poison.verdict(key, redelivered=bool(msg.redelivered))
        if verdict is poison.Verdict.POISON:
            self.poison.settle(key)
            self.poison.poisoned += 1
            detail = f"{self.core.gm_id} died handling this delivery before; not handled again"
            await self.broker.dead_letter(msg, queue, "poison", detail)
            self.refusals.unread(user, msg, "poison", detail)  # gone from the queue: no loop
            return
        async with self.poison.handling(key, verdict):
            if len(msg.body) > self.cfg.max_body:
                raise DecodeError(f"body of {len(msg.body)} bytes exceeds {self.cfg.max_body}",
                                  reason="too_large")  # fmt: skip
            head = intake.peek(msg.body)
            faults.die_on("die_on_job", head.job_id)
            intake.check_submitter(user, head, msg, self.resume_keys, self.tokens)
            intake.check_containers(msg.body)
            if len(msg.body) >= DECODE_OFF_LOOP:
                job = await asyncio.to_thread(
                    codec.decode, msg.body, expect=SubmitJob, max_size=self.cfg.max_body
                )
            else:
                job = codec.decode(msg.body, expect=SubmitJob, max_size=self.cfg.max_body)
            if not head.matches(job):
                raise DecodeError("a field named twice: the job is not what was checked",
                                  reason="ambiguous_fields")  # fmt: skip
            await self._admit(user, job, msg)

    async def _admit(self, user: UserId, job: SubmitJob, msg: amqp.Delivery) -> None:
        too_many = intake.dag_edges_error(job)
        if too_many is not None:  # before the core holds any of it
            self.refused_jobs += 1
            await self.broker.dead_letter(msg, self.cfg.user_queue(user), *too_many)
            if job.resumes is None:  # an authenticated user's: told
                self.refusals.before_core(job.user, job.job_id, job.submitted_at, *too_many)
            return
        key = (job.user, job.job_id, job.resumes is not None)
        held = self.deliveries.get(key)
        if held is not None:
            if msg.redelivered:  # the same job, on a channel that came back: ack this one
                self.deliveries[key] = msg
                return
            self.refused_jobs += 1
            await self.broker.dead_letter(
                msg, self.cfg.user_queue(user), "duplicate_job_id", f"job {job.job_id!r} is active"
            )
            return
        self.deliveries[key] = msg
        if msg.redelivered:
            self.redelivered_jobs += 1
        try:
            self.feed(AdmitJob(job=job, redelivered=bool(msg.redelivered)))
        except Exception as exc:
            # a bug in the core, which may have taken part of the job before raising: a
            # retry would find the job "admitted" and hold it unanswered for ever, so it
            # ends here, explicitly (the consumer's guard dead-letters it)
            self.deliveries.pop(key, None)
            log.exception("%s: the core failed on job %s/%s", self.core.gm_id, user, job.job_id)
            book = self.core.book  # (it may hold the job: then its record says)
            if job.resumes is None and book is not None and book.get(*key[:2]) is None:
                why = f"{self.core.gm_id} failed on this job ({type(exc).__name__}); see its log"
                r = self.refusals
                r.before_core(job.user, job.job_id, job.submitted_at, "internal_error", why)
            raise MeghaError(
                f"{self.core.gm_id} failed on this job ({type(exc).__name__}: {exc}); see its log",
                reason="internal_error",
            ) from exc

    def front_door(self) -> frontdoor.FrontDoor:
        """Users' calls (``global_master.frontdoor``): their jobs go to their queues."""

        return frontdoor.FrontDoor(self.core, self.tokens, self.refusals.publish_job,
                                   self._feed_and_record, self.cfg.gm_url)  # fmt: skip

    def _feed_and_record(self, msg: object) -> None:
        """A message whose answer (to a user) follows: its history goes first."""
        self.feed(msg)
        self.journal_out()

    # -------------------------------------------------------------- effects
    def _ack(self, eff: JobSettled) -> None:
        msg = self.deliveries.pop((eff.user, eff.job_id, eff.resume), None)
        if msg is not None:
            self.settled.add(msg)

    def _dead_letter(self, eff: JobRefused) -> None:
        self.refused_jobs += 1
        msg = self.deliveries.pop((eff.user, eff.job_id, eff.resume), None)
        if msg is not None:
            queue = self.cfg.user_queue(eff.user)
            self.sup.spawn(
                self.broker.dead_letter(msg, queue, eff.reason, eff.detail), "dead-letter"
            )
        # The core refuses only jobs whose submitter was authenticated: tell the user why
        # on its outcome stream.  Not a repeated job id: the notice names jobs by id, and
        # the job of that id may be running.
        if not eff.resume and eff.reason != "duplicate_job_id":
            r = self.refusals
            r.tell(r.notice(eff.user, eff.job_id, eff.submitted_at, eff.reason, eff.detail))

    def _to_lm(self, eff: ToLm) -> None:
        msg = eff.msg
        if type(msg) is KeepEnds:  # with the others of this turn to that LM
            for job in msg.jobs:
                self.keeps.add(eff.lm, job)
            return
        self.sup.spawn(self._send(eff), f"request to {eff.lm}")

    async def _send_keeps(self, lm: LmId, jobs: list[JobKeep]) -> None:
        """The jobs whose ends ``lm`` is to keep or let go, from the core's ``KeepEnds``
        of a loop turn (of ``KEEPS_LINGER_S``, when busy), as one message: one at a time, in
        the order the core made them, so a job's "keep" retried while its LM is away
        never lands after its "let go" (the LM would keep its ends for ever)."""
        self.journal_out()
        msg = KeepEnds(gm=self.core.gm_id, lm=lm, jobs=tuple(jobs))
        path, expect = ROUTES[KeepEnds]
        await self.lms[lm].post(path, msg, expect=(expect,), policy=SNAPSHOTS)

    async def _send(self, eff: ToLm) -> None:
        msg = eff.msg
        path, expect = ROUTES[type(msg)]
        peer = self.lms[eff.lm]
        reply: object | None
        if isinstance(msg, LaunchRequest | PreemptRequest | ReserveRequest | CommitGang):
            reply = await self._ask_until_answered(peer, path, expect, msg)
            if reply is None:
                return
            repartitions = isinstance(msg, LaunchRequest) and any(
                p.repartition for p in msg.placements
            )
            if repartitions and faults.taken("die_on_repartition"):
                faults.die()  # the LM took it; this GM never will
        elif isinstance(msg, CancelTasks):
            async with self._cancel_order.setdefault(eff.lm, asyncio.Lock()):
                await peer.post(path, msg, expect=(expect,), policy=SNAPSHOTS)
            return
        else:
            reply = await peer.post(path, msg, expect=(expect,), policy=SNAPSHOTS)
        if reply is not None:
            self.feed(reply)

    async def _ask_until_answered(
        self, peer: Peer, path: str, expect: type, msg: Asked
    ) -> object | None:
        """A launch or preemption, sent until its LM answers.  Without an answer the LM
        may have accepted it, so its tasks are not placed elsewhere: the same request
        (idempotent: same key, same attempts) goes again, until the LM answers or its
        tasks are settled otherwise (an event about them, the LM's new incarnation).
        A refusal (4xx) is an answer: everything asked for is refused."""
        key = f"{self.core.gm_id}:{msg.request_id}"
        while True:
            try:
                return await peer.post(
                    path, replace(msg, sent_at=self.driver.clock()), expect=(expect,), key=key
                )
            except PeerRefused as exc:
                log.error("%s refused %s: %s", peer.name, path, exc)
                self.feed(RequestFailed(lm=msg.lm, request_id=msg.request_id, reason=exc.reason))
                return None
            except GiveUp as exc:
                self.requests_in_doubt += 1
                rid = msg.request_id
                if not (self.core.awaits(rid) or rid in self.core.gang.requests):
                    return None
                log.warning("%s did not answer %s (%s): asking again", peer.name, path, exc)

    async def _publish_persists(
        self, user: UserId, jobs: list[tuple[SubmitJob, Held | None]]
    ) -> None:
        self.journal_out()
        for i, (job, _) in enumerate(jobs):
            body = codec.encode(job)
            seal = self.resume_seal.seal(body, f"resume.{user}")
            try:
                await self.broker.publish(
                    "submit", names.submit_key(user), amqp.persistent(body, headers=seal)
                )
            except BaseException:
                unpublished(jobs[i:])
                raise
            await published(jobs[i : i + 1])

    async def _publish_outcomes(
        self, user: UserId, outcomes: list[tuple[TaskOutcome, Held | None]]
    ) -> None:
        self.journal_out()
        msg = TaskOutcomes(gm=self.core.gm_id, outcomes=tuple(o for o, _ in outcomes))
        body = codec.encode(msg)
        key = names.user_event_key(user, self.core.gm_id)
        seal = self.outcome_seal.seal(body, user)
        try:
            await self.broker.publish("events", key, amqp.persistent(body, headers=seal))
        except BaseException:
            unpublished(outcomes)
            raise
        await published(outcomes)

    async def _decide_loop(self) -> None:
        """Decide while there is work; decisions of one batch share one request per LM.
        Woken by any input (``feed``; the core's own timers' messages too), and by the
        tick while tasks are queued (``_tick``)."""
        core = self.core
        batch = Decide(max_tasks=self.cfg.decide_batch)
        wake = self._wake
        loop = asyncio.get_running_loop()
        try:
            while True:
                await wake.wait()
                wake.clear()
                while core.has_work():
                    self.driver.feed(batch)
                    await asyncio.sleep(0)
                if self._ticker is None and len(core.queues):  # tasks left waiting
                    self._ticker = loop.call_later(DECIDE_TICK_S, self._tick)
        finally:
            if self._ticker is not None:
                self._ticker.cancel()
                self._ticker = None

    def _tick(self) -> None:
        """Wake the decide loop every ``DECIDE_TICK_S`` while tasks are queued (they may
        wait on no input: parked, a policy's order); with none, only an input brings
        work.  No timer per wake-up, none while idle."""
        self._ticker = None
        if not len(self.core.queues):
            return
        self._wake.set()
        self._ticker = asyncio.get_running_loop().call_later(DECIDE_TICK_S, self._tick)

    def _after(self, eff: After) -> None:
        """A core's timer: its message comes back through ``feed``, waking the decide
        loop (what it put back in the queues is decided then, not at the next tick)."""
        asyncio.get_running_loop().call_later(eff.delay, self.feed, eff.msg)

    # ----------------------------------------------------------------- pages
    def ident(self) -> str:
        return self.core.gm_id

    def status(self) -> str:
        return "ok" if self.consuming else "starting"

    def refusal(self) -> Refused | None:
        return None

    async def durable(self, msg: object) -> None:
        """A GM's answers carry nothing a sender keeps for it: only its job history goes
        out first."""
        self.journal_out()

    def state_page(self) -> dict[str, Any]:
        return pages.state_page(self)


def build_app(cfg: FederationConfig, gm: GmId, access: Access) -> web.Application:
    svc = GmService(cfg, gm, access)
    core = svc.core
    metrics = ServiceMetrics(
        "megha_gm",
        lambda: core.counters,
        lambda: {
            "queued_tasks": len(core.queues),
            "inflight_tasks": len(core.inflight),
            "running_tasks": len(core.placed),
            "jobs_unacked": len(svc.deliveries),
        },
    )
    app = service_app(cfg, svc, metrics, access)

    pages.add_routes(app, svc)
    frontdoor.add_routes(app, svc.front_door())
    return app


async def create_app() -> web.Application:
    """gunicorn entry point (``global_master.app:create_app``)."""
    cfg, ident, access = service_identity("gm")
    if ident not in cfg.gm_ids:
        raise ValueError(f"{ident} is not a GM of this federation ({cfg.gm_ids})")
    return build_app(cfg, GmId(ident), access)
