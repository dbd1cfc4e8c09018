"""The LM core on small hand-built clusters: validation, repartition, preemption,
worker loss, idempotent launches by attempt, versioned deltas, refusals as values.
No event loop, no sleeps; every input goes through ``handle``."""

from __future__ import annotations

import gc

from msgspec.structs import replace

from common.effects import Effect, Reply, ToAllGms, ToGm, ToWorker
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.messages import (
    CheckWorkers,
    EventKind,
    Heartbeat,
    JobKeep,
    KeepEnds,
    LaunchRequest,
    LaunchResponse,
    PlacedRef,
    Placement,
    PreemptRequest,
    PreemptResponse,
    Refused,
    RegisterWorkers,
    ReportKind,
    SnapshotRequest,
    StartTask,
    StateSnapshot,
    StopTask,
    TaskEvent,
    WorkerHeartbeat,
    WorkerReports,
)
from common.model import NodeSpec, TaskSpec
from local_master.core import LocalMaster
from tests.conftest import alive, check_workers, confirm_stops, key, make_lm, make_task, report

GM0, GM1 = GmId("gm0"), GmId("gm1")
LM0 = LmId("lm0")
N0, N1 = NodeIndex(0), NodeIndex(1)


def launch(
    lm: LocalMaster,
    *placements: tuple[TaskSpec, int],
    gm: GmId = GM0,
    known: int = -1,
    now: float = 1.0,
    repartition: bool = False,
    attempt: int = 1,
    altruistic: bool = False,
) -> tuple[LaunchResponse, list[object]]:
    req = LaunchRequest(
        gm=gm,
        lm=lm.lm_id,
        request_id=1,
        placements=tuple(
            Placement(
                spec=t,
                attempt=attempt,
                node=NodeIndex(n),
                repartition=repartition,
                altruistic=altruistic,
            )
            for t, n in placements
        ),
        known_version=known,
    )
    effects = lm.handle(req, now)
    first = effects[0]
    assert isinstance(first, Reply)
    assert isinstance(first.msg, LaunchResponse)
    return first.msg, [e.msg for e in effects[1:]]


def preempt(
    lm: LocalMaster, task: TaskSpec, victim: str, gm: GmId = GM0, now: float = 1.0
) -> tuple[PreemptResponse, list[Effect]]:
    req = PreemptRequest(
        gm=gm,
        lm=lm.lm_id,
        request_id=7,
        spec=task,
        attempt=1,
        victim=UserId(victim),
        known_version=-1,
    )
    effects = lm.handle(req, now)
    first = effects[0]
    assert isinstance(first, Reply)
    assert isinstance(first.msg, PreemptResponse)
    return first.msg, list(effects[1:])


def worker(
    lm: LocalMaster, task: TaskSpec, node: int, kind: ReportKind, at: float, attempt: int = 1
) -> list[object]:
    effects = lm.handle(report(lm.lm_id, kind, task, node, at, attempt=attempt), at)
    return [e.msg for e in effects if isinstance(e, ToGm)]


def conserved(lm: LocalMaster) -> None:
    for n in range(lm.n_nodes):
        if not lm.alive[n]:
            assert lm.free[n] == [0, 0]
            assert not lm.nodes.on_node[n]
            continue
        held = [0, 0]
        for k in lm.nodes.on_node[n]:
            for r, d in enumerate(lm.active[k].spec.demand):
                held[r] += d
        assert [f + h for f, h in zip(lm.free[n], held, strict=True)] == list(lm.nodes.capacity[n])
        assert all(0 <= f <= c for f, c in zip(lm.free[n], lm.nodes.capacity[n], strict=True))


# ------------------------------------------------------------------ launches
def test_internal_launch_deducts_and_starts_the_task() -> None:
    lm = make_lm()
    t = make_task(3, 1)
    resp, rest = launch(lm, (t, 1), known=lm.version)
    assert [r.reason for r in resp.results] == ["ok"]
    assert lm.free == [[4, 4], [1, 3]]
    assert rest == [StartTask(node=N1, spec=t, attempt=1, gm=GM0)]
    assert lm.counters.launches == 1
    assert lm.counters.repartitions == 0
    assert lm.active[key(t)].gm == GM0
    assert resp.delta.nodes == (N1,)
    assert resp.delta.free == ((1, 3),)
    assert resp.delta.usage == {UserId("u0"): (3, 1)}
    conserved(lm)


