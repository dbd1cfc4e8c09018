"""The LM core on small hand-built clusters: validation, repartition, preemption,
worker loss, idempotent launches, versioned deltas.  No event loop, no sleeps."""

from __future__ import annotations

from dataclasses import replace

from common.effects import ToAllGms, ToGm, ToWorker
from common.ids import GmId, LmId, NodeIndex, UserId
from common.messages import (
    LaunchRequest,
    LaunchResponse,
    Placement,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StartTask,
    StateSnapshot,
    StopTask,
    TaskEvent,
    WorkerReport,
)
from common.model import Phase, Task
from local_master.core import LocalMaster
from tests.conftest import make_lm, make_task

GM0, GM1 = GmId("gm0"), GmId("gm1")
N0, N1 = NodeIndex(0), NodeIndex(1)


def launch(
    lm: LocalMaster,
    *placements: tuple[Task, int],
    gm: GmId = GM0,
    known: int = -1,
    now: float = 1.0,
    repartition: bool = False,
) -> tuple[LaunchResponse, list[object]]:
    req = LaunchRequest(
        gm=gm,
        lm=lm.lm_id,
        request_id=1,
        placements=tuple(
            Placement(task=t, node=NodeIndex(n), repartition=repartition) for t, n in placements
        ),
        known_version=known,
    )
    effects = lm.on_launch(req, now)
    first = effects[0]
    assert isinstance(first, ToGm)
    assert isinstance(first.msg, LaunchResponse)
    return first.msg, [e.msg for e in effects[1:]]


def preempt(
    lm: LocalMaster, task: Task, victim: str, gm: GmId = GM0, now: float = 1.0
) -> tuple[PreemptResponse, list[object]]:
    req = PreemptRequest(
        gm=gm, lm=lm.lm_id, request_id=7, task=task, victim=UserId(victim), known_version=-1
    )
    effects = lm.on_preempt(req, now)
    first = effects[0]
    assert isinstance(first, ToGm)
    assert isinstance(first.msg, PreemptResponse)
    return first.msg, list(effects[1:])


def report(lm: LocalMaster, task: Task, node: int, kind: str, at: float) -> list[object]:
    rep = WorkerReport(lm=lm.lm_id, node=NodeIndex(node), task_id=task.task_id, kind=kind, at=at)
    return [e.msg for e in lm.on_worker_report(rep, at) if isinstance(e, ToGm)]


def conserved(lm: LocalMaster) -> None:
    for n in range(lm.n_nodes):
        if not lm.alive[n]:
            assert lm.free[n] == [0, 0]
            assert not lm.on_node[n]
            continue
        held = [0, 0]
        for tid in lm.on_node[n]:
            for r, d in enumerate(lm.active[tid].task.demand):
                held[r] += d
        assert [f + h for f, h in zip(lm.free[n], held, strict=True)] == list(lm.capacity[n])
        assert all(0 <= f <= c for f, c in zip(lm.free[n], lm.capacity[n], strict=True))


# ------------------------------------------------------------------ launches
def test_internal_launch_deducts_and_starts_the_task() -> None:
    lm = make_lm()
    t = make_task(3, 1)
    resp, rest = launch(lm, (t, 1), known=lm.version)
    assert [r.reason for r in resp.results] == ["ok"]
    assert lm.free == [[4, 4], [1, 3]]
    assert rest == [StartTask(lm=lm.lm_id, node=N1, task=t)]
    assert lm.counters["launches"] == 1
    assert lm.counters["repartitions"] == 0
    assert t.gm == GM0
    assert resp.delta.nodes == (N1,)
    assert resp.delta.free == ((1, 3),)
    assert resp.delta.usage == {UserId("u0"): (3, 1)}
    conserved(lm)


def test_every_resource_type_is_validated() -> None:
    lm = make_lm(nodes=[(4, 2)])
    resp, rest = launch(lm, (make_task(1, 3), 0))
    assert not resp.results[0].accepted
    assert resp.results[0].reason == "insufficient_resources"
    assert rest == []
    assert lm.free == [[4, 2]]


