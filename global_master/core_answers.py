"""The GM core's handlers of LM answers: placements accepted, refused (an
inconsistency: the view is refreshed and the decision retried at once), or never
answered; preemptions granted or refused (the next victim, Alg. 2).

Part of the core (``global_master.core.GlobalMaster`` inherits ``Answers``): like
``core.py`` it sequences the pieces -- the ``outbox`` says what a request asked, the
``ledger`` moves the task, the ``placer`` counts retries, ``fairness`` its victims --
and no piece imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.effects import Effect, ToLm
from common.ids import GmId, LmId
from common.messages import (
    LaunchResponse,
    PlacementResult,
    PreemptResponse,
    RequestFailed,
    StateDelta,
)
from common.model import Phase, Task, TaskKey, WaitReason
from common.reasons import ENDED_ANSWERS, Answer, TaskFailure
from global_master.ledger import InFlight, round_trip

if TYPE_CHECKING:
    from common.metrics import GmCounters
    from global_master.core import Batches
    from global_master.fairness import Fairness
    from global_master.journal import Journal
    from global_master.ledger import InFlightTable, Ledger
    from global_master.outbox import Outbox
    from global_master.placement import Placer
    from global_master.priority import ClassPreemption
    from global_master.queues import UserQueues
    from global_master.revocation import Revocations
    from global_master.view import LmView

_MISSING = PlacementResult(accepted=False, reason=Answer.MISSING_RESULT)
_REROUTED = Answer.REROUTED  # (bound once: an enum member read off its class is slow on 3.11)
_PROCESSING, _REFUSED_BY_LM = Phase.PROCESSING, WaitReason.REFUSED_BY_LM


class Answers:
    """LM answers into the ledger, the views and the queues (a mixin of ``GlobalMaster``)."""

    if TYPE_CHECKING:  # what these steps use of the core (``GlobalMaster`` has them)
        cancelled: set[TaskKey]
        classes: ClassPreemption
        counters: GmCounters
        fairness: Fairness
        gm_id: GmId
        lms: list[LmId]
        revocations: Revocations
        inflight: InFlightTable
        journal: Journal | None
        ledger: Ledger
        outbox: Outbox
        placer: Placer
        queues: UserQueues
        views: dict[LmId, LmView]

        def _apply(self, delta: StateDelta) -> list[Effect]: ...
        def _end(
            self,
            task: Task,
            ok: bool,
            why: str,
            now: float,
            effects: list[Effect],
            tell: bool = True,
        ) -> None: ...
        def _end_round(
            self, batches: Batches, effects: list[Effect], now: float
        ) -> list[Effect]: ...
        def _forget(self, key: TaskKey) -> None: ...
        def _note(
            self, task: Task, reason: WaitReason, now: float, lm: str = "", why: str = ""
        ) -> None: ...
        def _place(
            self, task: Task, now: float, batches: Batches, effects: list[Effect]
        ) -> None: ...
        def _preempt(self, task: Task, now: float, effects: list[Effect]) -> bool: ...
        def _preempt_lower(self, task: Task, now: float, effects: list[Effect]) -> bool: ...
        def _requeue(self, task: Task, now: float, wait: bool = False) -> None: ...
        def _settle(self, task: Task, effects: list[Effect]) -> None: ...
        def _stop(self, lm: LmId | None, tasks: list[Task]) -> ToLm: ...
        def _cancel_ends(self, task: Task, effects: list[Effect]) -> None: ...
        def _dispatch(
            self,
            task: Task,
            view: LmView,
            node: int,
            repartition: bool,
            batches: Batches,
            now: float,
        ) -> None: ...

    def _dispatch_free(self, task: Task, batches: Batches, now: float) -> bool:
        """Alg. 1: ``task`` onto free room in the views, its GM's partitions first, then the
        others' (a repartition); whether there was any.  A decision's first step
        (``_place``), and a refused preemption's when its answer's view has room."""
        s = task.spec
        found = self.placer.find(self.views, s.constraints, s.demand, self.queues.choose_node)
        if found is not None:
            self._dispatch(task, *found, batches, now)
        return found is not None

    def _on_launch_response(self, resp: LaunchResponse, now: float) -> list[Effect]:
        """Accepted placements are PLACED; refused ones are inconsistencies: the view
        is refreshed from the response and the decision retried at once."""
        sent = self.outbox.answered(resp.request_id)
        effects: list[Effect] = []
        retry: list[Task] = []
        if sent is not None and sent[0] == resp.lm:
            view = self.views.get(resp.lm)
            # an answer from an incarnation of the LM that has since been replaced: what
            # it accepted, the new one does not hold -- placed again, like a refusal
            stale = view is not None and resp.delta.epoch < view.epoch
            if stale:
                self.counters.stale_updates += 1
            results, rid, inflight = resp.results, resp.request_id, self.inflight
            n = len(results)
            for i, key in enumerate(sent[1]):
                fl = inflight.get(key)  # (``_answered``, inline)
                if fl is None or fl.request_id != rid:
                    continue  # an event overtook this answer; the task has moved on
                del inflight[key]
                self._release(fl)
                res = results[i] if i < n else _MISSING
                task = fl.task
                round_trip(task, resp.request_sent_at, resp.received_at, resp.sent_at)
                if not res.accepted or stale:
                    self._inconsistency(fl.repartition)
                    why = TaskFailure.STALE_INCARNATION if res.accepted else res.reason
                    retry.append(self._refused(task, now, resp.lm, why))
                    continue
                if self.placer.retries or self.fairness.tried or self.classes.tried:
                    self._forget(key)  # (any held)
                task.lm = resp.lm
                if res.reason == _REROUTED:  # the view was wrong; the LM made it good
                    self._inconsistency(fl.repartition)
                    self.counters.rerouted += 1
                if self.journal is not None:
                    self.journal.note(key, now, "accepted", lm=resp.lm, node=res.node,
                                      detail=res.reason)  # fmt: skip
                self._accepted(task, res.reason, res.attempt, now, effects)
        effects.extend(self._apply(resp.delta))  # a new epoch if the delta changed the view
        effects.extend(self._retry(retry, now))
        return effects

    def _answered(self, key: TaskKey, request_id: int, lm: LmId | None = None) -> InFlight | None:
        """Task ``key`` was in flight with request ``request_id`` (to ``lm``, if given):
        no longer; its reservation in the view and its victim are released."""
        fl = self.inflight.get(key)
        if fl is None or fl.request_id != request_id or (lm is not None and fl.lm != lm):
            return None
        del self.inflight[key]
        self._release(fl)
        return fl

    def _release(self, fl: InFlight) -> None:
        """``fl``'s request is over: its reservation in the view and its victim go."""
        spec = fl.task.spec
        view = self.views.get(fl.lm)
        if view is not None and fl.node >= 0:
            view.release(fl.node, spec.demand)
        self.fairness.release((spec.user, spec.task_id))

    def _refused(self, task: Task, now: float, lm: LmId, why: str) -> Task:
        """An LM refused ``task`` (or will never answer): it is decided again."""
        task.mark(_PROCESSING, now)
        self.queues.on_returned(task, now)
        self._note(task, _REFUSED_BY_LM, now, lm, why)
        return task

    def _inconsistency(self, external: bool) -> None:
        if external:
            self.counters.external_inconsistencies += 1
        else:
            self.counters.internal_inconsistencies += 1

    def _accepted(
        self, task: Task, reason: str, attempt: int, now: float, effects: list[Effect]
    ) -> None:
        """An LM took the task.  A duplicate names the attempt it holds (this GM may
        have restarted and lost count); an attempt that already ended is an outcome."""
        if attempt > task.attempt:
            task.attempt = attempt
        self._settle(task, effects)
        if reason not in ENDED_ANSWERS:
            self.ledger.accepted(task)
            revoked = self.revocations.users  # (``in self.revocations``, without a call)
            if revoked and task.spec.user in revoked:  # the launch crossed the stop: stop it
                effects.extend(self.revocations.stops(self.gm_id, task.user, self.lms))
            if self.cancelled and task.key in self.cancelled:  # cancelled while in flight
                effects.append(self._stop(task.lm, [task]))
            return
        task.finished_at = now
        self._end(task, reason == Answer.FINISHED, TaskFailure.ON_WORKER, now, effects)

    def _retry(self, tasks: list[Task], now: float) -> list[Effect]:
        """Tasks an LM refused are decided again at once, up to ``max_retries`` times."""
        effects: list[Effect] = []
        batches: Batches = {}
        for task in tasks:
            if self.placer.retry(task.key):
                self._place(task, now, batches, effects)
            else:
                self._requeue(task, now)
        return self._end_round(batches, effects, now)

    def _on_request_failed(self, msg: RequestFailed, now: float) -> list[Effect]:
        """No answer will come: everything the request asked for is refused."""
        rid = msg.request_id
        sent = self.outbox.answered(rid)
        keys = list(sent[1]) if sent is not None and sent[0] == msg.lm else []
        pre = self.outbox.preempt_answered(rid)
        if pre is not None:
            keys.append(pre)
        retry = [
            self._refused(fl.task, now, msg.lm, msg.reason)
            for key in dict.fromkeys(keys)
            if (fl := self._answered(key, rid, msg.lm)) is not None
        ]
        for task in retry:
            self._requeue(task, now)
        return []

    def _on_preempt_response(self, resp: PreemptResponse, now: float) -> list[Effect]:
        """Accepted: the task is placed (victims come back to their own GMs).
        Refused: failed verification; the task is placed if the view the answer brought
        has room for it, else the next victim is tried (Alg. 2), else it waits as a
        decision that finds no room has it wait -- unless its job was cancelled
        meanwhile: then it ends ``cancelled``."""
        key = self.outbox.preempt_answered(resp.request_id)
        effects = self._apply(resp.delta)
        fl = self.inflight.get(key) if key is not None else None
        if key is None or fl is None or fl.request_id != resp.request_id:
            return effects  # overtaken: the task has moved on
        if not resp.accepted and resp.reason == Answer.NO_VICTIM:
            # nothing of that victim there would make room (or pay): ask again later
            self.fairness.nothing_there(key, resp.lm, now)
        self._answered(key, resp.request_id)
        task = fl.task
        round_trip(task, resp.request_sent_at, resp.received_at, resp.sent_at)
        if self.journal is not None:
            what = "accepted" if resp.accepted else "preempt_refused"
            node = -1 if resp.node is None else resp.node
            self.journal.note(key, now, what, lm=resp.lm, node=node,
                              detail=f"{resp.reason}, {len(resp.preempted)} preempted")  # fmt: skip
        if resp.accepted:
            self.counters.preemptions_granted += len(resp.preempted)
            self._forget(key)
            task.lm = resp.lm  # placed there, as a launch's acceptance has it
            self._accepted(task, resp.reason, resp.attempt, now, effects)
            return effects
        task.mark(Phase.PROCESSING, now)
        self.queues.on_returned(task, now)
        if self.cancelled and key in self.cancelled:  # cancelled while it was asked for
            self._cancel_ends(task, effects)
            return effects
        batches: Batches = {}
        if self._dispatch_free(task, batches, now):  # the answer's view has room: no victim
            return self._end_round(batches, effects, now)
        lower = task.spec.priority > 0 and self._preempt_lower(task, now, effects)
        if not (lower or self._preempt(task, now, effects)):
            self._requeue(task, now, wait=True)  # tried against that view: as ``_place``
        return effects
