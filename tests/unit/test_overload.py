"""Overload (issue 11): the waiting index and its wake-ups, the preemption grace period,
victim choice and the work thrown away, the per-LM preemption rate limit, batched
repartitions.  Pure cores driven through ``handle``; every ``now`` is the test's."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import structs

from common.effects import Effect, Reply, ToAllGms, ToLm
from common.ids import GmId, LmId, UserId
from common.messages import LaunchRequest, PreemptRequest, PreemptResponse, ReportKind
from common.model import N_CONSTRAINTS, TaskSpec, TaskState
from common.overload import OverloadPolicy
from global_master.core import GlobalMaster
from local_master.core import LocalMaster
from tests.conftest import (
    heartbeat,
    launch_req,
    launches,
    make_lm,
    make_task,
    preempts,
    report,
    state,
    submit,
    sync_views,
)

GM0 = GmId("gm0")
LM0 = LmId("lm0")
INDEX = OverloadPolicy(wait_index=True)


def gm_with(
    policy: OverloadPolicy,
    users: tuple[tuple[str, float], ...] = (("u0", 1.0),),
    lms: tuple[str, ...] = ("lm0",),
) -> GlobalMaster:
    from common.model import UserConfig

    cfg = [UserConfig(UserId(u), GM0, s) for u, s in users]
    return GlobalMaster(GM0, [LmId(x) for x in lms], cfg, overload=policy)


def occupy(lm: LocalMaster, spec: TaskSpec, node: int = 0, at: float = 0.0) -> None:
    (reply, *_) = lm.handle(launch_req(spec, node), at)
    assert isinstance(reply, Reply)
    assert reply.msg.results[0].accepted  # type: ignore[attr-defined]


def finish(lm: LocalMaster, gm: GlobalMaster, spec: TaskSpec, node: int, now: float) -> None:
    """A blocker ends on its node; the LM's next state update reaches the GM."""
    lm.handle(report(LM0, ReportKind.FINISHED, spec, node, now), now)
    tell(gm, lm, now)


def tell(gm: GlobalMaster, lm: LocalMaster, now: float) -> None:
    """The LM's periodic state update reaches the GM."""
    for e in heartbeat(lm, now):
        assert isinstance(e, ToAllGms)
        gm.handle(e.msg, now)


def answer(effects: list[Effect]) -> PreemptResponse:
    first = effects[0]
    assert isinstance(first, Reply)
    assert isinstance(first.msg, PreemptResponse)
    return first.msg


def drain(gm: GlobalMaster, now: float) -> list[LaunchRequest]:
    out: list[LaunchRequest] = []
    while gm.has_work():
        out.extend(launches(gm.decide(now, 8)))
    return out


# ------------------------------------------------------------ waiting index
def test_a_task_without_room_waits_and_is_not_examined_on_every_event() -> None:
    lm = make_lm(nodes=[(2, 2)])
    gm = gm_with(INDEX)
    blocker = make_task(2, 2, job="blocker")
    occupy(lm, blocker)
    sync_views(gm, lm)
    tasks = [make_task() for _ in range(5)]
    submit(gm, tasks, 0.0)
    assert drain(gm, 1.0) == []
    assert len(gm.waiting) == 5
    assert gm.counters.waited == 5
    decisions = gm.counters.decisions
    for k in range(10):  # state updates that free nothing wake nobody
        tell(gm, lm, 2.0 + k)
        assert not gm.has_work()
    assert gm.counters.decisions == decisions
    finish(lm, gm, blocker, 0, 20.0)
    assert gm.counters.woken == 2  # the freed node holds two of them, no more
    (req,) = drain(gm, 20.0)
    assert [p.spec for p in req.placements] == tasks[:2]  # the oldest first
    assert [t.spec for t in gm.waiting] == tasks[2:]


def test_woken_tasks_keep_their_place_ahead_of_later_ones() -> None:
    lm = make_lm(nodes=[(1, 1)])
    gm = gm_with(INDEX)
    blocker = make_task(1, 1, job="blocker")
    occupy(lm, blocker)
    sync_views(gm, lm)
    old, new = make_task(), make_task(job="later")
    submit(gm, [old], 0.0)
    drain(gm, 0.5)
    submit(gm, [new], 1.0)
    finish(lm, gm, blocker, 0, 2.0)
    (req,) = drain(gm, 2.0)
    assert [p.spec for p in req.placements] == [old]
    assert state(gm, new) is TaskState.QUEUED


