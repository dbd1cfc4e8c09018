"""Recovery in the cores: an LM restarted (a new incarnation) rebuilds what runs from
its worker pool; a paused LM does not declare its workers dead; a restarted pool's lost
attempts are relaunched; GMs follow LM incarnations by epoch; pools fence old epochs.
No event loop, no sleeps."""

from __future__ import annotations

from msgspec.structs import replace

from common import codec
from common.effects import Reply, ToGm, ToLm, ToUser, ToWorker
from common.ids import GmId, LmId, NodeIndex, UserId
from common.messages import (
    CheckWorkers,
    EventKind,
    Heartbeat,
    LaunchRequest,
    Placement,
    Refused,
    Registered,
    RegisterPool,
    RegisterWorkers,
    ReportKind,
    SnapshotRequest,
    StartTask,
    StartTasks,
    SubmitJob,
    TaskDue,
    WorkerHeartbeat,
)
from common.model import NodeSpec, TaskSpec, TaskState
from global_master.core import GlobalMaster
from local_master.core import LocalMaster
from tests.conftest import (
    alive,
    as_events,
    decide,
    key,
    launch_req,
    make_gm,
    make_task,
    report,
    state,
    submit,
    sync_views,
)
from worker.core import WorkerPool

GM0 = GmId("gm0")
LM0 = LmId("lm0")


def fresh_lm(epoch: int, nodes: int = 2) -> LocalMaster:
    """A new LM incarnation, as the live service starts it: no node alive yet."""
    return LocalMaster(
        LM0, [NodeSpec((4, 4))] * nodes, [GM0] * nodes, gms=[GM0], epoch=epoch,
        awaiting_workers=True,
    )  # fmt: skip


def registration(pool: WorkerPool, now: float) -> RegisterWorkers:
    (eff,) = pool.handle(RegisterPool(), now)
    assert isinstance(eff, ToLm)
    assert isinstance(eff.msg, RegisterWorkers)
    return eff.msg


def test_a_new_lm_takes_nothing_before_its_pool_registers() -> None:
    """It may hold a task without knowing yet: GMs are told to ask again (503)."""
    lm = fresh_lm(epoch=2)
    (reply,) = lm.handle(launch_req(make_task()), 1.0)
    assert reply == Reply(Refused(reason="not_ready", detail="lm0 awaits its workers"))
    for msg in (WorkerHeartbeat(lm=LM0, nodes=(NodeIndex(0),), at=1.0),
                report(LM0, ReportKind.FINISHED, make_task(), 0, 1.0)):  # fmt: skip
        (refused,) = lm.handle(msg, 1.0)
        assert refused == Reply(Refused(reason="register_first", detail="lm0 restarted"))


def test_a_restarted_lm_rebuilds_what_runs_from_its_pool() -> None:
    old = fresh_lm(epoch=1)
    pool = WorkerPool(LM0, 2)
    old.handle(registration(pool, 0.0), 0.0)
    t = make_task(3, 3)
    _, start = old.handle(launch_req(t, node=1), 1.0)
    assert isinstance(start, ToWorker)
    (started,) = pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(start.msg,)), 1.5)[:1]  # type: ignore[arg-type]
    old.handle(started.msg, 1.5)  # type: ignore[union-attr]
    # the LM dies; a new incarnation asks its pool what runs
    new = fresh_lm(epoch=2)
    (ok,) = new.handle(registration(pool, 5.0), 5.0)
    assert ok == Reply(Registered(lm=LM0, epoch=2))
    a = new.active[key(t)]
    assert (a.node, a.attempt, a.gm, a.started_at) == (1, 1, GM0, 1.5)
    assert new.free == [[4, 4], [1, 1]]
    assert new.counters.recovered == 1
    # its events and state go on: the end reaches the GM with the attempt
    (ev,) = new.handle(report(LM0, ReportKind.FINISHED, t, 1, 7.0, started_at=1.5), 7.0)
    assert isinstance(ev, ToGm)
    assert (ev.msg.kind, ev.msg.attempt, ev.msg.started_at) == (EventKind.FINISHED, 1, 1.5)
    assert new.free == [[4, 4], [4, 4]]


