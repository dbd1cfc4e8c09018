"""An LM replaced by a new incarnation (restarted, or its standby took over): nothing
it accepted is lost, nothing that ended meanwhile runs again.  No event loop, no sleeps.

The new incarnation knows only what its worker pool tells it at registration: what
runs, and what ended while no LM took the pool's reports.  A GM that sees the new
epoch takes a snapshot and reconciles what it had placed there against it."""

from __future__ import annotations

from collections import deque

from common.effects import Effect, Reply, ToGm, ToLm, ToUser, ToWorker
from common.ids import GmId, LmId
from common.messages import (
    Heartbeat,
    LaunchRequest,
    RegisterPool,
    RegisterWorkers,
    ReportKind,
    ReportsTaken,
    StartTask,
    StartTasks,
    StopTask,
    StopTasks,
    TaskDue,
    TaskEvents,
)
from common.model import NodeSpec, TaskSpec
from global_master.core import GlobalMaster
from local_master.core import LocalMaster
from tests.conftest import decide, key, make_gm, make_task, outcomes, state, submit, sync_views
from worker.core import WorkerPool

GM0 = GmId("gm0")
LM0 = LmId("lm0")


def incarnation(epoch: int, pool: WorkerPool, now: float) -> tuple[LocalMaster, list[Effect]]:
    """An LM incarnation as the live service starts it, registered by its pool."""
    lm = LocalMaster(
        LM0, [NodeSpec((4, 4))] * 2, [GM0] * 2, gms=[GM0], epoch=epoch, awaiting_workers=True
    )
    (reg,) = pool.handle(RegisterPool(), now)
    assert isinstance(reg, ToLm)
    assert isinstance(reg.msg, RegisterWorkers)
    effects = lm.handle(reg.msg, now)
    for e in effects:
        if isinstance(e, Reply):  # Registered: the pool follows this epoch from now on
            pool.handle(e.msg, now)
    return lm, effects


def place(gm: GlobalMaster, lm: LocalMaster, spec: TaskSpec, now: float) -> StartTask:
    """The GM places ``spec`` at ``lm``, which accepts it; returns the start it sends."""
    submit(gm, [spec], now)
    (req,) = [e.msg for e in decide(gm, now) if isinstance(e, ToLm)]
    assert isinstance(req, LaunchRequest)
    answer, start = lm.handle(req, now)
    assert isinstance(answer, Reply)
    gm.handle(answer.msg, now)
    assert isinstance(start, ToWorker)
    assert isinstance(start.msg, StartTask)
    return start.msg


def take_over(gm: GlobalMaster, new: LocalMaster, now: float) -> list[Effect]:
    """The new incarnation's first heartbeat reaches the GM, which takes its snapshot."""
    (update,) = new.handle(Heartbeat(), now)
    asked = gm.handle(update.msg, now)  # type: ignore[attr-defined]
    (req,) = [e.msg for e in asked if isinstance(e, ToLm)]
    (snap,) = new.handle(req, now)
    assert isinstance(snap, Reply)
    return gm.handle(snap.msg, now)


def test_a_task_accepted_by_an_lm_that_died_before_starting_it_is_placed_again() -> None:
    pool = WorkerPool(LM0, 2)
    old, _ = incarnation(1, pool, 0.0)
    gm = make_gm()
    sync_views(gm, old)
    t = make_task(2, 2)
    place(gm, old, t, 1.0)  # its start never reaches the pool: the LM dies
    assert gm.placed[key(t)].lm == LM0
    new, _ = incarnation(2, pool, 5.0)
    take_over(gm, new, 5.0)
    assert gm.counters.lost_with_lm == 1
    assert key(t) not in gm.placed
    assert [q.spec for q in gm.queues] == [t]  # front of its queue
    # placed again, as a new attempt, at the new incarnation
    start = place_again(gm, new, 6.0)
    assert (start.spec, start.attempt) == (t, 2)
    assert state(gm, t) is not None


def place_again(gm: GlobalMaster, lm: LocalMaster, now: float) -> StartTask:
    (req,) = [e.msg for e in decide(gm, now) if isinstance(e, ToLm)]
    answer, start = lm.handle(req, now)
    gm.handle(answer.msg, now)  # type: ignore[attr-defined]
    assert isinstance(start, ToWorker)
    assert isinstance(start.msg, StartTask)
    return start.msg