def test_refusals_name_their_reason_and_count_as_internal_inconsistencies() -> None:
    lm = make_lm(nodes=[(4, 4, 0b01), (4, 4)])
    launch(lm, (make_task(4, 4), 1))
    resp, _ = launch(
        lm, (make_task(1, 1, constraints=0b10), 0), (make_task(1, 1), 1), (make_task(1, 1), 5)
    )
    assert [r.reason for r in resp.results] == [
        "constraints_unmet",
        "insufficient_resources",
        "unknown_node",
    ]
    assert lm.counters["refused_internal"] == 3


def test_refusal_piggybacks_the_true_state_since_the_known_version() -> None:
    """Inconsistency: the GM thought node 0 was free; the answer corrects it."""
    lm = make_lm()
    launch(lm, (make_task(4, 4), 0))
    known = lm.version
    launch(lm, (make_task(2, 2), 1))
    resp, _ = launch(lm, (make_task(1, 1), 0), known=known)
    assert not resp.results[0].accepted
    assert resp.delta.base_version == known
    assert resp.delta.nodes == (N1,)
    assert resp.delta.free == ((2, 2),)
    assert resp.delta.version == lm.version


def test_batch_is_judged_placement_by_placement() -> None:
    lm = make_lm(nodes=[(4, 4)])
    a, b, c = make_task(3, 1), make_task(3, 1), make_task(1, 1)
    resp, rest = launch(lm, (a, 0), (b, 0), (c, 0))
    assert [r.accepted for r in resp.results] == [True, False, True]
    assert [m.task for m in rest if isinstance(m, StartTask)] == [a, c]
    conserved(lm)


def test_launches_are_idempotent_by_task_id() -> None:
    lm = make_lm()
    t = make_task(2, 2)
    launch(lm, (t, 0))
    resp, rest = launch(lm, (t, 1))
    assert resp.results[0].accepted
    assert resp.results[0].reason == "duplicate"
    assert rest == []
    assert lm.free == [[2, 2], [4, 4]]
    assert lm.counters["duplicates"] == 1
    # still a duplicate after it finished: a redelivered job never runs twice
    report(lm, t, 0, "finished", 2.0)
    resp, rest = launch(lm, (t, 1))
    assert resp.results[0].reason == "duplicate"
    assert rest == []


# --------------------------------------------------------------- repartition
def test_repartition_carves_a_logical_node_at_resource_granularity() -> None:
    lm = make_lm(nodes=[(4, 4), (8, 8)], home=["gm0", "gm1"])
    t = make_task(3, 2)
    resp, rest = launch(lm, (t, 1), gm=GM0, repartition=True)
    assert resp.results[0].accepted
    assert lm.counters["repartitions"] == 1
    assert lm.counters["launches"] == 0
    assert lm.free[1] == [5, 6]  # deducted from the physical node, not the whole node
    assert lm.logical_nodes() == [(t.task_id, N1, GM0, (3, 2))]
    assert lm.home == [GM0, GM1]  # the physical node stays in gm1's partition
    assert isinstance(rest[0], StartTask)
    events = report(lm, t, 1, "started", 2.0)
    events += report(lm, t, 1, "finished", 3.0)
    assert [e.kind for e in events if isinstance(e, TaskEvent)] == ["started", "finished"]
    assert all(isinstance(e, TaskEvent) and e.gm == GM0 for e in events)
    assert lm.free[1] == [8, 8]  # returned when the task ends
    assert lm.logical_nodes() == []
    conserved(lm)


def test_external_refusal_counts_as_external_inconsistency() -> None:
    lm = make_lm(nodes=[(4, 4), (2, 2)], home=["gm0", "gm1"])
    resp, _ = launch(lm, (make_task(3, 3), 1), gm=GM0, repartition=True)
    assert resp.results[0].reason == "insufficient_resources"
    assert lm.counters["refused_external"] == 1
    assert lm.counters["refused_internal"] == 0


