"""Gang stages on a GM: all-or-nothing starts across LMs, and backfill (SPEC §7).

Theory of operation (Slurm's reservations and backfill, Volcano's gang plugin, Armada's
minimum cardinality):

* A stage marked ``gang`` (``StageSpec.gang``; ``min``: the fewest that may start)
  is placed as one unit.  When the first of its tasks leaves its queue, the others are
  taken out of theirs: the gang owns them until it commits or fails.
* **Reserve**: the GM matches every task of the gang in its view (Alg. 1, internal
  then external partitions) and, only if at least ``need`` of them fit there, asks
  each LM concerned to *reserve* its share (``ReserveRequest``).  An LM validates each
  placement as it validates a launch and holds what fits, under a lease, visible to
  every GM in its state updates.  What fits nowhere in the view is not asked for: a
  gang that does not fit waits (``gang_incomplete``) holding nothing.
* **Commit**: once ``need`` tasks are held and their lease has time left, the GM
  commits them (``CommitGang``, answered as a launch is); the others of a ``min``
  gang become ordinary tasks.  No task of a gang is ever launched on its own, so no
  partial gang runs (``partial_starts`` counts commits an LM refused: zero unless a
  commit came after its lease).
* **Fill, release, back off**: holds that came short are filled from the refreshed
  view (a ``GangRetry`` timer) while the lease lasts; then every hold is released and
  the gang backs off for a jittered, growing delay (the GM's seeded ``random.Random``),
  so two GMs reserving at once neither deadlock (holds end with their lease) nor
  livelock (jitter; after ``max_tries`` the gang fails ``gang_unschedulable``).  A gang
  that could not fit the federation even empty fails so at once.
* **Backfill**: a task that finds no free room may use reserved-but-idle capacity
  (any GM's holds, from the state updates) on a node where its known duration ends
  before the hold is due; the LM checks it again.  A task that could have run there
  but for its length waits ``reserved_for_gang``.

Who changes what: this piece owns the gang records; it reaches the GM's tables and
its placement through the core object it is given (``GangCore``), as ``core.py``'s
own handlers do, and ``core.py`` dispatches to it.  No clocks: ``now`` is an argument.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from common.effects import After, Effect, JobRefused, ToLm
from common.errors import ConfigError
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.messages import (
    CommitGang,
    GangHold,
    GangRetry,
    LaunchResponse,
    PlacedRef,
    Placement,
    ReleaseGang,
    RequestFailed,
    ReserveRequest,
    ReserveResponse,
    StateDelta,
    SubmitJob,
)
from common.model import Phase, Task, TaskKey, TaskState, WaitReason, fits
from global_master.ledger import InFlight, InFlightTable
from global_master.outbox import Outbox
from global_master.placement import Placer
from global_master.queues import UserQueues
from global_master.view import LmView

GangKey = tuple[UserId, JobId, int]
"""A gang stage: (user, job id, stage id)."""

UNSCHEDULABLE = "gang_unschedulable"


_COMMITTED = (TaskState.PLACED, TaskState.FINISHED, TaskState.FAILED)
"""What a gang's member is in only once its gang committed."""


class GangOwner(Protocol):
    """What of the GM core ``Gangs.drop`` uses (the cancel and revocation steps)."""

    gm_id: GmId

    def _answered(
        self, key: TaskKey, request_id: int, lm: LmId | None = None
    ) -> InFlight | None: ...


class GangCore(GangOwner, Protocol):
    """What of the GM core the gang flow uses (``global_master.core.GlobalMaster``)."""

    views: dict[LmId, LmView]
    placer: Placer
    queues: UserQueues
    inflight: InFlightTable
    outbox: Outbox

    @property
    def live(self) -> Mapping[TaskKey, Task]: ...

    def state_of(self, key: TaskKey) -> TaskState | None: ...

    def _note(
        self, task: Task, reason: WaitReason, now: float, lm: str = "", why: str = ""
    ) -> None: ...
    def _fail(
        self, task: Task, reason: str, effects: list[Effect], *, tell: bool = True
    ) -> None: ...
    def _requeue(self, task: Task, now: float, wait: bool = False) -> None: ...