def test_idle_nodes_count_one_attempt_per_node_a_low_bound() -> None:
    lm = make_lm()
    assert lm.idle_nodes() == lm.n_nodes == 2
    a, b = make_task(1, 1), make_task(1, 1)
    launch(lm, (a, 0), (b, 0))  # two on node 0: node 1 is idle, the count says none
    assert lm.idle_nodes() == 0
    worker(lm, a, 0, ReportKind.FINISHED, 2.0)
    assert lm.idle_nodes() == 1


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
    assert lm.counters.refused_internal == 3


def addressed(lm: str, gm: str) -> list[object]:
    """One message of each kind sent to an LM: a GM's four, then its pool's three."""
    t, to, by = make_task(), LmId(lm), GmId(gm)
    place = (Placement(spec=t, attempt=1, node=N0),)
    return [
        LaunchRequest(gm=by, lm=to, request_id=1, placements=place, known_version=-1),
        PreemptRequest(gm=by, lm=to, request_id=1, spec=t, attempt=1, victim=UserId("u1"),
                       known_version=-1),
        SnapshotRequest(gm=by, lm=to),
        KeepEnds(gm=by, lm=to, jobs=(JobKeep(user=t.user, job_id=t.job_id, keep=True),)),
        WorkerReports(lm=to, reports=()),
        WorkerHeartbeat(lm=to, nodes=(N0,), at=1.0),
        RegisterWorkers(lm=to, nodes=(N0,), at=1.0),
    ]  # fmt: skip


def reasons(lm: LocalMaster, msgs: list[object]) -> list[str]:
    """The refusal reason of each message, or the type of the first answer ("" if none)."""
    out = []
    for msg in msgs:
        effects = lm.handle(msg, 1.0)
        first = effects[0].msg if effects and isinstance(effects[0], Reply) else None
        if isinstance(first, Refused):
            out.append(first.reason)
        else:
            out.append(type(first).__name__ if first is not None else "")
    return out


def test_every_message_to_an_lm_passes_one_address_guard() -> None:
    """The wrong LM first, in the same words whatever the message; then, before its pool
    registered, the sender's own reason (a GM asks again later, a pool registers first;
    a keep and a registration are taken); then a GM not of the federation."""
    for msg in addressed("lm9", "gm0"):
        unready = LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], awaiting_workers=True)
        for lm in (make_lm(), unready):
            (reply,) = lm.handle(msg, 1.0)
            assert reply == Reply(Refused(reason="wrong_lm", detail="this is lm0, not lm9"))
    unready = LocalMaster(LM0, [NodeSpec((4, 4))], [GM0], awaiting_workers=True)
    assert reasons(unready, addressed("lm0", "gm9")) == [
        "not_ready", "not_ready", "not_ready", "unknown_gm",
        "register_first", "register_first", "Registered",
    ]  # fmt: skip
    (refused,) = make_lm().handle(addressed("lm0", "gm9")[2], 1.0)
    assert refused == Reply(
        Refused(reason="unknown_gm", detail="gm9 is not a GM of this federation")
    )
    assert reasons(make_lm(), addressed("lm0", "gm9")) == [
        "unknown_gm", "unknown_gm", "unknown_gm", "unknown_gm", "", "", "Registered",
    ]  # fmt: skip


def test_a_request_that_is_not_for_this_lm_is_refused_whole() -> None:
    lm = make_lm()
    for req, reason in [
        (LaunchRequest(gm=GM0, lm=LmId("lm9"), request_id=1, placements=(
            Placement(spec=make_task(), attempt=1, node=N0),), known_version=-1), "wrong_lm"),
        (LaunchRequest(gm=GmId("evil"), lm=LM0, request_id=1, placements=(
            Placement(spec=make_task(), attempt=1, node=N0),), known_version=-1), "unknown_gm"),
        (LaunchRequest(gm=GM0, lm=LM0, request_id=1, placements=(
            Placement(spec=TaskSpec(task_id=make_task().task_id, job_id=make_task().job_id,
                                    user=UserId("u0"), demand=(1,), duration=1.0),
                      attempt=1, node=N0),), known_version=-1), "wrong_resources"),
    ]:  # fmt: skip
        (reply,) = lm.handle(req, 1.0)
        assert reply == Reply(Refused(reason=reason, detail=reply.msg.detail))  # type: ignore[union-attr]
    assert lm.active == {}
    assert lm.counters.refused_requests == 3


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
    assert [m.spec for m in rest if isinstance(m, StartTask)] == [a, c]
    conserved(lm)


