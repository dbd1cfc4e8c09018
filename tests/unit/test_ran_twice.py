"""Sequences that ran an attempt twice in the compose end-to-end run under load (3 GMs,
3 LMs, a pool killed, then the whole federation restarted: ``scripts/compose-e2e``),
replayed on the cores.  Each test names the sequence; none sleeps.

* An LM made a new attempt of a task it no longer held: its pool, back from a kill,
  said (``LOST``, in its registration) that it had stopped an attempt the LM had given
  back to its GM long before; the LM relaunched it as the next attempt, the one the GM
  had placed elsewhere meanwhile ("attempt 2 started twice").
"""

from __future__ import annotations

from common.effects import ToGm, ToLm, ToWorker
from common.ids import GmId, LmId, NodeIndex
from common.messages import (
    CheckLease,
    CheckWorkers,
    EventKind,
    LeaseRenewed,
    RegisterPool,
    RegisterWorkers,
    StartTask,
    StartTasks,
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