def test_a_freed_node_wakes_only_classes_it_can_fit() -> None:
    lm = make_lm(nodes=[(4, 4, 0b01), (4, 4, 0b11)])
    gm = gm_with(INDEX)
    b0, b1 = make_task(4, 4, job="b0"), make_task(4, 4, job="b1")
    occupy(lm, b0, 0)
    occupy(lm, b1, 1)
    sync_views(gm, lm)
    needs_c1 = make_task(1, 1, constraints=0b10)
    too_big = make_task(4, 4)
    submit(gm, [needs_c1, too_big], 0.0)
    drain(gm, 0.5)
    assert len(gm.waiting) == 2
    lm.handle(report(LM0, ReportKind.FINISHED, b0, 0, 1.0), 1.0)
    occupy(lm, make_task(1, 1, job="other"), 0, 1.0)  # 3 of 4 free: fits neither
    tell(gm, lm, 1.0)
    assert gm.counters.woken == 0
    assert not gm.has_work()
    finish(lm, gm, b1, 1, 2.0)  # node 1 meets constraint 1 and is empty: room for one
    assert gm.counters.woken == 1
    (req,) = drain(gm, 2.0)
    assert len(req.placements) == 1
    assert len(gm.waiting) == 1


def test_users_furthest_below_their_share_are_woken_first() -> None:
    lm = make_lm(nodes=[(2, 2), (2, 2)])
    gm = gm_with(replace(INDEX, preempt_grace_s=1e9), users=(("rich", 0.5), ("poor", 0.5)))
    b = make_task(2, 2, user="rich", job="b")
    occupy(lm, b, 0)
    occupy(lm, make_task(2, 2, user="rich", job="c"), 1)
    sync_views(gm, lm)
    r, p = make_task(user="rich"), make_task(user="poor")
    submit(gm, [r], 0.0)
    submit(gm, [p], 0.1)
    drain(gm, 0.5)
    lm.handle(report(LM0, ReportKind.FINISHED, b, 0, 1.0), 1.0)
    occupy(lm, make_task(1, 1, user="rich", job="d"), 0, 1.0)  # room for one only
    tell(gm, lm, 1.0)
    (req,) = drain(gm, 1.0)
    assert [x.spec for x in req.placements] == [p]


classes = st.tuples(
    st.integers(0, (1 << 2) - 1),  # constraint mask over the first two constraints
    st.integers(1, 3),
    st.integers(1, 3),
)


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(0, 3)), min_size=1, max_size=5
    ),
    wanted=st.lists(classes, min_size=1, max_size=12),
    freed=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_no_lost_wake_up(
    nodes: list[tuple[int, int, int]], wanted: list[tuple[int, int, int]], freed: list[bool]
) -> None:
    """Whatever ends: once the GM has decided what woke, no task waits while its view
    shows a node that meets its constraints with room for its demand."""
    full_mask = (1 << N_CONSTRAINTS) - 1
    lm = make_lm(nodes=[(c, m, mask | (full_mask & ~0b11)) for c, m, mask in nodes])
    gm = gm_with(INDEX)
    blockers = []
    for i, (c, m, _) in enumerate(nodes):
        b = make_task(c, m, job=f"b{i}")
        occupy(lm, b, i)
        blockers.append(b)
    sync_views(gm, lm)
    specs = [make_task(c, m, constraints=mask) for mask, c, m in wanted]
    feasible = [
        s
        for s in specs
        if any(
            s.constraints & ~(mask | (full_mask & ~0b11)) == 0
            and c >= s.demand[0]
            and m >= s.demand[1]
            for c, m, mask in nodes
        )
    ]
    submit(gm, feasible, 0.0)
    drain(gm, 0.5)
    assert len(gm.waiting) == len(feasible)
    for i, b in enumerate(blockers):
        if freed[i % len(freed)]:
            lm.handle(report(LM0, ReportKind.FINISHED, b, i, 1.0), 1.0)
    tell(gm, lm, 1.0)
    drain(gm, 1.0)
    view = gm.views[LM0]
    for t in gm.waiting:
        for i in range(view.n):
            meets = t.constraints & ~view.node_masks[i] == 0
            room = all(f >= d for f, d in zip(view.free[i], t.demand, strict=True))
            assert not (meets and room), f"{t.task_id} waits though node {i} fits it"


# ------------------------------------------------------------ preemption
def contended(policy: OverloadPolicy) -> tuple[LocalMaster, GlobalMaster]:
    """``a`` holds the whole cluster; ``b`` (share 0.5) holds nothing."""
    lm = make_lm(nodes=[(2, 2), (2, 2)])
    gm = gm_with(policy, users=(("a", 0.5), ("b", 0.5)))
    for i in range(2):
        for k in range(2):
            occupy(lm, make_task(1, 1, user="a", job=f"a{i}{k}"), i)
    sync_views(gm, lm)
    return lm, gm


