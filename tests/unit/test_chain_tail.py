"""A job's chain tail (``altruism_tail``) packs to the same floats as the list
scheduler before it, plan after plan: the recipes and the reverse clocks kept across
plans, the tail's front moving as links are released, its recipes per allocation, a
link changed other than by its release (a task abandoned) making it again.

Random jobs ending in chains of 1-4 task links (demands and durations from small sets,
some ends within ``EPS`` or ``GAP`` of each other), run forward by random steps (tasks
start, stages end, a waiting task is dropped) while each plan packs them under a few
allocations, from smaller than one task to larger than a link: ``job_finish`` and
``must_start`` with the job must equal ``altruism.py`` at ``REFERENCE``; SJF's longest path to the end from each runnable task's
stage must equal ``finish_times`` over the whole DAG."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.dag import children_of, finish_times, make_job
from global_master.policy import altruism, altruism_tail, sjf
from global_master.policy.jobs import JobState, StageState
from global_master.policy.vectors import dominant
from tests.unit.packing_calls import packing_calls
from tests.unit.test_pack_alone import reference

DEMANDS = [(1, 1), (2, 1), (1, 2), (3, 2), (4, 4)]
DURATIONS = [0.5, 1.0, 1.0 + 4e-10, 1.0 + 5e-7, 1.5, 0.1 + 0.2, 0.3, 3.0, 7.25]
CAPS = [[1.0, 1.0], [3.0, 2.0], [4.0, 4.0], [6.0, 5.0], [2.0, 3.0], [40.0, 40.0]]
CAPACITY = [40.0, 40.0]

_TASK = st.tuples(st.integers(0, len(DEMANDS) - 1), st.sampled_from(DURATIONS))
_LINK = st.lists(_TASK, min_size=1, max_size=4)


@pytest.fixture(autouse=True)
def _short_tails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(altruism_tail, "MIN_LINKS", 2)


def _job(head: list[list[tuple[int, float]]], chain: list[list[tuple[int, float]]]) -> JobState:
    """Stages ``head`` (a small DAG: each after one or two before it, or a root), then
    ``chain``, the first after the last head stage (and the one before it, if any)."""
    stages = []
    for s, tasks in enumerate(head):
        parents = [s - 1] if s % 3 else ([s - 2, s - 1] if s >= 2 else [])
        stages.append((s, [(DEMANDS[d], x) for d, x in tasks], parents))
    n = len(head)
    for k, tasks in enumerate(chain):
        s = n + k
        parents = [s - 1] if s else []
        if k == 0 and n >= 2:
            parents = [n - 2, n - 1]
        stages.append((s, [(DEMANDS[d], x) for d, x in tasks], parents))
    job = make_job("j", "u", 0.0, stages)
    state = JobState(job.job_id, job.user, 0.0, None)
    for stg in job.stages:
        state.stages[stg.stage_id] = StageState(stg.parents, {t.task_id: t for t in stg.tasks}, 0)
        for t in stg.tasks:
            state.stage_of[t.task_id] = stg.stage_id
    _release(state)
    return state


def _ready(job: JobState) -> list[int]:
    return [s for s, stg in job.stages.items() if not any(p in job.stages for p in stg.parents)]


def _release(job: JobState) -> None:
    for s in _ready(job):
        for t in job.stages[s].waiting.values():
            if t.task_id not in job.queued:
                job.enqueue(t)


def _step(job: JobState, now: float, kind: int, pick: int) -> float:
    """One change of the job: start tasks, end a stage, or drop a waiting task."""
    job.version += 1
    ready = _ready(job)
    if kind == 0 and ready:  # start up to two runnable tasks of a ready stage
        stg = job.stages[ready[pick % len(ready)]]
        for tid in list(stg.waiting)[:2]:
            task = stg.waiting.pop(tid)
            job.dequeue(tid)
            stg.running += 1
            job.start(task, now - 0.1 * (pick % 3))
        return now
    if kind == 1 and ready:  # a ready stage ends (its tasks run and end)
        s = ready[pick % len(ready)]
        stg = job.stages[s]
        for tid, task in list(stg.waiting.items()):
            stg.waiting.pop(tid)
            job.dequeue(tid)
            stg.running += 1
            job.start(task, now)
        for tid in [t for t, _ in job.running.items() if job.stage_of[t] == s]:
            job.stop(tid)
            stg.running -= 1
        del job.stages[s]
        _release(job)
        return now + 0.5 + 0.25 * (pick % 4)
    if kind == 2:  # a waiting task is dropped (abandoned), anywhere
        stages = [s for s, g in job.stages.items() if len(g.waiting) > 1]
        if stages:
            stg = job.stages[stages[pick % len(stages)]]
            tid = next(iter(stg.waiting))
            stg.waiting.pop(tid)
            job.dequeue(tid)
    return now


def _same_packings(job: JobState, now: float, cap: list[float]) -> None:
    old = reference()
    fwd = altruism.job_finish(now, cap, CAPACITY, job)
    assert fwd == old.job_finish(now, cap, CAPACITY, job)
    running = job.running_list()
    for horizon in (fwd, fwd + 1.5, fwd + 1e-10):
        args = (now, horizon, cap, CAPACITY, job.stages, running, set(job.queued))
        new = altruism.must_start(*args, job.live_parents(), job)
        before = old.must_start(*args, job.live_parents())
        assert [(x, t.task_id) for x, t in new] == [(x, t.task_id) for x, t in before]
    # the edges kept as stages end, and the waiting work (tail terms kept)
    stages = job.stages
    assert job.live_parents() == {
        s: [p for p in g.parents if p in stages] for s, g in stages.items()
    }
    assert job.children() == children_of({s: g.parents for s, g in stages.items()})
    work = sum(
        dominant(t.demand, cap) * t.duration for g in stages.values() for t in g.waiting.values()
    )
    for t, since in job.running.values():
        work += dominant(t.demand, cap) * max(0.0, since + t.duration - now)
    job.version += 1  # (remaining_work keeps its sum per version)
    assert job.remaining_work(now, cap) == work
    # SJF's longest path to the end of every runnable task's stage
    length = {
        s: max((t.duration for t in g.waiting.values()), default=0.0) for s, g in job.stages.items()
    }
    paths = finish_times(job.children(), length)
    kept = sjf._longest_to_end(job, CAPACITY)
    for tid in job.queued:
        s = job.stage_of[tid]
        assert kept.get(s, 0.0) == paths.get(s, 0.0)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_LINK, min_size=0, max_size=4),
    st.lists(_LINK, min_size=2, max_size=24),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 11), st.lists(st.integers(0, 5), max_size=3)),
        max_size=30,
    ),
)
def test_plan_after_plan_the_tail_packs_as_the_list_scheduler(
    head: list[list[tuple[int, float]]],
    chain: list[list[tuple[int, float]]],
    steps: list[tuple[int, int, list[int]]],
) -> None:
    job = _job(head, chain)
    now = 0.0
    for kind, pick, caps in steps:
        for c in caps:
            _same_packings(job, now, CAPS[c])
        if not job.stages:
            break
        now = _step(job, now, kind, pick)


def test_a_deep_chain_is_packed_by_its_recipes() -> None:
    """A chain of links that fit their allocation: the list scheduler packs none of
    them after the first plan made the recipes (forward and reverse)."""
    chain = [[(1, 1.0 + s / 7), (0, 2.0)] for s in range(60)]
    job = _job([], chain)
    with packing_calls() as calls:
        _same_packings(job, 0.0, [4.0, 4.0])
        _step(job, 0.0, 1, 0)
        calls.update(alone=0, scheduler=0)
        _same_packings(job, 1.0, [4.0, 4.0])
    # one forward and three reverse packings: each packs the released first link alone
    # (runnable: not in the tail), and the 58 links after it by their recipes
    assert calls == {"alone": 4, "scheduler": 0}
    assert job.chain is not None
    assert job.chain.front == 1
