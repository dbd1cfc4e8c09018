"""The LM's handlers of a gang's requests (reserve, commit, release) and the backfill
and lease steps around every message; the holds themselves are
``local_master.reservations``'s.  Mixed into ``local_master.core.LocalMaster``: every
request passes the same address guard and shape check as a launch.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.effects import Effect, Reply, ToWorker
from common.ids import LmId
from common.messages import (
    CommitGang,
    LaunchResponse,
    PlacedRef,
    Placement,
    ReleaseGang,
    ReserveRequest,
    ReserveResponse,
)
from common.metrics import LmCounters
from common.model import TaskKey
from local_master.nodes import ActiveTask, NodeTable
from local_master.reservations import Reservations
from local_master.validation import ASK_LATER, Address, refuse_request


class GangRequests:
    """Gang reservations at one LM (SPEC §7): validated holds under a lease."""

    lm_id: LmId
    nodes: NodeTable
    address: Address
    counters: LmCounters
    reservations: Reservations

    def _preempt(self, victim: ActiveTask, effects: list[Effect]) -> PlacedRef:
        raise NotImplementedError  # the LM core's

    def _on_reserve(self, req: ReserveRequest, now: float) -> list[Effect]:
        """Hold each placement that fits now; none starts (``Reservations.reserve``)."""
        refused = self.address.refuse(req.lm, req.gm, ASK_LATER) or refuse_request(
            (p.spec for p in req.placements), self.nodes.n_resources
        )
        if refused is not None:
            self.counters.refused_requests += 1
            return [Reply(refused)]
        results = self.reservations.reserve(req, self.nodes, now)
        response = ReserveResponse(
            gm=req.gm, lm=self.lm_id, request_id=req.request_id, results=tuple(results),
            delta=self.nodes.delta_since(req.known_version), request_sent_at=req.sent_at,
            received_at=now, sent_at=now,
        )  # fmt: skip
        return [Reply(response)]

    def _on_commit(self, msg: CommitGang, now: float) -> list[Effect]:
        """Start the gang's held attempts; answered as a launch is."""
        if (refused := self.address.refuse(msg.lm, msg.gm, ASK_LATER)) is not None:
            self.counters.refused_requests += 1
            return [Reply(refused)]
        results, started = self.reservations.commit(msg, self.nodes, now)
        self.counters.launches += len(started)
        response = LaunchResponse(
            gm=msg.gm, lm=self.lm_id, request_id=msg.request_id, results=tuple(results),
            delta=self.nodes.delta_since(msg.known_version), request_sent_at=msg.sent_at,
            received_at=now, sent_at=now,
        )  # fmt: skip
        return [Reply(response), *(ToWorker(a.start()) for a in started)]

    def _on_release(self, msg: ReleaseGang, now: float) -> list[Effect]:
        """Give the gang's holds back (answered with nothing)."""
        if (refused := self.address.refuse(msg.lm, msg.gm, ASK_LATER)) is not None:
            return [Reply(refused)]
        self.reservations.release(msg, self.nodes)
        return []

    def _backfill(self, key: TaskKey, p: Placement, now: float) -> bool:
        """A launch that found no room may borrow idle holds due after it ends."""
        return bool(self.reservations.by_task) and self.reservations.backfill(
            key, p, self.nodes, now
        )

    def _gang_step(self, now: float, effects: list[Effect]) -> None:
        """Leases that ended, loans repaid, committed holds that may start now, and
        backfill tasks still running when their hold is due (stopped)."""
        res = self.reservations
        if not (res.by_task or res.borrowed):
            return
        started, stop = res.reconcile(self.nodes, now)
        for key in stop:
            victim = self.nodes.active.get(key)
            if victim is not None:
                self._preempt(victim, effects)
        if stop:
            more, _ = res.reconcile(self.nodes, now)
            started += more
        self._started(started, effects)

    def _started(self, started: Sequence[ActiveTask], effects: list[Effect]) -> None:
        self.counters.launches += len(started)
        effects.extend(ToWorker(a.start()) for a in started)