def test_an_end_reported_to_an_lm_that_never_held_the_task_still_reaches_its_gm() -> None:
    """The task ended while its LM was down: the new incarnation passes the end on."""
    lm = fresh_lm(epoch=2)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    t = make_task()
    (ev,) = lm.handle(report(LM0, ReportKind.FINISHED, t, 0, 1.0), 1.0)
    assert isinstance(ev, ToGm)
    assert (ev.gm, ev.msg.kind, ev.msg.task_id) == (GM0, EventKind.FINISHED, t.task_id)
    assert lm.active == {}


def test_a_restarted_pool_s_lost_attempts_are_relaunched() -> None:
    lm = fresh_lm(epoch=1)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    t = make_task(2, 2)
    lm.handle(launch_req(t, node=0), 1.0)
    # the pool crashed and came back empty: it registers again in the same LM epoch
    effects = lm.handle(registration(WorkerPool(LM0, 2), 2.0), 2.0)
    (ev,) = [e.msg for e in effects if isinstance(e, ToGm)]
    assert (ev.kind, ev.attempt) == (EventKind.RELAUNCHED, 2)
    starts = [e.msg for e in effects if isinstance(e, ToWorker)]
    assert [(s.spec, s.attempt) for s in starts] == [(t, 2)]  # type: ignore[union-attr]
    assert lm.active[key(t)].attempt == 2


def test_an_lm_that_was_paused_does_not_declare_its_workers_dead() -> None:
    lm = fresh_lm(epoch=1)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    t = make_task()
    lm.handle(launch_req(t, node=0), 0.5)
    assert lm.handle(CheckWorkers(timeout=2.0), 1.0) == []
    # SIGSTOP for 30 s: every node looks silent, but the silence is the LM's own
    assert lm.handle(CheckWorkers(timeout=2.0), 31.0) == []
    assert all(lm.alive)
    assert key(t) in lm.active
    assert lm.counters.pauses == 1
    # a node that really stays silent is still found out afterwards (checks run every
    # heartbeat period, well within the timeout)
    alive(lm, 32.0, 1)
    assert lm.handle(CheckWorkers(timeout=2.0), 32.0) == []
    alive(lm, 33.0, 1)
    lost = lm.handle(CheckWorkers(timeout=2.0), 33.5)
    assert not lm.alive[0]
    assert lost


def test_a_gm_follows_an_lm_restart_by_epoch_and_drops_the_old_incarnation() -> None:
    old, gm = fresh_lm(epoch=1), make_gm()
    old.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    sync_views(gm, old)
    (h_old,) = old.handle(Heartbeat(), 1.0)
    new = fresh_lm(epoch=2)
    new.handle(registration(WorkerPool(LM0, 2), 2.0), 2.0)
    (h_new,) = new.handle(Heartbeat(), 2.0)
    asked = gm.handle(h_new.msg, 2.5)  # type: ignore[union-attr]
    assert [type(e.msg) for e in asked if isinstance(e, ToLm)] == [SnapshotRequest]
    (snap,) = new.handle(asked[0].msg, 2.6)  # type: ignore[union-attr]
    gm.handle(snap.msg, 2.7)  # type: ignore[union-attr]
    assert gm.views[LM0].epoch == 2
    assert gm.handle(h_old.msg, 3.0) == []  # late news of the old incarnation
    assert gm.counters.stale_updates == 1
    # a snapshot of the old incarnation cannot take the view back either
    gm.handle(old.snapshot(GM0), 3.5)
    assert gm.views[LM0].epoch == 2


def test_a_pool_refuses_an_older_lm_epoch() -> None:
    pool = WorkerPool(LM0, 2)
    start = StartTask(node=NodeIndex(0), spec=make_task(), attempt=1, gm=GM0)
    pool.handle(StartTasks(lm=LM0, epoch=5, tasks=(start,)), 1.0)
    (refused,) = pool.handle(StartTasks(lm=LM0, epoch=4, tasks=(start,)), 2.0)
    assert isinstance(refused, Reply)
    assert refused.msg.reason == "stale_epoch"  # type: ignore[attr-defined]
    assert pool.counters.refused == 1