def test_a_task_that_ended_while_no_lm_listened_is_not_run_again() -> None:
    pool = WorkerPool(LM0, 2)
    old, _ = incarnation(1, pool, 0.0)
    gm = make_gm()
    sync_views(gm, old)
    t = make_task(2, 2, duration=3.0)
    start = place(gm, old, t, 1.0)
    pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(start,)), 1.0)
    # the LM dies; the task ends; its report finds no LM (it is kept)
    (report,) = pool.handle(TaskDue(user=t.user, task_id=t.task_id, attempt=1), 4.0)
    assert isinstance(report, ToLm)
    assert list(pool.unreported) == [(key(t), 1)]
    new, registered = incarnation(2, pool, 6.0)
    assert new.counters.recovered_ends == 1
    late = [e.msg for e in registered if isinstance(e, ToGm)]  # its end, on its way
    # the GM hears of the new incarnation before the end arrives: it must not place
    # the task again, and it learns the outcome from the snapshot
    effects = take_over(gm, new, 6.5)
    assert [(o.task.task_id, o.finished) for o in outcomes(effects)] == [(t.task_id, True)]
    assert gm.counters.lost_with_lm == 0
    assert len(gm.queues) == 0
    assert state(gm, t) is None
    # the end arriving afterwards (forwarded at registration, then the pool's own
    # report) tells the user nothing twice
    again = gm.handle(TaskEvents(lm=LM0, epoch=2, events=tuple(late)), 7.0)
    assert not [e for e in again if isinstance(e, ToUser)]
    forwarded = new.handle(_reports(report), 7.5)
    events = [e.msg for e in forwarded if isinstance(e, ToGm)]
    assert not [
        e for e in gm.handle(TaskEvents(lm=LM0, epoch=2, events=tuple(events)), 8.0)
        if isinstance(e, ToUser)
    ]  # fmt: skip
    # once the LM took the report, the pool forgets it
    pool.handle(ReportsTaken(reports=(report.msg,)), 8.0)  # type: ignore[arg-type]
    assert pool.unreported == {}


def _reports(report: ToLm) -> object:
    from common.messages import WorkerReports

    return WorkerReports(lm=LM0, reports=(report.msg,))  # type: ignore[arg-type]


def test_an_answer_from_a_replaced_incarnation_is_void() -> None:
    """The old LM accepted after the GM took the new one's state: the new incarnation
    does not hold the task, so the GM places it again instead of waiting forever."""
    pool = WorkerPool(LM0, 2)
    old, _ = incarnation(1, pool, 0.0)
    gm = make_gm()
    sync_views(gm, old)
    t = make_task(2, 2)
    submit(gm, [t], 1.0)
    (req,) = [e.msg for e in decide(gm, 1.0) if isinstance(e, ToLm)]
    new, _ = incarnation(2, pool, 2.0)
    take_over(gm, new, 2.0)
    (answer, _) = old.handle(req, 2.5)  # the old process, cut off, still answers
    retried = gm.handle(answer.msg, 3.0)  # type: ignore[attr-defined]
    assert key(t) not in gm.placed
    (again,) = [e.msg for e in retried if isinstance(e, ToLm)]
    assert isinstance(again, LaunchRequest)
    assert again.placements[0].attempt == 2
    # and the pool, which follows the new epoch, refuses what the old one sends
    (refused,) = pool.handle(
        StartTasks(lm=LM0, epoch=1, tasks=(StartTask(node=again.placements[0].node,
                                                     spec=t, attempt=1, gm=GM0),)), 3.0
    )  # fmt: skip
    assert refused.msg.reason == "stale_epoch"  # type: ignore[attr-defined]


def test_a_pool_keeps_ended_attempts_until_its_lm_takes_the_reports() -> None:
    pool = WorkerPool(LM0, 2)
    pool.handle(RegisterPool(), 0.0)
    specs = [make_task(duration=1.0) for _ in range(3)]
    starts = tuple(StartTask(node=0, spec=s, attempt=1, gm=GM0) for s in specs)  # type: ignore[arg-type]
    pool.handle(StartTasks(lm=LM0, epoch=1, tasks=starts), 0.0)
    reports = []
    for s in specs[:2]:
        (r,) = pool.handle(TaskDue(user=s.user, task_id=s.task_id, attempt=1), 1.0)
        reports.append(r.msg)  # type: ignore[attr-defined]
    (reg,) = pool.handle(RegisterPool(), 2.0)
    msg = reg.msg  # type: ignore[attr-defined]
    assert [e.start.spec for e in msg.ended] == specs[:2]
    assert [e.report.kind for e in msg.ended] == [ReportKind.FINISHED] * 2
    assert [s.spec for s in msg.running] == specs[2:]
    pool.handle(ReportsTaken(reports=tuple(reports)), 3.0)
    (reg,) = pool.handle(RegisterPool(), 4.0)
    assert reg.msg.ended == ()  # type: ignore[attr-defined]
    # an attempt the pool stopped itself (its lease ran out) is kept too, as LOST: a new
    # LM that never held it learns from the registration that it must run again
    from common.messages import CheckLease, LeaseRenewed

    pool.handle(LeaseRenewed(), 4.0)
    (lost,) = pool.handle(CheckLease(lease=1.0), 9.0)
    assert lost.msg.kind == ReportKind.LOST  # type: ignore[attr-defined]
    assert [e.report.kind for e in pool.unreported.values()] == [ReportKind.LOST]
    pool.handle(ReportsTaken(reports=(lost.msg,)), 9.5)  # type: ignore[attr-defined]
    assert pool.unreported == {}


