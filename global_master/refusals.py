"""What a GM's service tells a user of a job it did not take: refusals on the user's
outcome stream and in the job's record, and the front door's publish into the user's
queue, which may itself be refused.

Invariants:

* A refusal is told only for a job whose submitter was authenticated (its first fields
  show it is its user's, sent with the user's current token): a forged job gets no
  word to anyone and no record in anyone's book.
* A refusal is never told for a job its GM holds or admitted (a copy of it, shed or
  dead-lettered, is not that job: the book keeps the job's own record).
* A job refused before the core saw it (``user_backlog``, ``too_many_edges``,
  ``internal_error``, ``poison``) is recorded in the book through the core (``JobRefusal`` in,
  the book's record out), so ``megha job ID`` says failed and why, not "submitted"
  until the front door forgets it, then ``unknown_job``.
* A front-door submission leaves no publish running once it is answered: the broker
  takes it within ``frontdoor.PUBLISH_S`` or the caller is told (``NotQueued``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from common import broker_names as names
from common import codec
from common.errors import MeghaError
from common.ids import GmId, JobId, UserId
from common.messages import JobRefusal, SubmitJob
from global_master import frontdoor, intake
from global_master.core import GlobalMaster
from runtime import broker as amqp
from runtime.retry import Backoff, GiveUp
from runtime.supervisor import Supervisor
from security.identity import Identity
from security.outcomes import OutcomeSealer
from security.tokens import TokenStore

log = logging.getLogger("megha.gm")


class Refusals:
    """Tells users of the jobs their GM refused (the module doc)."""

    def __init__(
        self, gm: GmId, broker: amqp.Broker, sup: Supervisor, feed: Callable[[object], None],
        sealer: OutcomeSealer, tokens: TokenStore, resume_keys: Mapping[Identity, bytes],
        taken: Callable[[UserId, JobId], bool],
    ) -> None:  # fmt: skip
        self.gm, self.broker, self.sup, self.feed, self.sealer = gm, broker, sup, feed, sealer
        self.tokens, self.resume_keys, self.taken = tokens, resume_keys, taken

    def unread(self, user: UserId, msg: amqp.Delivery, reason: str, why: str) -> None:
        """A job refused before anything of it was decoded (``user_backlog``; ``poison``:
        its GM died handling it, so only its first fields are read, once it has left the
        queue): told if those fields show it is its user's, with the user's current
        token, and its GM holds no job of that id."""
        try:
            head = intake.peek(msg.body)
            intake.check_submitter(user, head, msg, self.resume_keys, self.tokens)
        except MeghaError:
            return
        if head.resumes is None and not self.taken(user, JobId(head.job_id)):
            self.before_core(user, JobId(head.job_id), -1.0, reason, why)

    def before_core(
        self, user: UserId, job_id: JobId, submitted_at: float, reason: str, why: str
    ) -> None:
        """A job of an authenticated user refused before the core took it: recorded in
        its book (through the core), and told."""
        notice = self.notice(user, job_id, submitted_at, reason, why)
        try:
            self.feed(notice)  # (the book's record: ``global_master.lifecycle``)
        except Exception:  # the core failed on it (it may be why): told all the same
            log.exception("%s: the refusal of %s/%s not recorded", self.gm, user, job_id)
        self.tell(notice)

    def notice(
        self, user: UserId, job_id: JobId, submitted_at: float, reason: str, why: str
    ) -> JobRefusal:
        return JobRefusal(gm=self.gm, user=user, job_id=job_id, submitted_at=submitted_at,
                          reason=reason, detail=why[:1000])  # fmt: skip

    def tell(self, notice: JobRefusal) -> None:
        """On the user's outcome stream."""
        self.sup.spawn(self._publish(notice), "job refusal notice")

    async def _publish(self, notice: JobRefusal) -> None:
        key = names.user_event_key(notice.user, self.gm)
        body = codec.encode(notice)
        headers = self.sealer.seal(body, notice.user)
        await self.broker.publish("events", key, amqp.persistent(body, headers=headers))

    async def publish_job(self, job: SubmitJob) -> None:
        """A front-door job into its user's queue within ``PUBLISH_S``, or ``NotQueued``
        (never a retry left running: a job its caller was told nothing of would run
        later)."""
        body = amqp.persistent(codec.encode(job))
        key = names.submit_key(job.user)
        policy = Backoff(first_s=0.05, cap_s=0.5, deadline_s=frontdoor.PUBLISH_S)
        try:
            async with asyncio.timeout(2 * frontdoor.PUBLISH_S):
                await self.broker.publish("submit", key, body, policy=policy)
        except GiveUp as exc:
            if isinstance(exc.last, amqp.Nacked):  # taken by no queue: nothing left
                raise frontdoor.NotQueued(
                    "queue_full", f"your queue is full (job {job.job_id!r} not taken): "
                    "retry once your GM has read some of it",
                ) from exc  # fmt: skip
            raise _not_reached(job) from exc
        except (TimeoutError, *amqp.PUBLISH_ERRORS) as exc:
            raise _not_reached(job) from exc


def job_taken(core: GlobalMaster, user: UserId, job_id: JobId) -> bool:
    """``core`` holds a job of this id, or its book a job it admitted (live or ended)."""
    return (user, job_id) in core.jobs or (
        core.book is not None and core.book.admitted(user, job_id) is not None
    )


def _not_reached(job: SubmitJob) -> frontdoor.NotQueued:
    return frontdoor.NotQueued(
        "broker_unavailable",
        f"the broker did not confirm job {job.job_id!r} within {frontdoor.PUBLISH_S:g} s: "
        "submit it again with ?id= this id (a copy it took after all is refused as a "
        "duplicate, never run twice)",
    )
