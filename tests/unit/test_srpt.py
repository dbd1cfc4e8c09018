"""``srpt``: least remaining work first within a user, in its queue and in the GM's
waiting index; the remaining work follows the tasks out and back."""

from __future__ import annotations

from common.ids import GmId, UserId
from common.model import Task, UserConfig
from global_master.policy import SrptQueues, make_policy
from global_master.policy.srpt import UNKNOWN_DURATION_S
from tests.conftest import make_task

A, B = UserId("a"), UserId("b")


def task(job: str, duration: float = 1.0, user: str = "a", constraints: int = 0) -> Task:
    return Task(spec=make_task(user=user, job=job, duration=duration, constraints=constraints))


def fill(q: SrptQueues, job: str, n: int, duration: float = 1.0, user: str = "a") -> list[Task]:
    tasks = [task(job, duration, user) for _ in range(n)]
    for t in tasks:
        q.push_back(t)
    return tasks


def test_the_job_with_least_remaining_work_goes_first_whatever_came_first() -> None:
    q = SrptQueues([A])
    big = fill(q, "big", 3, duration=10.0)
    small = fill(q, "small", 2, duration=1.0)
    assert [q.pop() for _ in range(5)] == [*small, *big]
    assert q.pop() is None


def test_ties_go_by_arrival_and_a_job_keeps_its_task_order() -> None:
    q = SrptQueues([A])
    first = fill(q, "j1", 2)
    second = fill(q, "j2", 2)
    assert list(q) == [*first, *second]
    assert [q.pop() for _ in range(4)] == [*first, *second]


def test_a_job_whose_tasks_left_overtakes_a_smaller_one_and_a_return_puts_work_back() -> None:
    q = SrptQueues([A])
    long_job = fill(q, "long", 4, duration=3.0)  # 12 s
    mid = fill(q, "mid", 2, duration=4.0)  # 8 s
    # mid goes first; two of its tasks leave for LMs
    for t in mid:
        assert q.pop() is t
        q.on_dispatched(t, 0.0)
    assert q.remaining.work == {(A, "long"): 12.0}
    for _ in range(3):  # three of long's leave: 3 s remain
        t = q.pop()
        assert t in long_job
        q.on_dispatched(t, 0.0)
    newcomer = fill(q, "new", 2, duration=2.0)  # 4 s: more than long's 3 s
    assert q.pop() is long_job[3]
    q.push_front(long_job[3])  # not placed: back, its work still counted once
    assert q.remaining.work[(A, "long")] == 3.0
    # preempted: mid has 4 s again, as newcomer; it had left the queues entirely, so it
    # comes back as arriving now, after newcomer
    q.on_returned(mid[0], 0.0)
    q.push_front(mid[0])
    assert q.remaining.work[(A, "mid")] == 4.0
    assert [q.pop() for _ in range(4)] == [long_job[3], *newcomer, mid[0]]


def test_users_are_still_served_round_robin() -> None:
    q = SrptQueues([A, B])
    a = fill(q, "ja", 2, duration=100.0)
    b = fill(q, "jb", 2, duration=1.0, user="b")
    assert [q.pop() for _ in range(4)] == [a[0], b[0], a[1], b[1]]


def test_the_waiting_index_offers_a_class_to_the_least_remaining_work() -> None:
    q = SrptQueues([A])
    big = fill(q, "big", 2, duration=50.0)
    small = fill(q, "small", 1, duration=5.0)
    for _ in range(3):  # none found room: all into the GM's waiting index
        t = q.pop()
        assert t is not None
        q.waiting.add(t)
    cls = (0, big[0].demand)
    assert q.waiting.take(cls, 2, [A]) == [small[0], big[0]]
    assert q.waiting.take_user(A, 5) == [big[1]]
    assert not q.waiting


def test_unknown_durations_count_as_tasks_and_removal_forgets_the_work() -> None:
    q = SrptQueues([A])
    three = fill(q, "three", 3, duration=0.0)
    two = fill(q, "two", 2, duration=0.0)
    assert q.remaining.work[(A, "three")] == 3 * UNKNOWN_DURATION_S
    assert q.pop() is two[0]
    assert q.abandon(two[0], 0.0) == []  # failed for good
    assert q.remove(two[1])
    assert not q.remove(two[1])
    assert (A, "two") not in q.remaining.work
    assert [q.pop() for _ in range(3)] == three
    for t in three:
        q.on_dispatched(t, 0.0)
    assert not q.remaining.held
    assert not q.remaining.work


def test_make_policy_builds_srpt_queues() -> None:
    users = [UserConfig(A, GmId("gm0"), 1.0)]
    q = make_policy("srpt", users)(GmId("gm0"), [A])
    assert isinstance(q, SrptQueues)
    assert q.kind == "fifo"


def _big_then_small(half_life_s: float) -> tuple[list[Task], list[Task], Task | None]:
    """A job 8x larger arrives at 0, a small one at 300 s: which the GM's srpt serves."""
    q = make_policy("srpt", [UserConfig(A, GmId("gm0"), 1.0)], srpt_half_life_s=half_life_s)(
        GmId("gm0"), [A]
    )
    big = [Task(spec=make_task(user="a", job="big", duration=8.0), submitted_at=0.0)]
    small = [Task(spec=make_task(user="a", job="small", duration=1.0), submitted_at=300.0)]
    for t in (*big, *small):
        q.push_back(t)
    return big, small, q.pop()


def test_the_half_life_set_for_the_policy_decides_when_a_large_job_goes_first() -> None:
    # log2(8) = 3 half-lives: 60 s each puts the big job ahead after 180 s < 300 s
    big, _, first = _big_then_small(60.0)
    assert first is big[0]
    # 200 s each: after 600 s, so the small job, 300 s younger, still goes first
    _, small, first = _big_then_small(200.0)
    assert first is small[0]
    # no aging (plain SRPT): least work first, however long the big one waited
    _, small, first = _big_then_small(float("inf"))
    assert first is small[0]