def test_a_start_that_reaches_a_pool_out_of_touch_is_answered_lost_not_run() -> None:
    """A pool frozen (or cut off) past its lease may find, when it resumes, a start its
    LM sent before: the LM has placed that task elsewhere since, so it is not run."""
    from common.messages import LeaseRenewed, WorkerReports

    pool = WorkerPool(LM0, 2, lease_s=2.0)
    pool.handle(LeaseRenewed(), 1.0)
    t = make_task(duration=1.0)
    start = StartTasks(lm=LM0, epoch=1, tasks=(StartTask(node=0, spec=t, attempt=1, gm=GM0),))  # type: ignore[arg-type]
    (answer,) = pool.handle(start, 9.0)  # nothing ran, so nothing was fenced before
    reports = answer.msg
    assert isinstance(reports, WorkerReports)
    assert [(r.kind, r.attempt, r.detail) for r in reports.reports] == [
        (ReportKind.LOST, 1, "lease lost")
    ]
    assert pool.running == {}
    assert [row for row in pool.launches if row[0] == "start"] == []
    # once its LM answers again, starts run
    pool.handle(LeaseRenewed(), 9.5)
    (answer, *_) = pool.handle(start, 9.6)
    assert [r.kind for r in answer.msg.reports] == [ReportKind.STARTED]  # type: ignore[attr-defined]


def test_the_launch_log_is_bounded_and_read_by_cursor() -> None:
    """A reader follows the pool's bounded log with ``launches_after``; what the log
    dropped before it was read is counted, never silently skipped."""
    from worker import core as worker_core

    pool = WorkerPool(LM0, 2)
    specs = [make_task(duration=1.0) for _ in range(5)]
    for i, s in enumerate(specs):
        start = StartTask(node=0, spec=s, attempt=1, gm=GM0)  # type: ignore[arg-type]
        pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(start,)), float(i))
    rows, missed = pool.launches_after(0)
    assert [r[2] for r in rows] == [s.task_id for s in specs]
    assert missed == 0
    rows, missed = pool.launches_after(3)
    assert [r[2] for r in rows] == [s.task_id for s in specs[3:]]
    assert missed == 0
    assert pool.launches_after(pool.launch_seq) == ([], 0)
    small = WorkerPool(LM0, 2)
    small.launches = deque(maxlen=2)
    for i, s in enumerate(specs):
        start = StartTask(node=0, spec=s, attempt=1, gm=GM0)  # type: ignore[arg-type]
        small.handle(StartTasks(lm=LM0, epoch=1, tasks=(start,)), float(i))
    rows, missed = small.launches_after(1)  # rows 2 and 3 are gone
    assert [r[2] for r in rows] == [s.task_id for s in specs[3:]]
    assert missed == 2
    assert worker_core.LAUNCH_LOG >= 10_000


def test_a_stop_that_overtakes_its_start_keeps_the_attempt_from_ever_running() -> None:
    """An LM preempts an attempt whose start is still in its batch (stops go first):
    the pool confirms the stop and refuses the late start; a newer attempt runs."""
    pool = WorkerPool(LM0, 2)
    t = make_task(duration=1.0)
    stop = StopTasks(lm=LM0, epoch=1, tasks=(StopTask(node=0, user=t.user, task_id=t.task_id,  # type: ignore[arg-type]
                                                      attempt=1, gm=GM0),))  # fmt: skip
    (answer,) = pool.handle(stop, 1.0)
    assert [r.kind for r in answer.msg.reports] == [ReportKind.STOPPED]  # type: ignore[attr-defined]
    late = StartTasks(lm=LM0, epoch=1, tasks=(StartTask(node=0, spec=t, attempt=1, gm=GM0),))  # type: ignore[arg-type]
    pool.handle(late, 1.0)
    assert pool.running == {}
    assert pool.counters.stopped_before_start == 1
    newer = StartTasks(lm=LM0, epoch=1, tasks=(StartTask(node=1, spec=t, attempt=2, gm=GM0),))  # type: ignore[arg-type]
    pool.handle(newer, 2.0)
    assert [r.attempt for r in pool.running.values()] == [2]


def test_an_answer_read_after_a_freeze_renews_the_lease_only_from_when_it_was_asked() -> None:
    """A pool frozen right after a heartbeat reads its LM's answer on waking: the lease
    runs from when the heartbeat left, so the starts queued meanwhile are still LOST."""
    from common.messages import LeaseRenewed, WorkerReports

    pool = WorkerPool(LM0, 2, lease_s=2.0)
    pool.handle(LeaseRenewed(sent=1.0), 1.0)
    pool.handle(LeaseRenewed(sent=1.1), 9.0)  # the answer, read after 8 s frozen
    t = make_task(duration=1.0)
    start = StartTasks(lm=LM0, epoch=1, tasks=(StartTask(node=0, spec=t, attempt=1, gm=GM0),))  # type: ignore[arg-type]
    (answer,) = pool.handle(start, 9.0)
    assert isinstance(answer.msg, WorkerReports)  # type: ignore[attr-defined]
    assert [r.kind for r in answer.msg.reports] == [ReportKind.LOST]  # type: ignore[attr-defined]
    assert pool.running == {}
