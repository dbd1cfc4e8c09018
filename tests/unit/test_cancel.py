"""Cancel in the cores, step by step: a job with tasks running, in flight and queued."""

from __future__ import annotations

from common.effects import ToLm
from common.ids import GmId
from common.messages import CancelJob, CancelTasks
from global_master.core_users import CANCELLED
from tests.conftest import Network, alive, make_gm, make_lm, make_task


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