def test_a_gm_learns_the_attempt_an_lm_holds_from_a_duplicate() -> None:
    """A restarted GM counts attempts from scratch; the LM's duplicate answer names the
    attempt it holds, so the task's later events are not taken for stale ones."""
    lm = LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0])
    t = make_task()
    lm.handle(
        LaunchRequest(gm=GM0, lm=LM0, request_id=1, known_version=-1,
                      placements=(Placement(spec=t, attempt=3, node=NodeIndex(0)),)),
        0.0,
    )  # fmt: skip
    gm = make_gm()
    gm.handle(
        lm.snapshot(None), 0.0
    )  # a view without the held tasks: the GM does not know the task runs
    submit(gm, [t], 1.0)
    (req,) = [e.msg for e in decide(gm, 1.0) if isinstance(e, ToLm)]
    (answer, *_) = lm.handle(req, 1.5)
    gm.handle(answer.msg, 1.6)  # type: ignore[union-attr]
    assert gm.placed[key(t)].attempt == 3
    (ev,) = lm.handle(report(LM0, ReportKind.FINISHED, t, 0, 2.0, attempt=3), 2.0)
    out = gm.handle(as_events(LM0, [ev.msg]), 2.1)  # type: ignore[union-attr]
    assert state(gm, t) is None  # finished and told
    assert out


def test_a_returned_task_of_an_acknowledged_job_is_kept_on_the_broker() -> None:
    """Preempted after its job was acknowledged: the GM persists it (``Persist``) before
    it acknowledges the event; a GM that restarts finds it in its user's queue."""
    from common.effects import JobSettled, Persist
    from common.messages import AdmitJob, TaskEvent

    lm = LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0])
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task(4, 4)
    submit(gm, [t], 0.0)
    (req,) = [e.msg for e in decide(gm, 1.0) if isinstance(e, ToLm)]
    (answer, *_) = lm.handle(req, 1.0)
    assert JobSettled(t.job_id, t.user) in gm.handle(answer.msg, 1.0)  # type: ignore[union-attr]
    preempted = TaskEvent(
        kind=EventKind.PREEMPTED, lm=LM0, gm=GM0, user=t.user, task_id=t.task_id, attempt=1,
        node=NodeIndex(0), node_free=(4, 4), node_version=lm.version + 1, at=2.0,
    )  # fmt: skip
    (persist,) = gm.handle(as_events(LM0, [preempted]), 2.0)
    assert isinstance(persist, Persist)
    assert persist.job.tasks == (t,)
    assert persist.job.resumes == t.job_id
    assert codec.decode(codec.encode(persist.job)) == persist.job  # it crosses the broker
    # this GM still holds it: the message is acknowledged once the task is placed again
    assert gm.handle(AdmitJob(job=persist.job), 2.1) == []
    (again,) = [e.msg for e in decide(gm, 3.0) if isinstance(e, ToLm)]
    (answer, *_) = lm.handle(again, 3.0)
    effects = gm.handle(answer.msg, 3.0)  # type: ignore[union-attr]
    assert JobSettled(persist.job.job_id, t.user, resume=True) in effects
    # a restarted GM (which never heard of the task) queues it from the message
    fresh = make_gm()
    sync_views(fresh, LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0]))
    assert fresh.handle(AdmitJob(job=persist.job, redelivered=True), 5.0) == []
    assert state(fresh, t) is not None
    assert len(fresh.queues) == 1
    # ... as newer an attempt than it ran as (a worker may hold that one as stopped)
    (placed,) = [e.msg for e in decide(fresh, 6.0) if isinstance(e, ToLm)]
    assert placed.placements[0].attempt == 2  # type: ignore[union-attr]


def test_a_returned_task_the_federation_can_no_longer_take_fails_explicitly() -> None:
    """A returned task kept on the broker while the federation restarted with another
    number of resources: queued, it raised (IndexError) in every decision after, so its
    GM placed nothing for anyone.  It fails with its reason; its message is settled."""
    from common.effects import JobSettled
    from common.messages import AdmitJob
    from global_master.recovery import resume_id

    gm = make_gm()
    sync_views(gm, LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0]))
    old = replace(make_task(), demand=(1, 1, 1))
    job = SubmitJob(
        job_id=resume_id(old.task_id, 1), user=old.user, token="", submitted_at=1.0,
        tasks=(old,), resumes=old.job_id, attempt=1,
    )  # fmt: skip
    effects = gm.handle(AdmitJob(job=job, redelivered=True), 2.0)
    failed = [e.msg for e in effects if isinstance(e, ToUser)]
    assert [(o.task.task_id, o.finished) for o in failed] == [(old.task_id, False)]
    assert failed[0].reason.startswith("wrong_resources")
    assert JobSettled(job.job_id, old.user, resume=True) in effects
    assert len(gm.queues) == 0
    good = make_task()
    submit(gm, [good], 3.0)
    (req,) = [e.msg for e in decide(gm, 4.0) if isinstance(e, ToLm)]
    assert [p.spec for p in req.placements] == [good]  # type: ignore[union-attr]