def test_launches_are_idempotent_by_attempt() -> None:
    lm = make_lm()
    t = make_task(2, 2)
    launch(lm, (t, 0))
    resp, rest = launch(lm, (t, 1))
    assert resp.results[0].accepted
    assert resp.results[0].reason == "duplicate"
    assert rest == []
    assert lm.free == [[2, 2], [4, 4]]
    assert lm.counters.duplicates == 1
    # still a duplicate after it finished: a redelivered request never runs it twice,
    # and the answer says it ended (the GM may have restarted and missed the event)
    worker(lm, t, 0, ReportKind.FINISHED, 2.0)
    resp, rest = launch(lm, (t, 1))
    assert (resp.results[0].reason, resp.results[0].attempt) == ("finished", 1)
    assert rest == []
    # ... until the finished attempt is forgotten (retain_s): nothing outlives its task
    lm.handle(Heartbeat(), 2.0 + lm.ends.retain_s + 1)
    assert lm.ends.done == {}


def test_a_task_id_used_again_in_a_later_job_is_a_new_task() -> None:
    """A user may name a task as one of an earlier job's that ended here lately: that
    is a new task, placed and run -- not answered "finished" from the other's end."""
    lm = make_lm()
    t = make_task(2, 2, job="j1")
    launch(lm, (t, 0))
    worker(lm, t, 0, ReportKind.FINISHED, 2.0)
    again = replace(t, job_id=JobId("j2"))
    resp, rest = launch(lm, (again, 0), now=3.0)
    assert (resp.results[0].accepted, resp.results[0].reason) == (True, "ok")
    assert [type(e).__name__ for e in rest] == ["StartTask"]  # to its worker
    assert lm.active[key(again)].spec.job_id == "j2"


def test_ended_attempts_are_kept_as_rows_the_collector_untracks() -> None:
    lm = make_lm()
    t = make_task(2, 2)
    launch(lm, (t, 0))
    worker(lm, t, 0, ReportKind.STARTED, 1.5)
    worker(lm, t, 0, ReportKind.FINISHED, 2.0)
    gc.collect()  # tuples of atoms are untracked as collections meet them (the inner
    gc.collect()  # one first, then the one that holds it)
    assert not gc.is_tracked(lm.ends.done[key(t)])
    (held,) = lm.snapshot(GM0).held  # a restarted GM still learns all of it
    assert (held.spec, held.attempt, held.ended_at, held.ok) == (t, 1, 2.0, True)
    assert held.started_at >= 0


def test_a_newer_attempt_supersedes_the_one_held_here() -> None:
    """A worker never runs two attempts of one task: the older one is stopped first."""
    lm = make_lm()
    t = make_task(2, 2)
    launch(lm, (t, 0))
    resp, rest = launch(lm, (t, 1), attempt=2)
    assert resp.results[0].reason == "ok"
    assert rest == [
        StopTask(node=N0, user=t.user, task_id=t.task_id, attempt=1, gm=GM0),
        StartTask(node=N1, spec=t, attempt=2, gm=GM0),
    ]
    assert lm.active[key(t)].attempt == 2
    assert lm.free == [[4, 4], [2, 2]]
    conserved(lm)


def test_two_users_may_use_the_same_task_id() -> None:
    lm = make_lm()
    a, b = make_task(task_id="same", user="u0"), make_task(task_id="same", user="u1")
    resp, _ = launch(lm, (a, 0), (b, 1))
    assert [r.reason for r in resp.results] == ["ok", "ok"]
    assert set(lm.active) == {key(a), key(b)}


# --------------------------------------------------------------- repartition
def test_repartition_carves_a_logical_node_at_resource_granularity() -> None:
    lm = make_lm(nodes=[(4, 4), (8, 8)], home=["gm0", "gm1"])
    t = make_task(3, 2)
    resp, rest = launch(lm, (t, 1), gm=GM0, repartition=True)
    assert resp.results[0].accepted
    assert lm.counters.repartitions == 1
    assert lm.counters.launches == 0
    assert lm.free[1] == [5, 6]  # deducted from the physical node, not the whole node
    assert lm.logical_nodes() == [(key(t), N1, GM0, (3, 2))]
    assert lm.nodes.home == [GM0, GM1]  # the physical node stays in gm1's partition
    assert isinstance(rest[0], StartTask)
    evs = worker(lm, t, 1, ReportKind.STARTED, 2.0)
    evs += worker(lm, t, 1, ReportKind.FINISHED, 3.0)
    # (started events are off by default: the end carries the worker's times)
    assert [(e.kind, e.started_at) for e in evs if isinstance(e, TaskEvent)] == [
        (EventKind.FINISHED, 2.0)
    ]
    assert all(isinstance(e, TaskEvent) and e.gm == GM0 for e in evs)
    assert lm.free[1] == [8, 8]  # returned when the task ends
    assert lm.logical_nodes() == []
    conserved(lm)


