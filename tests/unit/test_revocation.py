"""A revoked user's tasks end ``user_revoked``: queued ones at once, running ones
stopped by their LMs (issue 32, item 2; ``global_master.revocation``)."""

from __future__ import annotations

from common.ids import GmId, LmId, TaskId, UserId
from common.messages import LaunchRequest, StopUserTasks, UserAccess
from common.overload import OverloadPolicy
from global_master.revocation import USER_REVOKED
from security.identity import gm, lm, user, workers
from security.signing import may_call
from tests.conftest import Network, make_gm, make_lm, make_task

GM0, GM1, LM0 = GmId("gm0"), GmId("gm1"), LmId("lm0")
U0, U1, U2 = UserId("u0"), UserId("u1"), UserId("u2")


def _federation() -> tuple[Network, list[TaskId], list[TaskId]]:
    """gm0 serves u0 and u1 on lm0's one node of 4 CPUs; u0 runs 3 tasks and has 2
    queued, u1 runs 1."""
    users = (("u0", "gm0", 0.5), ("u1", "gm0", 0.5))
    net = Network({GM0: make_gm(users=users)}, {LM0: make_lm(nodes=[(4, 8)])})
    net.start(0.0)
    u0 = [make_task(user="u0", job=f"j{i // 3}", duration=60.0) for i in range(5)]
    u1 = [make_task(user="u1", job="j9", duration=60.0)]
    net.submit(GM0, u0[:3] + u1, 1.0)
    net.place_and_start(GM0, 1.0, 1.1, max_tasks=10)
    net.submit(GM0, u0[3:], 2.0)
    net.place_and_start(GM0, 2.0, 2.1, max_tasks=10)  # no room: they wait
    assert len(net.running) == 4
    return net, [s.task_id for s in u0], [s.task_id for s in u1]


def _revoke(net: Network, user: UserId, now: float) -> None:
    net.send(net.gms[GM0].handle(UserAccess(user=user), now), now, src_gm=GM0)
    net.run(now)
    net.work_all(now)  # the pool stops them and says so
    net.run(now)
    net.decide(GM0, now, max_tasks=10)  # what came back is decided on: it ends
    net.run(now)


def test_revoking_a_user_ends_its_queued_and_running_tasks_and_no_one_elses() -> None:
    net, u0, u1 = _federation()
    _revoke(net, U0, 3.0)
    for t in u0:
        out = net.outcomes[(U0, t)]
        assert not out.finished
        assert out.reason == USER_REVOKED
    assert [r[2:] for r in net.running] == [(U1, u1[0])]
    assert net.lms[LM0].counters.revoked_stops == 3
    assert net.gms[GM0].counters.revoked_ended == 5
    assert not net.gms[GM0].has_work()


def test_a_launch_that_crosses_the_stop_is_stopped_when_it_is_accepted() -> None:
    """The LM takes the stop first, then a launch of the revoked user sent before it:
    the GM stops that one too once the LM's acceptance arrives."""
    users = (("u0", "gm0", 1.0),)
    net = Network({GM0: make_gm(users=users)}, {LM0: make_lm(nodes=[(4, 8)])})
    net.start(0.0)
    spec = make_task(user="u0", job="j0", duration=60.0)
    net.submit(GM0, [spec], 1.0)
    net.decide(GM0, 1.0)  # the launch is on the wire
    net.send(net.gms[GM0].handle(UserAccess(user=U0), 1.1), 1.1, src_gm=GM0)
    stop = next(i for i, e in enumerate(net.wire) if isinstance(e.msg, StopUserTasks))
    net.deliver(stop, 1.2)  # the stop overtakes the launch: nothing to stop yet
    net.run(1.3)
    net.work_all(1.4)
    net.run(1.4)
    net.work_all(1.5)
    net.run(1.5)
    net.decide(GM0, 1.6)
    net.run(1.6)
    assert net.running == []
    out = net.outcomes[(U0, spec.task_id)]
    assert out.reason == USER_REVOKED


def test_a_gm_stops_only_what_it_placed_for_its_user() -> None:
    """gm1 asking lm0 to stop u0's tasks stops none of gm0's placements."""
    net, _, _ = _federation()
    lm = net.lms[LM0]
    effects = lm.handle(StopUserTasks(gm=GM1, lm=LM0, user=U0), 3.0)
    assert lm.counters.revoked_stops == 0
    assert [e for e in effects if type(e).__name__ == "ToWorker"] == []


def test_a_user_given_a_token_again_is_placed_again() -> None:
    net, _, _ = _federation()
    _revoke(net, U0, 3.0)
    net.send(net.gms[GM0].handle(UserAccess(user=U0, revoked=False), 4.0), 4.0, src_gm=GM0)
    spec = make_task(user="u0", job="j7", duration=60.0)
    net.submit(GM0, [spec], 5.0)
    net.place_and_start(GM0, 5.0, 5.1)
    assert (LM0, 0, U0, spec.task_id) in [(r[0], r[1], r[2], r[3]) for r in net.running]


def test_revoking_a_user_of_another_gm_changes_nothing() -> None:
    net, _, _ = _federation()
    assert net.gms[GM0].handle(UserAccess(user=U2), 3.0) == []


def test_only_a_gm_may_ask_an_lm_to_stop_a_users_tasks() -> None:
    assert may_call(gm("gm0"), lm("lm0"), "POST", "/v1/stop-user")
    assert not may_call(workers("lm0"), lm("lm0"), "POST", "/v1/stop-user")
    assert not may_call(user("u0"), lm("lm0"), "POST", "/v1/stop-user")


def test_a_task_held_back_by_the_launch_window_is_never_sent_once_its_user_is_revoked() -> None:
    """With a launch window of one, u0's second task is decided while the first one's
    request is unanswered: its placement waits in the outbox.  Revoked then, it ends
    ``user_revoked`` at once and no request for it leaves when the window opens (it
    used to leave, start on the LM after the stop, and be stopped again)."""
    users = (("u0", "gm0", 1.0),)
    gm0 = make_gm(users=users, overload=OverloadPolicy(launch_window=1))
    net = Network({GM0: gm0}, {LM0: make_lm(nodes=[(4, 8), (4, 8)])})
    net.start(0.0)
    specs = [make_task(4, 8, user="u0", job="j0", duration=60.0) for _ in range(2)]
    net.submit(GM0, specs, 1.0)
    net.decide(GM0, 1.0)
    net.decide(GM0, 1.0)  # the second one held behind the first one's request
    assert gm0.outbox.held
    net.send(gm0.handle(UserAccess(user=U0), 1.1), 1.1, src_gm=GM0)
    assert net.outcomes[(U0, specs[1].task_id)].reason == USER_REVOKED
    assert not gm0.outbox.held
    for _ in range(20):
        launched = [p.spec.task_id for e in net.wire if isinstance(e.msg, LaunchRequest)
                    for p in e.msg.placements]  # fmt: skip
        assert specs[1].task_id not in launched
        if not net.wire:
            break
        net.deliver(0, 1.2)
    net.work_all(1.3)
    net.run(1.3)
    net.decide(GM0, 1.4)
    net.run(1.4)
    assert net.running == []
    assert net.outcomes[(U0, specs[0].task_id)].reason == USER_REVOKED