def test_tasks_of_one_job_returned_together_are_kept_apart() -> None:
    """Two tasks of one acknowledged job preempted at once: each has its own message on
    the broker (one id per task and attempt), so neither is taken for the other."""
    from common.effects import Persist
    from common.messages import TaskEvent

    lm = LocalMaster(LM0, [NodeSpec((4, 4))] * 2, [GM0] * 2, gms=[GM0])
    gm = make_gm()
    sync_views(gm, lm)
    a, b = make_task(4, 4), make_task(4, 4)
    submit(gm, [a, b], 0.0)
    (req,) = [e.msg for e in decide(gm, 1.0, max_tasks=2) if isinstance(e, ToLm)]
    (answer, *_) = lm.handle(req, 1.0)
    gm.handle(answer.msg, 1.0)  # type: ignore[union-attr]
    preempted = [
        TaskEvent(
            kind=EventKind.PREEMPTED,
            lm=LM0,
            gm=GM0,
            user=t.user,
            task_id=t.task_id,
            attempt=1,
            node=NodeIndex(n),
            node_free=(4, 4),
            node_version=lm.version + 1 + n,
            at=2.0,
        )
        for n, t in enumerate((a, b))
    ]
    persists = [e for e in gm.handle(as_events(LM0, preempted), 2.0) if isinstance(e, Persist)]
    assert sorted(p.job.tasks[0].task_id for p in persists) == sorted([a.task_id, b.task_id])
    assert len({p.job.job_id for p in persists}) == 2
    assert {p.job.attempt for p in persists} == {1}


def test_a_start_of_an_attempt_stopped_before_it_arrived_is_reported_not_dropped() -> None:
    """The pool never runs it, and says so (``LOST``): an LM that holds that attempt as
    running (its GM lost track and placed it again) places it anew instead of keeping
    a slot for a task that runs nowhere."""
    from common.messages import StopTask, StopTasks, WorkerReports

    lm = fresh_lm(epoch=1)
    pool = WorkerPool(LM0, 2)
    lm.handle(registration(pool, 0.0), 0.0)
    spec = make_task(duration=60.0)
    start = StartTask(node=NodeIndex(0), spec=spec, attempt=1, gm=GM0)
    stop = StopTask(node=NodeIndex(0), user=spec.user, task_id=spec.task_id, attempt=1, gm=GM0)
    pool.handle(StopTasks(lm=LM0, epoch=1, tasks=(stop,)), 0.5)  # the stop came first
    lm.handle(LaunchRequest(gm=GM0, lm=LM0, request_id=1, known_version=-1, placements=(
        Placement(spec=spec, attempt=1, node=NodeIndex(0)),)), 1.0)  # fmt: skip
    (answer, *rest) = pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(start,)), 1.0)
    assert isinstance(answer, Reply)
    assert isinstance(answer.msg, WorkerReports)
    assert [(r.kind, r.attempt) for r in answer.msg.reports] == [(ReportKind.LOST, 1)]
    assert rest == []
    assert pool.running == {}
    out = lm.handle(answer.msg, 1.1)
    assert lm.active[key(spec)].attempt == 2  # placed anew, and started on the pool
    (again,) = [e.msg for e in out if isinstance(e, ToWorker)]
    (ran, *_) = pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(again,)), 1.2)  # type: ignore[arg-type]
    assert [r.kind for r in ran.msg.reports] == [ReportKind.STARTED]  # type: ignore[union-attr]