def test_external_refusal_counts_as_external_inconsistency() -> None:
    lm = make_lm(nodes=[(4, 4), (2, 2)], home=["gm0", "gm1"])
    resp, _ = launch(lm, (make_task(3, 3), 1), gm=GM0, repartition=True)
    assert resp.results[0].reason == "insufficient_resources"
    assert lm.counters.refused_external == 1
    assert lm.counters.refused_internal == 0


# ---------------------------------------------------------------- preemption
def test_preemption_frees_exactly_enough_and_launches() -> None:
    lm = make_lm(nodes=[(4, 4)])
    old, new, alt = make_task(2, 2, user="a"), make_task(1, 1, user="a"), make_task(1, 1, user="a")
    for i, t in enumerate((old, new, alt)):
        launch(lm, (t, 0), gm=GM1, now=1.0 + i, altruistic=t is alt)
        worker(lm, t, 0, ReportKind.STARTED, 1.0 + i)
    want = make_task(2, 2, user="b")
    resp, effects = preempt(lm, want, "a", now=5.0)
    # altruistic first, then the most recently accepted: the least work lost
    assert resp.accepted
    assert resp.reason == "ok"
    assert resp.node == N0
    assert resp.preempted == tuple(
        PlacedRef(user=t.user, task_id=t.task_id, attempt=1) for t in (alt, new)
    )
    stops = [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StopTask)]
    assert [s.task_id for s in stops] == [alt.task_id, new.task_id]
    # the victims go back to their GM only once the pool confirms their stops
    assert [e for e in effects if isinstance(e, ToGm)] == []
    confirmed = confirm_stops(lm, effects, 5.5)
    evs = [(e.gm, e.msg) for e in confirmed if isinstance(e, ToGm)]
    assert {(g, m.kind) for g, m in evs} == {(GM1, EventKind.PREEMPTED)}
    # the event says when the attempt started: its run is counted as thrown away
    assert [m.started_at for _, m in evs] == [3.0, 2.0]
    assert lm.nodes.stopping == {}
    assert confirm_stops(lm, effects, 6.0) == []  # a repeated confirmation: nothing more
    assert lm.active.keys() == {key(old), key(want)}
    assert lm.free == [[0, 0]]
    conserved(lm)


def test_an_unconfirmed_stop_is_settled_when_its_node_is_lost_or_its_pool_restarts() -> None:
    """A pool that never answers the stop fenced itself before its node timed out; a
    pool that restarted runs nothing it does not list: either way the victim's GM gets
    it back, exactly once."""
    for how in ("lost", "restarted"):
        lm = make_lm(nodes=[(4, 4)])
        victim = make_task(4, 4, user="a")
        launch(lm, (victim, 0), gm=GM1)
        _, effects = preempt(lm, make_task(4, 4, user="b"), "a", now=2.0)
        assert [e for e in effects if isinstance(e, ToGm)] == []
        if how == "lost":
            later = lm.handle(CheckWorkers(timeout=1.0), 3.0)
        else:
            later = lm.handle(RegisterWorkers(lm=LM0, nodes=(N0,), at=3.0), 3.0)
        evs = [e.msg for e in later if isinstance(e, ToGm) and e.msg.task_id == victim.task_id]
        assert [(m.kind, m.attempt) for m in evs] == [(EventKind.PREEMPTED, 1)], how
        assert lm.nodes.stopping == {}
        assert confirm_stops(lm, effects, 4.0) == [], how  # the late answer changes nothing