@dataclass(frozen=True, slots=True)
class GangSettings:
    lease_s: float = 5.0
    """How long an LM holds a reservation (from its receipt)."""
    commit_margin_s: float = 1.0
    """No commit leaves later than this before the lease ends (its trip to the LM)."""
    refills: int = 3
    """Fills tried at once after an LM refused part of a reservation (its answer
    refreshed the view), as a launch's inconsistency is retried at once."""
    fill_period_s: float = 0.5
    """How often a gang that holds part of itself tries to fill the rest."""
    backoff_s: float = 0.5
    """The first back-off after a gang released its holds (doubled each time, jittered)."""
    max_tries: int = 8
    """Reservations that may come short before the gang fails ``gang_unschedulable``."""
    backfill_margin_s: float = 0.5
    """A backfill task must end this long before the hold it uses is due."""

    def __post_init__(self) -> None:
        if not 0 <= self.commit_margin_s < self.lease_s or self.max_tries < 1:
            raise ConfigError(
                f"gang settings: the commit margin ({self.commit_margin_s} s) must be below "
                f"the lease ({self.lease_s} s) and max_tries ({self.max_tries}) at least 1",
                reason="bad_gang_settings",
            )


@dataclass(slots=True)
class Gang:
    """One gang stage as its GM tracks it."""

    key: GangKey
    members: list[TaskKey]
    need: int
    tasks: dict[TaskKey, Task] = field(default_factory=dict)
    """Members out of their queues, owned by the gang."""
    holds: dict[TaskKey, tuple[LmId, int, bool]] = field(default_factory=dict)
    """Members held at an LM: where (LM, node, repartition)."""
    asked: dict[int, LmId] = field(default_factory=dict)
    """Reserve requests unanswered."""
    lease_until: float = 0.0
    tries: int = 0
    fits: bool = False
    """Known to fit the federation with nothing running (``Gangs._fits_empty``)."""
    refills: int = 0
    """Fills tried at once (the view refreshed by a refusal) since the last timer."""
    backing_off: bool = False
    timer: bool = False
    first_at: float = -1.0