def test_a_pool_out_of_touch_with_its_lm_stops_its_tasks_before_they_run_elsewhere() -> None:
    """Its lease (shorter than the LM's worker timeout) expired: it fences itself, as of
    the expiry (a frozen pool did nothing since), and reports the attempts lost."""
    from common.messages import CheckLease, LeaseRenewed, TaskDue

    pool = WorkerPool(LM0, 2, lease_s=3.0)
    start = StartTask(node=NodeIndex(0), spec=make_task(duration=60.0), attempt=1, gm=GM0)
    pool.handle(LeaseRenewed(), 0.0)
    pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(start,)), 1.0)
    assert pool.handle(CheckLease(lease=3.0), 2.5) == []
    # frozen from 2.5 to 20: the first thing it does on waking is to stop its task
    effects = pool.handle(TaskDue(user=start.spec.user, task_id=start.spec.task_id, attempt=1),
                          20.0)  # fmt: skip
    (lost,) = [e.msg for e in effects if isinstance(e, ToLm)]
    assert (lost.kind, lost.at, lost.attempt) == (ReportKind.LOST, 3.0, 1)  # type: ignore[union-attr]
    assert pool.running == {}
    assert pool.counters.fenced == 1
    # the LM that still holds it places it again; one that moved on ignores the report
    lm = fresh_lm(epoch=1)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    lm.handle(LaunchRequest(gm=GM0, lm=LM0, request_id=1, known_version=-1, placements=(
        Placement(spec=start.spec, attempt=1, node=NodeIndex(0)),)), 1.0)  # fmt: skip
    from common.messages import WorkerReports

    out = lm.handle(WorkerReports(lm=LM0, reports=(lost,)), 20.5)  # type: ignore[arg-type]
    assert [e.msg.kind for e in out if isinstance(e, ToGm)] == [EventKind.RELAUNCHED]
    assert lm.active[key(start.spec)].attempt == 2


def test_the_id_of_a_returned_task_s_job_is_always_a_valid_id() -> None:
    from common.ids import TaskId
    from global_master.recovery import resume_id

    for jid in ("j0", "a" * 200, "x.y:z@w+1-" * 18):
        rid = resume_id(TaskId(jid), 12)
        job = SubmitJob(job_id=rid, user=UserId("u"), token="", submitted_at=0.0,
                        tasks=(make_task(),))  # fmt: skip
        assert codec.decode(codec.encode(job)) == job
    assert resume_id(TaskId("a" * 200), 1) != resume_id(TaskId("a" * 199 + "b"), 1)


def test_a_task_that_ended_while_its_gm_and_lm_were_down_reaches_its_user_once() -> None:
    """Its job was acknowledged before both died (nothing will redeliver it): the new
    LM learns the end from its pool, the new GM from the LM's snapshot, and the user
    is told once, whichever of the end event and the snapshot comes first."""
    for event_first in (True, False):
        pool = WorkerPool(LM0, 2)
        t = make_task(duration=1.0)
        pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(StartTask(node=NodeIndex(0), spec=t,
                                                                 attempt=1, gm=GM0),)), 0.0)  # fmt: skip
        pool.handle(TaskDue(user=t.user, task_id=t.task_id, attempt=1), 1.0)  # no LM to hear it
        lm = fresh_lm(epoch=2)
        learnt = lm.handle(registration(pool, 2.0), 2.0)
        ends = [e.msg for e in learnt if isinstance(e, ToGm)]
        gm = make_gm()  # restarted: knows nothing
        told = []
        if event_first:
            told += gm.handle(as_events(LM0, ends), 2.5)
        told += gm.handle(lm.snapshot(GM0), 3.0)
        if not event_first:
            told += gm.handle(as_events(LM0, ends), 3.5)
        finished = [e.msg for e in told if isinstance(e, ToUser)]
        assert [(o.task.task_id, o.finished) for o in finished] == [(t.task_id, True)], event_first


def test_an_end_redelivered_to_a_restarted_gm_before_any_snapshot_reaches_the_user() -> None:
    """The old GM died before it told the user (the end event goes back to the broker)
    and the LM that sent it died too: the restarted GM has no view and no record, yet
    the event says whose job it was, so the user is told, once."""
    old_lm, old_gm = fresh_lm(epoch=1), make_gm()
    old_lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    sync_views(old_gm, old_lm)
    t = make_task()
    submit(old_gm, [t], 0.5)
    for e in decide(old_gm, 1.0):
        if isinstance(e, ToLm):
            old_lm.handle(e.msg, 1.0)
    ends = [e.msg for e in old_lm.handle(report(LM0, ReportKind.FINISHED, t, 0, 2.0), 2.0)
            if isinstance(e, ToGm)]  # fmt: skip
    assert [(e.kind, e.job_id) for e in ends] == [(EventKind.FINISHED, t.job_id)]
    gm = make_gm()  # restarted: no view of lm0 yet, no record of the task
    told = [e.msg for e in gm.handle(as_events(LM0, ends), 3.0) if isinstance(e, ToUser)]
    assert [(o.task.task_id, o.task.job_id, o.finished) for o in told] == [
        (t.task_id, t.job_id, True)
    ]
    assert told[0].task.submitted_at == 0.5  # its allocation time is still right
    assert [e for e in gm.handle(as_events(LM0, ends), 3.5) if isinstance(e, ToUser)] == []


