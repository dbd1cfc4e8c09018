"""``srpt`` under any sequence of what a GM does to its queues: every task held is
counted once, the remaining work is the sum of what is held, and a pop serves a job
with the least aged remaining work of its user's queue; a job goes ahead of a smaller
one that came after it by more than the aging bound."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from common.ids import UserId
from common.model import Task
from global_master.policy.srpt import SRPT_HALF_LIFE_S, SrptQueues, work_of
from tests.conftest import make_task

USERS = [UserId("a"), UserId("b")]

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.integers(0, 1),
            st.integers(0, 4),
            st.integers(0, 3),
            st.floats(0, 600),
        ),
        st.tuples(st.just("pop"), st.sampled_from(["dispatch", "wait", "back", "fail"])),
        st.tuples(st.just("wake"), st.integers(1, 3)),
        st.tuples(st.just("return"), st.integers(0, 50)),
        st.tuples(st.just("remove"), st.integers(0, 50)),
    ),
    max_size=60,
)


def check(q: SrptQueues, held: dict[tuple[str, str], Task]) -> None:
    r = q.remaining
    assert set(r.held) == set(held)
    expect: dict[tuple[str, str], float] = {}
    for t in held.values():
        jk = (t.user, t.job_id)
        expect[jk] = expect.get(jk, 0.0) + work_of(t)
    assert set(r.work) == set(expect)
    for jk, w in expect.items():
        assert abs(r.work[jk] - w) < 1e-9
    assert len(q) == len(held)


def aged(q: SrptQueues, jk: tuple[UserId, str]) -> float:
    """The rank the module documents: log2(remaining) + first submission / half-life."""
    r = q.remaining
    return math.log2(max(r.work[jk], 1e-9)) + r.arrival[jk] / r.half_life_s


def least_of(q: SrptQueues, user: UserId) -> float:
    jobs = q.queues[user].jobs  # type: ignore[attr-defined]
    return min(aged(q, jk) for jk in jobs)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_remaining_work_is_what_is_held_and_pops_serve_the_least(steps: list[tuple]) -> None:
    q = SrptQueues(USERS)
    held: dict[tuple[str, str], Task] = {}
    out: list[Task] = []  # dispatched to an LM
    for step in steps:
        if step[0] == "submit":
            _, u, job, dur, at = step
            spec = make_task(user=str(USERS[u]), job=f"j{job}", duration=float(dur))
            t = Task(spec=spec, submitted_at=at)
            q.push_back(t)
            held[t.key] = t
        elif step[0] == "pop":
            users_ready = [u for u in USERS if q.queues[u]]
            least = {u: least_of(q, u) for u in users_ready}
            t = q.pop()
            if t is None:
                assert not users_ready
                continue
            assert aged(q, (t.user, t.job_id)) == least[t.user]
            if step[1] == "dispatch":
                q.on_dispatched(t, 0.0)
                del held[t.key]
                out.append(t)
            elif step[1] == "wait":
                q.waiting.add(t)
            elif step[1] == "back":
                q.push_back(t)
            else:
                q.abandon(t, 0.0)
                del held[t.key]
        elif step[0] == "wake":
            for t in reversed(q.waiting.take_user(USERS[0], step[1])):
                q.push_front(t)
        elif step[0] == "return" and out:
            t = out.pop(step[1] % len(out))
            q.on_returned(t, 0.0)
            q.push_front(t)
            held[t.key] = t
        elif step[0] == "remove" and held:
            t = list(held.values())[step[1] % len(held)]
            assert q.remove(t)
            del held[t.key]
        check(q, held)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 2000),
    st.floats(0.5, 600),
    st.integers(1, 5),
    st.floats(0.5, 600),
    st.floats(0, 3600),
)
def test_a_larger_job_goes_first_once_it_waited_past_the_aging_bound(
    n_big: int, d_big: float, n_small: int, d_small: float, gap: float
) -> None:
    """A job arrived ``gap`` s before a smaller one: it is served first exactly when
    ``gap`` exceeds its aging bound, ``log2(its work / the other's) * half_life_s``
    (ties to the one that came first)."""
    q = SrptQueues(USERS)
    big = [
        Task(spec=make_task(user="a", job="big", duration=d_big), submitted_at=0.0)
        for _ in range(n_big)
    ]
    small = [
        Task(spec=make_task(user="a", job="small", duration=d_small), submitted_at=gap)
        for _ in range(n_small)
    ]
    for t in (*big, *small):
        q.push_back(t)
    w_big, w_small = n_big * d_big, n_small * d_small
    bound = math.log2(w_big / w_small) * SRPT_HALF_LIFE_S
    first = q.pop()
    assert first is not None
    margin = 1e-6 * max(1.0, gap)
    if gap > bound + margin:
        assert first.job_id == "big"
    elif gap < bound - margin:
        assert first.job_id == "small"
