"""An LM's gang reservations: validated holds under a lease, and backfill.

Theory of operation (SPEC §7; Slurm's and Volcano's backfill, Armada's gang minimum):

* A GM asks an LM to **reserve** placements of one gang stage (``ReserveRequest``).
  Each is validated exactly as a launch is (``NodeTable.check``) and, if it fits, its
  demand leaves the node's free resources and becomes a **hold** (nothing starts).
  Holds show in every state update (``NodeTable.gang_holds``), so every GM sees the room as
  taken.  A hold lives until its GM commits it (``CommitGang``: the attempt starts),
  releases it (``ReleaseGang``) or its **lease** ends (``expire``): a hold never
  outlives its lease.  Reserving a task again replaces its older hold.
* **Backfill**: a hold's resources are idle until the gang commits.  A launch that
  finds no room on a node may *borrow* from the idle holds there whose ``due`` time
  is after the task's known end (``now + duration``): the hold lends exactly the
  shortfall, and the borrower's resources return to the hold when it ends
  (``reclaim``).  A hold committed while lent starts its attempt once what it lent is
  back; a borrower still running when the hold is due is stopped (preempted, back to
  its GM's queue), as Slurm ends a backfill job at its time limit.
* **Journal**: a durable LM writes every hold as it changes (``JournalHold``: taken,
  lent, repaid, committed) and its end (``JournalHoldGone``); a new incarnation takes
  them back (``restore``: pending, holding nothing) and, once its pool registered what
  runs, holds them again (``resume``): a commit that comes after an LM restart starts
  what its former incarnation held, as long as the lease lasts.
* Invariant (checked by the property tests): on every node, free + held (not lent) +
  the demands of active attempts = capacity, and free is never negative.

Who changes what: this piece owns the holds; it moves resources only through
``NodeTable.take`` / ``give`` and places attempts through ``NodeTable.place``; it
never calls the LM core.  No clocks: ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from common.ids import GmId, JobId, NodeIndex, UserId
from common.messages import (
    CommitGang,
    GangHold,
    HoldLoan,
    JournalHold,
    JournalHoldGone,
    Placement,
    PlacementResult,
    ReleaseGang,
    ReserveRequest,
)
from common.model import TaskKey
from local_master.nodes import ActiveTask, NodeTable

GangKey = tuple[GmId, UserId, JobId, int]
"""A gang stage of one GM: (gm, user, job id, stage id)."""

_HELD = PlacementResult(accepted=True, reason="ok")


@dataclass(slots=True)
class Hold:
    """One placement of a gang held on one node."""

    gang: GangKey
    placement: Placement
    node: int
    lease_until: float
    due: float
    lent: list[int]
    """What of the demand is lent to backfill tasks now (the rest is held)."""
    borrowers: dict[TaskKey, tuple[int, list[int]]] = field(default_factory=dict)
    """Backfill tasks using this hold: their attempt and what each borrowed."""
    committed: bool = False

    @property
    def key(self) -> TaskKey:
        spec = self.placement.spec
        return (spec.user, spec.task_id)

    @property
    def held(self) -> list[int]:
        return [d - x for d, x in zip(self.placement.spec.demand, self.lent, strict=True)]


def gang_of(msg: ReserveRequest | CommitGang | ReleaseGang) -> GangKey:
    return (msg.gm, msg.user, msg.job_id, msg.stage)


class Reservations:
    """The holds of one LM, by gang and by task."""

    def __init__(self) -> None:
        self.by_task: dict[TaskKey, Hold] = {}
        self.by_gang: dict[GangKey, dict[TaskKey, Hold]] = {}
        self.borrowed: dict[TaskKey, list[Hold]] = {}
        """Backfill tasks and the holds they borrow from."""
        self.gang_tasks: set[TaskKey] = set()
        """Attempts started by a commit: never a preemption victim alone (a gang runs
        whole), until they end."""
        self.expired = 0
        """Holds whose lease ended before a commit or a release (counted)."""
        self.pending: list[Hold] = []
        """Holds taken back from the journal, until the pool registers (``resume``)."""
        self.journal: list[object] | None = None
        """A durable LM's journal (``JournalHold``, ``JournalHoldGone``); None: not durable."""
        self.backfilled = 0
        self.backfill_stopped = 0

    def __len__(self) -> int:
        return len(self.by_task)

    # ------------------------------------------------------------- requests
    def reserve(self, req: ReserveRequest, nodes: NodeTable, now: float) -> list[PlacementResult]:
        """Hold each placement that fits now (validated as a launch is)."""
        gang = gang_of(req)
        out: list[PlacementResult] = []
        for p in req.placements:
            key = (p.spec.user, p.spec.task_id)
            if key in nodes.active:
                out.append(PlacementResult(accepted=False, reason="running"))
                continue
            old = self.by_task.get(key)
            if old is not None:
                self._drop(old, nodes)
            reason = nodes.check(p.spec, p.node)
            if reason != "ok":
                out.append(PlacementResult(accepted=False, reason=reason))
                continue
            nodes.take(p.node, p.spec.demand)
            hold = Hold(
                gang, p, p.node, now + req.lease_s, now + req.due_s, [0] * len(p.spec.demand)
            )
            self._keep(hold)
            out.append(_HELD)
        self._publish(nodes)
        return out

    def commit(
        self, msg: CommitGang, nodes: NodeTable, now: float
    ) -> tuple[list[PlacementResult], list[ActiveTask]]:
        """Start the held attempts ``msg`` names: at once where nothing is lent, once it
        is back otherwise.  A task no longer held (its lease ended, or its node died) is
        refused ``hold_expired`` -- the commit names only the attempt, not its
        placement -- and its GM counts a partial start and places it on as a single
        task.  Holds outlive a restart of a durable LM (``restore``, ``resume``)."""
        gang = gang_of(msg)
        held = self.by_gang.get(gang, {})
        results: list[PlacementResult] = []
        started: list[ActiveTask] = []
        for ref in msg.tasks:
            key = (ref.user, ref.task_id)
            hold = held.get(key)
            a = nodes.active.get(key)
            if hold is None and a is not None and a.attempt == ref.attempt:
                results.append(
                    PlacementResult(accepted=True, reason="duplicate", attempt=a.attempt)
                )
                continue  # the same commit again (its answer was lost)
            if hold is None or hold.placement.attempt != ref.attempt:
                results.append(PlacementResult(accepted=False, reason="hold_expired"))
                continue
            hold.committed = True
            results.append(_HELD)
            if not any(hold.lent):
                started.append(self._start(hold, nodes, now))
            else:
                self._write(hold)
        self._publish(nodes)
        return results, started

    def release(self, msg: ReleaseGang, nodes: NodeTable) -> int:
        """Give back every hold of the gang not committed; how many."""
        held = self.by_gang.get(gang_of(msg), {})
        gone = [h for h in held.values() if not h.committed]
        for h in gone:
            self._drop(h, nodes)
        self._publish(nodes)
        return len(gone)

    # ------------------------------------------------------------- backfill
    def backfill(self, spec_key: TaskKey, p: Placement, nodes: NodeTable, now: float) -> bool:
        """A launch found no room on ``p.node``: borrow the shortfall from idle holds
        there that are due after the task ends.  True: it now fits (the caller places
        it and then calls ``lent_to``)."""
        node, spec = p.node, p.spec
        if not nodes.has(node) or nodes.check(spec, node) != "insufficient_resources":
            return False
        ends = now + spec.duration
        lenders = [
            h for h in self.by_task.values()
            if h.node == node and not h.committed and h.due >= ends and any(h.held)
        ]  # fmt: skip
        if not lenders:
            return False
        short = [max(d - f, 0) for d, f in zip(spec.demand, nodes.free[node], strict=True)]
        room = [sum(h.held[r] for h in lenders) for r in range(len(short))]
        if any(s > r for s, r in zip(short, room, strict=True)):
            return False
        took: list[Hold] = []
        for h in lenders:
            amount = [min(s, x) for s, x in zip(short, h.held, strict=True)]
            if not any(amount):
                continue
            short = [s - a for s, a in zip(short, amount, strict=True)]
            h.lent = [x + a for x, a in zip(h.lent, amount, strict=True)]
            h.borrowers[spec_key] = (p.attempt, amount)
            nodes.give(node, amount)
            self._write(h)
            took.append(h)
        self.borrowed[spec_key] = took
        self.backfilled += 1
        self._publish(nodes)
        return True

    def released(self, key: TaskKey, nodes: NodeTable) -> None:
        """Attempt ``key`` was released (ended, stopped, superseded): if it is a backfill
        task, what it borrowed goes back to its holds at once, before anything else
        could take it."""
        self.gang_tasks.discard(key)
        lenders = self.borrowed.pop(key, None)
        if lenders is None:
            return
        for h in lenders:
            if key in h.borrowers:
                self._repay(h, key, nodes)
        self._publish(nodes)

    # ------------------------------------------------------ after each message
    def reconcile(self, nodes: NodeTable, now: float) -> tuple[list[ActiveTask], list[TaskKey]]:
        """What time and the last message changed: leases that ended, borrowers that
        ended (their loan back), committed holds whose loan is back (started: the
        first list), borrowers still running on a hold that is due (to stop: the
        second list), holds on dead nodes (dropped)."""
        started: list[ActiveTask] = []
        stop: list[TaskKey] = []
        changed = False
        for key in list(self.borrowed):
            a = nodes.active.get(key)
            for h in self.borrowed[key]:
                attempt = h.borrowers[key][0]
                if a is None or a.attempt != attempt:
                    changed = self._repay(h, key, nodes) or changed
                elif now >= h.due and key not in stop:
                    stop.append(key)
            if all(key not in h.borrowers for h in self.borrowed[key]):
                del self.borrowed[key]
        for h in list(self.by_task.values()):
            if h.committed and not any(h.lent):
                started.append(self._start(h, nodes, now))
                changed = True
            elif not nodes.alive[h.node] or (not h.committed and now >= h.lease_until):
                self.expired += now >= h.lease_until
                self._drop(h, nodes)
                changed = True
        if changed:
            self._publish(nodes)
        self.backfill_stopped += len(stop)
        return started, stop

    def victims(self, active: dict[TaskKey, ActiveTask]) -> Iterable[ActiveTask]:
        """The attempts a preemption may stop: all but a gang's, and but backfill tasks
        (what they free goes back to a hold, not to the requester)."""
        if not self.gang_tasks and not self.borrowed:
            return active.values()
        keep = self.gang_tasks
        lent = self.borrowed
        return (a for k, a in active.items() if k not in keep and k not in lent)

    def next_due(self) -> float:
        """The earliest time a lease ends or a hold is due (inf: none held)."""
        times = [min(h.lease_until, h.due) for h in self.by_task.values()]
        return min(times, default=float("inf"))

    # -------------------------------------------------------------- journal
    def records(self) -> list[JournalHold]:
        """Every hold (pending ones too), as journal records (a compacted journal)."""
        return [record(h) for h in (*self.by_task.values(), *self.pending)]

    def restore(self, r: JournalHold) -> None:
        """Take back a hold a former incarnation wrote: pending, holding nothing, until
        its pool registers (``resume``)."""
        p = r.placement
        loans = {(x.user, x.task_id): (x.attempt, list(x.amount)) for x in r.loans}
        hold = Hold(
            (r.gm, r.user, r.job_id, r.stage), p, p.node, r.until, r.due, list(r.lent), loans,
            r.committed,
        )  # fmt: skip
        self.pending = [h for h in self.pending if h.key != hold.key]
        self.pending.append(hold)

    def resume(self, nodes: NodeTable, now: float) -> None:
        """The pool registered what runs: each hold taken back holds again what it held
        (a loan to a backfill task that no longer runs is back in it), unless its lease
        ended, its node is not alive, or what runs there left it no room (dropped)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        for h in pending:
            for b, (attempt, amount) in list(h.borrowers.items()):
                a = nodes.active.get(b)
                if a is None or a.attempt != attempt:
                    del h.borrowers[b]
                    h.lent = [x - y for x, y in zip(h.lent, amount, strict=True)]
            free = nodes.free[h.node]
            room = nodes.alive[h.node] and all(f >= x for f, x in zip(free, h.held, strict=True))
            if not room or (not h.committed and now >= h.lease_until):
                self.expired += now >= h.lease_until
                if self.journal is not None:
                    self.journal.append(JournalHoldGone(user=h.key[0], task_id=h.key[1]))
                continue
            nodes.take(h.node, h.held)
            for b in h.borrowers:
                self.borrowed.setdefault(b, []).append(h)
            self._keep(h)
        self._publish(nodes)

    # ------------------------------------------------------------- internals
    def _repay(self, h: Hold, key: TaskKey, nodes: NodeTable) -> bool:
        """Borrower ``key`` ended: what it borrowed goes back to ``h`` (if held still)."""
        _, amount = h.borrowers.pop(key)
        if self.by_task.get(h.key) is not h:
            return False  # the hold ended meanwhile: the loan stays free
        nodes.take(h.node, amount)
        h.lent = [x - a for x, a in zip(h.lent, amount, strict=True)]
        self._write(h)
        return True

    def _start(self, h: Hold, nodes: NodeTable, now: float) -> ActiveTask:
        self._forget(h)
        p = h.placement
        nodes.give(h.node, p.spec.demand)
        self.gang_tasks.add(h.key)
        return nodes.place(
            p.spec, p.attempt, h.node, h.gang[0], p.altruistic, now, p.queued_at, gang=True
        )

    def _drop(self, h: Hold, nodes: NodeTable) -> None:
        """The hold ends without starting: what it holds (not what it lent) is free."""
        self._forget(h)
        nodes.give(h.node, h.held)

    def _keep(self, h: Hold) -> None:
        self.by_task[h.key] = h
        self.by_gang.setdefault(h.gang, {})[h.key] = h
        self._write(h)

    def _write(self, h: Hold) -> None:
        if self.journal is not None:
            self.journal.append(record(h))

    def _forget(self, h: Hold) -> None:
        key = h.key
        if self.journal is not None:
            self.journal.append(JournalHoldGone(user=key[0], task_id=key[1]))
        del self.by_task[key]
        held = self.by_gang[h.gang]
        del held[key]
        if not held:
            del self.by_gang[h.gang]
        for b in h.borrowers:
            rest = [x for x in self.borrowed.get(b, ()) if x is not h]
            if rest:
                self.borrowed[b] = rest
            else:
                self.borrowed.pop(b, None)

    def _publish(self, nodes: NodeTable) -> None:
        nodes.gang_holds = tuple(
            GangHold(
                gm=h.gang[0], user=h.gang[1], job_id=h.gang[2], stage=h.gang[3],
                node=NodeIndex(h.node), held=tuple(h.held), due=h.due, lease_until=h.lease_until,
            )
            for h in self.by_task.values()
        )  # fmt: skip


def record(h: Hold) -> JournalHold:
    """Hold ``h`` as its journal record."""
    gm, user, job_id, stage = h.gang
    loans = tuple(
        HoldLoan(user=b[0], task_id=b[1], attempt=attempt, amount=tuple(amount))
        for b, (attempt, amount) in h.borrowers.items()
    )
    return JournalHold(
        gm=gm, user=user, job_id=job_id, stage=stage, placement=h.placement, until=h.lease_until,
        due=h.due, lent=tuple(h.lent), loans=loans, committed=h.committed,
    )  # fmt: skip


__all__ = ["GangKey", "Hold", "Reservations", "record"]