# ---------------------------------------------------------------- preemption
def test_preemption_frees_exactly_enough_and_launches() -> None:
    lm = make_lm(nodes=[(4, 4)])
    old, new, alt = make_task(2, 2, user="a"), make_task(1, 1, user="a"), make_task(1, 1, user="a")
    alt.altruistic = True
    for i, t in enumerate((old, new, alt)):
        launch(lm, (t, 0), gm=GM1, now=1.0 + i)
        report(lm, t, 0, "started", 1.0 + i)
    want = make_task(2, 2, user="b")
    resp, effects = preempt(lm, want, "a", now=5.0)
    # altruistic first, then the most recently accepted: the least work lost
    assert resp.accepted
    assert resp.reason == "ok"
    assert resp.node == N0
    assert resp.preempted == (alt.task_id, new.task_id)
    stops = [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StopTask)]
    assert [s.task_id for s in stops] == [alt.task_id, new.task_id]
    evs = [(e.gm, e.msg) for e in effects if isinstance(e, ToGm)]
    assert {(g, m.kind) for g, m in evs if isinstance(m, TaskEvent)} == {(GM1, "preempted")}
    assert lm.active.keys() == {old.task_id, want.task_id}
    assert lm.free == [[0, 0]]
    assert new.started_at == -1.0
    conserved(lm)


def test_preemption_refused_without_a_victim_here() -> None:
    lm = make_lm(nodes=[(4, 4)])
    launch(lm, (make_task(4, 4, user="c"), 0))
    resp, effects = preempt(lm, make_task(2, 2, user="b"), "a")
    assert not resp.accepted
    assert resp.reason == "no_victim"
    assert effects == []
    assert lm.counters["preemptions_refused"] == 1


def test_preemption_respects_constraints() -> None:
    lm = make_lm(nodes=[(4, 4, 0b01)])
    launch(lm, (make_task(4, 4, user="a"), 0))
    resp, _ = preempt(lm, make_task(1, 1, user="b", constraints=0b10), "a")
    assert not resp.accepted
    assert len(lm.active) == 1


def test_preempted_task_can_be_launched_again_on_the_same_lm() -> None:
    """A preempted task returns to its GM's queue; its next launch must run it, not be
    answered ``duplicate`` (which would leave it placed at the GM and never run)."""
    lm = make_lm(nodes=[(4, 4), (4, 4)])
    victim = make_task(4, 4, user="a")
    launch(lm, (victim, 0), gm=GM1)
    preempt(lm, make_task(4, 4, user="b"), "a")
    resp, rest = launch(lm, (victim, 1), gm=GM1)
    assert resp.results[0].reason == "ok"
    assert [m.task for m in rest if isinstance(m, StartTask)] == [victim]
    conserved(lm)


# ------------------------------------------------------------------- workers
def test_started_report_carries_the_workers_ledger() -> None:
    lm = make_lm()
    t = make_task()
    t.submit(0.0)
    launch(lm, (t, 0), now=1.0)
    copy = replace(t, spent=list(t.spent))  # as decoded from the wire
    copy.enter(Phase.WORKER_QUEUEING, 2.0)
    copy.start(3.0)
    rep = WorkerReport(lm=lm.lm_id, node=N0, task_id=t.task_id, kind="started", at=3.0)
    (eff,) = lm.on_worker_report(rep, 3.0, task=copy)
    assert isinstance(eff, ToGm)
    assert isinstance(eff.msg, TaskEvent)
    assert eff.msg.task.spent == copy.spent
    assert eff.msg.task.started_at == 3.0
    assert lm.active[t.task_id].started


def test_late_report_of_a_moved_task_is_ignored() -> None:
    lm = make_lm()
    t = make_task(4, 4, user="a")
    launch(lm, (t, 0))
    preempt(lm, make_task(4, 4, user="b"), "a")
    assert report(lm, t, 0, "finished", 2.0) == []
    conserved(lm)