def test_a_registered_task_of_another_resource_width_is_stopped_not_adopted() -> None:
    """A pool may list a task of another width (it ran under a config with more or
    fewer resource types, or the pool is wrong): the LM stops it and registers the
    rest, instead of failing the registration (and refusing every launch) for good."""
    lm = LocalMaster(LM0, [NodeSpec(capacity=(4, 4))], [GM0], awaiting_workers=True)
    good = make_task(1, 1)
    wide = replace(make_task(), demand=(1, 1, 1))
    narrow = replace(make_task(), demand=(1,))
    running = tuple(StartTask(node=N0, spec=t, attempt=1, gm=GM0) for t in (wide, narrow, good))
    effects = lm.handle(RegisterWorkers(lm=LM0, nodes=(N0,), at=1.0, running=running), 1.0)
    stops = [e.msg for e in effects if isinstance(e, ToWorker)]
    assert [(s.task_id, s.attempt) for s in stops if isinstance(s, StopTask)] == [
        (wide.task_id, 1),
        (narrow.task_id, 1),
    ]
    assert lm.registered
    assert lm.active.keys() == {key(good)}
    assert lm.free == [[3, 3]]
    conserved(lm)


def test_preemption_refused_without_a_victim_here() -> None:
    lm = make_lm(nodes=[(4, 4)])
    launch(lm, (make_task(4, 4, user="c"), 0))
    resp, effects = preempt(lm, make_task(2, 2, user="b"), "a")
    assert not resp.accepted
    assert resp.reason == "no_victim"
    assert effects == []
    assert lm.counters.preemptions_refused == 1


def test_preemption_respects_constraints() -> None:
    lm = make_lm(nodes=[(4, 4, 0b01)])
    launch(lm, (make_task(4, 4, user="a"), 0))
    resp, _ = preempt(lm, make_task(1, 1, user="b", constraints=0b10), "a")
    assert not resp.accepted
    assert len(lm.active) == 1


def test_preempted_task_can_be_launched_again_on_the_same_lm() -> None:
    """A preempted task returns to its GM's queue; its next attempt must run, not be
    answered ``duplicate`` (which would leave it placed at the GM and never run)."""
    lm = make_lm(nodes=[(4, 4), (4, 4)])
    victim = make_task(4, 4, user="a")
    launch(lm, (victim, 0), gm=GM1)
    preempt(lm, make_task(4, 4, user="b"), "a")
    resp, rest = launch(lm, (victim, 1), gm=GM1, attempt=2)
    assert resp.results[0].reason == "ok"
    assert [m.spec for m in rest if isinstance(m, StartTask)] == [victim]
    conserved(lm)


# ------------------------------------------------------------------- workers
def test_started_report_carries_the_workers_times() -> None:
    lm = make_lm()
    t = make_task()
    launch(lm, (t, 0), now=1.0)
    rep = report(LM0, ReportKind.STARTED, t, 0, 3.0, worker_at=2.0, started_at=3.0)
    assert lm.handle(rep, 3.0) == []  # kept, not relayed: started events are off by default
    assert lm.active[key(t)].started_at == 3.0
    done = report(LM0, ReportKind.FINISHED, t, 0, 4.0, worker_at=2.0, started_at=3.0)
    (eff,) = lm.handle(done, 4.0)
    assert isinstance(eff, ToGm)
    assert (eff.msg.worker_at, eff.msg.started_at, eff.msg.attempt) == (2.0, 3.0, 1)


def test_late_report_of_a_moved_task_is_ignored_and_its_run_stopped() -> None:
    lm = make_lm()
    t = make_task(4, 4, user="a")
    launch(lm, (t, 0))
    preempt(lm, make_task(4, 4, user="b"), "a")
    # the end of an attempt this LM does not hold goes to its GM, which judges the
    # attempt (here: superseded, ignored); nothing changes at the LM
    (ev,) = worker(lm, t, 0, ReportKind.FINISHED, 2.0)
    assert isinstance(ev, TaskEvent)
    assert (ev.kind, ev.attempt, ev.gm) == (EventKind.FINISHED, 1, GM0)
    # a worker that (re)starts an attempt this LM no longer holds is told to stop it
    (stop,) = lm.handle(report(LM0, ReportKind.STARTED, t, 0, 2.5), 2.5)
    assert stop == ToWorker(StopTask(node=N0, user=t.user, task_id=t.task_id, attempt=1, gm=GM0))
    assert lm.counters.stale_reports == 2
    conserved(lm)


