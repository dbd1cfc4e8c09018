"""``srpt`` under any sequence of what a GM does to its queues: every task held is
counted once, the remaining work is the sum of what is held, and a pop serves a job
with the least remaining work of its user's queue."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from common.ids import UserId
from common.model import Task
from global_master.policy.srpt import SrptQueues, work_of
from tests.conftest import make_task

USERS = [UserId("a"), UserId("b")]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 1), st.integers(0, 4), st.integers(0, 3)),
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


def least_of(q: SrptQueues, user: UserId) -> float:
    jobs = q.queues[user].jobs  # type: ignore[attr-defined]
    return min(q.remaining.work[jk] for jk in jobs)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_remaining_work_is_what_is_held_and_pops_serve_the_least(steps: list[tuple]) -> None:
    q = SrptQueues(USERS)
    held: dict[tuple[str, str], Task] = {}
    out: list[Task] = []  # dispatched to an LM
    for step in steps:
        if step[0] == "submit":
            _, u, job, dur = step
            t = Task(spec=make_task(user=str(USERS[u]), job=f"j{job}", duration=float(dur)))
            q.push_back(t)
            held[t.key] = t
        elif step[0] == "pop":
            users_ready = [u for u in USERS if q.queues[u]]
            least = {u: least_of(q, u) for u in users_ready}
            t = q.pop()
            if t is None:
                assert not users_ready
                continue
            assert q.remaining.work[(t.user, t.job_id)] == least[t.user]
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
