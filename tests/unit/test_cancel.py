"""Cancel in the cores, step by step: a job with tasks running, in flight and queued."""

from __future__ import annotations

from common.effects import ToLm
from common.ids import GmId, TaskId, UserId
from common.messages import (
    CancelJob,
    CancelTasks,
    Decide,
    EventKind,
    LaunchRequest,
    PreemptRequest,
    StartTasks,
    TaskEvents,
)
from common.model import TaskState
from common.overload import OverloadPolicy
from global_master.core import GlobalMaster
from global_master.core_users import CANCELLED
from local_master.core import LocalMaster
from tests.conftest import Envelope, Network, alive, launches, make_gm, make_lm, make_task


def test_cancel_drops_queued_tasks_and_stops_running_ones() -> None:
    lm = make_lm("lm0", [(1, 1), (1, 1)])
    gm = make_gm("gm0", ("lm0",))
    net = Network({gm.gm_id: gm}, {lm.lm_id: lm})
    net.start(0.0)
    alive(lm, 0.0)
    specs = [make_task(1, 1, user="u0", task_id=f"t{i}", job="j") for i in range(3)]
    net.submit(GmId("gm0"), specs, 0.1)
    net.place_and_start(GmId("gm0"), 0.2, 0.3, max_tasks=3)
    assert len(net.running) == 2  # two nodes: t2 waits in its queue
    effects = gm.handle(CancelJob(user="u0", job_id="j"), 1.0)
    stops = [e for e in effects if isinstance(e, ToLm)]
    assert [type(e.msg) for e in stops] == [CancelTasks]
    assert {r.task_id for r in stops[0].msg.tasks} == {"t0", "t1"}
    queued = [k for k, t in gm.live.items() if t.lm is None]
    assert queued == []  # t2 ended at once
    net.send(effects, 1.0, src_gm=GmId("gm0"))
    assert net.outcomes[("u0", "t2")].reason == CANCELLED
    net.run(1.0)  # the LM stops them as a preemption does
    net.work_all(1.1)  # the pool confirms
    net.run(1.1)
    assert not net.running
    assert {k: o.reason for k, o in net.outcomes.items()} == dict.fromkeys(
        [("u0", "t0"), ("u0", "t1"), ("u0", "t2")], CANCELLED
    )
    assert not lm.active
    assert all(list(f) == [1, 1] for f in lm.free)
    assert not gm.jobs  # the job is over
    assert gm.handle(CancelJob(user="u0", job_id="j"), 2.0) == []  # idempotent
    assert gm.counters.jobs_cancelled == 1


def _placed_not_started() -> tuple[Network, LocalMaster, GlobalMaster]:
    """One job of one task (u0's t0 of j1), placed on lm0 (the LM accepted it, the GM
    heard so) but not started yet: its pool has the start command still to take."""
    lm = make_lm("lm0", [(2, 2)])
    gm = make_gm("gm0", ("lm0",))
    net = Network({gm.gm_id: gm}, {lm.lm_id: lm})
    net.start(0.0)
    alive(lm, 0.0)
    net.submit(GmId("gm0"), [make_task(1, 1, user="u0", task_id="t0", job="j1")], 0.5)
    net.decide(GmId("gm0"), 1.5)
    net.run(1.5)  # the launch, then the LM's answer
    assert gm.state_of(T0) == TaskState.PLACED
    assert [type(c) for c in net.inbox["lm0"]] == [StartTasks]
    return net, lm, gm


T0 = (UserId("u0"), TaskId("t0"))


def test_a_stop_confirmed_after_its_task_finished_does_not_queue_it_again() -> None:
    """The saved Hypothesis example of ``test_cancel_stateful``: the cancel's stop
    reaches the pool after the task finished there.  The LM tells its end (the GM ends
    it ``finished``: it ended before the stop took effect) and the job retires; then the
    pool confirms the stop and the LM gives the attempt back (PREEMPTED, with its
    spec).  That late return is about an attempt that ended: the task is not queued
    again (it was both queued and ended, and would have run a second time)."""
    net, lm, gm = _placed_not_started()
    net.send(gm.handle(CancelJob(user="u0", job_id="j1"), 2.25), 2.25, src_gm=GmId("gm0"))
    net.run(2.5)  # the LM stops t0 (released; held as stopping until its pool confirms)
    net.work("lm0", 3.5)  # the pool takes the start first: t0 runs
    net.finish(TaskId("t0"), 5.75)  # and finishes before it takes the stop
    net.run(6.0)
    assert net.outcomes[T0].finished
    assert gm.state_of(T0) is None
    assert not gm.jobs  # j1 ended and retired
    net.work_all(6.25)  # the pool confirms the stop of what it no longer runs
    evs = [e.msg for e in net.wire if isinstance(e.msg, TaskEvents)]
    assert [ev.kind for m in evs for ev in m.events] == [EventKind.PREEMPTED]
    net.run(6.5)
    assert gm.state_of(T0) is None
    assert T0 not in gm.live
    assert not list(gm.queues)
    assert not gm.has_work()
    assert not launches(gm.handle(Decide(max_tasks=4), 7.0))
    assert net.outcomes[T0].finished  # told once, as it ended
    assert not lm.active
    assert not lm.nodes.stopping
    assert list(lm.free[0]) == [2, 2]