def test_lost_worker_tasks_are_relaunched_in_their_gms_partition() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4), (4, 4)], home=["gm0", "gm0", "gm1"])
    t = make_task(2, 2)
    launch(lm, (t, 0))
    alive(lm, 1.0, 0)
    alive(lm, 5.0, 1, 2)
    effects = check_workers(lm, 6.0, timeout=2.0)
    assert not lm.alive[0]
    assert lm.free[0] == [0, 0]
    assert [e.msg for e in effects if isinstance(e, ToWorker)] == [
        StartTask(node=N1, spec=t, attempt=2, gm=GM0)
    ]
    (ev,) = [e.msg for e in effects if isinstance(e, ToGm)]
    assert (ev.kind, ev.attempt, ev.node) == (EventKind.RELAUNCHED, 2, N1)
    assert lm.active[key(t)].node == N1
    assert (lm.counters.workers_lost, lm.counters.relaunched) == (1, 1)
    conserved(lm)


def test_lost_worker_tasks_without_room_go_back_to_their_gm() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4)], home=["gm0", "gm1"])
    t = make_task(2, 2)
    launch(lm, (t, 0))
    alive(lm, 5.0, 1)
    effects = check_workers(lm, 6.0, timeout=2.0)
    evs = [e.msg for e in effects if isinstance(e, ToGm)]
    assert len(evs) == 1
    assert evs[0].kind == EventKind.REQUEUED
    assert evs[0].gm == GM0
    assert key(t) not in lm.active
    # the GM launches it again, as its next attempt
    resp, _ = launch(lm, (t, 1), gm=GM0, repartition=True, now=7.0, attempt=2)
    assert resp.results[0].reason == "ok"
    conserved(lm)


def test_a_dead_node_comes_back_empty() -> None:
    lm = make_lm(nodes=[(4, 4)])
    launch(lm, (make_task(2, 2), 0))
    check_workers(lm, 10.0, timeout=1.0)
    v = lm.version
    alive(lm, 11.0)
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
    (first,) = lm.handle(Heartbeat(), 0.0)
    assert isinstance(first, ToAllGms)
    assert first.msg.delta.nodes == ()
    launch(lm, (make_task(), 1))
    (second,) = lm.handle(Heartbeat(), 1.0)
    assert isinstance(second, ToAllGms)
    assert second.msg.delta.base_version == 0
    assert second.msg.delta.nodes == (N1,)


def test_snapshot_lists_what_the_lm_holds_for_that_gm() -> None:
    lm = make_lm(home=["gm0", "gm1"])
    a, b, c = make_task(), make_task(), make_task(duration=0.5)
    launch(lm, (a, 0), gm=GM0)
    launch(lm, (b, 1), gm=GM1, attempt=3)
    launch(lm, (c, 1), gm=GM1)
    worker(lm, c, 1, ReportKind.FINISHED, 1.5)
    (eff,) = lm.handle(SnapshotRequest(gm=GM1, lm=LM0), 2.0)
    assert isinstance(eff, Reply)
    assert isinstance(eff.msg, StateSnapshot)
    # what runs (for a restarted GM to adopt), and what ended lately (never run again)
    assert [(h.spec, h.attempt, h.ended_at) for h in eff.msg.held] == [
        (b, 3, -1.0),
        (c, 1, 1.5),
    ]
    assert eff.msg.layout.home == (GM0, GM1)
    assert eff.msg.state.base_version == -1


def test_a_start_is_sent_again_only_while_the_lm_still_holds_it_there() -> None:
    """The LM's driver asks before each new try: a start of an attempt relaunched
    elsewhere (its node declared dead) must not reach the old pool again."""
    lm = make_lm(nodes=[(4, 4), (4, 4)])
    t = make_task(2, 2)
    launch(lm, (t, 0))
    first = StartTask(node=N0, spec=t, attempt=1, gm=GM0)
    assert lm.still_starts(first)
    alive(lm, 1.0, 0)
    alive(lm, 5.0, 1)
    check_workers(lm, 6.0, timeout=2.0)  # node 0 dead: attempt 2 on node 1
    assert not lm.still_starts(first)
    assert lm.still_starts(StartTask(node=N1, spec=t, attempt=2, gm=GM0))