def test_a_user_below_its_share_preempts_only_after_the_grace_period() -> None:
    lm, gm = contended(replace(INDEX, preempt_grace_s=30.0))
    t = make_task(1, 1, user="b")
    submit(gm, [t], 0.0)
    assert preempts(gm.decide(1.0)) == []
    assert gm.counters.preemptions_deferred == 1
    for now in (5.0, 20.0, 30.9):  # state updates before the grace is over: nothing
        tell(gm, lm, now)
        assert not gm.has_work()
    tell(gm, lm, 31.0)
    assert gm.has_work()
    (req,) = preempts(gm.decide(31.0))
    assert req.victim == UserId("a")
    assert req.spec == t


def _gm_state(gm: GlobalMaster) -> tuple[object, ...]:
    """What an update could change in a GM, but its count of updates applied."""
    counters = {**gm.counters.as_dict(), "updates_applied": 0}
    return (
        counters,
        [t.key for t in gm.waiting],
        dict(gm.fairness.starved),
        gm.fairness.grace_check,
        gm.has_work(),
        list(gm.wait_reasons),
        [(t.decisions, list(t.waits)) for t in gm.waiting],
    )


def test_unchanged_until_says_when_an_update_with_nothing_new_may_act() -> None:
    """Tasks waiting and a user in its grace: an update that changes nothing in the view
    changes nothing in the GM before ``unchanged_until``; the first one at or after it
    may (the grace check: here it moves on, and then the grace ends)."""
    lm, gm = contended(replace(INDEX, preempt_grace_s=30.0))
    assert gm.unchanged_until() == float("inf")  # nothing waits
    submit(gm, [make_task(1, 1, user="b")], 0.0)
    assert preempts(gm.decide(1.0)) == []
    assert len(gm.waiting) == 1
    now = 2.0
    while not gm.has_work():
        due = gm.unchanged_until()
        assert due <= 31.0  # at the latest when the grace is over
        while now < due:  # nothing new, before it is due: nothing changes
            before = _gm_state(gm)
            tell(gm, lm, now)
            assert _gm_state(gm) == before
            now += 0.5
        before = _gm_state(gm)
        tell(gm, lm, now)  # due: it acts (the check moves on, or the grace is over)
        assert _gm_state(gm) != before
    assert now == 31.0
    assert len(preempts(gm.decide(now))) == 1


def test_unchanged_until_without_a_starved_user_is_never() -> None:
    """Tasks waiting for room while their user is at its share: only freed resources
    wake them, no time does."""
    lm = make_lm(nodes=[(2, 2)])
    gm = gm_with(replace(INDEX, preempt_grace_s=30.0))
    occupy(lm, make_task(2, 2, job="blocker"))
    sync_views(gm, lm)
    submit(gm, [make_task() for _ in range(3)], 0.0)
    assert drain(gm, 1.0) == []
    assert len(gm.waiting) == 3
    tell(gm, lm, 2.0)
    # no time wakes the waiting tasks; only their held jobs' ends are kept from a time on
    assert gm.unchanged_until() == gm.keep_ends_after_s
    tell(gm, lm, gm.keep_ends_after_s)  # that update asks the LM to keep them
    assert all(r.keeps_ends for r in gm.jobs.values())
    assert gm.unchanged_until() == float("inf")


def test_no_grace_preempts_at_once() -> None:
    _, gm = contended(INDEX)
    submit(gm, [make_task(1, 1, user="b")], 0.0)
    assert len(preempts(gm.decide(1.0))) == 1


def test_preemptions_are_rate_limited_per_lm_and_period() -> None:
    lm, gm = contended(replace(INDEX, preempt_per_lm=1, preempt_period_s=10.0))
    ts = [make_task(1, 1, user="b") for _ in range(2)]
    submit(gm, ts, 0.0)
    first = preempts(gm.decide(1.0, 2))
    assert len(first) == 1
    assert gm.counters.preemptions_rate_limited == 1
    assert len(gm.waiting) == 1
    tell(gm, lm, 5.0)
    assert preempts(gm.decide(5.0)) == []  # still within the period
    tell(gm, lm, 11.5)
    assert len(preempts(gm.decide(11.5, 2))) == 1


def preempt_req(spec: TaskSpec, victim: str) -> PreemptRequest:
    return PreemptRequest(
        gm=GM0,
        lm=LM0,
        request_id=9,
        spec=spec,
        attempt=1,
        victim=UserId(victim),
        known_version=-1,
    )


