"""Priority classes under any sequence of what a GM does, and in a hostile federation.

* Order, up to the aging bound: whenever a task of class ``c`` leaves a GM's queues
  while a task of class ``c' > c`` is still held there, some task of class ``c`` held
  at that moment had waited at least ``(c' - c) * aging_s`` (the one its class was
  ranked by); with no aging, never.  The same for the waiting index's freed room.
* The federation of ``test_federation_stateful`` (its hostile network, its
  invariants: no node over-allocated, every task in one state, nothing lost or run
  twice) with jobs of three classes under classed ``fifo`` or ``srpt`` queues, where
  higher classes preempt lower ones (``PreemptRequest.lower_only``) with no budget.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule
from msgspec.structs import replace

from common.ids import GmId, LmId, UserId
from common.model import Task, TaskSpec, UserConfig
from common.overload import OverloadPolicy
from global_master.core import GlobalMaster
from global_master.journal import Journal
from global_master.policy import make_policy
from global_master.policy.classes import ClassedQueue, ClassedQueues
from global_master.queues import UserQueues
from tests.conftest import Network, alive, make_lm, make_task
from tests.property.test_federation_stateful import CAPACITIES, MASKS, Federation

USERS = [UserId("a"), UserId("b")]
AGING_S = 10.0


def held(q: ClassedQueues) -> list[Task]:
    return [t for u in USERS for t in q.queues[u]]


def check_aging_bound(popped: Task, before: list[Task], now: float, aging_s: float) -> None:
    """``popped`` left while ``before`` were held (it among them)."""
    c = popped.spec.priority
    higher = [t.spec.priority for t in before if t.spec.priority > c]
    if not higher:
        return
    waited = max(now - t.submitted_at for t in before if t.spec.priority == c)
    assert waited >= (max(higher) - c) * aging_s - 1e-9, (c, max(higher), waited)


steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 1), st.integers(0, 3), st.integers(0, 3)),
        st.tuples(st.just("pop"), st.booleans()),
        st.tuples(st.just("time"), st.floats(0.0, 25.0)),
        st.tuples(st.just("wake"), st.integers(1, 3)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.sampled_from(["fifo", "srpt"]), st.sampled_from([AGING_S, float("inf")]))
def test_a_lower_class_goes_first_only_past_the_aging_bound(
    ops: list[tuple], policy: str, aging_s: float
) -> None:
    users = [UserConfig(u, GmId("gm0"), 0.5) for u in USERS]
    q = make_policy(policy, users, aging_s=aging_s)(GmId("gm0"), USERS)
    assert isinstance(q, ClassedQueues)
    now, n = 0.0, 0
    for op in ops:
        if op[0] == "submit":
            n += 1
            spec = replace(
                make_task(user=str(USERS[op[1]]), job=f"j{op[3]}", duration=1.0 + op[3]),
                priority=op[2],
            )
            q.push_back(Task(spec=spec, submitted_at=now))
        elif op[0] == "time":
            now += op[1]
            q.on_finished(Task(spec=make_task(user="a", job="x")), now)  # the GM reports
        elif op[0] == "pop":
            before = held(q)
            t = q.pop()
            if t is None:
                assert not before
                continue
            check_aging_bound(t, before, now, aging_s)
            if op[1]:
                q.waiting.add(t)  # no room: into the waiting index
            else:
                q.on_dispatched(t, now)
        else:  # freed room for one class of demand: the waiting index's order
            classes = list(q.waiting.by_class)
            if not classes:
                continue
            cls = classes[0]
            for _ in range(op[1]):
                before = [t for users in q.waiting.by_class.get(cls, {}).values() for t in users]
                got = q.waiting.take(cls, 1, USERS)
                if not got:
                    break
                check_aging_bound(got[0], before, now, aging_s)
                q.push_front(got[0])
        for sub in (
            *q.queues.values(),
            *(x for u in q.waiting.by_class.values() for x in u.values()),
        ):
            assert isinstance(sub, ClassedQueue)
            assert len(sub) == sum(len(inner) for inner in sub.by_class.values())


class ClassedFederation(Federation):
    """``Federation`` with classed queues and jobs of classes 0-2."""

    @initialize(
        copies=st.booleans(),
        policy=st.sampled_from(["fifo", "srpt"]),
        aging_s=st.sampled_from([1.0, float("inf")]),
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
    def build(  # type: ignore[override]
        self,
        copies: bool,
        policy: str,
        aging_s: float,
        n_gms: int,
        clusters: list[list[tuple[tuple[int, int], int]]],
    ) -> None:
        gm_names = [f"gm{g}" for g in range(n_gms)]
        self.users = [("u0", "gm0"), ("u1", "gm0"), ("u2", gm_names[-1])]
        cfg = [UserConfig(UserId(u), GmId(g), 1 / 3) for u, g in self.users]
        lm_names = [f"lm{i}" for i in range(len(clusters))]
        k = 0
        for name, nodes in zip(lm_names, clusters, strict=True):
            home = [gm_names[(k + i) % n_gms] for i in range(len(nodes))]
            k += len(nodes)
            lm = make_lm(name, [(c[0], c[1], m) for c, m in nodes], home)
            self.lms[lm.lm_id] = lm
        factory = make_policy(policy, cfg, aging_s=aging_s)
        for g in gm_names:
            mine = [c.user for c in cfg if c.gm == g]
            gm = GlobalMaster(
                GmId(g), [LmId(x) for x in lm_names], cfg, max_retries=2, patience=3,
                queues=factory(GmId(g), mine), overload=OverloadPolicy(),
            )  # fmt: skip
            gm.journal = Journal(per_task=6, ended=8)
            self.gms[gm.gm_id] = gm
        self.net = Network(self.gms, self.lms, copies=copies)
        self.net.start(self.now)
        for lm in self.lms.values():
            alive(lm, self.now)

    @rule(
        user=st.integers(0, 2),
        cpu=st.sampled_from((1, 2, 4)),
        priority=st.integers(0, 2),
        count=st.integers(1, 3),
    )
    def submit_classed(self, user: int, cpu: int, priority: int, count: int) -> None:
        name, gm = self.users[user]
        self.jobs += 1
        batch: list[TaskSpec] = []
        for _ in range(count):
            tid = f"t{len(self.tasks) + len(batch)}"
            spec = make_task(cpu, 1, user=name, task_id=tid, job=f"j{self.jobs}")
            batch.append(replace(spec, priority=priority))
        self.net.submit(GmId(gm), batch, self.tick())
        for t in batch:
            self.tasks[(t.user, t.task_id)] = t
            self.owner[(t.user, t.task_id)] = GmId(gm)


ClassedFederation.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_classed_federation = ClassedFederation.TestCase


@settings(max_examples=200, deadline=None)
@given(steps)
def test_one_class_is_served_as_plain_fifo_queues_serve(ops: list[tuple]) -> None:
    """With every task in one class, ``fifo``'s classed queues and waiting index give
    what plain ``UserQueues`` give, whatever the waits (aging changes nothing)."""
    users = [UserConfig(u, GmId("gm0"), 0.5) for u in USERS]
    classed = make_policy("fifo", users, aging_s=AGING_S)(GmId("gm0"), USERS)
    plain = UserQueues(USERS)
    now, n = 0.0, 0
    for op in ops:
        if op[0] == "submit":
            n += 1
            spec = make_task(user=str(USERS[op[1]]), job=f"j{op[3]}", task_id=f"t{n}")
            for q in (classed, plain):
                q.push_back(Task(spec=spec, submitted_at=now))
        elif op[0] == "time":
            now += op[1]
            classed.on_finished(Task(spec=make_task(user="a", job="x")), now)
        elif op[0] == "pop":
            got = [q.pop() for q in (classed, plain)]
            assert [t and t.task_id for t in got] == [got[1] and got[1].task_id] * 2
            for q, t in zip((classed, plain), got, strict=True):
                if t is not None and op[1]:
                    q.waiting.add(t)
        else:
            cls = next(iter(plain.waiting.by_class), None)
            if cls is None:
                continue
            order = [USERS[1], USERS[0]]
            took = [q.waiting.take(cls, op[1], order) for q in (classed, plain)]
            assert [t.task_id for t in took[0]] == [t.task_id for t in took[1]]
            for q, ts in zip((classed, plain), took, strict=True):
                for t in reversed(ts):
                    q.push_front(t)
