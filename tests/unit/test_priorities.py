"""Priority classes: the higher class first, in the queues and the waiting index, up to
the aging bound; a higher class preempts lower ones (any user's, lowest first), never
the other way round; ``megha why`` names the classes ahead."""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from common.dag import jobs_to_doc, parse_jobs
from common.errors import ConfigError
from common.ids import GmId, LmId, UserId
from common.model import Task, TaskSpec, TaskState, UserConfig
from common.overload import OverloadPolicy
from global_master.core import GlobalMaster
from global_master.inspect import task_answer
from global_master.policy import make_policy
from global_master.policy.classes import Aging, ClassedFifo, ClassedQueue, ClassedWaiting
from global_master.queues import WaitClass
from local_master.victims import choose
from tests.conftest import (
    decide,
    key,
    make_lm,
    make_task,
    preempts,
    state,
    submit,
    sync_views,
    task_of,
)
from tests.unit.test_gm_core import deliver

A, B = UserId("a"), UserId("b")
GM0, LM0 = GmId("gm0"), LmId("lm0")


def spec(cls: int, user: str = "a", cpu: int = 1, job: str = "j0") -> TaskSpec:
    return replace(make_task(cpu, cpu, user=user, job=job), priority=cls)


def task(cls: int, at: float = 0.0, user: str = "a") -> Task:
    return Task(spec=spec(cls, user), submitted_at=at)


def test_the_higher_class_goes_first_and_fifo_within_a_class() -> None:
    q = ClassedQueue(deque, Aging(aging_s=100.0))
    low1, high1, low2, high2 = task(0), task(2), task(0), task(2)
    for t in (low1, high1, low2, high2):
        q.append(t)
    assert list(q) == [high1, high2, low1, low2]
    assert [q.popleft() for _ in range(4)] == [high1, high2, low1, low2]


def test_a_lower_class_goes_ahead_only_after_waiting_its_gap_times_the_aging() -> None:
    aging = Aging(aging_s=100.0)
    q = ClassedQueue(deque, aging)
    old_low = task(0, at=0.0)
    q.append(old_low)
    fresh_high = task(2, at=150.0)  # (2 - 0) * 100 s: the low one needs 200 s of waiting
    q.append(fresh_high)
    aging.saw(199.0)
    assert q.best() == (2.49, 2)
    aging.saw(251.0)  # low: 0 + 2.51; high: 2 + 1.01
    assert q.popleft() is fresh_high
    q.append(fresh_high)
    aging.saw(400.0)  # low: 4.0; high: 4.5
    assert q.popleft() is fresh_high
    fresher = task(2, at=400.0)
    q.append(fresher)  # low 4.0 > high 2.0: the low one has waited long enough
    assert q.popleft() is old_low


def test_users_with_the_higher_class_are_served_first_then_round_robin() -> None:
    q = ClassedFifo([A, B], aging_s=float("inf"))
    a0, a1, b1, b1b = task(0, user="a"), task(1, user="a"), task(1, user="b"), task(1, user="b")
    for t in (a0, b1, a1, b1b):
        q.push_back(t)
    assert [q.pop() for _ in range(5)] == [a1, b1, b1b, a0, None]


def test_freed_room_goes_to_the_highest_waiting_class_of_any_user() -> None:
    q = ClassedFifo([A, B], aging_s=float("inf"))
    a0, b2, a1 = task(0, user="a"), task(2, user="b"), task(1, user="a")
    for t in (a0, b2, a1):
        q.waiting.add(t)
    cls = (0, a0.demand)
    assert q.waiting.take(cls, 2, [A, B]) == [b2, a1]
    assert q.waiting.take(cls, 2, [A, B]) == [a0]


def running(s: TaskSpec, started: float = 0.0) -> object:
    class Run:
        spec, node, altruistic, started_at = s, 0, False, started

    return Run()


def test_an_lm_never_preempts_a_higher_class_and_takes_the_lowest_first() -> None:
    hi_a, lo_b, mid_b = spec(2, "a"), spec(0, "b"), spec(1, "b")
    runs = [running(hi_a, 0.0), running(mid_b, 9.0), running(lo_b, 0.0)]
    free, alive, masks = [(0, 0)], [True], [(1 << 21) - 1]
    # Alg. 2 for a class-1 task of user c: victims of b in its class or below
    for_mid = spec(1, "c")
    got = choose(for_mid, B, runs, free, alive, masks, 10.0)  # type: ignore[arg-type]
    assert got is not None
    assert [v.spec for v in got.victims] == [lo_b]  # class 0 first, though it ran longer
    # Alg. 2 for a class-0 task: never b's class-1 task; a's class 2 never at all
    got = choose(spec(0, "c", cpu=2), B, runs, free, alive, masks, 10.0)  # type: ignore[arg-type]
    assert got is None
    assert choose(spec(1, "c"), A, runs, free, alive, masks, 10.0) is None  # type: ignore[arg-type]
    # a higher class's preemption: any user's lower class, the lowest first
    got = choose(spec(2, "c", cpu=2), A, runs, free, alive, masks, 10.0, lower_only=True)  # type: ignore[arg-type]
    assert got is not None
    assert [v.spec for v in got.victims] == [lo_b, mid_b]
    assert choose(spec(1, "c", cpu=2), A, runs, free, alive, masks, 10.0, lower_only=True) is None  # type: ignore[arg-type]


