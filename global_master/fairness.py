"""Megha's Alg. 2 on a GM's views: fairness under contention (paper §IV-B5).

Invariants:

* Fairness is asked only when no node anywhere has room for a task (never while
  resources are free).  A user's *dominant share* is its largest fraction of any
  resource of the federation, from the views (stale) plus this GM's own in-flight
  requests (the part of the state it knows consistently).
* A user below its share may preempt: the victim is a user over its share, the one
  with the largest violation first, and the move must make the allocation fairer
  (afterwards the requester's share, relative to what it is promised, may not exceed
  the victim's): that keeps two users from preempting each other back and forth on
  stale views.  An LM is asked at most once per task and victim; the LM verifies.
  ``choose_victim`` returns the victim and the LM to ask, or why there is none.
* With an overload policy (``common.overload``): a user preempts only once it has been
  below ``preempt_below`` of its share for ``preempt_grace_s`` (*starved*, YARN's
  fair-share preemption), until it holds its share; at most ``preempt_per_lm``
  preemption requests per LM per ``preempt_period_s``; an LM that lately found nothing
  of a victim to preempt is not asked again for it within the period.
* What may be stale: the shares (from views, cached until a view changes:
  ``views_changed``); the LM's verification makes up for it.

Who changes what: this piece holds the starved users, the preemption budgets and the
victims asked for; it returns values (a victim, a wait reason, users to wake) and the
core sends the requests.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from common.ids import LmId, UserId
from common.model import Task, TaskKey, UserConfig, WaitReason
from common.overload import OverloadPolicy
from global_master.queues import WaitingTasks
from global_master.view import LmView

ShareOf = Callable[[Sequence[int]], float]


class InFlightShares(Protocol):
    """The GM's requests to LMs not yet answered, as fairness counts them."""

    def share(self, user: UserId, share_of: ShareOf, /) -> float:
        """The sum of ``user``'s in-flight requests' shares."""
        ...


class Grace(Enum):
    """Why a user below its share does not preempt yet."""

    RUNNING = "running"
    """Its grace period (``preempt_grace_s``) is not over."""


@dataclass(frozen=True, slots=True)
class Victim:
    """Alg. 2's answer: ask ``lm`` to preempt tasks of ``user`` (``need``: the share
    the requester's task takes)."""

    user: UserId
    lm: LmId
    need: float


@dataclass(frozen=True, slots=True)
class NoVictim:
    """Alg. 2 found no one to preempt: why (``USER_AT_SHARE``, ``PREEMPTION_FAILED``),
    and whether only the preemption budgets stood in the way (``rate_limited``)."""

    reason: WaitReason
    rate_limited: bool = False


