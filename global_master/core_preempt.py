"""The GM core's preemption requests: Alg. 2 (a user below its share asks the LM
``fairness`` chose to stop a victim over its share) and a higher priority class asking
an LM to stop lower ones (``global_master.priority``); each request leaves as a
``PreemptRequest`` in flight in the ledger, answered in ``core_answers``.

Part of the core (``global_master.core.GlobalMaster`` inherits ``Preemptions``): like
``core.py`` it sequences the pieces and no piece imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.effects import Effect, ToLm
from common.ids import LmId, UserId
from common.model import Task, TaskKey, WaitReason
from global_master.fairness import Grace, NoVictim
from global_master.ledger import InFlight

if TYPE_CHECKING:
    from common.metrics import GmCounters
    from global_master.fairness import Fairness
    from global_master.journal import Journal
    from global_master.ledger import InFlightTable, Ledger
    from global_master.outbox import Outbox
    from global_master.priority import ClassPreemption
    from global_master.queues import UserQueues
    from global_master.view import LmView, Views


class Preemptions:
    """Preemption requests on behalf of queued tasks (a mixin of ``GlobalMaster``)."""

    if TYPE_CHECKING:  # what these steps use of the core (``GlobalMaster`` has them)
        classes: ClassPreemption
        counters: GmCounters
        fairness: Fairness
        inflight: InFlightTable
        journal: Journal | None
        ledger: Ledger
        lm_views: Views
        lms: list[LmId]
        outbox: Outbox
        placed: dict[TaskKey, Task]
        queues: UserQueues
        views: dict[LmId, LmView]
        _index: bool

        def _note(
            self, task: Task, reason: WaitReason, now: float, lm: str = "", why: str = ""
        ) -> None: ...

    # -------------------------------------------------------------- fairness
    def _may_preempt(self, task: Task, now: float) -> bool:
        """Fairness lets ``task``'s user preempt now (else why not is noted)."""
        why = self.fairness.may_preempt(task, now, self.views.values(), self.inflight)
        if why is None:
            return True
        if why is Grace.RUNNING:
            self.counters.preemptions_deferred += 1
        else:
            self._note(task, why, now)
        return False

    def _preempt(self, task: Task, now: float, effects: list[Effect]) -> bool:
        """Alg. 2: a preemption request on behalf of ``task`` (its user below its share)
        to the LM fairness chose; False: no victim (why is noted)."""
        got = self.fairness.choose_victim(task, now, self.views, self.inflight, self._index)
        if isinstance(got, NoVictim):
            if got.rate_limited:
                self.counters.preemptions_rate_limited += 1
            self._note(task, got.reason, now)
            return False
        self._send_preempt(task, got.user, got.lm, now, effects)
        return True

    def _preempt_lower(self, task: Task, now: float, effects: list[Effect]) -> bool:
        """A higher class's preemption of lower ones (``global_master.priority``: not
        held to Alg. 2's rate limit, nor spending it); False: no LM to ask now."""
        lm = self.classes.lm_for(task, now, self.lms, self.placed.values())
        if lm is None:
            return False
        self._send_preempt(task, task.user, lm, now, effects, lower_only=True)
        return True

    def _send_preempt(
        self, task: Task, victim: UserId, lm: LmId, now: float, effects: list[Effect],
        lower_only: bool = False,
    ) -> None:  # fmt: skip
        task.attempt += 1
        version = self.lm_views.version_of(lm)
        req = self.outbox.preempt(task, victim, lm, version, lower_only)
        self.counters.preemption_attempts += 1
        if not lower_only:
            self.fairness.preempt_sent(lm, now)
        self.ledger.dispatch(InFlight(task, lm, -1, False, req.request_id))
        self.queues.on_dispatched(task, now)
        if self.journal is not None:
            whom = f"class below {task.spec.priority}" if lower_only else f"victim {victim}"
            self.journal.note(task.key, now, "preempt_request", lm=lm,
                              detail=f"attempt {req.attempt}, {whom}")  # fmt: skip
        effects.append(ToLm(lm, req))
