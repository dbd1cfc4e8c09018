"""The services' pure handlers: bytes in, the same core decisions out.

A GM core and an LM core exchange their messages only as encoded bodies through
``global_master.app.handle_body`` / ``local_master.app.handle_body`` and the worker
pool core, exactly as the live services do, minus sockets.
"""

from __future__ import annotations

import pytest

from common import codec
from common.codec import TaskReport, WorkerHeartbeat
from common.effects import ToGm, ToLm, ToWorker, stamp_sent
from common.errors import ValidationError
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import LaunchRequest, StartTask
from common.model import NodeSpec, Task, UserConfig
from global_master import app as gm_app
from global_master.core import GlobalMaster
from local_master import app as lm_app
from local_master.core import LocalMaster
from worker.core import WorkerPool


def _federation() -> tuple[GlobalMaster, LocalMaster, WorkerPool]:
    lm = LocalMaster(LmId("lm0"), [NodeSpec((2,))] * 4, [GmId("gm0")] * 2 + [GmId("gm1")] * 2)
    gm = GlobalMaster(GmId("gm0"), [LmId("lm0")], [UserConfig(UserId("u0"), GmId("gm0"), 1.0)])
    return gm, lm, WorkerPool(LmId("lm0"), 4)


def _task(i: int) -> Task:
    return Task(TaskId(f"j.t{i}"), JobId("j"), UserId("u0"), (1,), 1.0)


def test_tasks_travel_gm_lm_worker_as_bytes_with_an_exact_ledger() -> None:
    gm, lm, pool = _federation()
    (snap_req,) = gm.start(0.0)
    assert isinstance(snap_req, ToLm)
    (snap,) = lm_app.handle_body(lm, "snapshot", codec.encode(snap_req.msg), 0.0)
    assert isinstance(snap, ToGm)
    gm_app.handle_body(gm, "snapshot", codec.encode(snap.msg), 0.0)
    gm.submit([_task(i) for i in range(6)], 1.0)

    effects = gm.decide(1.5, max_tasks=6)
    stamp_sent(effects, 1.6)
    (req,) = effects  # six decisions, one batched request to the one LM
    assert isinstance(req, ToLm)
    assert isinstance(req.msg, LaunchRequest)
    assert len(req.msg.placements) == 6
    lm_effects = lm_app.handle_body(lm, "launch", codec.encode(req.msg), 2.0, received_at=1.9)
    resp, *starts = lm_effects
    assert isinstance(resp, ToGm)
    assert all(isinstance(s, ToWorker) for s in starts)
    assert len(starts) == 6  # 4 internal, 2 by repartition of gm1's nodes
    gm_app.handle_body(gm, "launch_response", codec.encode(resp.msg), 2.2)
    assert len(gm.placed) == 6

    start = starts[0]
    assert isinstance(start, ToWorker)
    assert isinstance(start.msg, StartTask)
    wire = codec.decode(
        codec.encode_batch([start.msg]).__bytes__().__class__(codec.encode(start.msg))
    )
    assert isinstance(wire, StartTask)
    task = pool.accept(wire, 2.3)
    assert task is not None
    rep = pool.started(task.task_id, 2.35)
    assert rep is not None
    ev_effects = lm_app.handle_body(lm, "worker-report", codec.encode_batch([rep]), 2.4)
    (event,) = ev_effects
    assert isinstance(event, ToGm)
    done = event.msg.task  # type: ignore[union-attr]
    assert done.started_at == 2.35
    assert done.allocation_time == pytest.approx(2.35 - 1.0)
    # queueing 1.0->1.5, processing 1.5->1.6 + 1.9->2.0, communication 1.6->1.9 + 2.0->2.3
    assert done.spent[:4] == pytest.approx([0.5, 0.2, 0.6, 0.05])
    gm_app.handle_body(gm, "task_events", codec.encode_batch([event.msg]), 2.5)


def test_lm_handler_refuses_what_the_core_must_not_see() -> None:
    _, lm, _ = _federation()
    hb = WorkerHeartbeat(lm=LmId("lm0"), nodes=(NodeIndex(7),), at=0.0)
    with pytest.raises(ValidationError) as err:
        lm_app.handle_body(lm, "worker-heartbeat", codec.encode(hb), 0.0)
    assert err.value.reason == "unknown_node"
    other = WorkerHeartbeat(lm=LmId("lm9"), nodes=(), at=0.0)
    with pytest.raises(ValidationError) as err:
        lm_app.handle_body(lm, "worker-heartbeat", codec.encode(other), 0.0)
    assert err.value.reason == "wrong_lm"


def test_worker_pool_reports_carry_the_ledger_and_ignore_repeats() -> None:
    pool = WorkerPool(LmId("lm0"), 2)
    t = _task(0)
    t.submit(0.0)
    msg = StartTask(lm=LmId("lm0"), node=NodeIndex(1), task=t)
    assert pool.accept(msg, 1.0) is t
    assert pool.accept(msg, 1.1) is None  # a repeated request starts nothing twice
    started = pool.started(t.task_id, 1.25)
    assert isinstance(started, TaskReport)
    assert started.report.kind == "started"
    assert started.task.spent[3] == pytest.approx(0.25)
    finished = pool.ended(t.task_id, 3.0, ok=True)
    assert finished is not None
    assert finished.report.kind == "finished"
    assert pool.ended(t.task_id, 3.1, ok=True) is None
    assert pool.counters == {"started": 1, "finished": 1, "failed": 0, "stopped": 0}
