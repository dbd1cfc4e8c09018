"""User queues: round-robin, front/back, parking per epoch."""

from __future__ import annotations

import pytest

from common.ids import GmId, UserId
from common.model import Task, UserConfig
from global_master.policy import POLICIES, make_policy
from global_master.queues import UserQueues
from tests.conftest import make_task

A, B, C = UserId("a"), UserId("b"), UserId("c")


def queued(user: str) -> Task:
    """A task as a GM queues it."""
    return Task(spec=make_task(user=user))


def test_pop_is_round_robin_over_non_empty_queues() -> None:
    q = UserQueues([A, B, C])
    tasks = {u: [queued(user=u) for _ in range(2)] for u in ("a", "c")}
    for ts in tasks.values():
        for t in ts:
            q.push_back(t)
    order = [q.pop() for _ in range(5)]
    assert order == [tasks["a"][0], tasks["c"][0], tasks["a"][1], tasks["c"][1], None]
    assert len(q) == 0


def test_front_and_back() -> None:
    q = UserQueues([A])
    first, second, preempted = queued(user="a"), queued(user="a"), queued(user="a")
    q.push_back(first)
    q.push_back(second)
    q.push_front(preempted)
    assert list(q) == [preempted, first, second]
    assert q.remove(first)
    assert not q.remove(first)
    assert len(q) == 2


def test_a_queue_parks_after_patience_failures_until_a_new_epoch() -> None:
    q = UserQueues([A, B], patience=2)
    a_tasks = [queued(user="a") for _ in range(3)]
    for a in a_tasks:
        q.push_back(a)
    for _ in range(2):
        t = q.pop()
        assert t is not None
        assert t.user == A
        q.push_back(t)
        q.failed(A)
    b_task = queued(user="b")
    q.push_back(b_task)
    # a failed twice: parked; b still served
    assert q.parked(A)
    assert not q.parked(B)
    assert q.pop() is b_task
    assert q.pop() is None
    assert not q.has_work()
    q.new_epoch()
    assert q.has_work()
    assert q.pop() is not None


def test_a_short_queue_parks_after_each_of_its_tasks_failed() -> None:
    q = UserQueues([A], patience=8)
    t = queued(user="a")
    q.push_back(t)
    q.failed(A)
    assert q.parked(A)
    assert not q.has_work()


def test_placing_or_a_preempted_task_unparks() -> None:
    q = UserQueues([A], patience=1)
    q.push_back(queued(user="a"))
    q.failed(A)
    assert q.parked(A)
    q.placed(A)
    assert not q.parked(A)
    q.failed(A)
    q.push_front(queued(user="a"))
    assert not q.parked(A)
    assert q.has_work()


def test_membership_is_by_user() -> None:
    q = UserQueues([A])
    assert A in q
    assert B not in q


def test_fifo_queues_let_the_gm_preempt_for_default_tasks_only() -> None:
    q = UserQueues([A])
    t = queued(user="a")
    assert q.may_preempt_for(t)
    t.altruistic = True
    assert not q.may_preempt_for(t)


@pytest.mark.parametrize("name", POLICIES)
def test_each_policy_declares_who_keeps_its_blocked_tasks(name: str) -> None:
    """The GM reads a policy's kind, never its methods: a policy whose ``push_back``
    keeps blocked tasks itself declares ``job_aware``; plain FIFO queues hand them to
    the GM's waiting index (``fifo``)."""
    users = [UserConfig(UserId("u0"), GmId("gm0"), 1.0)]
    q = make_policy(name, users)(GmId("gm0"), [UserId("u0")])
    t = queued(user="u0")
    q.push_back(t)
    in_user_queue = any(x is t for x in q.queues[UserId("u0")])
    assert q.kind == ("fifo" if in_user_queue else "job_aware")
    # srpt orders the user queues and the waiting index, and keeps no task itself
    assert (q.kind == "fifo") == (name in ("fifo", "srpt"))