def test_an_attempt_its_pool_stopped_for_want_of_an_lm_runs_again_under_the_next_one() -> None:
    """The LM dies, the pool's lease runs out and it stops what ran: the next LM
    incarnation, which never held the task, gives it back to its GM (it cannot tell
    whether the GM placed a newer attempt elsewhere meanwhile: ``test_ran_twice``); a
    GM that died too and has no record of it queues it from the event and places it
    again, as the next attempt."""
    from common.messages import CheckLease, LeaseRenewed

    pool = WorkerPool(LM0, 2, lease_s=1.0)
    pool.handle(LeaseRenewed(), 0.0)
    t = make_task(duration=5.0)
    pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(StartTask(node=NodeIndex(0), spec=t,
                                                             attempt=1, gm=GM0),)), 0.0)  # fmt: skip
    pool.handle(CheckLease(lease=1.0), 2.0)  # no LM answered: stopped, kept as LOST
    assert pool.running == {}
    lm = fresh_lm(epoch=2)
    out = lm.handle(registration(pool, 3.0), 3.0)
    evs = [e.msg for e in out if isinstance(e, ToGm)]
    assert [(e.kind, e.attempt, e.job_id, e.spec) for e in evs] == [
        (EventKind.REQUEUED, 1, t.job_id, t)
    ]
    assert [e for e in out if isinstance(e, ToWorker)] == []
    assert key(t) not in lm.active
    gm = make_gm()  # restarted: no record of the task
    sync_views(gm, lm)
    gm.handle(as_events(LM0, evs), 3.5)
    assert gm.counters.orphans_queued == 1
    (req,) = [e.msg for e in decide(gm, 4.0) if isinstance(e, ToLm)]
    assert [(p.spec, p.attempt) for p in req.placements] == [(t, 2)]  # type: ignore[union-attr]


# ------------------------------------------------ silent nodes: dead, then given up
LOST_AFTER = 10.0


def cut_off(lm: LocalMaster, t: object, until: float) -> list[object]:
    """Node 0 runs ``t``; node 1 keeps heartbeating; node 0 is silent from 1.0 to
    ``until`` (checks every 0.5 s, timeout 2 s): the effects of every check."""
    out: list[object] = []
    now = 1.0
    while now < until:
        now += 0.5
        alive(lm, now, 1)
        out.extend(lm.handle(CheckWorkers(timeout=2.0, lost_after=LOST_AFTER), now))
    return out


def test_a_silent_node_is_dead_but_what_it_held_waits_for_its_pool() -> None:
    """Cut off past the timeout: nothing more is placed there, and its task is not run
    again, since it may have ended unheard; the pool's late report of that end is the
    task's one end."""
    lm = fresh_lm(epoch=1)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    t = make_task(3, 3)
    lm.handle(launch_req(t, node=0), 0.5)
    assert cut_off(lm, t, 6.0) == []  # no relaunch, no event
    assert not lm.alive[0]
    assert lm.free[0] == [0, 0]
    assert lm.active[key(t)].attempt == 1
    refused = lm.handle(launch_req(make_task(1, 1), node=0), 6.0)
    assert isinstance(refused[0], Reply)
    assert not refused[0].msg.results[0].accepted
    # the cut heals: the pool speaks again, with the end it could not report
    alive(lm, 6.5, 0, 1)
    assert lm.alive[0]
    assert lm.free[0] == [1, 1]
    assert lm.counters.held_through_silence == 1
    (ev,) = lm.handle(report(LM0, ReportKind.FINISHED, t, 0, 2.0, started_at=0.6), 6.5)
    assert isinstance(ev, ToGm)
    assert (ev.msg.kind, ev.msg.attempt) == (EventKind.FINISHED, 1)
    assert lm.free[0] == [4, 4]
    assert lm.active == {}
    assert lm.counters.relaunched == 0
    assert lm.counters.nodes_given_up == 0