def test_lost_worker_tasks_are_relaunched_in_their_gms_partition() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4), (4, 4)], home=["gm0", "gm0", "gm1"])
    t = make_task(2, 2)
    launch(lm, (t, 0))
    for n in range(3):
        lm.on_worker_heartbeat(NodeIndex(n), 5.0 if n else 1.0)
    effects = lm.check_workers(6.0, timeout=2.0)
    assert not lm.alive[0]
    assert lm.free[0] == [0, 0]
    assert [(e.node, type(e.msg)) for e in effects if isinstance(e, ToWorker)] == [(N1, StartTask)]
    assert lm.active[t.task_id].node == N1
    assert lm.counters == lm.counters | {"workers_lost": 1, "relaunched": 1}
    conserved(lm)


def test_lost_worker_tasks_without_room_go_back_to_their_gm() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4)], home=["gm0", "gm1"])
    t = make_task(2, 2)
    launch(lm, (t, 0))
    lm.on_worker_heartbeat(N1, 5.0)
    effects = lm.check_workers(6.0, timeout=2.0)
    evs = [e.msg for e in effects if isinstance(e, ToGm)]
    assert len(evs) == 1
    assert isinstance(evs[0], TaskEvent)
    assert evs[0].kind == "requeued"
    assert evs[0].gm == GM0
    assert t.task_id not in lm.active
    # not remembered as accepted: the GM may launch it again
    resp, _ = launch(lm, (t, 1), gm=GM0, repartition=True, now=7.0)
    assert resp.results[0].reason == "ok"
    conserved(lm)


def test_a_dead_node_comes_back_empty() -> None:
    lm = make_lm(nodes=[(4, 4)])
    launch(lm, (make_task(2, 2), 0))
    lm.check_workers(10.0, timeout=1.0)
    v = lm.version
    lm.on_worker_heartbeat(N0, 11.0)
    assert lm.alive[0]
    assert lm.free == [[4, 4]]
    assert lm.version == v + 1
    conserved(lm)


# ------------------------------------------------------------------ versions
def test_versions_are_monotone_and_deltas_name_changed_nodes() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4), (4, 4)])
    seen = [lm.version]
    launch(lm, (make_task(), 0))
    seen.append(lm.version)
    mid = lm.version
    launch(lm, (make_task(), 2))
    seen.append(lm.version)
    assert seen == sorted(seen)
    assert len(set(seen)) == 3
    d = lm.delta_since(mid)
    assert d.nodes == (NodeIndex(2),)
    assert d.node_versions == (lm.version,)
    assert lm.delta_since(lm.version).nodes == ()


def test_a_delta_older_than_the_log_is_a_full_state() -> None:
    lm = make_lm(nodes=[(8, 8), (8, 8)], log_limit=4)
    for _ in range(6):
        launch(lm, (make_task(), 0))
    d = lm.delta_since(0)
    assert d.base_version == -1
    assert d.nodes == (N0, N1)


def test_heartbeat_sends_what_changed_since_the_previous_heartbeat() -> None:
    lm = make_lm()
    (first,) = lm.heartbeat(0.0)
    assert isinstance(first, ToAllGms)
    assert first.msg.delta.nodes == ()
    launch(lm, (make_task(), 1))
    (second,) = lm.heartbeat(1.0)
    assert isinstance(second, ToAllGms)
    assert second.msg.delta.base_version == 0
    assert second.msg.delta.nodes == (N1,)


def test_snapshot_lists_the_gms_accepted_tasks() -> None:
    lm = make_lm(home=["gm0", "gm1"])
    a, b = make_task(), make_task()
    launch(lm, (a, 0), gm=GM0)
    launch(lm, (b, 1), gm=GM1)
    (eff,) = lm.on_snapshot_request(SnapshotRequest(gm=GM1, lm=LmId("lm0")), 2.0)
    assert isinstance(eff, ToGm)
    assert isinstance(eff.msg, StateSnapshot)
    assert eff.msg.placed_by_gm == (b.task_id,)
    assert eff.msg.layout.home == (GM0, GM1)
    assert eff.msg.state.base_version == -1