class Gangs:
    """The gang stages of one GM's users and the holds the LMs announce."""

    def __init__(
        self, gm: GmId, settings: GangSettings | None = None, rng: random.Random | None = None
    ) -> None:
        self.settings = settings or GangSettings()
        self.rng = rng if rng is not None else random.Random(zlib.crc32(gm.encode()))
        self.member: dict[TaskKey, GangKey] = {}
        self.gangs: dict[GangKey, Gang] = {}
        self.holds: dict[LmId, tuple[int, tuple[GangHold, ...]]] = {}
        """Every LM's holds (any GM's), from its latest state: version, holds."""
        self.stats = {
            "gangs": 0, "committed": 0, "unschedulable": 0, "reserve_requests": 0,
            "released": 0, "backoffs": 0, "partial_starts": 0, "backfilled": 0,
            "committed_before": 0,
        }  # fmt: skip
        self.requests: dict[int, tuple[GangKey, LmId, list[TaskKey]]] = {}
        """Reserve requests unanswered: the gang, the LM, the tasks in request order."""
        self.commits: dict[int, list[TaskKey]] = {}
        """Commit requests unanswered (their answers are launch responses)."""
        self.allocation: list[float] = []
        """Per committed gang: the last member's commit - its first member's submission."""

    # ------------------------------------------------------------ admission
    def admitted(self, job: SubmitJob, effects: list[Effect]) -> list[Effect]:
        """A submission went through admission with ``effects``: unless they refuse it,
        its gang stages are known from now on (also for a job held behind its user's
        job being admitted, queued later).  Returns ``effects``."""
        if job.stages is None or not any(s.gang for s in job.stages):
            return effects
        if any(isinstance(e, JobRefused) and (e.user, e.job_id) == (job.user, job.job_id)
               for e in effects):  # fmt: skip
            return effects
        k = 0
        for s in job.stages:
            keys = [(t.user, t.task_id) for t in job.tasks[k : k + s.count]]
            k += s.count
            gk = (job.user, job.job_id, s.stage_id)
            if not s.gang or gk in self.gangs:
                continue
            need = s.min_count if 0 < s.min_count <= s.count else s.count
            self.gangs[gk] = Gang(gk, keys, need)
            self.stats["gangs"] += 1
            for key in keys:
                self.member[key] = gk
        return effects

    def describe(self, key: TaskKey) -> str | None:
        """Where task ``key`` stands in its gang, in words (None: not a gang's task, or
        its gang committed): for ``megha why``."""
        gk = self.member.get(key)
        g = self.gangs.get(gk) if gk is not None else None
        if g is None:
            return None
        _, job_id, stage = g.key
        of = f"gang stage {stage} of job {job_id}: {len(g.holds)} of {g.need} held"
        if key in g.holds:
            lm, node, _ = g.holds[key]
            return f"reserved on {lm} node {node} for its {of}; it starts when the gang commits"
        if g.backing_off:
            return f"its {of}; backing off after {g.tries} reservations came short"
        return f"its {of} (gang_incomplete); {len(g.tasks)} of {len(g.members)} tasks ready"

    # -------------------------------------------------------------- deciding
    def place(self, gm: GangCore, task: Task, now: float, effects: list[Effect]) -> bool:
        """A gang's task left its queue: the gang takes it (True), or it is placed as
        any task is (False: a member its gang no longer owns)."""
        g = self.gangs.get(self.member[task.key])
        if g is None:
            return False
        if not g.tasks and not g.holds and any(gm.state_of(k) in _COMMITTED for k in g.members):
            # a member ran already: the gang committed under an earlier incarnation of this
            # GM (no member runs before its commit), and this task was left over (a
            # ``min`` gang's rest, or one given back since): an ordinary task now, as it
            # was then -- made a gang again it would wait for ``need`` tasks that run
            self.stats["committed_before"] += 1
            self._forget(g)
            return False
        g.tasks[task.key] = task
        for key in g.members:
            t = gm.live.get(key)
            if t is not None and key not in g.tasks and key not in g.holds and gm.queues.remove(t):
                g.tasks[key] = t
        if g.first_at < 0:
            g.first_at = min(t.submitted_at for t in g.tasks.values())
        if g.asked or g.backing_off:
            return True  # answers or a timer will carry it on
        self._attempt(gm, g, now, effects)
        return True

    def _attempt(self, gm: GangCore, g: Gang, now: float, effects: list[Effect]) -> None:
        """Reserve what of the gang is not held yet, if enough fits in the view."""
        if len(g.tasks) < g.need:
            self._wait(gm, g, now, f"{len(g.tasks)} of {g.need} tasks ready")
            return
        if not g.fits:  # asked once: the federation's capacity does not change with load
            g.fits = self._fits_empty(gm, g)
            if not g.fits:
                self._give_up(gm, g, effects, f"{g.need} tasks cannot fit the federation")
                return
        plan = self._match(gm, g) if self._may_fit(gm, g) else []
        if len(g.holds) + len(plan) < g.need:
            for t, view, node, _ in plan:
                view.release(node, t.demand)
            self._wait(gm, g, now, f"{len(g.holds) + len(plan)} of {g.need} fit now")
            if g.holds:
                self._timer(g, self.settings.fill_period_s, effects)
            return
        if not g.holds:
            g.lease_until = now + self.settings.lease_s
        self._reserve(gm, g, plan, now, effects)

    def _may_fit(self, gm: GangCore, g: Gang) -> bool:
        """A cheap necessary condition before matching every task: the free room of
        every view's nodes, added up, covers the smallest demands still to hold."""
        short = g.need - len(g.holds)
        demands = sorted(t.demand for k, t in g.tasks.items() if k not in g.holds)[:short]
        if not demands:
            return True
        want = [sum(col) for col in zip(*demands, strict=True)]
        have = [0] * len(want)
        for view in gm.views.values():
            for r, col in enumerate(zip(*view.free, strict=True)):
                have[r] += sum(x for x in col if x > 0)
        return all(h >= w for h, w in zip(have, want, strict=True))

    def _match(self, gm: GangCore, g: Gang) -> list[tuple[Task, LmView, int, bool]]:
        """Alg. 1 for every member not held, each reserved in the view as it is found."""
        out: list[tuple[Task, LmView, int, bool]] = []
        choose = gm.queues.choose_node
        for t in g.tasks.values():
            if t.key in g.holds:
                continue
            for internal in (True, False):
                found = gm.placer.match(gm.views, t.constraints, t.demand, internal, choose)
                if found is not None:
                    view, node = found
                    view.reserve(node, t.demand)
                    out.append((t, view, node, not internal))
                    break
        return out

    def _reserve(
        self, gm: GangCore, g: Gang, plan: Sequence[tuple[Task, LmView, int, bool]],
        now: float, effects: list[Effect],
    ) -> None:  # fmt: skip
        """One reserve request per LM for the members ``plan`` matched."""
        by_lm: dict[LmId, list[tuple[Task, int, bool]]] = {}
        for t, view, node, rep in plan:
            by_lm.setdefault(view.lm, []).append((t, node, rep))
        lease = max(g.lease_until - now, 0.0)
        user, job_id, stage = g.key
        for lm, items in by_lm.items():
            rid = gm.outbox.request_id()
            placements = []
            for t, node, rep in items:
                t.attempt += 1
                t.mark(Phase.PROCESSING, now)
                gm.inflight[t.key] = InFlight(t, lm, node, rep, rid)
                placements.append(Placement(
                    spec=t.spec, attempt=t.attempt, node=NodeIndex(node), repartition=rep,
                    queued_at=t.submitted_at,
                ))  # fmt: skip
            g.asked[rid] = lm
            self.requests[rid] = (g.key, lm, [t.key for t, _, _ in items])
            self.stats["reserve_requests"] += 1
            effects.append(ToLm(lm, ReserveRequest(
                gm=gm.gm_id, lm=lm, request_id=rid, user=user, job_id=job_id, stage=stage,
                placements=tuple(placements), lease_s=lease, due_s=lease,
                known_version=gm.views[lm].version,
            )))  # fmt: skip

    # --------------------------------------------------------------- answers
    def on_reserve_response(
        self, gm: GangCore, resp: ReserveResponse, now: float, effects: list[Effect]
    ) -> list[Effect]:
        """What an LM holds of a gang (``effects``: what its state asked for already);
        once every LM asked has answered, commit or fill."""
        asked = self.requests.pop(resp.request_id, None)
        if asked is None or asked[1] != resp.lm:
            return effects
        gk, lm, keys = asked
        g = self.gangs.get(gk)
        if g is not None:
            g.asked.pop(resp.request_id, None)
        held = False
        for i, key in enumerate(keys):
            res = resp.results[i] if i < len(resp.results) else None
            fl = gm._answered(key, resp.request_id, lm)
            held = held or (res is not None and res.accepted)  # (the LM holds it)
            if fl is None or res is None or not res.accepted:
                if fl is not None:
                    why = res.reason if res is not None else "missing_result"
                    gm._note(fl.task, WaitReason.REFUSED_BY_LM, now, lm, why)
                continue
            if g is not None:
                g.holds[key] = (lm, fl.node, fl.repartition)
        if g is None:  # the gang ended meanwhile: what the LM holds of it goes back
            if held:
                effects.append(self._release_msg(gm, lm, gk))
            return effects
        if not g.asked:
            self._round_over(gm, g, now, effects)
        return effects

    def request_failed(self, gm: GangCore, msg: RequestFailed, now: float) -> list[Effect]:
        """No answer will come to a reserve request (a commit's is a launch's): nothing
        of it is held; the LM is asked to let go of it all the same."""
        effects: list[Effect] = []
        asked = self.requests.pop(msg.request_id, None)
        if asked is None or asked[1] != msg.lm:
            if msg.request_id in self.commits:
                self.stats["partial_starts"] += len(self.commits.pop(msg.request_id)) > 0
            return effects
        gk, lm, keys = asked
        for key in keys:
            gm._answered(key, msg.request_id, lm)
        effects.append(self._release_msg(gm, lm, gk))
        g = self.gangs.get(gk)
        if g is not None:
            g.asked.pop(msg.request_id, None)
            if not g.asked:
                self._round_over(gm, g, now, effects)
        return effects

    def commit_answered(self, msg: LaunchResponse) -> list[Effect]:
        """An LM answered a commit: any task refused there is a partial start (the
        others of its gang started): counted, and placed on as a single task."""
        keys = self.commits.pop(msg.request_id, None)
        if keys is not None and not all(r.accepted for r in msg.results):
            self.stats["partial_starts"] += 1
        return []

    def _round_over(self, gm: GangCore, g: Gang, now: float, effects: list[Effect]) -> None:
        """Every LM asked answered: commit, fill, or release and back off."""
        s = self.settings
        in_time = now < g.lease_until - s.commit_margin_s
        if len(g.holds) >= g.need and in_time:
            self._commit(gm, g, now, effects)
        elif in_time and g.holds and g.refills < s.refills:
            g.refills += 1  # an inconsistency: the answer refreshed the view, fill at once
            self._attempt(gm, g, now, effects)
        elif in_time and g.holds:
            self._timer(g, s.fill_period_s, effects)
        else:
            self._back_off(gm, g, now, effects)

    def _commit(self, gm: GangCore, g: Gang, now: float, effects: list[Effect]) -> None:
        """Start what is held (at least ``need``): a commit per LM, answered as a launch."""
        by_lm: dict[LmId, list[TaskKey]] = {}
        for key, (lm, _, _) in g.holds.items():
            by_lm.setdefault(lm, []).append(key)
        user, job_id, stage = g.key
        for lm, keys in by_lm.items():
            tasks = [g.tasks[k] for k in keys]
            placements = [
                Placement(spec=t.spec, attempt=t.attempt, node=NodeIndex(g.holds[t.key][1]))
                for t in tasks
            ]
            rid = gm.outbox.launch(
                lm, placements, keys, False, now, gm.views[lm].version
            ).request_id
            self.commits[rid] = keys
            for t in tasks:
                _, node, rep = g.holds[t.key]
                gm.views[lm].reserve(node, t.demand)
                gm.inflight[t.key] = InFlight(t, lm, node, rep, rid)
                gm.queues.on_dispatched(t, now)
            refs = tuple(
                PlacedRef(user=t.user, task_id=t.task_id, attempt=t.attempt) for t in tasks
            )
            effects.append(ToLm(lm, CommitGang(
                gm=gm.gm_id, lm=lm, request_id=rid, user=user, job_id=job_id, stage=stage,
                tasks=refs, known_version=gm.views[lm].version,
            )))  # fmt: skip
        self.stats["committed"] += 1
        self.allocation.append(now - g.first_at)
        for key, t in g.tasks.items():  # a min gang's others: ordinary tasks from now on
            if key not in g.holds:
                gm._requeue(t, now)
        self._forget(g)

    def _back_off(self, gm: GangCore, g: Gang, now: float, effects: list[Effect]) -> None:
        """The gang came short: every hold goes back; try again after a jittered,
        growing delay, or fail ``gang_unschedulable`` after ``max_tries``."""
        for lm in dict.fromkeys(lm for lm, _, _ in g.holds.values()):
            effects.append(self._release_msg(gm, lm, g.key))
        g.holds.clear()
        g.tries += 1
        s = self.settings
        if g.tries >= s.max_tries:
            self._give_up(gm, g, effects, f"no reservation of {g.need} held after {g.tries} tries")
            return
        self.stats["backoffs"] += 1
        g.backing_off = True
        delay = s.backoff_s * 2 ** min(g.tries - 1, 6) * (0.5 + self.rng.random())
        self._timer(g, delay, effects)

    def retry(self, gm: GangCore, msg: GangRetry, now: float) -> list[Effect]:
        """A gang's timer: fill what is not held, or (backed off) try afresh."""
        effects: list[Effect] = []
        g = self.gangs.get((msg.user, msg.job_id, msg.stage))
        if g is None:
            return effects
        g.timer = False
        g.refills = 0
        if g.asked:
            return effects
        if g.backing_off:
            g.backing_off = False
        elif g.holds and now >= g.lease_until - self.settings.commit_margin_s:
            self._back_off(gm, g, now, effects)
            return effects
        self._attempt(gm, g, now, effects)
        return effects

    def drop(self, gm: GangOwner, keys: Iterable[TaskKey], effects: list[Effect]) -> list[Task]:
        """Tasks ``keys`` end out of turn (their job cancelled, their user revoked, a
        parent stage failed): the open gangs they belong to go.  What the LMs hold of
        them is released (what they were asked to hold, when they answer), and nothing
        of them is reserved or committed later.  Returns the tasks those gangs had
        taken out of their queues, out of flight, for the caller to end."""
        member = self.member
        out: list[Task] = []
        for gk in dict.fromkeys(member[k] for k in keys if k in member):
            g = self.gangs.get(gk)
            if g is None:
                continue
            for lm in dict.fromkeys(lm for lm, _, _ in g.holds.values()):
                effects.append(self._release_msg(gm, lm, gk))
            for rid, lm in g.asked.items():  # (its answer finds no gang: released then)
                for key in self.requests[rid][2]:
                    gm._answered(key, rid, lm)
            out.extend(g.tasks.values())
            self._forget(g)
        return out

    # ------------------------------------------------------------- backfill
    def saw(self, delta: StateDelta) -> None:
        """An LM's state: its holds (any GM's) replace what this GM knew of them."""
        known = self.holds.get(delta.lm)
        if (known is None and delta.holds) or (known is not None and delta.version >= known[0]):
            self.holds[delta.lm] = (delta.version, tuple(delta.holds))

    def backfill(self, gm: GangCore, task: Task, now: float) -> tuple[LmView, int] | None:
        """A node whose idle holds, due after ``task`` ends, make room for it; None
        (and, if only its length kept it out, it waits ``reserved_for_gang``)."""
        ends = now + task.duration + self.settings.backfill_margin_s
        too_long = False
        for lm, (_, holds) in self.holds.items():
            view = gm.views.get(lm)
            if view is None or not holds:
                continue
            for node, room, due in _idle_by_node(holds, view):
                if task.constraints & ~view.node_masks[node] or not fits(room, task.demand):
                    continue
                if due >= ends:
                    self.stats["backfilled"] += 1
                    return view, node
                too_long = True
        if too_long:
            gm._note(task, WaitReason.RESERVED_FOR_GANG, now)
        return None

    # --------------------------------------------------------------- internals
    def _wait(self, gm: GangCore, g: Gang, now: float, why: str) -> None:
        """The gang cannot reserve now: its members wait out of their queues; one of
        them waits in the GM's index (or its queue) to bring the gang back."""
        free = [t for k, t in g.tasks.items() if k not in g.holds]
        for t in free:
            gm._note(t, WaitReason.GANG_INCOMPLETE, now, why=why)
        if free and not g.holds:
            lead = free[0]
            del g.tasks[lead.key]
            gm._requeue(lead, now, wait=True)

    def _give_up(self, gm: GangCore, g: Gang, effects: list[Effect], why: str) -> None:
        """The gang fails as a whole, explicitly."""
        self.stats["unschedulable"] += 1
        for key in g.members:
            t = g.tasks.get(key)
            if t is None:
                t = gm.live.get(key)
                if t is None or not gm.queues.remove(t):
                    continue
            gm._fail(t, f"{UNSCHEDULABLE}: {why}", effects)
        self._forget(g)

    def _fits_empty(self, gm: GangCore, g: Gang) -> bool:
        """Could ``need`` of the gang's tasks fit the federation with nothing running?"""
        room: list[tuple[int, list[int]]] = [
            (view.node_masks[i], list(cap)) for view in gm.views.values()
            for i, cap in enumerate(view.capacity)
        ]  # fmt: skip
        placed = 0
        for t in g.tasks.values():
            for mask, free in room:
                if not t.constraints & ~mask and fits(free, t.demand):
                    for r, d in enumerate(t.demand):
                        free[r] -= d
                    placed += 1
                    break
            if placed >= g.need:
                return True
        return False

    def _timer(self, g: Gang, delay: float, effects: list[Effect]) -> None:
        if not g.timer:
            g.timer = True
            user, job_id, stage = g.key
            effects.append(After(delay, GangRetry(user=user, job_id=job_id, stage=stage)))

    def _release_msg(self, gm: GangOwner, lm: LmId, gk: GangKey) -> ToLm:
        self.stats["released"] += 1
        user, job_id, stage = gk
        return ToLm(lm, ReleaseGang(gm=gm.gm_id, lm=lm, user=user, job_id=job_id, stage=stage))

    def _forget(self, g: Gang) -> None:
        """The gang committed or failed: its tasks are ordinary tasks from now on."""
        del self.gangs[g.key]
        for key in g.members:
            self.member.pop(key, None)


def _idle_by_node(holds: Sequence[GangHold], view: LmView) -> list[tuple[int, list[int], float]]:
    """Per node with holds: the view's free room plus what is held idle there, and the
    earliest time a hold there is due."""
    per: dict[int, tuple[list[int], float]] = {}
    for h in holds:
        if h.node >= view.n:
            continue
        got = per.get(h.node)
        if got is None:
            room = [max(f, 0) for f in view.free[h.node]]
            per[h.node] = got = (room, h.due)
        room, due = got
        for r, x in enumerate(h.held):
            room[r] += x
        per[h.node] = (room, min(due, h.due))
    return [(n, room, due) for n, (room, due) in per.items()]


__all__ = ["UNSCHEDULABLE", "Gang", "GangCore", "GangKey", "GangSettings", "Gangs"]