def test_a_task_its_pool_stopped_in_the_cut_runs_again_when_the_pool_says_so() -> None:
    lm = fresh_lm(epoch=1)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    t = make_task(3, 3)
    lm.handle(launch_req(t, node=0), 0.5)
    assert cut_off(lm, t, 6.0) == []
    alive(lm, 6.5, 0, 1)
    effects = lm.handle(report(LM0, ReportKind.LOST, t, 0, 2.5, started_at=0.6), 6.5)
    (ev,) = [e.msg for e in effects if isinstance(e, ToGm)]
    assert (ev.kind, ev.attempt) == (EventKind.RELAUNCHED, 2)
    assert lm.active[key(t)].attempt == 2


def test_a_node_silent_for_lost_after_is_given_up() -> None:
    """Liveness: a pool that never comes back does not keep its tasks forever."""
    lm = fresh_lm(epoch=1)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    t = make_task(3, 3)
    lm.handle(launch_req(t, node=0), 0.5)
    effects = cut_off(lm, t, 1.0 + LOST_AFTER + 1.0)
    evs = [e.msg for e in effects if isinstance(e, ToGm)]  # type: ignore[union-attr]
    assert [(m.kind, m.attempt, m.node) for m in evs] == [(EventKind.RELAUNCHED, 2, 1)]
    assert lm.counters.nodes_given_up == 1
    assert lm.free[0] == [0, 0]  # still dead: nothing placed there
    assert lm.active[key(t)].node == 1


def test_a_restarted_pool_settles_a_silent_node_at_once() -> None:
    """A pool that comes back as a new process registers without the held task: it is
    gone, and runs again without waiting for ``lost_after``."""
    lm = fresh_lm(epoch=1)
    lm.handle(registration(WorkerPool(LM0, 2), 0.0), 0.0)
    t = make_task(3, 3)
    lm.handle(launch_req(t, node=0), 0.5)
    assert cut_off(lm, t, 4.0) == []
    effects = lm.handle(registration(WorkerPool(LM0, 2), 4.5), 4.5)
    (ev,) = [e.msg for e in effects if isinstance(e, ToGm)]
    assert (ev.kind, ev.attempt) == (EventKind.RELAUNCHED, 2)
    assert lm.counters.nodes_given_up == 0


def test_a_task_its_lm_gives_back_to_a_restarted_gm_is_queued_not_lost() -> None:
    """The whole federation restarted: the LM, back from its journal, finds no room for
    an attempt its pool lost and gives it back (``REQUEUED``) to a GM that has no record
    of it, its job acknowledged before the restart (nothing will redeliver it).  The
    event carries the task: the GM queues it again, keeps it on the broker, places it,
    and a redelivery of the job, if one comes, runs it no second time."""
    from common.effects import Persist
    from common.messages import AdmitJob

    lm = LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0])
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task(4, 4)
    submit(gm, [t], 0.0)
    (req,) = [e.msg for e in decide(gm, 1.0) if isinstance(e, ToLm)]
    lm.handle(req, 1.0)
    # the pool's attempt is gone and no node of the partition fits it: given back
    held = lm.nodes.active[key(t)]
    lm.nodes.release(key(t))
    ev = lm.nodes.event(EventKind.REQUEUED, held, 2.0, "worker lost")
    assert ev.spec == t
    assert lm.nodes.event(EventKind.STARTED, held, 2.0).spec is None  # events stay small
    fresh = make_gm()  # restarted: no record of the task or its job
    sync_views(fresh, LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0]))
    effects = fresh.handle(as_events(LM0, [ev]), 3.0)
    (persist,) = [e for e in effects if isinstance(e, Persist)]
    assert persist.job.tasks == (t,)
    assert fresh.counters.orphans_queued == 1
    assert state(fresh, t) is not None
    (placed,) = [e.msg for e in decide(fresh, 4.0) if isinstance(e, ToLm)]
    assert [p.spec for p in placed.placements] == [t]  # type: ignore[union-attr]
    # its job, if it comes back after all, finds the task placed: not run twice
    redelivered = replace(persist.job, job_id=t.job_id, resumes=None, attempt=0, token="t")
    fresh.handle(AdmitJob(job=redelivered, redelivered=True), 5.0)
    assert [e for e in decide(fresh, 6.0) if isinstance(e, ToLm)] == []