class Fairness:
    """A GM's users' shares, who is starved, and the preemptions it has asked for."""

    def __init__(self, users: Iterable[UserConfig], overload: OverloadPolicy) -> None:
        self.users: dict[UserId, UserConfig] = {u.user: u for u in users}
        self.overload = overload
        self.capacity: Sequence[int] = ()
        self.starved: dict[UserId, float] = {}
        """Users below their share with tasks waiting for room, since when."""
        self.grace_check = 0.0
        """No starved user's grace ends, nor a budget refills, before this."""
        self._shares: dict[UserId, float] | None = None
        self._sent: dict[LmId, deque[float]] = {}
        """When this GM's latest preemption requests to each LM left (the budget)."""
        self._no_victim: dict[tuple[UserId, LmId], float] = {}
        """(victim, LM) pairs an LM lately found nothing to preempt in, until when."""
        self._pending: dict[UserId, float] = {}
        """Shares asked of each victim by requests not yet answered."""
        self._victim_of: dict[TaskKey, tuple[UserId, float]] = {}
        self.tried: dict[TaskKey, set[tuple[UserId, LmId]]] = {}
        """(victim, LM) pairs asked per task (read-only outside: empty means none held)."""

    # ------------------------------------------------------------- shares
    def rescale(self, capacity: Sequence[int]) -> None:
        """The federation's capacity (a view was rebuilt from a snapshot)."""
        self.capacity = capacity
        self._shares = None

    def views_changed(self) -> None:
        """A view changed: shares are computed afresh when next asked."""
        self._shares = None

    def dominant_shares(self, views: Iterable[LmView]) -> dict[UserId, float]:
        """Each user's dominant share of the federation, from the (stale) views."""
        if self._shares is not None:
            return self._shares
        if not self.capacity:
            return {}
        used: dict[UserId, list[int]] = {}
        for v in views:
            for u, res in v.usage.items():
                acc = used.get(u)
                if acc is None:
                    used[u] = list(res)
                else:
                    for r, x in enumerate(res):
                        acc[r] += x
        self._shares = {u: self.share_of(res) for u, res in used.items()}
        return self._shares

    def share_of(self, res: Sequence[int]) -> float:
        """The dominant share of resources ``res``."""
        best = 0.0
        for x, t in zip(res, self.capacity, strict=True):
            if t > 0 and x / t > best:
                best = x / t
        return best

    def below_share(
        self,
        user: UserId,
        views: Iterable[LmView],
        inflight: InFlightShares,
        fraction: float = 1.0,
    ) -> bool:
        """``user`` holds less than ``fraction`` of its share (its in-flight requests
        to LMs counted)."""
        own = inflight.share(user, self.share_of)
        have = self.dominant_shares(views).get(user, 0.0) + own
        return have < self.users[user].share * fraction

    def wake_order(self, views: Iterable[LmView], mine: Container[UserId]) -> list[UserId]:
        """This GM's users (``mine``), furthest below their share first."""
        shares = self.dominant_shares(views)
        users = [u for u in self.users if u in mine]
        return sorted(users, key=lambda u: shares.get(u, 0.0) / max(self.users[u].share, 1e-9))

    # ------------------------------------------------------------- grace
    def may_preempt(
        self, task: Task, now: float, views: Iterable[LmView], inflight: InFlightShares
    ) -> WaitReason | Grace | None:
        """May ``task``'s user preempt now (None)?  Once it has been below
        ``preempt_below`` of its share for ``preempt_grace_s`` it is *starved*, and
        preempts until it holds its share (YARN's fair-share preemption); a user at
        its share never does (``USER_AT_SHARE``); ``Grace.RUNNING``: not yet."""
        pol = self.overload
        if pol.preempt_grace_s <= 0 and pol.preempt_below >= 1:
            return None
        user = task.user
        since = self.starved.get(user)
        if since is None or now - since < pol.preempt_grace_s:
            if not self.below_share(user, views, inflight, pol.preempt_below):
                self.starved.pop(user, None)  # the shortfall closed by itself
                return WaitReason.USER_AT_SHARE
            if since is None:
                since = self.starved[user] = now
            if now - since < pol.preempt_grace_s:
                self.grace_check = min(self.grace_check, since + pol.preempt_grace_s)
                return Grace.RUNNING
        if not self.below_share(user, views, inflight):
            del self.starved[user]
            return WaitReason.USER_AT_SHARE
        return None

    def next_check(self) -> float:
        """When a starved user may next be woken to preempt (inf: no one is starved)."""
        return self.grace_check if self.starved else math.inf

    def grace_due(
        self,
        now: float,
        lms: Iterable[LmId],
        waiting: WaitingTasks,
        views: Iterable[LmView],
        inflight: InFlightShares,
    ) -> list[tuple[UserId, int]]:
        """Users whose grace period is over, with how many of their waiting tasks to
        wake to preempt for (as many as the LMs' preemption budgets allow)."""
        if not self.starved or now < self.grace_check:
            return []
        pol = self.overload
        period = max(pol.preempt_period_s, 1e-3)
        refills = [q[0] + period for q in self._sent.values() if q and q[0] + period > now]
        self.grace_check = min([now + period, *refills])  # when a budget refills
        out: list[tuple[UserId, int]] = []
        for user, since in list(self.starved.items()):
            if now - since < pol.preempt_grace_s:
                self.grace_check = min(self.grace_check, since + pol.preempt_grace_s)
                continue
            if not waiting.count(user) or not self.below_share(user, views, inflight):
                del self.starved[user]
                continue
            out.append((user, sum(self.preempt_room(lm, now) for lm in lms)))
        return out

    def preempt_room(self, lm: LmId, now: float) -> int:
        """Preemption requests this GM may still send ``lm`` in the current period."""
        limit = self.overload.preempt_per_lm
        if limit <= 0:
            return 1
        sent = self._sent.get(lm)
        if not sent:
            return limit
        horizon = now - self.overload.preempt_period_s
        while sent and sent[0] <= horizon:
            sent.popleft()
        return max(0, limit - len(sent))

    # ------------------------------------------------------------- Alg. 2
    def choose_victim(
        self,
        task: Task,
        now: float,
        views: dict[LmId, LmView],
        inflight: InFlightShares,
        index: bool,
    ) -> Victim | NoVictim:
        """Alg. 2: whom to preempt, on which LM, on behalf of ``task`` (its user below
        its share), or why no one.  ``index``: the GM keeps a waiting index (an LM that
        lately found nothing of a victim is then not asked again within the period).
        A victim chosen is counted as asked of until its answer (``release``)."""
        shares = self.dominant_shares(views.values())
        need = self.share_of(task.demand)
        mine = self.users[task.user].share
        have = shares.get(task.user, 0.0) + inflight.share(task.user, self.share_of)
        if have >= mine:
            self.starved.pop(task.user, None)
            return NoVictim(WaitReason.USER_AT_SHARE)
        tried = self.tried.setdefault(task.key, set())
        limited = False
        for victim in self._violators(task.user, shares, (have + need) / mine, need):
            ranked = sorted(
                (lm for lm, v in views.items() if any(v.usage.get(victim, ()))),
                key=lambda lm: -sum(views[lm].usage[victim]),
            )
            for lm in ranked:
                if (victim, lm) in tried:
                    continue
                if not self.preempt_room(lm, now) or (
                    index and self._no_victim.get((victim, lm), now) > now
                ):
                    limited = True
                    continue
                tried.add((victim, lm))
                self._pending[victim] = self._pending.get(victim, 0.0) + need
                self._victim_of[task.key] = (victim, need)
                return Victim(victim, lm, need)
        if limited:  # its turn comes when the budgets refill (``grace_due``)
            self.starved.setdefault(task.user, now)
        return NoVictim(WaitReason.PREEMPTION_FAILED, rate_limited=limited)

    def _violators(
        self, user: UserId, shares: dict[UserId, float], after: float, need: float
    ) -> list[UserId]:
        """Users over their share whom preempting for ``user`` would leave no less
        fairly treated than ``user`` (``after``: its share afterwards, relative to what
        it is promised), the largest violation first."""
        violators = []
        for u, ds in shares.items():
            cfg = self.users.get(u)
            if cfg is None or u == user or ds <= cfg.share:
                continue
            left = ds - self._pending.get(u, 0.0) - need
            if after <= left / cfg.share + 1e-9:
                violators.append((ds - cfg.share, u))
        violators.sort(reverse=True)
        return [u for _, u in violators]

    # ------------------------------------------------------------- answers
    def preempt_sent(self, lm: LmId, now: float) -> None:
        """A preemption request left for ``lm`` (it counts against the budget)."""
        self._sent.setdefault(lm, deque()).append(now)

    def nothing_there(self, key: TaskKey, lm: LmId, now: float) -> None:
        """``lm`` found nothing of the victim asked for task ``key`` that would make
        room (or pay): it is not asked again for that victim within the period."""
        pending = self._victim_of.get(key)
        if pending is not None:
            self._no_victim[(pending[0], lm)] = now + self.overload.preempt_period_s

    def release(self, key: TaskKey) -> None:
        """The preemption request for task ``key`` is answered (or will never be)."""
        pending = self._victim_of.pop(key, None)
        if pending is not None:
            left = self._pending.get(pending[0], 0.0) - pending[1]
            if left > 1e-12:
                self._pending[pending[0]] = left
            else:
                self._pending.pop(pending[0], None)

    def forget(self, key: TaskKey) -> None:
        """Task ``key`` was placed, went back to its queue, or ended: no victims tried."""
        self.tried.pop(key, None)
