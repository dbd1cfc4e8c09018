"""Carbyne's re-plan kept cheap: what a plan reads of the running tasks is kept as they
start and stop, and T_k skips the completions that release nothing -- with the same
results, to the bit, as the straightforward computation over every task."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.dag import children_of, make_job
from common.ids import JobId, TaskId, UserId
from common.model import Task, TaskSpec
from global_master.policy import CarbyneQueues, DrfQueues, JobQueues, SjfQueues
from global_master.policy import carbyne as carbyne_mod
from global_master.policy import sjf as sjf_mod
from global_master.policy.altruism import _from_last_release, forward_pack, job_finish
from global_master.policy.jobs import PLAN_TASKS, JobState, StageState
from global_master.policy.vectors import EPS, give

U = UserId("u")


def _task(k: int, stage: int, demand: tuple[int, int], duration: float) -> Task:
    spec = TaskSpec(
        task_id=TaskId(f"t{k}"), job_id=JobId("j"), user=U, demand=demand, duration=duration
    )
    return Task(spec=spec)


def _job(
    shape: list[tuple[list[int], int, tuple[int, int], float]],
    starts: list[float],
    stops: list[int],
) -> JobState:
    """A job of ``shape`` (parents among earlier stages, task count, demand, duration):
    the first tasks start at ``starts`` (in that order), then those at ``stops`` stop."""
    job = JobState(JobId("j"), U, 0.0, None)
    tasks: list[Task] = []
    for sid, (parents, n, demand, duration) in enumerate(shape):
        mine = [_task(len(tasks) + i, sid, demand, duration) for i in range(n)]
        job.stages[sid] = StageState(
            tuple(p for p in parents if p < sid), {t.task_id: t for t in mine}, 0
        )
        for t in mine:
            job.stage_of[t.task_id] = sid
        tasks += mine
    for t, since in zip(tasks, starts, strict=False):
        st_ = job.stages[job.stage_of[t.task_id]]
        del st_.waiting[t.task_id]
        st_.running += 1
        job.start(t, since)
    for k in stops if tasks else ():
        t = tasks[k % len(tasks)]
        if job.stop(t.task_id) is not None:
            job.stages[job.stage_of[t.task_id]].running -= 1
    return job


def _straight_usage(job: JobState, m: int) -> list[float]:
    out = [0.0] * m
    for t, _ in job.running.values():
        give(out, t.demand)
    return out


# ends close together (within EPS: one completion batch), equal, or before now
_START = st.sampled_from([0.0, 0.5, 1.0, 1.0 + EPS / 3, 1.0 + 2 * EPS / 3, 1.5, 2.0, 3.25])
_STAGE = st.tuples(
    st.lists(st.integers(0, 5), max_size=2),
    st.integers(0, 5),
    st.sampled_from([(1, 1), (2, 1), (1, 2), (3, 2), (5, 5)]),
    st.sampled_from([0.5, 1.0, 1.0 + EPS / 2, 2.0]),
)


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(_STAGE, min_size=1, max_size=6),
    starts=st.lists(_START, max_size=20),
    stops=st.lists(st.integers(0, 40), max_size=4),
    now=st.sampled_from([0.0, 1.0, 2.0, 2.5, 3.0 + EPS / 2]),
    cap=st.sampled_from([(4.0, 4.0), (6.5, 3.0), (20.0, 20.0)]),
)
def test_job_finish_is_forward_pack_over_every_running_task(
    shape: list[tuple[list[int], int, tuple[int, int], float]],
    starts: list[float],
    stops: list[int],
    now: float,
    cap: tuple[float, float],
) -> None:
    job = _job(shape, starts, stops)
    assert [e[0] for e in job.by_end] == sorted(s + t.duration for t, s in job.running.values())
    assert job.usage(2) == _straight_usage(job, 2)
    straight = forward_pack(now, cap, (20, 20), job.stages, job.running_list())
    assert job_finish(now, cap, (20, 20), job) == straight


@settings(max_examples=300, deadline=None)
@given(
    wide=_STAGE,
    child=_STAGE,
    others=st.lists(_STAGE, max_size=3),
    starts=st.lists(_START, min_size=5, max_size=20),
    now=st.sampled_from([0.0, 1.0, 2.0]),
)
def test_job_finish_of_a_running_stage_and_its_waiting_child(
    wide: tuple[list[int], int, tuple[int, int], float],
    child: tuple[list[int], int, tuple[int, int], float],
    others: list[tuple[list[int], int, tuple[int, int], float]],
    starts: list[float],
    now: float,
) -> None:
    """The stage that runs first has every task running, the next waits on it: the
    completions before it ends are skipped, most often."""
    shape = [([], min(wide[1], 5), *wide[2:]), ([0], max(child[1], 1), *child[2:]), *others]
    job = _job(shape, starts, [])
    straight = forward_pack(now, (6.5, 3.0), (20, 20), job.stages, job.running_list())
    assert job_finish(now, (6.5, 3.0), (20, 20), job) == straight


def test_job_finish_skips_the_completions_that_release_nothing() -> None:
    """A wide running stage and the stage waiting on it: T_k starts at the batch in
    which the wide stage ends, and is the same as packing every completion."""
    shape = [([], 400, (1, 1), 1.0), ([], 2, (1, 1), 1.0), ([0], 3, (2, 2), 2.0)]
    starts = [k / 1000 for k in range(400)] + [0.0, 0.5]
    job = _job(shape, starts, [7, 100])
    rest = _from_last_release(0.2, job.stages, {0: [2]}, job.by_end)
    assert rest is not None
    assert [e[3] for e in rest] == [0, 1]  # the wide stage's last task, then stage 1's
    straight = forward_pack(0.2, (4.0, 4.0), (20, 20), job.stages, job.running_list())
    assert job_finish(0.2, (4.0, 4.0), (20, 20), job) == straight == pytest.approx(5.399)


@settings(max_examples=200, deadline=None)
@given(
    parents=st.lists(st.lists(st.integers(0, 11), max_size=4), min_size=1, max_size=12),
    changes=st.lists(
        st.tuples(st.integers(0, 11), st.one_of(st.none(), st.integers(0, 11))), max_size=12
    ),
)
def test_the_kept_edges_are_those_of_the_stages_left(
    parents: list[list[int]], changes: list[tuple[int, int | None]]
) -> None:
    """``children`` and ``live_parents`` are kept between plans; as stages finish (and,
    in the same step, a returning task's stage comes back) they are those of the stages
    left, to the order of each list."""
    job = JobState(JobId("j"), U, 0.0, None)
    for sid, ps in enumerate(parents):
        job.stages[sid] = StageState(tuple(p for p in ps if p < sid), {}, 0)
    for gone, back in changes:
        job.stages.pop(gone, None)
        if back is not None:
            ps = tuple(p for p in parents[back % len(parents)] if p < back)  # a DAG's
            job.stages.setdefault(back, StageState(ps, {}, 0))
        left = job.stages
        assert job.children() == children_of({s: x.parents for s, x in left.items()})
        assert job.live_parents() == {
            s: [p for p in x.parents if p in left] for s, x in left.items()
        }


def test_a_ready_stage_packs_from_the_start() -> None:
    job = _job([([], 5, (1, 1), 1.0)], [0.0, 0.1], [])
    assert _from_last_release(0.0, job.stages, {}, job.by_end) is None
    assert job_finish(0.0, (1.0, 1.0), (20, 20), job) == 4.1


# ----------------------------------------------------- decisions, event by event
def _straightforward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan computed from every task: T_k by forward packing over the running
    list, usage summed afresh."""

    def finish(now: float, cap: Any, capacity: Any, job: JobState) -> float:
        return forward_pack(now, cap, capacity, job.stages, job.running_list())

    monkeypatch.setattr(carbyne_mod, "job_finish", finish)
    monkeypatch.setattr(sjf_mod, "job_finish", finish)
    monkeypatch.setattr(JobState, "usage", _straight_usage)


def _drive(
    policy: str, jobs: list[list[tuple[int, int, int, int]]], seed: int
) -> list[tuple[Any, ...]]:
    """Run ``jobs`` (stages of (count, cpu, mem, duration), each waiting on the one
    before or on none) through the queues as a GM would -- pop, start, finish, some
    tasks coming back, arrivals over time -- and record every decision."""
    users = [UserId(u) for u in ("A", "B")]
    rng = random.Random(seed)
    q: JobQueues
    if policy == "carbyne":
        q = CarbyneQueues(users, capacity=(16, 16), p_altruism=0.7, rng=random.Random(seed))
    elif policy == "carbyne-pack":
        q = CarbyneQueues(users, capacity=(16, 16), packing_first=True)
    else:
        q = (
            DrfQueues(users, capacity=(16, 16))
            if policy == "drf"
            else SjfQueues(users, capacity=(16, 16))
        )
    pending = []
    for k, stages in enumerate(jobs):
        spec = [
            (i, [((c, m), float(d))] * n, [i - 1] if i and (n + i) % 3 else [])
            for i, (n, c, m, d) in enumerate(stages)
        ]
        pending.append((float(k % 3), make_job(f"j{k}", users[k % 2], float(k % 3), spec)))
    log: list[tuple[Any, ...]] = []
    now, running = 0.0, list[tuple[float, int, Task]]()
    stamp = 0
    for _ in range(2000):
        while pending and pending[0][0] <= now:
            q.add_job(pending.pop(0)[1], now)
        while (t := q.pop()) is not None:
            q.on_dispatched(t, now)
            running.append((now + t.duration, stamp, t))
            stamp += 1
            log.append(("start", now, t.task_id, t.altruistic))
        log.append(("plan", q.counters["plans"], dict(q.counters)))
        if isinstance(q, CarbyneQueues):
            log.append(("yield", q.last_yield, q.last_leftover))
            log.append(("t_k", [(j.job_id, j.deadline) for j in q.jobs.values()]))
        if not running and not pending:
            break
        running.sort(key=lambda p: (p[0], p[1]))
        if not running or (pending and pending[0][0] < running[0][0]):
            now = pending[0][0]
            continue
        end, _, t = running.pop(0)
        now = end
        if rng.random() < 0.1:  # preempted: back to the front of its queue
            q.on_returned(t, now)
            q.push_front(t)
            log.append(("back", now, t.task_id))
        else:
            q.on_finished(t, now)
            log.append(("done", now, t.task_id))
    return log


# a job: up to 4 stages of (count, cpu, mem, duration)
_STAGE4 = st.tuples(st.integers(1, 12), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3))
_JOB = st.lists(_STAGE4, min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(
    policy=st.sampled_from(["carbyne", "carbyne-pack", "drf", "sjf"]),
    jobs=st.lists(_JOB, min_size=1, max_size=4),
    seed=st.integers(0, 1000),
)
def test_decisions_are_those_of_the_straightforward_plan(
    policy: str, jobs: list[list[tuple[int, int, int, int]]], seed: int
) -> None:
    fast = _drive(policy, jobs, seed)
    with pytest.MonkeyPatch.context() as mp:
        _straightforward(mp)
        straight = _drive(policy, jobs, seed)
    assert fast == straight


# ----------------------------------------------- a large job's packings, amortized
def _packings_per_end(
    n: int, ends: int, *, come_back: int | None = None, policy: str = "carbyne"
) -> list[int]:
    """One job of ``n`` runnable 1-s tasks and a task after them, on room for 16: the
    packings made after each of its first ``ends`` task ends (``come_back``: the end at
    which a running task comes back instead) -- Carbyne's reverse packings, or SJF's
    finish-time packings."""
    calls = [0]
    module, name = (carbyne_mod, "must_start") if policy == "carbyne" else (sjf_mod, "job_finish")
    inner = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return inner(*args, **kwargs)

    q: JobQueues = (
        CarbyneQueues([U], capacity=(16, 16))
        if policy == "carbyne"
        else SjfQueues([U], capacity=(16, 16))
    )
    job = make_job("j", U, 0.0, [(0, [((1, 1), 1.0)] * n, []), (1, [((1, 1), 1.0)], [0])])
    out = []
    handed: set[TaskId] = set()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module, name, counted)
        q.add_job(job, 0.0)
        running = []
        for k in range(ends + 1):
            while (t := q.pop()) is not None:
                assert t.task_id not in handed  # a kept order never hands out a started task
                handed.add(t.task_id)
                q.on_dispatched(t, float(k))
                running.append(t)
            out.append(calls[0])
            t = running.pop(0)
            if k == come_back:
                q.on_returned(t, k + 1.0)
                q.push_front(t)
                handed.discard(t.task_id)
            else:
                q.on_finished(t, k + 1.0)
    return [b - a for a, b in itertools.pairwise(out)]


