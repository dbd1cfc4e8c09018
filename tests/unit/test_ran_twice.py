"""Sequences that ran an attempt twice in the compose end-to-end run under load (3 GMs,
3 LMs, a pool killed, then the whole federation restarted: ``scripts/compose-e2e``),
replayed on the cores.  Each test names the sequence; none sleeps.

* An LM made a new attempt of a task it no longer held: its pool, back from a kill,
  said (``LOST``, in its registration) that it had stopped an attempt the LM had given
  back to its GM long before; the LM relaunched it as the next attempt, the one the GM
  had placed elsewhere meanwhile ("attempt 2 started twice").
"""

from __future__ import annotations

from msgspec.structs import replace

from common.effects import After, Record, Reply, RunCommand, ToGm, ToLm, ToWorker
from common.ids import GmId, JobId, LmId, NodeIndex
from common.messages import (
    CancelTasks,
    CheckLease,
    CheckWorkers,
    EventKind,
    LeaseRenewed,
    PlacedRef,
    RegisterPool,
    RegisterWorkers,
    ReportKind,
    ReportsTaken,
    StartTask,
    StartTasks,
    StopTasks,
    TaskDue,
    WorkerReport,
    WorkerReports,
)
from common.model import NodeSpec
from local_master.core import LocalMaster
from tests.conftest import key, launch_req, make_task
from worker.core import WorkerPool

GM0 = GmId("gm0")
LM0 = LmId("lm0")


def registration(pool: WorkerPool, now: float) -> RegisterWorkers:
    (eff,) = [e for e in pool.handle(RegisterPool(), now) if isinstance(e, ToLm)]
    assert isinstance(eff.msg, RegisterWorkers)
    return eff.msg


def starts(effects: list[object]) -> list[StartTask]:
    return [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StartTask)]


def lm_of_one_node() -> LocalMaster:
    lm = LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], gms=[GM0])
    lm.handle(registration(WorkerPool(LM0, 1), 0.0), 0.0)
    return lm


def fenced_pool(attempt: int) -> WorkerPool:
    """A pool that ran ``attempt`` of a task, lost its lease (its LM did not answer)
    and stopped it: ``LOST``, kept in its journal until an LM takes it."""
    pool = WorkerPool(LM0, 1, lease_s=1.0, durable=True)
    pool.handle(LeaseRenewed(), 0.0)
    t = make_task(4, 4, task_id="t", duration=5.0)
    start = StartTask(node=NodeIndex(0), spec=t, attempt=attempt, gm=GM0)
    pool.handle(StartTasks(lm=LM0, epoch=0, tasks=(start,)), 0.5)
    pool.handle(CheckLease(lease=1.0), 2.0)
    assert pool.running == {}
    return pool


def test_an_attempt_given_back_is_not_relaunched_when_its_pool_comes_back() -> None:
    """lm0's pool is killed after it stopped attempt 1 for want of a lease (its report
    never left); lm0 gives the node up, finds no other node, and gives the task back to
    its GM, which places attempt 2 on another LM.  The pool's next process registers
    with the LOST attempt 1: lm0 must not start the task again (it was relaunched as
    attempt 2 here while attempt 2 ran elsewhere)."""
    lm = lm_of_one_node()
    t = make_task(4, 4, task_id="t", duration=5.0)
    lm.handle(launch_req(t, node=0), 0.5)
    pool = fenced_pool(attempt=1)
    given_back = []
    for now in range(1, 41):  # silent: dead, then given up (no node left)
        given_back += lm.handle(CheckWorkers(timeout=5.0, lost_after=30.0), float(now))
    assert [(e.msg.kind, e.msg.attempt) for e in given_back if isinstance(e, ToGm)] == [
        (EventKind.REQUEUED, 1)
    ]
    assert key(t) not in lm.active
    # the GM placed attempt 2 on another LM, which ran it; lm0's pool comes back
    back = WorkerPool(LM0, 1, lease_s=1.0, durable=True)
    back.restore(pool.records())
    effects = lm.handle(registration(back, 60.0), 60.0)
    assert starts(effects) == []
    # what it tells the GM is a REQUEUED of attempt 1 at most: stale for a GM that
    # placed attempt 2 elsewhere (``Ledger.current``)
    assert all(e.msg.attempt == 1 for e in effects if isinstance(e, ToGm))