def test_rerouting_places_a_task_whose_node_has_no_room_on_the_last_that_fits() -> None:
    """The GM's own partition first, then another's (a repartition), each from its last
    node (the GM fills its partition from the first); a placement no node can take, or
    a broken one, is still refused."""
    lm = make_lm(nodes=[(4, 4), (2, 2), (4, 4), (4, 4, 0b01)], home=["gm0", "gm0", "gm1", "gm1"],
                 reroute=True)  # fmt: skip
    launch(lm, (make_task(4, 4, user="x"), 0), gm=GmId("gm1"), repartition=True)
    resp, starts = launch(lm, (make_task(2, 2), 0), (make_task(3, 3), 0), known=lm.version)
    assert [(r.accepted, r.reason, r.node) for r in resp.results] == [
        (True, "rerouted", 1),  # gm0's own node 1 fits
        (True, "rerouted", 3),  # nothing of gm0's does: gm1's last node, a repartition
    ]
    assert [s.node for s in starts] == [1, 3]  # type: ignore[attr-defined]
    assert set(resp.delta.nodes) == {1, 3}  # the GM's view learns where they went
    assert (lm.counters.rerouted, lm.counters.repartitions, lm.counters.refused_internal) == (
        2, 2, 0)  # fmt: skip
    resp, _ = launch(lm, (make_task(3, 3), 0), (make_task(1, 1, constraints=0b10), 3))
    assert [(r.accepted, r.reason, r.node) for r in resp.results] == [
        (True, "rerouted", 2),  # node 3 has (1, 1) left
        (False, "constraints_unmet", -1),  # asked for a node it knows cannot: no guess
    ]
    resp, _ = launch(lm, (make_task(4, 4), 0))
    assert [(r.accepted, r.reason) for r in resp.results] == [(False, "insufficient_resources")]
    assert (lm.counters.refused_internal, lm.counters.refused_external) == (1, 1)
    conserved(lm)


def test_an_lm_whose_pool_never_registers_answers_snapshots_once_it_gives_the_pool_up() -> None:
    """A GM takes jobs only with a view of every LM, and an LM answers no snapshot
    before its pool registers (it may hold tasks without knowing yet).  A pool that
    never comes back left every GM that started afterwards without jobs, for ever
    (`megha chaos`: pool gone, its LM restarted, then a GM restarted).  Once the pool has
    been silent ``lost_after`` since the LM's first check, the LM answers: every node
    dead, nothing held -- and judges launches (refused: their nodes are dead) instead
    of asking them to wait, so a launch in flight when it restarted goes elsewhere."""
    from tests.conftest import make_gm

    lm = LocalMaster(LM0, [NodeSpec((4, 4))] * 2, [GM0] * 2, awaiting_workers=True)
    gm = make_gm()
    ask = SnapshotRequest(gm=GM0, lm=LM0)
    launch = LaunchRequest(gm=GM0, lm=LM0, request_id=1, known_version=-1,
                           placements=(Placement(spec=make_task(), attempt=1, node=N0),))  # fmt: skip
    check = CheckWorkers(timeout=1.0, lost_after=4.0)
    now = 1_700_000_000.0  # a wall clock: the nodes' last_seen (0) is long past
    for t in (0.0, 1.0, 4.0):  # the first check starts the pool's silence
        assert lm.handle(check, now + t) == []
        (refused,) = lm.handle(ask, now + t)
        assert isinstance(refused.msg, Refused)  # type: ignore[union-attr]
        assert refused.msg.reason == "not_ready"  # type: ignore[union-attr]
    lm.handle(check, now + 4.5)
    (snap,) = lm.handle(ask, now + 4.5)
    assert isinstance(snap.msg, StateSnapshot)  # type: ignore[union-attr]
    assert snap.msg.held == ()  # type: ignore[union-attr]
    gm.handle(snap.msg, now + 4.5)  # type: ignore[union-attr]
    assert gm.ready
    assert not gm.views[LM0].avail.any()  # every node dead: nothing is placed there
    # a launch (sent before the LM restarted, asked again) is judged: its node is dead
    (answer,) = lm.handle(launch, now + 4.6)
    assert isinstance(answer.msg, LaunchResponse)  # type: ignore[union-attr]
    assert [r.accepted for r in answer.msg.results] == [False]  # type: ignore[union-attr]
    assert lm.active == {}
    # the pool comes back after all: its nodes live, launches are taken
    lm.handle(RegisterWorkers(lm=LM0, nodes=(N0, N1), at=now + 5.0), now + 5.0)
    launch = replace(launch, request_id=2)
    answer, start = lm.handle(launch, now + 5.1)
    assert [r.accepted for r in answer.msg.results] == [True]  # type: ignore[union-attr]
    assert isinstance(start, ToWorker)