def test_a_redelivered_return_of_a_cancelled_task_does_not_queue_it_again() -> None:
    """The broker delivers the PREEMPTED event of a cancelled task twice: the first ends
    it ``cancelled`` (its job retires), the second is a copy and changes nothing."""
    net, _, gm = _placed_not_started()
    net.work_all(2.0)  # t0 runs
    net.send(gm.handle(CancelJob(user="u0", job_id="j1"), 2.25), 2.25, src_gm=GmId("gm0"))
    net.run(2.5)
    net.work_all(2.75)  # the pool stops it: PREEMPTED on its way
    (env,) = net.wire
    net.wire.append(Envelope(env.dst, env.msg, env.to_lm))  # redelivered
    net.run(3.0)
    assert net.outcomes[T0].reason == CANCELLED
    assert gm.state_of(T0) is None
    assert T0 not in gm.live
    assert not list(gm.queues)
    assert not gm.has_work()
    assert not gm.jobs


def test_a_task_cancelled_while_its_preemption_is_in_flight_is_stopped_where_it_was_placed() -> (
    None
):
    """Found by ``test_cancel_stateful``: u1's task is placed by a preemption (u0's task
    the victim) and its job is cancelled before the LM's answer comes.  The accepted
    answer places it on that LM, which is asked to stop it (the GM had no LM for it: an
    assertion failed in the core)."""
    lm0, lm1 = make_lm("lm0", [(2, 2, 0b01)]), make_lm("lm1", [(2, 2, 0b11)])
    users = (("u0", "gm0", 0.2), ("u1", "gm0", 0.6), ("u2", "gm0", 0.2))
    gm = make_gm("gm0", ("lm0", "lm1"), users, max_retries=2, patience=3,
                 overload=OverloadPolicy(launch_window=0))  # fmt: skip
    net = Network({gm.gm_id: gm}, {lm0.lm_id: lm0, lm1.lm_id: lm1})
    net.start(0.0)
    alive(lm0, 0.0)
    alive(lm1, 0.0)
    net.submit(GmId("gm0"), [make_task(2, 1, constraints=0b10, user="u0", task_id="t0", job="j1")], 0.25)  # fmt: skip
    net.decide(GmId("gm0"), 0.5)
    net.submit(GmId("gm0"), [make_task(1, 1, constraints=0b11, user="u1", task_id="t1", job="j2")], 0.75)  # fmt: skip
    net.run(1.0)  # u0's t0 fills lm1's node
    net.decide(GmId("gm0"), 1.25)  # u1 is under its share: t1 preempts t0
    (pre,) = [e.msg for e in net.wire if isinstance(e.msg, PreemptRequest)]
    assert pre.lm == "lm1"
    net.deliver(0, 1.5)  # lm1 stops t0 and places t1
    t1 = (UserId("u1"), TaskId("t1"))
    assert t1 in lm1.active
    net.send(gm.handle(CancelJob(user="u1", job_id="j2"), 1.75), 1.75, src_gm=GmId("gm0"))
    net.deliver(0, 2.0)  # the answer: t1 placed on lm1, and stopped there
    assert gm.state_of(t1) == TaskState.PLACED
    assert gm.tasks_of([t1])[0].lm == "lm1"
    (cancel,) = [e.msg for e in net.wire if isinstance(e.msg, CancelTasks)]
    assert cancel.lm == "lm1"
    assert [r.task_id for r in cancel.tasks] == ["t1"]
    net.run(2.25)
    net.work_all(2.5)  # lm1's pool stops t0 and t1
    net.run(2.75)
    assert net.outcomes[t1].reason == CANCELLED
    assert t1 not in lm1.active
    assert gm.state_of(t1) is None


def test_a_task_held_back_by_the_launch_window_ends_at_the_cancel_and_is_never_sent() -> None:
    """Found by ``test_cancel_stateful``: with a launch window of one, a job's second
    task is decided while the first one's request is unanswered, and its placement is
    held in the outbox (in flight, reserved in the view).  The cancel ends it at once
    and frees its reservation: when the window opens, no request for it leaves."""
    lm = make_lm("lm0", [(4, 4), (4, 4)])
    gm = make_gm("gm0", ("lm0",), overload=OverloadPolicy(launch_window=1))
    net = Network({gm.gm_id: gm}, {lm.lm_id: lm})
    net.start(0.0)
    alive(lm, 0.0)
    specs = [make_task(1, 3, user="u0", task_id=f"t{i}", job="j") for i in range(2)]
    net.submit(GmId("gm0"), specs, 0.1)
    net.decide(GmId("gm0"), 0.2)
    net.decide(GmId("gm0"), 0.3)  # t1 decided, held behind t0's unanswered request
    (sent,) = [e.msg for e in net.wire if isinstance(e.msg, LaunchRequest)]
    assert [p.spec.task_id for p in sent.placements] == ["t0"]
    assert gm.state_of((UserId("u0"), TaskId("t1"))) == TaskState.DISPATCHED
    net.send(gm.handle(CancelJob(user="u0", job_id="j"), 0.4), 0.4, src_gm=GmId("gm0"))
    assert net.outcomes[(UserId("u0"), TaskId("t1"))].reason == CANCELLED
    assert not gm.outbox.held
    pending = [p for p in gm.views[lm.lm_id].pending if p is not None]
    assert pending == [[1, 3]]  # t0's reservation only: t1's was given back
    for _ in range(10):  # t0's answer opens the window: t0 is stopped, t1 never sent
        if not net.wire:
            break
        launched = [
            p.spec.task_id
            for e in net.wire
            if isinstance(e.msg, LaunchRequest)
            for p in e.msg.placements
        ]
        assert "t1" not in launched
        net.deliver(0, 0.5)
    net.work_all(0.6)
    net.run(0.7)
    assert net.outcomes[(UserId("u0"), TaskId("t0"))].reason == CANCELLED
    assert not lm.active
    assert not gm.jobs