# ----------------------------------------------- a pool never runs an ended attempt
def pool_start(pool: WorkerPool, spec: object, attempt: int, now: float) -> list[object]:
    start = StartTask(node=NodeIndex(0), spec=spec, attempt=attempt, gm=GM0)  # type: ignore[arg-type]
    return pool.handle(StartTasks(lm=LM0, epoch=0, tasks=(start,)), now)


def answered(effects: list[object]) -> list[tuple[int, int]]:
    """(kind, attempt) of the reports in the answer to a start."""
    (reply,) = [e for e in effects if isinstance(e, Reply)]
    assert isinstance(reply.msg, WorkerReports)
    return [(r.kind, r.attempt) for r in reply.msg.reports]


def ran(pool: WorkerPool) -> list[tuple[str, int]]:
    rows, _ = pool.launches_after(0)
    return [(what, attempt) for what, _u, _t, attempt, _n, _a in rows]


def test_a_start_sent_again_after_its_attempt_ended_is_answered_with_the_end() -> None:
    """The LM's start reached the pool, the task ran and ended, and the same start came
    again (the LM sent it again: its answer was lost or late under load; or it came
    back from its journal): the pool ran it a second time ("attempt 1 started twice").
    It answers with the end (the LM learns what it missed) and runs nothing."""
    pool = WorkerPool(LM0, 1)
    t = make_task(task_id="t", duration=1.0)
    assert answered(pool_start(pool, t, 1, 0.0)) == [(ReportKind.STARTED, 1)]
    pool.handle(TaskDue(user=t.user, task_id=t.task_id, attempt=1), 1.0)
    pool.handle(ReportsTaken(reports=tuple(e.report for e in pool.unreported.values())), 1.5)
    again = pool_start(pool, t, 1, 2.0)
    assert answered(again) == [(ReportKind.FINISHED, 1)]
    assert [e for e in again if isinstance(e, After | RunCommand)] == []
    assert ran(pool) == [("start", 1), ("end", 1)]
    assert pool.running == {}
    # a newer attempt of it runs; a later job's task of the same id is a new task
    assert answered(pool_start(pool, t, 2, 3.0)) == [(ReportKind.STARTED, 2)]
    reused = replace(make_task(task_id="u", duration=1.0), job_id=JobId("j1"))
    first = replace(reused, job_id=JobId("j0"))
    pool_start(pool, first, 1, 4.0)
    pool.handle(TaskDue(user=t.user, task_id=first.task_id, attempt=1), 5.0)
    assert answered(pool_start(pool, reused, 1, 6.0)) == [(ReportKind.STARTED, 1)]


def test_a_pool_back_from_its_journal_does_not_run_an_attempt_that_ended_before() -> None:
    """The pool's process dies (the whole federation restarts) after an attempt ended
    and its LM took the report; the next process, from the journal (as written, and
    compacted), answers a start of that attempt with its end."""
    pool = WorkerPool(LM0, 1, durable=True)
    t = make_task(task_id="t", duration=1.0)
    journal: list[object] = []
    for msg, now in (
        (None, 0.0),
        (TaskDue(user=t.user, task_id=t.task_id, attempt=1), 1.0),
    ):
        effects = pool_start(pool, t, 1, now) if msg is None else pool.handle(msg, now)
        journal += [r for e in effects if isinstance(e, Record) for r in e.records]
    taken = ReportsTaken(reports=tuple(e.report for e in pool.unreported.values()))
    journal += [r for e in pool.handle(taken, 1.5) if isinstance(e, Record) for r in e.records]
    for records in (journal, pool.records()):
        back = WorkerPool(LM0, 1, durable=True)
        back.restore(records)
        assert back.unreported == {}  # taken: not told again at registration
        assert answered(pool_start(back, t, 1, 2.0)) == [(ReportKind.FINISHED, 1)]
        assert ran(back) == []


