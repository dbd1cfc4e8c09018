"""A federation of one or two GMs and two or three LMs under a hostile network.

The cores (GMs, LMs and the real worker-pool cores) are driven by hand through
``tests.conftest.Network``: Hypothesis chooses which message is delivered next, which
is dropped or duplicated, when pools start and finish tasks, when LMs send heartbeats
and when a worker dies or comes back.  Half the runs send every message through the
codec (as the live federation does), half share objects (as the simulator does).

What the network may do, and why:

* GM -> LM requests (launch, preemption, snapshot) and LM -> GM answers and task
  events are delivered **in any order**; task events may also be **duplicated** (the
  broker redelivers; attempts make the GM ignore a second copy).  An event may
  overtake the answer to the request that placed its task.
* Periodic state updates (``StateUpdated`` heartbeats, a fan-out) may be delivered
  in any order, **dropped** or **duplicated**: per-node versions make them
  order-independent and a gap is repaired with a snapshot.
* LM -> pool commands arrive in order per pool.  A node may die with its tasks, or
  only fall silent (its pool goes on running and reporting what it had; its LM has
  moved those tasks on and tells the pool to stop them).

After every step: no node over-allocated, resources conserved on live nodes, each
task in exactly one state (queued, in flight or placed at its GM, or ended with an
outcome to its user) and each change of state, message by message, one that
``common.transitions.NEXT`` allows, active on at most one LM and then dispatched or placed at its
GM, a pool never running two attempts of one task, LM versions monotone, GM view
versions monotone (a snapshot of the same LM incarnation is merged node by node, so
not even a stale one takes a view back), every ledger adding up.
At the end the network is drained, dead workers come back, and every task must have
an outcome: nothing refused, preempted or orphaned is ever lost, nothing ends twice.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from common.effects import Reply
from common.ids import GmId, LmId, NodeIndex
from common.messages import (
    CheckWorkers,
    RegisterWorkers,
    StateUpdated,
    TaskEvents,
    WorkerHeartbeat,
)
from common.model import TaskKey, TaskSpec, TaskState
from common.overload import OverloadPolicy
from common.transitions import NEXT
from global_master.core import GlobalMaster
from global_master.journal import Journal
from local_master.core import LocalMaster
from tests.conftest import Envelope, Network, alive, make_gm, make_lm, make_task

CAPACITIES = ((2, 2), (4, 2), (4, 4))
MASKS = (0b01, 0b10, 0b11)
TIMEOUT = 0.5
HOLD = 4 * TIMEOUT
"""``lost_after`` when a run holds a silent node's tasks (half the runs; the others give
them up at the timeout)."""


class Federation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.gms: dict[GmId, GlobalMaster] = {}
        self.lms: dict[LmId, LocalMaster] = {}
        self.net = Network({}, {})
        self.tasks: dict[TaskKey, TaskSpec] = {}
        self.owner: dict[TaskKey, GmId] = {}
        self.dead: set[tuple[LmId, NodeIndex]] = set()
        self.crashed: set[tuple[LmId, NodeIndex]] = set()
        self.lost_after = 0.0
        self.ended: set[TaskKey] = set()
        """Tasks of jobs their GM refused at admission (dead-lettered when live)."""
        self.losses = 0
        self.jobs = 0
        self.users: list[tuple[str, str]] = []
        self.lm_versions: dict[LmId, int] = {}
        self.view_versions: dict[tuple[GmId, LmId], tuple[int, list[int]]] = {}

    def tick(self) -> float:
        self.now += 0.25
        return self.now

    @initialize(
        copies=st.booleans(),
        hold=st.booleans(),
        reroute=st.booleans(),
        window=st.sampled_from((0, 1, 2)),
        admit_slice=st.sampled_from((1000, 1, 2)),
        shares=st.sampled_from(((0.2, 0.6, 0.2), (0.6, 0.2, 0.2), (1 / 3, 1 / 3, 1 / 3))),
        n_gms=st.integers(1, 2),
        clusters=st.lists(
            st.lists(
                st.tuples(st.sampled_from(CAPACITIES), st.sampled_from(MASKS)),
                min_size=1,
                max_size=3,
            ),
            min_size=2,
            max_size=3,
        ),
    )
    def build(
        self,
        copies: bool,
        hold: bool,
        reroute: bool,
        window: int,
        admit_slice: int,
        shares: tuple[float, float, float],
        n_gms: int,
        clusters: list[list[tuple[tuple[int, int], int]]],
    ) -> None:
        self.lost_after = HOLD if hold else 0.0
        gm_names = [f"gm{g}" for g in range(n_gms)]
        self.users = [("u0", "gm0"), ("u1", "gm0"), ("u2", gm_names[-1])]
        users = [(u, g, share) for (u, g), share in zip(self.users, shares, strict=True)]
        lm_names = [f"lm{i}" for i in range(len(clusters))]
        k = 0
        for name, nodes in zip(lm_names, clusters, strict=True):
            home = []
            for _ in nodes:
                home.append(gm_names[k % n_gms])
                k += 1
            lm = make_lm(name, [(c[0], c[1], m) for c, m in nodes], home, reroute=reroute)
            self.lms[lm.lm_id] = lm
        for g in gm_names:
            gm = make_gm(
                g, lm_names, users, max_retries=2, patience=3,
                overload=OverloadPolicy(launch_window=window), admit_slice=admit_slice,
            )  # fmt: skip
            gm.journal = Journal(per_task=6, ended=8)
            self.gms[gm.gm_id] = gm
            _follow_states(gm)
        self.net = Network(self.gms, self.lms, copies=copies)
        self.net.start(self.now)
        for lm in self.lms.values():
            alive(lm, self.now)

    # ------------------------------------------------------------------ rules
    @rule(
        user=st.integers(0, 2),
        cpu=st.sampled_from((1, 1, 2, 3, 4)),
        mem=st.sampled_from((1, 1, 2, 3)),
        constraints=st.sampled_from((0, 0, 0b01, 0b10, 0b11, 0b100)),
        count=st.integers(1, 4),
    )
    def submit(self, user: int, cpu: int, mem: int, constraints: int, count: int) -> None:
        name, gm = self.users[user]
        self.jobs += 1
        batch: list[TaskSpec] = []
        for _ in range(count):
            tid = f"t{len(self.tasks) + len(batch)}"
            batch.append(
                make_task(
                    cpu, mem, constraints=constraints, user=name, task_id=tid, job=f"j{self.jobs}"
                )
            )
        self.net.submit(GmId(gm), batch, self.tick())
        for t in batch:
            self.tasks[(t.user, t.task_id)] = t
            self.owner[(t.user, t.task_id)] = GmId(gm)

    def _ended(self) -> set[TaskKey]:
        """Tasks ended without an outcome: failed by the test, or of a job refused whole
        (with a reason; at once, or later if it was held behind a job being admitted)."""
        refused = {(r.user, r.job_id) for r in self.net.refused}
        return self.ended | {k for k, t in self.tasks.items() if (t.user, t.job_id) in refused}

    @rule(gm=st.integers(0, 1), max_tasks=st.integers(1, 4))
    def decide(self, gm: int, max_tasks: int) -> None:
        g = list(self.gms)[gm % len(self.gms)]
        self.net.decide(g, self.tick(), max_tasks)

    def _deliver(self, index: int) -> None:
        self.net.deliver(index, self.tick())

    @precondition(lambda self: self.net.wire)
    @rule(pick=st.integers(0, 10_000))
    def deliver(self, pick: int) -> None:
        self._deliver(pick % len(self.net.wire))

    @precondition(lambda self: self.net.wire)
    @rule()
    def deliver_oldest(self) -> None:
        self._deliver(0)

    @precondition(lambda self: self.net.wire)
    @rule()
    def settle(self) -> None:
        """A calm spell: everything on the wire now arrives, in order."""
        for _ in range(len(self.net.wire)):
            self._deliver(0)

    @rule()
    def work_all(self) -> None:
        self.net.work_all(self.tick())

    def _updates(self) -> list[int]:
        return [i for i, e in enumerate(self.net.wire) if isinstance(e.msg, StateUpdated)]

    def _events(self) -> list[int]:
        return [i for i, e in enumerate(self.net.wire) if isinstance(e.msg, TaskEvents)]

    @precondition(lambda self: self._updates())
    @rule(pick=st.integers(0, 10_000))
    def drop_update(self, pick: int) -> None:
        idx = self._updates()
        self.net.wire.pop(idx[pick % len(idx)])

    @precondition(lambda self: self._updates())
    @rule(pick=st.integers(0, 10_000))
    def duplicate_update(self, pick: int) -> None:
        idx = self._updates()
        env = self.net.wire[idx[pick % len(idx)]]
        self.net.wire.append(Envelope(env.dst, env.msg, env.to_lm))

    @precondition(lambda self: self._events())
    @rule(pick=st.integers(0, 10_000))
    def redeliver_events(self, pick: int) -> None:
        """The broker delivers a batch of task events a second time."""
        idx = self._events()
        env = self.net.wire[idx[pick % len(idx)]]
        self.net.wire.append(Envelope(env.dst, env.msg, env.to_lm))

    @rule(lm=st.integers(0, 2))
    def heartbeat(self, lm: int) -> None:
        name = list(self.lms)[lm % len(self.lms)]
        self.net.heartbeat(name, self.tick())

    def _busy_pools(self) -> list[LmId]:
        return sorted(k for k, q in self.net.inbox.items() if q)

    @precondition(lambda self: self._busy_pools())
    @rule(pick=st.integers(0, 10_000))
    def work(self, pick: int) -> None:
        busy = self._busy_pools()
        self.net.work(busy[pick % len(busy)], self.tick())

    @precondition(lambda self: self.net.running)
    @rule(pick=st.integers(0, 10_000), fail=st.booleans())
    def finish(self, pick: int, fail: bool) -> None:
        lm, _, user, tid = self.net.running[pick % len(self.net.running)]
        self.net.finish(tid, self.tick(), "failed" if fail else "finished", lm=lm, user=user)

    @precondition(lambda self: len(self.dead) < 2 and self.losses < 3)
    @rule(lm=st.integers(0, 2), node=st.integers(0, 2), crashed=st.booleans())
    def lose_worker(self, lm: int, node: int, crashed: bool) -> None:
        """A node falls silent: crashed (its tasks die) or only cut off (its pool goes on
        running and reporting what it had; its LM has moved those tasks on)."""
        name = list(self.lms)[lm % len(self.lms)]
        core = self.lms[name]
        n = NodeIndex(node % core.n_nodes)
        if not core.alive[n]:
            return
        self.losses += 1
        if crashed:
            self.net.lose_node(name, n)
            self.crashed.add((name, n))
        self.dead.add((name, n))
        self._silence(name, 3 * TIMEOUT)
        assert not core.alive[n]

    def _silence(self, name: LmId, seconds: float) -> None:
        """The LM's periodic timers while its dead nodes stay silent."""
        core = self.lms[name]
        live = tuple(
            NodeIndex(i) for i in range(core.n_nodes) if (name, NodeIndex(i)) not in self.dead
        )
        check = CheckWorkers(timeout=TIMEOUT, lost_after=self.lost_after)
        for _ in range(int(seconds / 0.25)):
            now = self.tick()
            self.net.lm_input(name, WorkerHeartbeat(lm=name, nodes=live, at=now), now)
            self.net.lm_input(name, check, now)

    @precondition(lambda self: self.dead and self.lost_after > 0)
    @rule(pick=st.integers(0, 10_000))
    def silent_past_lost_after(self, pick: int) -> None:
        """A dead node stays silent until its LM gives up what it held."""
        lm, node = sorted(self.dead)[pick % len(self.dead)]
        self._silence(lm, self.lost_after + TIMEOUT)
        assert not self.lms[lm].nodes.on_node[node]

    @precondition(lambda self: self.dead)
    @rule(pick=st.integers(0, 10_000))
    def revive_worker(self, pick: int) -> None:
        lm, node = sorted(self.dead)[pick % len(self.dead)]
        self._revive(lm, node)

    def _revive(self, lm: LmId, node: NodeIndex) -> None:
        """A cut-off node speaks again; a crashed one comes back as a restarted pool
        does, registering what it runs (nothing)."""
        self.dead.discard((lm, node))
        now = self.tick()
        if (lm, node) in self.crashed:
            self.crashed.discard((lm, node))
            reg = RegisterWorkers(lm=lm, nodes=(node,), at=now)
            effects = self.lms[lm].handle(reg, now)
            self.net.send([e for e in effects if not isinstance(e, Reply)], now, src_lm=lm)
        else:
            self.net.lm_input(lm, WorkerHeartbeat(lm=lm, nodes=(node,), at=now), now)

    # ------------------------------------------------------------- invariants
    @invariant()
    def nodes_conserve_resources(self) -> None:
        for lm in self.lms.values():
            for n in range(lm.n_nodes):
                free, cap = lm.free[n], lm.nodes.capacity[n]
                assert all(0 <= f <= c for f, c in zip(free, cap, strict=True)), (lm.lm_id, n)
                if not lm.alive[n]:  # dead: nothing placed; held only if this run holds
                    assert not any(free), (lm.lm_id, n)
                    assert self.lost_after > 0 or not lm.nodes.on_node[n]
                    continue
                held = [0] * len(cap)
                for k in lm.nodes.on_node[n]:
                    a = lm.active[k]
                    assert a.node == n
                    for r, d in enumerate(a.spec.demand):
                        held[r] += d
                assert [f + h for f, h in zip(free, held, strict=True)] == list(cap)
            assert sum(len(s) for s in lm.nodes.on_node) == len(lm.active)

    @invariant()
    def each_task_in_exactly_one_state(self) -> None:
        queued: dict[GmId, set[TaskKey]] = {}
        for g, gm in self.gms.items():
            keys = [t.key for t in gm.queues]
            assert len(keys) == len(set(keys)), f"a task is queued twice at {g}"
            assert len(keys) == len(gm.queues)
            queued[g] = set(keys)
        admitting = (
            {  # of a job admitted in slices, not yet queued, or held behind one
                (a.job.user, spec.task_id)
                for gm in self.gms.values()
                for a in gm.admitting.values()
                for spec in a.job.tasks[a.queued :]
            }
            | {
                (m.job.user, spec.task_id)
                for gm in self.gms.values()
                for held in gm.held_admissions.values()
                for m, _ in held
                for spec in m.job.tasks
            }
        )
        ended = self._ended()
        for k, g in self.owner.items():
            gm = self.gms[g]
            where = [
                k in admitting,
                k in queued[g],
                k in gm.inflight,
                k in gm.placed,
                k in self.net.outcomes or k in ended,
            ]
            assert sum(where) == 1, (k, where)
            for other, ogm in self.gms.items():
                if other != g:
                    assert k not in queued[other]
                    assert k not in ogm.inflight
                    assert k not in ogm.placed

    @invariant()
    def each_user_s_task_count_is_that_of_the_ledger(self) -> None:
        for gm in self.gms.values():
            assert gm.live.per_user == Counter(user for user, _ in gm.live)

    @invariant()
    def a_task_runs_in_one_place_its_gm_knows_of(self) -> None:
        seen: set[TaskKey] = set()
        for lm in self.lms.values():
            for k in lm.active:
                assert k not in seen, f"{k} active on two LMs"
                seen.add(k)
                state = self.gms[self.owner[k]].state_of(k)
                assert state in (TaskState.DISPATCHED, TaskState.PLACED), (k, state)

    @invariant()
    def versions_never_go_backwards(self) -> None:
        for name, lm in self.lms.items():
            assert lm.version >= self.lm_versions.get(name, 0)
            self.lm_versions[name] = lm.version
        for g, gm in self.gms.items():
            for name, view in gm.views.items():
                before = self.view_versions.get((g, name))
                if before is not None:
                    assert view.version >= before[0]
                    assert all(a >= b for a, b in zip(view.node_version, before[1], strict=True))
                self.view_versions[(g, name)] = (view.version, list(view.node_version))

    @invariant()
    def in_flight_demands_add_up(self) -> None:
        """The per-user in-flight counts fairness reads are those of the table."""
        for gm in self.gms.values():
            want: dict[str, dict[tuple[int, ...], int]] = {}
            for fl in gm.inflight.values():
                per = want.setdefault(fl.task.user, {})
                per[tuple(fl.task.demand)] = per.get(tuple(fl.task.demand), 0) + 1
            assert gm.inflight.demands == want
            for user in want:  # the cached share is the sum's
                got = gm.inflight.share(user, gm.fairness.share_of)
                assert got == pytest.approx(
                    sum(gm.fairness.share_of(fl.task.demand) for fl in gm.inflight.values()
                        if fl.task.user == user)
                )  # fmt: skip

    @invariant()
    def journals_stay_bounded(self) -> None:
        """Operators' timelines exist only for tasks a GM holds, each bounded, and only
        the latest ended tasks are kept."""
        for gm in self.gms.values():
            j = gm.journal
            assert j is not None
            assert set(j.trails) <= set(gm.live)
            assert all(len(t.steps) <= j.per_task for t in j.trails.values())
            assert len(j.ended) <= j.limit
            assert not set(j.ended) & set(gm.live)

    @invariant()
    def ledgers_add_up(self) -> None:
        """Every task a GM holds, and every outcome, says where all its time went."""
        tasks = [o.task for o in self.net.outcomes.values()]
        for gm in self.gms.values():
            tasks.extend(gm.placed.values())
            tasks.extend(fl.task for fl in gm.inflight.values())
        for t in tasks:
            spent = t.components()
            assert all(x >= -1e-9 for x in spent)
            if t.started_at >= 0:
                assert sum(spent) == pytest.approx(t.started_at - t.submitted_at)
                assert t.first_started_at <= t.started_at

    # ------------------------------------------------------------------ drain
    def teardown(self) -> None:
        """Heal the network and the workers; every task must end finished or failed."""
        if not self.gms:
            return
        for lm, node in sorted(self.dead):
            self._revive(lm, node)
        last: list[object] = []
        for _ in range(20 + 3 * len(self.owner)):  # progress stops long before
            now = self.tick()
            self.net.run(now)
            self.net.work_all(now)
            for lm, _, user, tid in self.net.running:
                self.net.finish(tid, now, lm=lm, user=user)
            for name in self.lms:
                self.net.heartbeat(name, now)
            self.net.run(now)
            for g, gm in self.gms.items():
                for _ in range(50):
                    if not gm.has_work():
                        break
                    self.net.decide(g, now, 8)
                    self.net.run(now)
            self.nodes_conserve_resources()
            self.each_task_in_exactly_one_state()
            ended = self._ended()
            if all(k in self.net.outcomes or k in ended for k in self.owner):
                assert not any(gm.jobs for gm in self.gms.values()), "a finished job lingers"
                return
            states = [self.gms[g].state_of(k) for k, g in self.owner.items()]
            if states == last and not self.net.wire and not self._busy_pools():
                break  # quiet and no progress: stuck for good
            last = states
        stuck = {
            k: self.gms[g].state_of(k)
            for k, g in self.owner.items()
            if k not in self.net.outcomes and k not in self._ended()
        }
        raise AssertionError(f"tasks never finished nor failed: {stuck}")


