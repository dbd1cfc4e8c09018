"""The GM core's handlers of what users ask of their jobs (issue 31, issue 32 item 2):
a cancel (queued tasks end ``cancelled`` at once, placed ones are stopped through their
LMs as a preemption stops them, one in flight once its LM accepts it) and a revoked
token (its queued tasks end ``user_revoked``, its LMs stop the rest).

Part of the core (``global_master.core.GlobalMaster`` inherits ``UserRequests``): like
``core.py`` it sequences the pieces -- the ``ledger`` says where each task is, the
queues give up the queued ones, ``revocation`` keeps who was revoked -- and no piece
imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.effects import Effect, ToLm
from common.ids import GmId, JobId, LmId, UserId
from common.messages import CancelJob, CancelTasks, PlacedRef, UserAccess
from common.model import Task, TaskKey, TaskState
from global_master.revocation import USER_REVOKED

if TYPE_CHECKING:
    from common.metrics import GmCounters
    from global_master.admission import Admission, JobKey
    from global_master.gang import GangKey, Gangs
    from global_master.ledger import InFlight, InFlightTable, JobRecord, Ledger, LiveTable
    from global_master.outbox import Outbox
    from global_master.queues import UserQueues
    from global_master.revocation import Revocations

_ENDED = (TaskState.FINISHED, TaskState.FAILED)
CANCELLED = "cancelled"
"""The reason a task of a cancelled job ended with (``TaskOutcome.reason``)."""


class UserRequests:
    """Cancels and revocations into the queues and the LMs (a mixin of ``GlobalMaster``)."""

    if TYPE_CHECKING:  # what these steps use of the core (``GlobalMaster`` has them)
        gm_id: GmId
        lms: list[LmId]
        counters: GmCounters
        cancelled: set[TaskKey]
        jobs: dict[JobKey, JobRecord]
        admitting: dict[JobKey, Admission]
        held_admissions: dict[UserId, Any]
        ledger: Ledger
        live: LiveTable
        inflight: InFlightTable
        outbox: Outbox
        placed: dict[TaskKey, Task]
        queues: UserQueues
        revocations: Revocations
        gang: Gangs
        _gang_of: dict[TaskKey, GangKey]

        def _ended(
            self,
            task: Task,
            effects: list[Effect],
            *,
            finished: bool,
            reason: str,
            tell: bool = True,
        ) -> None: ...
        def _release(self, fl: InFlight) -> None: ...
        def _answered(
            self, key: TaskKey, request_id: int, lm: LmId | None = None
        ) -> InFlight | None: ...
        def _fail(
            self, task: Task, reason: str, effects: list[Effect], *, tell: bool = True
        ) -> None: ...

    # ------------------------------------------------------------------ cancel
    def _on_cancel(self, msg: CancelJob, now: float) -> list[Effect]:
        """A user cancels one of its jobs: its queued tasks end ``cancelled`` now, and so
        do those decided but held back by the outbox (never sent); its placed ones are
        stopped through their LMs (as a preemption stops them) and end when the stop is
        confirmed; one whose request left is stopped once its LM accepts it.  No
        request for one leaves after this.  Idempotent; a job unknown here changes nothing."""
        jk = (msg.user, msg.job_id)
        rec = self.jobs.get(jk)
        keys = rec.tasks if rec is not None else self._admitting_keys(jk)
        effects: list[Effect] = []
        if self._gang_of:  # its open gangs go: none reserves or commits after this
            self.gang.drop(self, keys, effects)  # (what they took: ended below)
        stops: dict[LmId, list[Task]] = {}
        for key in keys:  # also those a large job has not queued yet
            if key in self.cancelled or self.ledger.state_of(key) in _ENDED:
                continue
            self.cancelled.add(key)
            task = self.live.get(key)
            if task is None:
                continue  # queued later (then dropped)
            if key in self.inflight:
                if self._withdrawn(key) is not None:  # held back: never sent
                    self._cancel_ends(task, effects)
                continue  # sent: stopped once its LM accepts it
            if key in self.placed:
                if task.lm is not None:
                    stops.setdefault(task.lm, []).append(task)
            elif not self.queues.held_back(task):  # held back: ends with its parents
                self.queues.remove(task)
                self._cancel_ends(task, effects)
        effects += [self._stop(lm, tasks) for lm, tasks in stops.items()]
        if keys:
            self.counters.jobs_cancelled += 1
        return effects

    def _withdrawn(self, key: TaskKey) -> Task | None:
        """Task ``key``, decided but held back by the outbox (the launch window): taken
        back before its request leaves, out of flight and its reservation released; None
        if it is not held."""
        fl = self.inflight.get(key)
        if fl is None or fl.request_id != 0 or not self.outbox.withdraw(fl.lm, key):
            return None
        del self.inflight[key]
        self._release(fl)
        return fl.task

    def _admitting_keys(self, jk: tuple[UserId, JobId]) -> list[TaskKey]:
        """The tasks of job ``jk`` if it is still being admitted (none queued yet, or
        held behind its user's job being admitted): dropped as they come."""
        adm = self.admitting.get(jk)
        jobs = [adm.job] if adm is not None else []
        jobs += [m.job for m, _ in self.held_admissions.get(jk[0], ()) if m.job.job_id == jk[1]]
        return [(s.user, s.task_id) for job in jobs[:1] for s in job.tasks]

    def _stop(self, lm: LmId | None, tasks: list[Task]) -> ToLm:
        """Ask ``lm`` to stop the current attempts of cancelled ``tasks``."""
        assert lm is not None
        refs = tuple(PlacedRef(user=t.user, task_id=t.task_id, attempt=t.attempt) for t in tasks)
        return ToLm(lm, CancelTasks(gm=self.gm_id, lm=lm, tasks=refs))

    def _cancel_ends(self, task: Task, effects: list[Effect]) -> None:
        """A cancelled task runs no more: it ends ``cancelled``, with the tasks of later
        DAG stages that were waiting for it."""
        self._ended(task, effects, finished=False, reason=CANCELLED)
        for lost in self.queues.abandon(task, 0.0):
            self._ended(lost, effects, finished=False, reason=CANCELLED)

    # ------------------------------------------------------------ revocation
    def _on_user_access(self, msg: UserAccess, now: float) -> list[Effect]:
        """A user's token was revoked (``global_master.revocation``) or issued again."""
        if msg.user not in self.queues:
            return []
        if not msg.revoked:
            self.revocations.restore(msg.user)
            return []
        taken = self.revocations.revoke(msg.user, self.queues)
        if taken is None:
            return []
        effects: list[Effect] = []
        if self._gang_of:  # its open gangs go, and what they took out of the queues
            taken += self.gang.drop(self, [k for k in self._gang_of if k[0] == msg.user], effects)
        for task in taken:
            self._revoked(task, effects)
        for key in [k for k in self.inflight if k[0] == msg.user]:
            if (held := self._withdrawn(key)) is not None:  # never sent
                self._revoked(held, effects)
        effects.extend(self.revocations.stops(self.gm_id, msg.user, self.lms))
        return effects

    def _revoked(self, task: Task, effects: list[Effect]) -> None:
        self.counters.revoked_ended += 1
        self._fail(task, USER_REVOKED, effects)