def classed_gm(overload: OverloadPolicy | None = None) -> GlobalMaster:
    users = [UserConfig(A, GM0, 0.5), UserConfig(B, GM0, 0.5)]
    queues = make_policy("fifo", users)(GM0, [A, B])
    return GlobalMaster(GM0, [LM0], users, queues=queues, overload=overload)


def test_a_higher_class_at_its_share_preempts_a_lower_class_of_another_user() -> None:
    lm = make_lm(nodes=[(4, 4)])
    gm = classed_gm()
    sync_views(gm, lm)
    low, mine = spec(0, "a", cpu=2), spec(1, "b", cpu=2, job="jb")
    submit(gm, [low, mine], 0.0)
    assert deliver(lm, gm, decide(gm, 1.0, max_tasks=2), 1.0) == []
    assert state(gm, low) is TaskState.PLACED
    # b holds its share: Alg. 2 would not preempt for it; its class does
    more = spec(1, "b", cpu=2, job="jb2")
    submit(gm, [more], 2.0)
    effects = decide(gm, 3.0)
    (req,) = preempts(effects)
    assert req.lower_only
    deliver(lm, gm, effects, 3.0)
    assert state(gm, more) is TaskState.PLACED
    assert gm.counters.preemptions_granted == 1


def test_class_preemptions_neither_wait_for_nor_spend_alg2_s_rate_limit() -> None:
    """One Alg. 2 preemption per LM per 10 s: two class-1 tasks arriving at once both
    preempt at once, and Alg. 2's budget is still whole after them."""
    lm = make_lm(nodes=[(2, 2), (2, 2)])
    gm = classed_gm(OverloadPolicy(wait_index=True, preempt_per_lm=1, preempt_period_s=10.0))
    sync_views(gm, lm)
    lows = [spec(0, "a", cpu=2, job=f"low{k}") for k in range(2)]
    submit(gm, lows, 0.0)
    assert deliver(lm, gm, decide(gm, 1.0, max_tasks=2), 1.0) == []
    assert all(state(gm, t) is TaskState.PLACED for t in lows)
    highs = [spec(1, "b", cpu=2, job=f"high{k}") for k in range(2)]
    submit(gm, highs, 2.0)
    effects = decide(gm, 3.0, max_tasks=2)
    reqs = preempts(effects)
    assert len(reqs) == 2
    assert all(r.lower_only for r in reqs)
    assert gm.counters.preemptions_rate_limited == 0
    assert gm.fairness.preempt_room(LM0, 3.0) == 1  # Alg. 2's budget untouched
    deliver(lm, gm, effects, 3.0)
    assert all(state(gm, t) is TaskState.PLACED for t in highs)
    assert gm.counters.preemptions_granted == 2


def test_a_lowest_class_task_never_asks_for_a_class_preemption() -> None:
    lm = make_lm(nodes=[(2, 2)])
    gm = classed_gm()
    sync_views(gm, lm)
    first, second = spec(0, "a", cpu=2), spec(0, "a", cpu=2, job="j1")
    submit(gm, [first], 0.0)
    deliver(lm, gm, decide(gm, 1.0), 1.0)
    submit(gm, [second], 2.0)
    assert not [r for r in preempts(decide(gm, 3.0)) if r.lower_only]


def test_why_names_the_classes_ahead_of_a_queued_task() -> None:
    gm = classed_gm()
    sync_views(gm, make_lm(nodes=[(4, 4)]))
    low, high = spec(0, "a"), spec(3, "b")
    submit(gm, [low, high], 0.0)  # no decision yet: both stay queued
    answer = task_answer(gm, key(low))
    assert answer is not None
    assert answer["priority"] == 0
    assert any(line.startswith("class 3 goes first: 1 of its tasks") for line in answer["why"])
    assert not any("goes first" in line for line in task_answer(gm, key(high))["why"])  # type: ignore[index]


def test_a_job_file_names_a_job_s_class_and_refuses_a_bad_one() -> None:
    stage = {"id": 0, "parents": [], "count": 2, "demand": [1], "duration": 1.0}
    job = {"id": "j", "user": "u", "arrival": 0.0, "priority": 3, "stages": [stage]}
    doc = {"format": "megha-dag/1", "resources": ["cpu"], "jobs": [job]}
    names, jobs = parse_jobs(doc)
    assert [t.spec.priority for t in jobs[0].tasks] == [3, 3]
    assert jobs_to_doc(jobs, names)["jobs"][0]["priority"] == 3
    for bad in (True, -1, 1001, 1.5):
        with pytest.raises(ConfigError, match="priority"):
            parse_jobs({**doc, "jobs": [{**job, "priority": bad}]})


