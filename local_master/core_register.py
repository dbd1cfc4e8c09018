"""The LM core's handling of a worker pool's registration (§IV-D: the workers hold what
runs): what the pool runs is held here, what this LM held there and the pool no longer
runs is relaunched, ends no LM took are learnt (and told to their GMs), attempts the
pool stopped when it lost its LM and this LM does not hold go back to their GMs.

Part of the core (``local_master.core.LocalMaster`` inherits ``Registration``): like
``core.py`` it sequences the pieces (``nodes``, ``ends``) and no piece imports it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from common.effects import Effect, Reply, ToGm, ToWorker
from common.ids import GmId, LmId
from common.messages import (
    EndedAttempt,
    EventKind,
    HeldTask,
    Registered,
    RegisterWorkers,
    ReportKind,
    StartTask,
    StopTask,
    WorkerReport,
)
from common.model import TaskKey
from common.reasons import Answer
from local_master.nodes import ActiveTask
from local_master.validation import unknown_node

if TYPE_CHECKING:
    from collections.abc import Iterable

    from common.metrics import LmCounters
    from local_master.ends import Ends
    from local_master.nodes import NodeTable
    from local_master.reservations import Reservations
    from local_master.validation import Address

ENDS = (ReportKind.FINISHED, ReportKind.FAILED)

REGISTRATIONS_REMEMBERED = 8
"""How many registrations an LM knows again (a copy: the same message, ``at``
included).  A pool sends one at a time (the next only once one was taken), so a copy of
an older one than these is not on its way any more."""


class Registration:
    """A pool's registration into the node table (a mixin of ``LocalMaster``)."""

    if TYPE_CHECKING:  # what these steps use of the core (``LocalMaster`` has them)
        lm_id: LmId
        registrations_taken: deque[RegisterWorkers]
        gms: frozenset[GmId]
        address: Address
        nodes: NodeTable
        ends: Ends
        counters: LmCounters
        reservations: Reservations

        @property
        def epoch(self) -> int: ...
        def _seen(self, nodes: Iterable[int], now: float) -> None: ...
        def _relaunch(self, orphans: list[ActiveTask], now: float) -> list[Effect]: ...
        def _confirm_stops(
            self,
            gone: Callable[[tuple[TaskKey, int], ActiveTask], bool],
            now: float,
            effects: list[Effect],
        ) -> None: ...
        def _report(self, rep: WorkerReport, now: float, effects: list[Effect]) -> None: ...

    def _on_register(self, msg: RegisterWorkers, now: float) -> list[Effect]:
        """The worker pool says which nodes live and what runs on them: this incarnation
        takes it as the truth (§IV-D: the workers hold what runs)."""
        if (refused := self.address.refuse(msg.lm)) is not None:
            return [Reply(refused)]
        has = self.nodes.has
        bad = next((n for n in msg.nodes if not has(n)), None)
        if bad is None:
            bad = next((s.node for s in msg.running if not has(s.node)), None)
        if bad is not None:
            return [Reply(unknown_node(bad))]
        effects: list[Effect] = [Reply(Registered(lm=self.lm_id, epoch=self.epoch))]
        if any(msg.at == m.at and msg == m for m in self.registrations_taken):
            # a copy the pool sent again after a timeout, read late: what it says was
            # taken, and may have changed since (an attempt ended or was stopped)
            self.counters.stale_reports += 1
            return effects
        self.registrations_taken.append(msg)
        self._seen(msg.nodes, now)
        # what this LM holds on those nodes and the pool no longer runs (the pool
        # restarted) is lost; what it accepted after the pool spoke may still be on its way
        # (an attempt it reports ended is settled by that report below, not run again)
        runs = {(s.spec.user, s.spec.task_id, s.attempt) for s in msg.running}
        settled = runs | {
            (e.report.user, e.report.task_id, e.report.attempt)
            for e in msg.ended
            if e.report.kind in ENDS
        }
        nodes = set(msg.nodes)
        gone = [
            a for k, a in self.nodes.active.items()
            if a.node in nodes and (k[0], k[1], a.attempt) not in settled
            and a.accepted_at < msg.at
        ]  # fmt: skip
        for a in gone:
            self.nodes.release((a.spec.user, a.spec.task_id))
        effects.extend(self._relaunch(gone, now))
        self._confirm_stops(
            lambda k, a: a.node in nodes and (*k[0], k[1]) not in runs, now, effects
        )
        started = {(r.user, r.task_id, r.attempt): r for r in msg.started}
        for s in msg.running:
            self._adopt(s, started.get((s.spec.user, s.spec.task_id, s.attempt)), now, effects)
        for e in msg.ended:
            self._learn_ended(e, now, effects)
        self.reservations.resume(self.nodes, now)  # holds taken back from the journal
        self.address.register()
        return effects

    def _adopt(
        self, s: StartTask, started: WorkerReport | None, now: float, effects: list[Effect]
    ) -> None:
        """An attempt the registering pool runs: held here, unless this LM holds a newer
        one or saw it (or a newer one) end -- the registration is a copy the pool sent
        again after a timeout, read late: held again, it would be a phantom that takes its
        node's room and runs nothing -- or it cannot be the truth (its GM is not of the
        federation, or it does not fit its node): then it is stopped."""
        key = (s.spec.user, s.spec.task_id)
        held = self.nodes.active.get(key)
        if held is not None and held.attempt >= s.attempt:
            return
        if self.ends.covering(key, s.spec.job_id, s.attempt) is not None:
            self.counters.stale_reports += 1
            return
        if held is not None:  # an older attempt here: the pool's is the one that runs
            self.nodes.release(key)
        if s.gm not in self.gms or self.nodes.check(s.spec, s.node) is not Answer.OK:
            self.counters.refused_internal += 1
            stop = StopTask(
                node=s.node, user=s.spec.user, task_id=s.spec.task_id, attempt=s.attempt, gm=s.gm
            )
            effects.append(ToWorker(stop))
            return
        a = self.nodes.place(s.spec, s.attempt, s.node, s.gm, s.altruistic, now, s.queued_at)
        if started is not None:
            a.worker_at = started.worker_at
            a.started_at = started.started_at
        self.counters.recovered += 1

    def _learn_ended(self, e: EndedAttempt, now: float, effects: list[Effect]) -> None:
        """An attempt that ended while no LM took its report: held as ended (a GM that
        asks sees it ended, and does not place it again), its end sent on to its GM."""
        rep = e.report
        key = (rep.user, rep.task_id)
        if not self.nodes.has(rep.node):
            return
        if rep.kind == ReportKind.LOST:
            self._learn_lost(e, now, effects)
            return
        if rep.kind not in ENDS:
            return
        a = self.nodes.active.get(key)
        if a is not None:
            if a.attempt == rep.attempt and a.node == rep.node:
                self._report(rep, now, effects)
            return
        if key in self.ends or e.start.gm not in self.gms:
            return
        held = HeldTask(
            spec=e.start.spec,
            attempt=rep.attempt,
            queued_at=e.start.queued_at,
            worker_at=rep.worker_at,
            started_at=rep.started_at,
            ended_at=rep.at,
            ok=rep.kind == ReportKind.FINISHED,
        )
        self.ends.retire(key, e.start.gm, held, now)
        self.counters.recovered_ends += 1
        effects.append(ToGm(e.start.gm, self.nodes.report_event(rep)))

    def _learn_lost(self, e: EndedAttempt, now: float, effects: list[Effect]) -> None:
        """An attempt its pool stopped when it lost its LM (the lease) that this
        incarnation does not hold: given back to its GM (``REQUEUED``, the task whole),
        never run again here.  This LM cannot tell whether it (or a former incarnation)
        gave the task back already, and the GM placed a newer attempt elsewhere or saw
        it end: a relaunch here would run that newer attempt twice.  The GM knows: it
        takes the event as stale if it holds a newer attempt, queues the task again if
        it holds this one, and queues it from the event if it restarted and has no
        record of it (``Recovery.given_back``)."""
        rep, start = e.report, e.start
        key = (rep.user, rep.task_id)
        if key in self.nodes.active or key in self.ends or start.gm not in self.gms:
            return
        lost = ActiveTask(
            spec=start.spec, attempt=rep.attempt, node=rep.node, gm=start.gm, logical=False,
            altruistic=start.altruistic, accepted_at=now, worker_at=rep.worker_at,
            started_at=rep.started_at, queued_at=start.queued_at,
        )  # fmt: skip
        self.counters.returned_to_gm += 1
        effects.append(
            ToGm(start.gm, self.nodes.event(EventKind.REQUEUED, lost, now, "worker lost"))
        )