def test_a_start_of_an_attempt_the_pool_fenced_is_not_run() -> None:
    """The pool stopped an attempt when its lease ran out (``LOST``); the same start
    coming again once the lease is back is answered ``LOST``, not run."""
    pool = WorkerPool(LM0, 1, lease_s=1.0)
    pool.handle(LeaseRenewed(), 0.0)
    t = make_task(task_id="t", duration=5.0)
    pool_start(pool, t, 1, 0.5)
    pool.handle(CheckLease(lease=1.0), 2.0)
    pool.handle(LeaseRenewed(), 3.0)
    assert answered(pool_start(pool, t, 1, 3.0)) == [(ReportKind.LOST, 1)]
    assert ran(pool) == [("start", 1), ("stop", 1)]


def test_a_registration_read_again_does_not_hold_an_attempt_that_ended_since() -> None:
    """The pool re-sent its registration after a timeout and the LM read both copies:
    an attempt the first named as running had ended since (the LM took its end), and the
    second copy held it again -- a phantom that takes its node's room and runs nothing."""
    lm = lm_of_one_node()
    pool = WorkerPool(LM0, 1)
    t = make_task(4, 4, task_id="t", duration=1.0)
    (start,) = starts(lm.handle(launch_req(t, node=0), 1.0))
    pool.handle(StartTasks(lm=LM0, epoch=lm.epoch, tasks=(start,)), 1.0)
    reg = registration(pool, 1.5)
    assert [s.attempt for s in reg.running] == [1]
    lm.handle(reg, 1.5)
    ended = pool.handle(TaskDue(user=t.user, task_id=t.task_id, attempt=1), 2.0)
    (end,) = [e.msg for e in ended if isinstance(e, ToLm)]
    assert isinstance(end, WorkerReport)
    lm.handle(WorkerReports(lm=LM0, reports=(end,)), 2.0)
    assert key(t) not in lm.nodes.active
    lm.handle(reg, 3.0)  # the copy sent again, read late
    assert key(t) not in lm.nodes.active
    # the node's room is free: the next task of its size is placed there
    nxt = make_task(4, 4, task_id="n", duration=1.0)
    assert [s.spec.task_id for s in starts(lm.handle(launch_req(nxt, node=0), 3.0))] == ["n"]


def test_a_registration_read_again_does_not_hold_an_attempt_stopped_since() -> None:
    """As above, but the attempt was stopped in between (its task cancelled, the pool
    confirmed the stop): the late copy held it again, a phantom its GM had been told was
    stopped.  A registration is taken once: a copy (the same ``at``) changes nothing."""
    lm = lm_of_one_node()
    pool = WorkerPool(LM0, 1)
    t = make_task(4, 4, task_id="t", duration=10.0)
    (start,) = starts(lm.handle(launch_req(t, node=0), 1.0))
    pool.handle(StartTasks(lm=LM0, epoch=lm.epoch, tasks=(start,)), 1.0)
    reg = registration(pool, 1.5)
    lm.handle(reg, 1.5)
    ref = PlacedRef(user=t.user, task_id=t.task_id, attempt=1)
    stops = [e.msg for e in lm.handle(CancelTasks(gm=GM0, lm=LM0, tasks=(ref,)), 2.0)
             if isinstance(e, ToWorker)]  # fmt: skip
    assert stops
    batch = StopTasks(lm=LM0, epoch=lm.epoch, tasks=tuple(stops))
    (answer,) = [e.msg for e in pool.handle(batch, 2.1) if isinstance(e, Reply)]
    assert isinstance(answer, WorkerReports)
    assert [r.kind for r in answer.reports] == [ReportKind.STOPPED]
    lm.handle(answer, 2.2)  # the stop's answer
    assert key(t) not in lm.nodes.active
    assert not lm.nodes.stopping
    lm.handle(reg, 3.0)  # the copy sent again, read late
    assert key(t) not in lm.nodes.active
    nxt = make_task(4, 4, task_id="n", duration=1.0)
    assert [s.spec.task_id for s in starts(lm.handle(launch_req(nxt, node=0), 3.0))] == ["n"]