def test_a_small_job_is_repacked_at_every_task_end() -> None:
    n = 2 * PLAN_TASKS - 2  # with the last stage's task: just under twice
    assert _packings_per_end(n, 8) == [1] * 8


def test_a_large_job_is_repacked_once_per_stride_of_task_ends() -> None:
    """Every end re-packed the whole DAG: a job of n tasks cost O(n^2 log n)."""
    n = 4 * PLAN_TASKS + 8  # left // PLAN_TASKS stays 4 for 8 ends
    assert _packings_per_end(n, 8) == [0, 0, 0, 1, 0, 0, 0, 1]  # every 4th end


def test_a_task_coming_back_repacks_a_large_job_at_once() -> None:
    n = 4 * PLAN_TASKS + 8
    assert _packings_per_end(n, 4, come_back=1) == [0, 1, 0, 0]


def test_sjf_ranks_a_large_job_once_per_stride_of_task_ends() -> None:
    small = 2 * PLAN_TASKS - 2
    assert _packings_per_end(small, 4, policy="sjf") == [1] * 4
    large = 4 * PLAN_TASKS + 8
    assert _packings_per_end(large, 8, policy="sjf") == [0, 0, 0, 1, 0, 0, 0, 1]
    assert _packings_per_end(large, 4, come_back=1, policy="sjf") == [0, 1, 0, 0]