def _full_class_order(waiting: ClassedWaiting) -> list[WaitClass]:
    """``ClassedWaiting.class_order`` as it was before it kept a count of the classes
    held: every class's queues asked for their head."""
    keys = {
        c: min((q.head_key() for q in users.values()), default=(math.inf,))
        for c, users in waiting.by_class.items()
    }
    if len({k[1] for k in keys.values() if len(k) > 1}) <= 1:
        return sorted(waiting.by_class, key=lambda c: keys[c][2:])
    return sorted(waiting.by_class, key=keys.__getitem__)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "take", "take_user", "remove"]),
            st.integers(0, 2),  # priority class (add); how many (take)
            st.integers(0, 2),  # wait class: constraints
            st.sampled_from(["a", "b", "c"]),
            st.floats(0, 500),
        ),
        max_size=40,
    ),
    aging_s=st.sampled_from([50.0, float("inf")]),
    one_class=st.booleans(),
)
def test_the_waiting_index_offers_classes_in_the_order_every_queue_would_give(
    ops: list[tuple[str, int, int, str, float]], aging_s: float, one_class: bool
) -> None:
    """Freed room is offered to the waiting classes in the order their queues' heads
    give (the aging of each class's oldest task), whether one priority class waits
    (asked of no queue) or several; taking and removing tasks keeps the count right."""
    q = ClassedFifo([A, B, UserId("c")], aging_s=aging_s)
    waiting = q.waiting
    assert isinstance(waiting, ClassedWaiting)
    held: list[Task] = []
    for op, n, mask, user, at in ops:
        if op == "add":
            s = replace(spec(0 if one_class else n, user), constraints=mask)
            t = Task(spec=s, submitted_at=at)
            q.aging.saw(at)
            waiting.add(t)
            held.append(t)
        elif op == "take" and waiting.by_class:
            cls = list(waiting.by_class)[mask % len(waiting.by_class)]
            for t in waiting.take(cls, n + 1, [UserId(user)]):
                held.remove(t)
        elif op == "take_user":
            for t in waiting.take_user(UserId(user), n + 1):
                held.remove(t)
        elif op == "remove" and held:
            t = held[mask % len(held)]
            assert waiting.remove(t)
            held.remove(t)
        assert waiting.class_order() == _full_class_order(waiting)
        priorities = {t.spec.priority for t in held}
        assert set(waiting.held.queues) == priorities
        for u in ("a", "b", "c"):
            assert waiting.count(UserId(u)) == sum(t.spec.user == u for t in held)


def test_one_waiting_class_is_ordered_without_asking_its_queues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one priority class waiting under FIFO, the order is the order the classes
    came, known without asking any queue for its head (a GM asked it on every message
    that freed a node: under overload, per waiting class and user, per message)."""
    q = ClassedFifo([A, B], aging_s=100.0)
    for m in (2, 1, 3):
        q.waiting.add(Task(spec=replace(spec(0, "a"), constraints=m), submitted_at=m))
        q.waiting.add(Task(spec=replace(spec(0, "b"), constraints=m), submitted_at=m))

    def asked(self: ClassedQueue) -> tuple[float, ...]:
        raise AssertionError("a queue was asked for its head")

    monkeypatch.setattr(ClassedQueue, "head_key", asked)
    assert [c[0] for c in q.waiting.class_order()] == [2, 1, 3]


def test_a_waiting_task_asks_each_lm_for_lower_classes_once_per_period() -> None:
    """An LM's refusal (nothing of a lower class runs there) sends the task back to its
    queue, and each change of the views decides it again: each decision asked every LM
    again (91,441 requests for 402 tasks in a DAG run with classes).  The LMs asked stay
    asked while it waits, for ``preempt_period_s``."""
    lm = make_lm(nodes=[(2, 2)])
    gm = classed_gm(OverloadPolicy(preempt_period_s=10.0))
    sync_views(gm, lm)
    running = spec(1, "a", cpu=2)
    submit(gm, [running], 0.0)
    deliver(lm, gm, decide(gm, 1.0), 1.0)
    assert state(gm, running) is TaskState.PLACED
    waiting = spec(1, "b", cpu=2, job="jb")
    submit(gm, [waiting], 2.0)
    effects = decide(gm, 3.0)
    assert len(preempts(effects)) == 1
    deliver(lm, gm, effects, 3.0)  # refused: its only task is of the same class
    assert state(gm, waiting) is TaskState.QUEUED
    decisions = task_of(gm, waiting).decisions
    for now in (4.0, 6.0, 12.9):
        sync_views(gm, lm)  # the views change: the task is decided again
        assert preempts(decide(gm, now)) == []
    assert task_of(gm, waiting).decisions == decisions + 3
    sync_views(gm, lm)
    assert len(preempts(decide(gm, 13.0))) == 1  # a period on: that LM is asked again
    assert gm.counters.preemption_attempts == 2