def test_victims_lose_least_work_youngest_first_never_more_than_needed() -> None:
    lm = make_lm(nodes=[(3, 3), (3, 3)])
    old = [make_task(1, 1, user="a", job="old") for _ in range(3)]
    young = [make_task(1, 1, user="a", job="young") for _ in range(3)]
    for k, s in enumerate(old):
        occupy(lm, s, 0, 0.0)
        lm.handle(report(LM0, ReportKind.STARTED, s, 0, 1.0 + k), 1.0 + k)
    for k, s in enumerate(young):
        occupy(lm, s, 1, 50.0)
        lm.handle(report(LM0, ReportKind.STARTED, s, 1, 90.0 + k), 90.0 + k)
    resp = answer(lm.handle(preempt_req(make_task(2, 2, user="b"), "a"), 100.0))
    assert resp.accepted
    # node 1 (young tasks) loses least; there, the two youngest, and only two
    assert resp.node == 1
    assert {(r.user, r.task_id) for r in resp.preempted} == {(s.user, s.task_id) for s in young[1:]}
    assert lm.counters.preempted_work_s == (100.0 - 91.0) + (100.0 - 92.0)


def test_altruistic_victims_go_first_even_if_older() -> None:
    lm = make_lm(nodes=[(2, 2)])
    alt, plain = make_task(1, 1, user="a"), make_task(1, 1, user="a")
    lm.handle(
        structs.replace(
            launch_req(alt),
            placements=(structs.replace(launch_req(alt).placements[0], altruistic=True),),
        ),
        0.0,
    )
    lm.handle(report(LM0, ReportKind.STARTED, alt, 0, 1.0), 1.0)
    occupy(lm, plain, 0, 50.0)
    lm.handle(report(LM0, ReportKind.STARTED, plain, 0, 60.0), 60.0)
    resp = answer(lm.handle(preempt_req(make_task(1, 1, user="b"), "a"), 100.0))
    assert [r.task_id for r in resp.preempted] == [alt.task_id]


# ------------------------------------------------------------ repartitions
def test_repartitions_to_one_lm_are_batched_while_one_is_unanswered() -> None:
    lm = make_lm(nodes=[(1, 1), (8, 8)], home=["gm0", "gm1"])
    gm = gm_with(replace(INDEX, repartition_batching=True))
    occupy(lm, make_task(1, 1, job="mine"), 0)
    sync_views(gm, lm)
    ts = [make_task() for _ in range(4)]
    submit(gm, ts, 0.0)
    first = gm.decide(1.0)
    (req,) = launches(first)
    assert [p.repartition for p in req.placements] == [True]
    assert launches(gm.decide(1.1, 3)) == []  # decided, held until the answer
    assert gm.counters.repartition_requests == 4
    assert gm.counters.repartition_messages == 1
    answer = [
        e.msg
        for e in lm.handle(structs.replace(req, sent_at=1.0), 1.2)
        if isinstance(e, Reply)  # the LM's answer
    ]
    effects = gm.handle(answer[0], 1.3)
    (batch,) = [e.msg for e in effects if isinstance(e, ToLm)]
    assert isinstance(batch, LaunchRequest)
    assert [p.spec for p in batch.placements] == ts[1:]
    assert gm.counters.repartition_messages == 2


def test_without_batching_each_decision_sends_its_repartition() -> None:
    lm = make_lm(nodes=[(1, 1), (8, 8)], home=["gm0", "gm1"])
    gm = gm_with(INDEX)
    occupy(lm, make_task(1, 1, job="mine"), 0)
    sync_views(gm, lm)
    submit(gm, [make_task() for _ in range(3)], 0.0)
    assert sum(len(launches(gm.decide(1.0))) for _ in range(3)) == 3


def test_a_paying_preemption_spares_tasks_that_ran_longer_than_the_requester_waited() -> None:
    from common.ids import GmId as G
    from common.model import NodeSpec

    lm = LocalMaster(
        LM0,
        [NodeSpec((1, 1), (1 << N_CONSTRAINTS) - 1)] * 2,
        [G("gm0")] * 2,
        gms=[G("gm0")],
        victims_younger_than_wait=True,
    )
    old, young = make_task(1, 1, user="a"), make_task(1, 1, user="a")
    occupy(lm, old, 0, 0.0)
    lm.handle(report(LM0, ReportKind.STARTED, old, 0, 0.0), 0.0)
    asker = make_task(1, 1, user="b")
    req = structs.replace(preempt_req(asker, "a"), queued_at=50.0)  # waited 50 s at t=100
    resp = answer(lm.handle(req, 100.0))
    assert not resp.accepted
    assert resp.reason == "no_victim"
    occupy(lm, young, 1, 80.0)
    lm.handle(report(LM0, ReportKind.STARTED, young, 1, 80.0), 80.0)
    resp = answer(lm.handle(structs.replace(req, attempt=2), 100.0))
    assert resp.accepted
    assert [r.task_id for r in resp.preempted] == [young.task_id]
    assert lm.counters.preempted_work_s == 20.0
