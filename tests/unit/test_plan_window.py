"""A plan lists at most ``PLAN_WINDOW`` of a job's runnable tasks (the first in the
policy's order), so one task end of a job of n tasks costs a plan bounded in n, not
linear in it; a plan that handed a whole window out is made afresh at once, so a large
job on a large idle cluster still starts everything that fits without waiting for an
event.  ``queued_demands`` always counts what ``queued`` holds.  No event loop."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.dag import make_job
from common.ids import GmId, UserId
from common.model import Task, UserConfig
from global_master.policy import POLICIES, make_policy
from global_master.policy.jobs import PLAN_WINDOW, JobQueues

U = UserId("u")
JOB_AWARE = [p for p in POLICIES if p not in ("fifo", "srpt")]  # srpt: the GM keeps its waits


def queues(policy: str, slots: int) -> JobQueues:
    users = [UserConfig(user=U, gm=GmId("gm0"), share=1.0)]
    q = make_policy(policy, users)(GmId("gm0"), [U])
    assert isinstance(q, JobQueues)
    q.set_cluster((slots, slots), {(1, 1)})
    return q


def wide_job(n: int) -> object:
    """One stage of ``n`` identical 1-s tasks, and one task after them."""
    return make_job("wide", U, 0.0, [(0, [((1, 1), 1.0)] * n, []), (1, [((1, 1), 1.0)], [0])])


@pytest.mark.parametrize("policy", JOB_AWARE)
def test_a_large_job_on_an_idle_cluster_starts_everything_that_fits_at_once(
    policy: str,
) -> None:
    n = 3 * PLAN_WINDOW + 10
    q = queues(policy, slots=n)
    q.add_job(wide_job(n), 0.0)  # type: ignore[arg-type]
    handed: list[Task] = []
    while (t := q.pop()) is not None:
        assert len(q._plan) < PLAN_WINDOW  # the plan lists one window of the job
        handed.append(t)
        q.on_dispatched(t, 0.0)
    assert len({t.task_id for t in handed}) == len(handed) == n
    assert q.counters["plans"] == 4  # one per window handed out, no more


@pytest.mark.parametrize("policy", JOB_AWARE)
def test_a_large_job_on_a_full_cluster_costs_one_bounded_plan_per_task_end(
    policy: str,
) -> None:
    q = queues(policy, slots=16)
    q.add_job(wide_job(4 * PLAN_WINDOW), 0.0)  # type: ignore[arg-type]
    running: list[Task] = []
    for k in range(40):
        while (t := q.pop()) is not None:
            q.on_dispatched(t, float(k))
            running.append(t)
        assert len(running) == 16  # every freed slot is filled again
        assert len(q._plan) <= PLAN_WINDOW
        q.on_finished(running.pop(0), k + 1.0)
    assert q.counters["plans"] == 40  # the first and one per end but the last: no more


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 19)), max_size=80))
def test_queued_demands_count_what_is_queued(ops: list[tuple[int, int]]) -> None:
    q = queues("drf", slots=64)
    demands = [(1 + k % 3, 1 + k % 2) for k in range(20)]
    job = make_job("j", U, 0.0, [(0, [(d, 1.0) for d in demands], [])])
    q.add_job(job, 0.0)
    tasks = {t.task_id: t for t in job.tasks}
    ids = sorted(tasks)
    rng = random.Random(len(ops))
    for op, i in ops:
        t = tasks[ids[i]]
        state = q.jobs.get(t.job_id)
        if op == 0 and (popped := q.pop()) is not None:
            q.on_dispatched(popped, 0.0)
        elif op == 1 and state is not None and t.task_id in state.running:
            q.on_returned(t, 0.0)
            q.push_front(t)
        elif op == 2 and state is not None and t.task_id in state.running:
            q.on_finished(t, 1.0)
        elif op == 3 and rng.random() < 0.5:
            q.remove(t)
        for j in q.jobs.values():
            assert j.queued_demands == dict(Counter(x.demand for x in j.queued.values()))
