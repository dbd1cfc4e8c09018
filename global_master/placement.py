"""Megha's Alg. 1 on a GM's views: where a task goes (paper §IV-B2, §IV-B3, §IV-B4).

Invariants:

* **Match**: walk the GM's *internal* partitions round-robin over LMs; in each, AND
  the task's constraint vectors with the partition's, and take a node with room for
  its demand (first fit, or the policy's ``choose_node``).  Otherwise the same walk
  over the *external* partitions: a node there is asked of its LM by a
  **repartition**.  The walk starts where the previous match was and moves on one LM
  per decision round (``next_round``): a round's tasks fill one LM before the next,
  so they travel in one launch request, while successive rounds still spread over
  every LM.
* **Feasible**: a (constraints, demand) class that no node of any LM could ever run
  (whatever is free) fails explicitly; the answer is memoized until the views are
  rebuilt from a snapshot (``forget_feasible``).
* **One walk per class and round**: within one round of decisions (``decide``, the
  retries of a refused launch) the views only lose room (each match reserves), so a
  (constraints, demand) class for which the walk found no node finds none again until
  the round ends: the core skips its walk for the rest of the round and keeps whether
  it is feasible with it (``GlobalMaster._no_fit``; first fit only; a gang's placement,
  which may release room, empties it).
* **Inconsistency**: an LM that refuses a placement answers with its state; the GM
  retries the decision at once, at most ``max_retries`` times a task (``retry``),
  then the task goes to the back of its queue.
* **Wake**: a task that found no room waits (FIFO queues: ``WaitingTasks``) until a
  node's free resources grow in a view (``LmView.freed``); ``woken`` takes, per freed
  node and class, as many as the node's room holds.  No lost wake-up: every growth of
  a node's free resources marks it freed, and a task only waits after a full match
  found no node for it.
* What may be stale: the views (an LM's truth moved on); the LM validates, and its
  refusal is the inconsistency above.

Who changes what: the cursor, the memo and the retry counts are this piece's; the
views it reads belong to the core, which reserves what a match returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from common.ids import GmId, LmId, UserId
from common.model import Resources, Task, TaskKey
from global_master.queues import NodeChooser, WaitClass, WaitingTasks
from global_master.view import LmView


class Placer:
    """Alg. 1's state: where the next walks start, what is feasible, retries per task."""

    def __init__(self, gm: GmId, lms: Sequence[LmId], max_retries: int) -> None:
        self.gm = gm
        self.lms = list(lms)
        self.max_retries = max_retries
        self.rr: dict[bool, int] = {True: 0, False: 0}
        """Where the next round-robin walk of internal (True) / external partitions starts."""
        self._feasible: dict[tuple[int, tuple[int, ...]], bool] = {}
        self.retries: dict[TaskKey, int] = {}
        """Inconsistency retries per task (read-only outside: empty means none held)."""

    def match(
        self,
        views: dict[LmId, LmView],
        mask: int,
        demand: Resources,
        internal: bool,
        choose: NodeChooser | None,
    ) -> tuple[LmView, int] | None:
        """Alg. 1: walk the internal (or external) partitions round-robin over LMs; in
        each, AND the constraint vectors and take the first node that fits (or the
        one ``choose`` picks).  None: no node of that kind fits."""
        lms, n, me = self.lms, len(self.lms), self.gm
        fit = choose or LmView.first_fit
        full_skips = fit is LmView.first_fit and all(demand)  # first fit needs an avail node
        start = self.rr[internal]
        for k in range(n):
            view = views[lms[(start + k) % n]]
            if full_skips and not view.avail.any():
                continue
            node = fit(view, view.eligible(mask, me, internal), demand)
            if node >= 0:
                self.rr[internal] = (start + k) % n
                return view, node
        return None

    def find(
        self, views: dict[LmId, LmView], mask: int, demand: Resources, choose: NodeChooser | None
    ) -> tuple[LmView, int, bool] | None:
        """Alg. 1 both ways, as ``match`` internal then ``match`` external (one call: a
        decision's hot path): the view, the node, and whether it is a repartition.
        None: no node of any kind fits."""
        lms, n, me, rr = self.lms, len(self.lms), self.gm, self.rr
        fit = choose or LmView.first_fit
        full_skips = fit is LmView.first_fit and all(demand)  # first fit needs an avail node
        for internal in (True, False):
            start = rr[internal]
            for k in range(n):
                at = (start + k) % n
                view = views[lms[at]]
                if full_skips and not view.avail.any():
                    continue
                node = fit(view, view.eligible(mask, me, internal), demand)
                if node >= 0:
                    rr[internal] = at
                    return view, node, not internal
        return None

    def next_round(self) -> None:
        """A round of decisions placed something: the next walks start at the next LM."""
        n, rr = len(self.lms), self.rr  # (in place: once per round, no dict made)
        rr[True] = (rr[True] + 1) % n
        rr[False] = (rr[False] + 1) % n

    def feasible(self, views: Iterable[LmView], mask: int, demand: Resources) -> bool:
        """Some node of some LM could ever run this class (memoized)."""
        key = (mask, demand)
        ok = self._feasible.get(key)
        if ok is None:
            ok = any(v.feasible(mask, demand) for v in views)
            self._feasible[key] = ok
        return ok

    def forget_feasible(self) -> None:
        """The views were rebuilt (a snapshot): feasibility is asked afresh."""
        self._feasible.clear()

    def retry(self, key: TaskKey) -> bool:
        """May task ``key``, refused by an LM, be decided again at once?  (Counted.)"""
        n = self.retries.get(key, 0) + 1
        if n > self.max_retries:
            return False
        self.retries[key] = n
        return True

    def forget(self, key: TaskKey) -> None:
        """Task ``key`` was placed, went back to its queue, or ended: no retries held."""
        self.retries.pop(key, None)


def woken(
    views: Iterable[LmView], waiting: WaitingTasks, order: Callable[[], list[UserId]]
) -> list[Task]:
    """Waiting tasks that the freed nodes could fit: per freed node and class, as many
    as the node's room holds, taken in ``order`` of users (asked once, when a class
    has several).  Every view's freed nodes are cleared."""
    out: list[Task] = []
    users_first: list[UserId] | None = None
    classes: list[WaitClass] | None = None  # in the policy's order, asked once
    for view in views:
        freed = view.freed
        if not freed:
            continue
        if waiting:
            masks, free = view.node_masks, view.free
            skip_empty = waiting.all_positive
            for i in freed:
                room = free[i]
                if skip_empty and 0 in room:
                    continue
                node_mask = masks[i]
                if classes is None:
                    classes = waiting.class_order()
                for cls in classes:
                    if cls not in waiting.by_class:
                        continue
                    mask, demand = cls
                    if mask & ~node_mask:
                        continue
                    k = _fits_times(room, demand)
                    if k <= 0:
                        continue
                    if users_first is None and len(waiting.by_class[cls]) > 1:
                        users_first = order()
                    got = waiting.take(cls, k, users_first or ())
                    room = [x - d * len(got) for x, d in zip(room, demand, strict=True)]
                    out.extend(got)
                    if skip_empty and 0 in room:
                        break  # the node is full for every class: the rest fit none
                if not waiting:
                    break
        freed.clear()
    return out


def _fits_times(room: Sequence[int], demand: Resources) -> int:
    """How many tasks of ``demand`` fit in ``room`` (-1: it asks for nothing)."""
    k = -1
    for x, d in zip(room, demand, strict=True):
        if d > 0:
            q = x // d
            if k < 0 or q < k:
                k = q
                if k <= 0:
                    break
    return k
