"""The GM's outbox: which requests to LMs leave now, which wait, and what each one
asked (paper §IV-B: launch and repartition requests; the overload policy's launch
window and repartition batching, ``common.overload``).

Invariants:

* Every request has an id that only grows (``request_id``); an answer, an event or a
  failure names it, and the outbox says what it asked of which LM (``answered``,
  ``preempt_answered``) exactly once.
* A decision's placements leave in one launch request per LM (``release``).  With a
  ``launch_window``, at most that many launch requests per LM are unanswered: what is
  decided meanwhile is *held* and leaves with the next one, unless it reaches
  ``launch_full_batch`` placements: then it leaves at once, one request beyond the
  window (Nagle's full segment).  With repartition batching,
  one repartition request per LM is in flight and at most one leaves per
  ``repartition_period_s``; repartitions decided meanwhile travel together in the next.
  A held placement stays reserved in the GM's view and its task in flight
  (DISPATCHED) in the ledger: only its request waits; a cancel or a revocation takes it
  back before it leaves (``withdraw``).
* Nothing here is stale: it is what this GM sent and has not heard back about.

Who changes what: the outbox holds requests, not tasks; it says what to send and
records what was sent; the core builds the messages.
"""

from __future__ import annotations

from collections import Counter

from common.ids import GmId, LmId, UserId
from common.messages import LaunchRequest, Placement, PreemptRequest
from common.model import Task, TaskKey
from common.overload import OverloadPolicy

Release = tuple[LmId, list[Placement]]
"""Placements to send to one LM in one launch request."""


class Outbox:
    """This GM's requests to LMs: those unanswered, and placements held back."""

    def __init__(self, gm: GmId, overload: OverloadPolicy) -> None:
        self.gm = gm
        self.launch_window = overload.launch_window
        self.full_batch = overload.launch_full_batch
        self.batching = overload.repartition_batching
        self.period = overload.repartition_period_s
        self.passes_all = not self.launch_window and not self.batching
        """No window, no batching: every placement leaves at once (``release`` is the
        identity, nothing is ever held)."""
        self.held: dict[LmId, list[Placement]] = {}
        """Placements decided but held back (the window, repartition batching), per LM."""
        self._next_request = 0
        self._launches: dict[int, tuple[LmId, list[TaskKey]]] = {}
        self._open_launches: Counter[LmId] = Counter()
        """Requests of ``_launches`` per LM (the launch window's count)."""
        self._preempts: dict[int, TaskKey] = {}
        self._rep_sent: dict[LmId, tuple[float, int]] = {}
        """The last repartition request to each LM: when, and its id."""

    def request_id(self) -> int:
        """A new request id (ids only grow)."""
        self._next_request += 1
        return self._next_request

    # ------------------------------------------------------------ launches
    def release(self, batches: dict[LmId, list[Placement]], now: float) -> list[Release]:
        """A round's placements, per LM with those held for it before: what leaves now
        (the rest is held)."""
        out: list[Release] = []
        for lm, placements in batches.items():
            held = self.held.pop(lm, None)
            if held:  # (the round's placements after them, in the held list: no copy)
                held += placements
            go = self._release(lm, held or placements, now)
            if go:
                out.append((lm, go))
        return out

    def release_held(self, now: float) -> list[Release]:
        """Placements held back: what leaves now, one request per LM that may take one."""
        out: list[Release] = []
        for lm in list(self.held):
            if not self._window_full(lm, len(self.held[lm])):
                go = self._release(lm, self.held.pop(lm), now)
                if go:
                    out.append((lm, go))
        return out

    def withdraw(self, lm: LmId, key: TaskKey) -> bool:
        """Task ``key``'s placement, held back for ``lm``, will not leave (its job was
        cancelled, its user revoked): whether it was held."""
        held = self.held.get(lm)
        if not held:
            return False
        kept = [p for p in held if (p.spec.user, p.spec.task_id) != key]
        if len(kept) == len(held):
            return False
        if kept:
            self.held[lm] = kept
        else:
            del self.held[lm]
        return True

    def _release(self, lm: LmId, placements: list[Placement], now: float) -> list[Placement]:
        """What of ``placements`` goes to ``lm`` now; the rest is held."""
        if self._window_full(lm, len(placements)):
            self.held[lm] = placements
            return []
        if self.batching and self._rep_busy(lm, now) and any(p.repartition for p in placements):
            self.held[lm] = [p for p in placements if p.repartition]
            return [p for p in placements if not p.repartition]
        return placements

    def _window_full(self, lm: LmId, n_held: int) -> bool:
        """``lm`` has as many launch requests of this GM unanswered as the window allows,
        for ``n_held`` placements waiting: a full batch may have one request more."""
        window = self.launch_window
        if not window:
            return False
        n = self._open_launches[lm]
        full = self.full_batch
        if full and n_held >= full:
            return n > window
        return n >= window

    def _rep_busy(self, lm: LmId, now: float) -> bool:
        """A repartition request to ``lm`` is unanswered, or went out too lately."""
        sent = self._rep_sent.get(lm)
        if sent is None:
            return False
        at, rid = sent
        return rid in self._launches or now - at < self.period

    def launch(
        self,
        lm: LmId,
        placements: list[Placement],
        keys: list[TaskKey],
        repartition: bool,
        now: float,
        known_version: int,
    ) -> LaunchRequest:
        """The launch request with ``placements`` (of tasks ``keys``; ``repartition``:
        some of them are) that leaves for ``lm`` now."""
        rid = self.request_id()
        if repartition:
            self._rep_sent[lm] = (now, rid)
        self._launches[rid] = (lm, keys)
        self._open_launches[lm] += 1
        return LaunchRequest(gm=self.gm, lm=lm, request_id=rid, placements=tuple(placements),
                             known_version=known_version)  # fmt: skip

    def answered(self, request_id: int) -> tuple[LmId, list[TaskKey]] | None:
        """The launch request ``request_id`` is answered (or will never be): what it
        asked of which LM, if it was open."""
        sent = self._launches.pop(request_id, None)
        if sent is not None:
            self._open_launches[sent[0]] -= 1
        return sent

    # ------------------------------------------------------------ preemptions
    def preempt(
        self, task: Task, victim: UserId, lm: LmId, known_version: int, lower_only: bool = False
    ) -> PreemptRequest:
        """The preemption request for ``task`` (its attempt counted already) that leaves
        for ``lm`` now: make room by preempting tasks of ``victim`` (``lower_only``: of
        any user in a lower priority class)."""
        rid = self.request_id()
        self._preempts[rid] = task.key
        return PreemptRequest(gm=self.gm, lm=lm, request_id=rid, spec=task.spec,
                              attempt=task.attempt, victim=victim, known_version=known_version,
                              queued_at=task.submitted_at, lower_only=lower_only)  # fmt: skip

    def preempt_answered(self, request_id: int) -> TaskKey | None:
        """The preemption request ``request_id`` is answered (or will never be): the
        task it was for, if it was open."""
        return self._preempts.pop(request_id, None)

    # ------------------------------------------------------------ read-only
    def asked(self, request_id: int) -> list[TaskKey]:
        """The tasks an open request (launch or preemption) asked for."""
        sent = self._launches.get(request_id)
        keys = list(sent[1]) if sent is not None else []
        pre = self._preempts.get(request_id)
        if pre is not None:
            keys.append(pre)
        return keys
