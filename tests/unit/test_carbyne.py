"""Queue policies without an event loop: DRF, Tetris, SJF and Carbyne's three steps."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.dag import DagJob, make_job
from common.effects import Effect, Reply, ToGm, ToLm
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.messages import AdmitJob, ReportKind, TaskEvents
from common.model import Task, TaskSpec, UserConfig
from global_master.core import GlobalMaster
from global_master.policy import POLICIES as POLICY_NAMES
from global_master.policy import (
    CarbyneQueues,
    DrfQueues,
    JobQueues,
    SjfQueues,
    TetrisQueues,
    make_policy,
)
from global_master.policy.altruism import forward_pack, must_start
from global_master.policy.drf import drf_allocation
from global_master.policy.jobs import StageState
from tests.conftest import (
    decide,
    failures,
    launch_req,
    make_gm,
    make_lm,
    make_task,
    preempts,
    report,
    submit,
    sync_views,
    task_of,
)
from workload.dags import carbyne_fig2_jobs
from workload.jobs import to_submission

A, B = UserId("A"), UserId("B")


def _task(task_id: str, job: str, user: str, demand: tuple[int, ...], duration: float) -> Task:
    spec = TaskSpec(
        task_id=TaskId(task_id),
        job_id=JobId(job),
        user=UserId(user),
        demand=demand,
        duration=duration,
    )
    return Task(spec=spec)


def _tasks(user: str, demand: tuple[int, ...], n: int, job: str) -> list[Task]:
    return [_task(f"{job}.t{i}", job, user, demand, 1.0) for i in range(n)]


def _drain(q: JobQueues) -> list[Task]:
    out = []
    while (t := q.pop()) is not None:
        out.append(t)
    return out


def _fig2() -> tuple[DagJob, DagJob]:
    j1, j2 = carbyne_fig2_jobs()
    return j1, j2


# ----------------------------------------------------------------------- DRF
def test_drf_example_from_the_lecture_closed_form() -> None:
    """9 CPUs, 18 GB; A (1 CPU, 4 GB), B (3 CPU, 1 GB): A gets 3 tasks, B 2."""
    a, b = drf_allocation((9, 18), [(100, 400), (300, 100)], [1.0, 1.0])
    assert a == pytest.approx([3, 12])
    assert b == pytest.approx([6, 2])


def test_drf_example_from_the_lecture_as_queued_tasks() -> None:
    q = DrfQueues([A, B], shares={A: 0.5, B: 0.5}, capacity=(9, 18))
    for t in _tasks("A", (1, 4), 10, "ja") + _tasks("B", (3, 1), 10, "jb"):
        t.submit(0.0)
        q.push_back(t)
    handed = _drain(q)
    assert sum(t.user == A for t in handed) == 3
    assert sum(t.user == B for t in handed) == 2


def test_weighted_drf_follows_the_shares() -> None:
    a, b = drf_allocation((100,), [(100,), (100,)], [0.75, 0.25])
    assert a == pytest.approx([75])
    assert b == pytest.approx([25])


def test_drf_caps_a_job_at_its_demand_and_gives_the_rest_away() -> None:
    a, b = drf_allocation((100,), [(10,), (500,)], [0.5, 0.5])
    assert a == pytest.approx([10])
    assert b == pytest.approx([90])


def test_fig2_strict_drf_holds_j2_to_one_task() -> None:
    q = DrfQueues([UserId("u1"), UserId("u2")], capacity=(100,))
    for job in _fig2():
        q.add_job(job, 0.0)
    handed = _drain(q)
    assert sorted(t.task_id for t in handed) == [
        "J1.s0.t0",
        "J1.s0.t1",
        "J1.s1.t0",
        "J1.s1.t1",
        "J2.s0.t0",
    ]


# ------------------------------------------------------------------- Carbyne
def test_forward_and_reverse_packing_of_fig2_j1() -> None:
    j1, _ = _fig2()
    stages = {
        s.stage_id: StageState(s.parents, {t.task_id: t for t in s.tasks}, 0) for s in j1.stages
    }
    t_k = forward_pack(0.0, (50,), (100,), stages, [])
    assert t_k == pytest.approx(2.1)
    latest = must_start(0.0, t_k, (50,), (100,), stages, [], {t.task_id for t in j1.tasks[:5]})
    now = [t for start, t in latest if start <= 1e-9]
    assert [t.demand for t in now] == [(21,)]
    assert all(start == pytest.approx(1.0) for start, t in latest if t not in now)


def test_fig2_carbyne_yields_0_29_of_j1_at_t0() -> None:
    q = CarbyneQueues([UserId("u1"), UserId("u2")], capacity=(100,))
    for job in _fig2():
        q.add_job(job, 0.0)
    handed = _drain(q)
    default = sorted(t.task_id for t in handed if not t.altruistic)
    altruistic = sorted(t.task_id for t in handed if t.altruistic)
    assert q.last_yield[JobId("J1")] == pytest.approx([29])
    assert q.last_yield[JobId("J2")] == pytest.approx([21])
    assert len(default) == 2
    assert default[1] == "J2.s0.t0" or default[1].startswith("J2")
    assert default[0].startswith("J1.s1")
    # leftover 0.5: SRTF gives J2 its second task first, then one more S1 task of J1
    assert [t[:2] for t in altruistic] == ["J1", "J2"]
    assert sum(t.demand[0] for t in handed) == 100


def test_p_altruism_zero_is_plain_drf() -> None:
    users = [UserId("u1"), UserId("u2")]
    drf, carb = (
        DrfQueues(users, capacity=(100,)),
        CarbyneQueues(users, capacity=(100,), p_altruism=0.0),
    )
    for q in (drf, carb):
        for job in _fig2():
            q.add_job(job, 0.0)
    assert [t.task_id for t in _drain(carb)] == [t.task_id for t in _drain(drf)]


def test_dag_release_and_job_cleanup_through_the_hooks() -> None:
    q = CarbyneQueues([UserId("u1"), UserId("u2")], capacity=(100,))
    j1, _ = _fig2()
    q.add_job(j1, 0.0)
    first = _drain(q)
    assert {t.task_id for t in first} == {t.task_id for t in j1.tasks[:5]}
    for t in first:
        q.on_dispatched(t, 0.0)
    for t in first:
        q.on_finished(t, 1.0)
    (last,) = _drain(q)
    assert last.task_id == "J1.s2.t0"
    assert last.submitted_at == 1.0
    q.on_dispatched(last, 1.0)
    q.on_finished(last, 1.1)
    assert not q.jobs
    assert not q.has_work()


def test_a_task_that_could_not_be_placed_waits_for_a_new_epoch() -> None:
    q = TetrisQueues([A], capacity=(10,))
    (t,) = _tasks("A", (5,), 1, "j")
    q.push_back(t)
    popped = q.pop()
    assert popped is t
    q.push_back(t)  # the GM re-queued it: nothing fitted
    assert not q.has_work()
    q.new_epoch()
    assert q.pop() is t


def test_a_task_that_found_no_node_gives_its_room_to_the_next_ones() -> None:
    """Fragmented nodes: the plan's room is 10; a task of 8 is handed out first, finds
    no node and comes back.  Its room goes to the task of 4 that did not fit beside it,
    and a task at least as large as 8 is not tried again until the view changes."""
    q = SjfQueues([A], capacity=(10,))
    big = _task("big", "j1", "A", (8,), 1.0)
    bigger = _task("bigger", "j2", "A", (9,), 1.0)
    small = _task("small", "j3", "A", (4,), 1.0)
    for t in (big, bigger, small):
        q.push_back(t)
    assert q.pop() is big
    q.push_back(big)  # the GM found no node for it
    assert q.pop() is small
    assert q.pop() is None
    q.on_dispatched(small, 0.0)
    q.on_finished(small, 1.0)
    q.new_epoch()
    assert q.pop() is big


def test_policies_without_fairness_hand_out_altruistic_tasks() -> None:
    """Tetris (knob f = 0), SJF and DRF's work-conserving extras claim no share: the GM
    never preempts for them.  Strict DRF's tasks are within their job's share."""
    handed: dict[str, list[Task]] = {}
    for name, q in (
        ("tetris", TetrisQueues([A, B], capacity=(10,))),
        ("sjf", SjfQueues([A, B], capacity=(10,))),
        ("drf", DrfQueues([A, B], capacity=(10,))),
        ("drf-wc", DrfQueues([A, B], capacity=(10,), work_conserving=True)),
    ):
        for t in _tasks("A", (3,), 4, "ja") + _tasks("B", (3,), 2, "jb"):
            q.push_back(t)
        handed[name] = _drain(q)
        assert all(not q.may_preempt_for(t) for t in handed[name])
    assert all(t.altruistic for t in handed["tetris"] + handed["sjf"])
    assert not any(t.altruistic for t in handed["drf"])
    # each job's share is 5: one task of 3 each within it, one more beyond a share
    assert len(handed["drf"]) == 2
    assert sum(t.altruistic for t in handed["drf-wc"]) == 1


def test_the_gm_tells_the_policy_its_cluster_and_the_policy_never_reads_the_gm() -> None:
    from common.model import UserConfig
    from global_master.core import GlobalMaster
    from global_master.policy import make_policy
    from tests.conftest import make_lm, sync_views

    users = [UserConfig(A, GmId("gm0"), 0.25), UserConfig(B, GmId("gm1"), 0.75)]
    queues = make_policy("carbyne", users)(GmId("gm0"), [A])
    gm = GlobalMaster(GmId("gm0"), [LmId("lm0")], users, queues=queues)
    assert isinstance(queues, JobQueues)
    assert queues.capacity == []  # nothing known before the first snapshot
    lm = make_lm()
    sync_views(gm, lm)
    total = [sum(c[r] for c in lm.nodes.capacity) for r in range(2)]
    assert queues.capacity == pytest.approx([0.25 * x for x in total])
    assert not any(v is gm for v in vars(queues).values())


def test_a_task_larger_than_the_allocation_time_shares_it() -> None:
    """Forward packing within a share smaller than the task: it runs alone, for as long
    as the share takes to hold it (half the task: twice its duration)."""
    job = make_job("j", "A", 0.0, [(0, [((10,), 1.0)], []), (1, [((5,), 1.0)], [0])])
    stages = {
        s.stage_id: StageState(s.parents, {t.task_id: t for t in s.tasks}, 0) for s in job.stages
    }
    assert forward_pack(0.0, (5,), (100,), stages, []) == pytest.approx(3.0)


def test_sjf_prefers_the_job_with_the_shortest_critical_path() -> None:
    q = SjfQueues([A], capacity=(10,))
    long = make_job("long", "A", 0.0, [(0, [((10,), 5.0)], []), (1, [((10,), 5.0)], [0])])
    short = make_job("short", "A", 1.0, [(0, [((10,), 1.0)], [])])
    q.add_job(long, 0.0)
    q.add_job(short, 1.0)
    first = q.pop()
    assert first is not None
    assert first.job_id == "short"


def test_tetris_packs_the_best_aligned_task_first() -> None:
    q = TetrisQueues([A], capacity=(10, 10))
    small = _task("s", "j", "A", (1, 1), 1.0)
    big = _task("b", "j", "A", (6, 6), 1.0)
    q.push_back(small)
    q.push_back(big)
    first = q.pop()
    assert first is big


# ---------------------------------------------------------------- invariants
POLICIES = (DrfQueues, TetrisQueues, SjfQueues, CarbyneQueues)


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    jobs=st.lists(
        st.tuples(
            st.sampled_from(["A", "B", "C"]),
            st.lists(
                st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 4)),
                min_size=1,
                max_size=4,
            ),
        ),
        min_size=1,
        max_size=5,
    ),
    seed=st.integers(0, 1000),
)
def test_policies_never_hand_out_more_than_capacity_and_finish_every_job(
    policy: type[JobQueues], jobs: list[tuple[str, list[tuple[int, int, int]]]], seed: int
) -> None:
    """Drive a policy as a GM would (pop, run, finish): usage stays within the
    entitled capacity, and every task of every DAG is released and handed out."""
    cap = (10, 10)
    users = [UserId(u) for u in ("A", "B", "C")]
    q = policy(users, capacity=cap)
    rng = random.Random(seed)
    all_ids: set[TaskId] = set()
    for k, (user, stages) in enumerate(jobs):
        spec = [
            (i, [((c, m), float(dur))] * (1 + i % 2), [i - 1] if i else [])
            for i, (c, m, dur) in enumerate(stages)
        ]
        job = make_job(f"j{k}", user, 0.0, spec)
        all_ids |= {t.task_id for t in job.tasks}
        q.add_job(job, 0.0)
    now, running, done = 0.0, list[tuple[float, Task]](), set[TaskId]()
    for _ in range(500):
        while (t := q.pop()) is not None:
            q.on_dispatched(t, now)
            running.append((now + t.duration, t))
        used = [sum(t.demand[r] for _, t in running) for r in range(2)]
        assert all(u <= c for u, c in zip(used, cap, strict=True))
        if not running:
            break
        running.sort(key=lambda p: (p[0], rng.random()))
        end, t = running.pop(0)
        now = end
        q.on_finished(t, now)
        done.add(t.task_id)
    assert done == all_ids
    assert not q.jobs


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(POLICIES),
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=5),
    seed=st.integers(0, 1000),
)
def test_a_task_held_across_plans_comes_back_to_the_plan_of_its_return(
    policy: type[JobQueues], sizes: list[int], seed: int
) -> None:
    """As a gang holds popped tasks while other events make new plans, then gives some
    back (``push_back``): a task handed out by a plan made over since is queued anew,
    never charged to (or refunded into) the budgets of a plan that did not hand it out,
    and every task is still handed out once and ends; usage stays within capacity."""
    cap = (6, 6)
    users = [UserId(u) for u in ("A", "B")]
    q = policy(users, capacity=cap)
    rng = random.Random(seed)
    all_ids: set[TaskId] = set()
    for k, n in enumerate(sizes):
        job = make_job(f"j{k}", "AB"[k % 2], 0.0, [(0, [((1, 1), 1.0)] * n, [])])
        all_ids |= {t.task_id for t in job.tasks}
        q.add_job(job, 0.0)
    now, held, running, done = 0.0, list[Task](), list[tuple[float, Task]](), set[TaskId]()
    for _ in range(300):
        while (t := q.pop()) is not None:
            if rng.random() < 0.4:
                held.append(t)  # a gang holds it: neither dispatched nor back yet
            else:
                q.on_dispatched(t, now)
                running.append((now + t.duration, t))
        if held and (not running or rng.random() < 0.5):
            q.push_back(held.pop(rng.randrange(len(held))))  # no node: back, as the GM does
            q.new_epoch()
        used = [sum(t.demand[r] for _, t in running) for r in range(2)]
        assert all(u <= c for u, c in zip(used, cap, strict=True))
        if not running:
            continue
        running.sort(key=lambda p: (p[0], rng.random()))
        now, t = running.pop(0)
        q.on_finished(t, now)
        done.add(t.task_id)
        q.new_epoch()
    assert done == all_ids
    assert not q.jobs


# ------------------------------------------------------- failure of a DAG task
def _gm_with(policy: str) -> GlobalMaster:
    users = [UserConfig(A, GmId("gm0"), 1.0)]
    queues = make_policy(policy, users)(GmId("gm0"), [A])
    return GlobalMaster(GmId("gm0"), [LmId("lm0")], users, queues=queues)


def _submit_dag(gm: GlobalMaster, job: DagJob, now: float) -> list[Effect]:
    return gm.handle(AdmitJob(job=to_submission(job, "", now)), now)


@pytest.mark.parametrize("policy", ["fifo", "drf", "carbyne"])
def test_a_failed_task_fails_the_stages_that_needed_it_explicitly(policy: str) -> None:
    gm = _gm_with(policy)
    sync_views(gm, make_lm(nodes=[(4, 4, 0b001), (4, 4, 0b001)]))
    job = make_job(
        "j",
        "A",
        0.0,
        [
            (0, [((1, 1), 1.0)], []),  # no node has constraint 0b010: infeasible
            (1, [((1, 1), 1.0)], []),
            (2, [((1, 1), 1.0)] * 2, [0, 1]),
        ],
        constraints=[[0b010], [0b001], [0b001, 0b001]],
    )
    effects = _submit_dag(gm, job, 0.0) + decide(gm, 0.0, max_tasks=10)
    failed = {f.task.task_id: f.reason for f in failures(effects)}
    assert set(failed) == {"j.s0.t0", "j.s2.t0", "j.s2.t1"}
    assert failed[TaskId("j.s2.t0")] == "parent task j.s0.t0 failed"
    assert not gm.queues.has_work()
    if isinstance(gm.queues, JobQueues):
        assert list(gm.queues.jobs[JobId("j")].stages) == [1]


def test_an_altruistic_task_never_triggers_a_fairness_preemption() -> None:
    """Same situation as the GM core's preemption test, but the waiting task is
    ALTRUISTIC: it uses only what is free, so it is re-queued, nobody is preempted."""
    lm = make_lm(nodes=[(10, 10)])
    gm = make_gm(users=[("a", "gm0", 0.2), ("c", "gm0", 0.2), ("b", "gm0", 0.6)])
    for user, cpu in (("a", 4), ("c", 6)):
        (reply, *_) = lm.handle(launch_req(make_task(cpu, cpu, user=user)), 0.0)
        assert isinstance(reply, Reply)
    sync_views(gm, lm)
    t = make_task(2, 2, user="b")
    submit(gm, [t], 0.0)
    task_of(gm, t).altruistic = True
    assert preempts(decide(gm, 1.0)) == []
    assert gm.counters.requeues == 1
    task_of(gm, t).altruistic = False  # as DEFAULT it does preempt (the core's own test)
    gm.queues.new_epoch()
    assert len(preempts(decide(gm, 2.0))) == 1


@pytest.mark.parametrize("policy", ["fifo", "carbyne"])
def test_a_task_failing_on_its_worker_fails_its_dependent_stages(policy: str) -> None:
    gm = _gm_with(policy)
    lm = make_lm()
    sync_views(gm, lm)
    job = make_job("j", "A", 0.0, [(0, [((1, 1), 1.0)], []), (1, [((1, 1), 1.0)] * 2, [0])])
    _submit_dag(gm, job, 0.0)
    for e in decide(gm, 0.0):
        assert isinstance(e, ToLm)
        for ans in lm.handle(e.msg, 0.0):
            if isinstance(ans, Reply):
                gm.handle(ans.msg, 0.0)
    root = job.stages[0].tasks[0].spec
    lost: list[Effect] = []
    for ans in lm.handle(report(LmId("lm0"), ReportKind.FAILED, root, 0, 1.0), 1.0):
        if isinstance(ans, ToGm):
            lost.extend(gm.handle(TaskEvents(lm=LmId("lm0"), events=(ans.msg,)), 1.0))
    assert sorted(f.task.task_id for f in failures(lost)) == ["j.s0.t0", "j.s1.t0", "j.s1.t1"]
    assert not gm.queues.has_work()
    if isinstance(gm.queues, JobQueues):
        assert not gm.queues.jobs


# ------------------------------------------------ issue 12: faithful mechanisms
def test_reverse_packing_runs_a_task_larger_than_the_share_at_full_speed() -> None:
    """One task of 10 units for 1 s, a share of 5: forward packing time-shares it
    (T_k = 2 s), but the job may run it whole in the last second: latest start 1 s,
    so at t = 0 it need not start (it yields its share)."""
    job = make_job("j", "A", 0.0, [(0, [((10,), 1.0)], [])])
    stages = {
        s.stage_id: StageState(s.parents, {t.task_id: t for t in s.tasks}, 0) for s in job.stages
    }
    t_k = forward_pack(0.0, (5,), (100,), stages, [])
    assert t_k == pytest.approx(2.0)
    ids = {t.task_id for t in job.tasks}
    latest = must_start(0.0, t_k, (5,), (100,), stages, [], ids)
    assert [s for s, _ in latest] == pytest.approx([1.0])


def test_carbyne_keeps_t_k_until_a_new_job_arrives() -> None:
    """Capacity 10; J alone gets all of it (DRF gives B's unused share away): a chain of
    two 2-s tasks, T_k = 4 s.  At t = 1, with nothing started (J was altruistic), a
    fresh packing says 5 s; T_k stays 4 s.  When a second job arrives and takes half the
    capacity, T_k moves later: both tasks time-share 5 of their 10, 1 + 2 x 4 = 9 s."""
    q = CarbyneQueues([A, B], shares={A: 0.5, B: 0.5}, capacity=(10,))
    j = make_job("j", "A", 0.0, [(0, [((10,), 2.0)], []), (1, [((10,), 2.0)], [0])])
    q.add_job(j, 0.0)
    q.has_work()
    state = q.jobs[JobId("j")]
    assert state.deadline is not None
    assert state.deadline[0] == pytest.approx(4.0)
    state.events += 1  # a re-plan at t = 1 (a task of J came back, say)
    q.now = 1.0
    q._dirty = True
    q.has_work()
    assert state.deadline[0] == pytest.approx(4.0)
    q.add_job(make_job("k", "A", 1.0, [(0, [((10,), 9.0)], [])]), 1.0)
    q.has_work()
    assert state.deadline[0] == pytest.approx(9.0)


def test_sjf_counts_a_wide_stage_that_cannot_run_at_once() -> None:
    """Capacity 10.  'wide': ten 1-s tasks of 10 (critical path 1 s, but 10 s alone);
    'narrow': a chain of two 2-s tasks (4 s).  SJF by the critical path alone would
    run 'wide' first; counting resources, 'narrow' is the shorter job."""
    q = SjfQueues([A], capacity=(10,))
    q.add_job(make_job("wide", "A", 0.0, [(0, [((10,), 1.0)] * 10, [])]), 0.0)
    q.add_job(
        make_job("narrow", "A", 0.0, [(0, [((10,), 2.0)], []), (1, [((10,), 2.0)], [0])]), 0.0
    )
    first = q.pop()
    assert first is not None
    assert first.job_id == "narrow"


def test_sjf_starts_the_task_on_the_longest_remaining_path_first() -> None:
    """Two root stages: s0 (1 s, nothing after it) and s1 (1 s, then s2 of 5 s).
    Room for one task: s1's goes first (6 s of path left against 1 s)."""
    q = SjfQueues([A], capacity=(10,))
    stages = [(0, [((10,), 1.0)], []), (1, [((10,), 1.0)], []), (2, [((10,), 5.0)], [1])]
    q.add_job(make_job("j", "A", 0.0, stages), 0.0)
    first = q.pop()
    assert first is not None
    assert first.task_id.startswith("j.s1.")


def test_leftover_goes_srtf_first_then_packs_what_did_not_fit() -> None:
    """Leftover (6, 6).  Job 'short' (less work) asks (5, 1) and (5, 1); job 'long'
    asks (1, 5).  SRTF gives 'short' its first task; its second does not fit, 'long's
    does (packing): order short.t0, long.t0, then short.t1 (does not fit)."""
    from global_master.policy.leftover import schedule_leftover

    q = DrfQueues([A], capacity=(100, 100))
    short = make_job("short", "A", 0.0, [(0, [((5, 1), 1.0)] * 2, [])])
    long = make_job("long", "A", 0.0, [(0, [((1, 5), 9.0)], [])])
    q.add_job(short, 0.0)
    q.add_job(long, 0.0)
    js, jl = q.jobs[JobId("short")], q.jobs[JobId("long")]
    room = [6.0, 6.0]
    order = schedule_leftover(
        [(jl, list(jl.queued.values())), (js, list(js.queued.values()))], room, (100, 100), 0.0
    )
    assert [t.task_id for t in order] == ["short.s0.t0", "long.s0.t0", "short.s0.t1"]
    assert room == pytest.approx([0.0, 0.0])


@pytest.mark.parametrize("policy", [p for p in POLICY_NAMES if p not in ("fifo", "srpt")])
def test_a_task_no_node_admits_fails_at_once_behind_a_backlog(policy: str) -> None:
    """A task whose constraints no node meets failed as infeasible only when its turn
    in a job-aware plan came: behind a deep backlog, 646 s after it came in a 16,000-task
    run.  It goes to the GM first now, which fails it at once (as FIFO does)."""
    gm = _gm_with(policy)
    sync_views(gm, make_lm(nodes=[(1, 1, 0b001), (1, 1, 0b001)]))
    backlog = make_job("long", "A", 0.0, [(0, [((1, 1), 100.0)] * 40, [])])
    doomed = make_job("doomed", "A", 0.0, [(0, [((1, 1), 1.0)], [])], constraints=[[0b100]])
    effects = _submit_dag(gm, backlog, 0.0) + decide(gm, 0.0, max_tasks=10)
    assert not failures(effects)  # two tasks run, 38 wait
    effects = _submit_dag(gm, doomed, 1.0) + decide(gm, 1.0, max_tasks=10)
    (f,) = failures(effects)
    assert f.task.task_id == "doomed.s0.t0"
    assert "infeasible" in f.reason