def test_a_copy_of_a_task_s_end_is_told_once_and_leaves_its_job_open() -> None:
    """The broker delivers a task's end again while its job still waits for another
    task: it went to recovery as an orphan and ended the task a second time (its user
    told twice, its job's count of tasks left taken down twice: the job retired early).
    Found by the state-transition table of the ``reasons`` work (issue 33)."""
    from common.model import TaskState
    from tests.conftest import events, launches, make_lm, outcomes, replies

    gm, lm = make_gm(), make_lm("lm0", [(4, 4)])
    alive(lm, 0.0)
    sync_views(gm, lm)
    t0, t1 = (make_task(1, 1, task_id=f"t{i}", job="j") for i in range(2))
    submit(gm, [t0, t1], 0.0)
    (req,) = launches(decide(gm, 0.1))
    (resp,) = replies(lm.handle(req, 0.2))
    gm.handle(resp, 0.3)
    evs = events(lm.handle(report(LM0, ReportKind.FINISHED, t0, 0, 1.0), 1.0))
    ev = as_events(LM0, evs)
    assert [o.task.task_id for o in outcomes(gm.handle(ev, 1.1))] == [t0.task_id]
    assert outcomes(gm.handle(ev, 1.2)) == []  # the broker redelivers the same events
    assert state(gm, t0) is TaskState.FINISHED
    assert state(gm, t1) is not None  # its job still waits for it
    assert gm.jobs[(t0.user, t0.job_id)].left == 1


def _placed_then_ended(gm_tasks: int) -> tuple[LocalMaster, GlobalMaster, list[TaskSpec], object]:
    """A GM places a job of ``gm_tasks`` tasks on one LM; an LM snapshot taken while the
    first runs is still on the wire (a gap repair) when that task's end reaches the GM."""
    lm = LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0])
    alive(lm, 0.0)
    gm = make_gm()
    sync_views(gm, lm)
    ts = [make_task(1, 1, task_id=f"t{i}", job="j1") for i in range(gm_tasks)]
    submit(gm, ts, 0.5)
    for e in decide(gm, 1.0, max_tasks=1):
        assert isinstance(e, ToLm)
        for r in lm.handle(replace(e.msg, sent_at=1.0), 1.0):
            if isinstance(r, Reply):
                gm.handle(r.msg, 1.0)
    lm.handle(report(LM0, ReportKind.STARTED, ts[0], 0, 2.0), 2.0)
    stale = lm.snapshot(GM0)  # says ts[0] runs
    ends = lm.handle(report(LM0, ReportKind.FINISHED, ts[0], 0, 3.0), 3.0)
    told = gm.handle(as_events(LM0, [e.msg for e in ends if isinstance(e, ToGm)]), 3.5)
    assert [e.msg.task.task_id for e in told if isinstance(e, ToUser)] == ["t0"]
    return lm, gm, ts, stale


def test_a_snapshot_older_than_a_task_s_end_does_not_place_it_again() -> None:
    """The task's job ended with it (retired here): the stale snapshot's word that it
    runs is not taken, nor is a later snapshot's word of its end told again (found by
    the federation state machine: the task was placed and ended at once)."""
    lm, gm, (t,), stale = _placed_then_ended(1)
    assert not gm.jobs
    assert state(gm, t) is None
    for snap in (stale, lm.snapshot(GM0)):
        assert [e for e in gm.handle(snap, 4.0) if isinstance(e, ToUser)] == []
        assert key(t) not in gm.live
        assert key(t) not in gm.placed
        assert gm.counters.tasks_adopted == 0


def test_a_snapshot_older_than_the_end_of_one_task_of_a_live_job_keeps_it_ended() -> None:
    """Its job still runs here: the ended task is not adopted (FINISHED -> PLACED)."""
    _, gm, (t, other), stale = _placed_then_ended(2)
    assert state(gm, t) is TaskState.FINISHED
    assert [e for e in gm.handle(stale, 4.0) if isinstance(e, ToUser)] == []
    assert state(gm, t) is TaskState.FINISHED
    assert state(gm, other) is TaskState.QUEUED
    assert gm.counters.tasks_adopted == 0