def _held(gm: GlobalMaster) -> dict[TaskKey, TaskState | None]:
    keys = {*gm.live, *gm.inflight, *gm.placed, *gm.finished, *gm.failed}
    return {k: gm.state_of(k) for k in keys}


def _follows(was: TaskState | None, now: TaskState | None) -> bool:
    """``now`` may follow ``was``; or the task ended (finished or failed) and its job
    retired in the one message (its last task ended: every record of it goes)."""
    if now in NEXT[was]:
        return True
    ends = NEXT[was] & {TaskState.FINISHED, TaskState.FAILED}
    return now is None and any(None in NEXT[e] for e in ends)


def _follow_states(gm: GlobalMaster) -> None:
    """Every message ``gm`` handles moves each task's state only as the table says
    (``common.transitions.NEXT``; a task not held before or after is ``None``)."""
    handle = gm.handle

    def handle_checked(msg: object, now: float) -> list[object]:
        before = _held(gm)
        effects = handle(msg, now)
        after = _held(gm)
        for key in before.keys() | after.keys():
            was, now_in = before.get(key), after.get(key)
            if was != now_in:
                assert _follows(was, now_in), (type(msg).__name__, key, was, now_in)
        return effects  # type: ignore[return-value]

    setattr(gm, "handle", handle_checked)  # noqa: B010


Federation.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_federation = Federation.TestCase
