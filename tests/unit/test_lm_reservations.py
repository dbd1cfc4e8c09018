"""An LM's gang reservations through ``handle``: holds validated as launches, shown in
state updates, never outliving their lease; commit, release; backfill on idle holds
only for tasks that end before the hold is due, and borrowers stopped at the due time."""

from __future__ import annotations

from common.effects import Effect, Reply, ToAllGms, ToWorker
from common.ids import GmId, JobId, NodeIndex, UserId
from common.messages import (
    CommitGang,
    Heartbeat,
    LaunchRequest,
    LaunchResponse,
    PlacedRef,
    Placement,
    ReleaseGang,
    ReportKind,
    ReserveRequest,
    ReserveResponse,
    StartTask,
    StopTask,
)
from common.model import TaskSpec
from local_master.core import LocalMaster
from tests.conftest import key, make_lm, make_task, report

GM0 = GmId("gm0")
U0, JOB = UserId("u0"), JobId("j0")


def reserve(
    lm: LocalMaster, *placed: tuple[TaskSpec, int], now: float = 1.0, lease: float = 5.0,
    due: float | None = None,
) -> ReserveResponse:  # fmt: skip
    req = ReserveRequest(
        gm=GM0, lm=lm.lm_id, request_id=7, user=U0, job_id=JOB, stage=0,
        placements=tuple(Placement(spec=t, attempt=1, node=NodeIndex(n)) for t, n in placed),
        lease_s=lease, due_s=lease if due is None else due, known_version=-1,
    )  # fmt: skip
    (reply,) = [e for e in lm.handle(req, now) if isinstance(e, Reply)]
    assert isinstance(reply.msg, ReserveResponse)
    return reply.msg


def commit(
    lm: LocalMaster, *specs: TaskSpec, now: float = 2.0
) -> tuple[LaunchResponse, list[Effect]]:
    refs = tuple(PlacedRef(user=s.user, task_id=s.task_id, attempt=1) for s in specs)
    msg = CommitGang(
        gm=GM0, lm=lm.lm_id, request_id=8, user=U0, job_id=JOB, stage=0, tasks=refs,
        known_version=-1,
    )  # fmt: skip
    effects = lm.handle(msg, now)
    reply = effects[0]
    assert isinstance(reply, Reply)
    assert isinstance(reply.msg, LaunchResponse)
    return reply.msg, effects


def starts(effects: list[Effect]) -> list[StartTask]:
    return [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StartTask)]


def conserved(lm: LocalMaster) -> None:
    """Every node: free + held + active demands = capacity; nothing negative."""
    for n in range(lm.n_nodes):
        total = list(lm.free[n])
        assert min(total) >= 0
        for h in lm.reservations.by_task.values():
            if h.node == n:
                total = [t + x for t, x in zip(total, h.held, strict=True)]
        for a in lm.active.values():
            if a.node == n:
                total = [t + d for t, d in zip(total, a.spec.demand, strict=True)]
        assert tuple(total) == lm.nodes.capacity[n]


def test_a_hold_is_validated_taken_from_free_and_shown_in_state_updates() -> None:
    lm = make_lm(nodes=((4, 4), (4, 4)))
    a, b, big = make_task(3, 3), make_task(2, 2), make_task(9, 1)
    resp = reserve(lm, (a, 0), (b, 0), (big, 1))
    assert [r.accepted for r in resp.results] == [True, False, False]
    assert [r.reason for r in resp.results[1:]] == [
        "insufficient_resources",
        "insufficient_resources",
    ]
    assert lm.free[0] == [1, 1]
    assert not lm.active  # nothing started
    (hb,) = lm.handle(Heartbeat(), 1.5)
    assert isinstance(hb, ToAllGms)
    (hold,) = hb.msg.delta.holds
    assert (hold.node, hold.held, hold.lease_until, hold.gm) == (0, (3, 3), 6.0, GM0)
    conserved(lm)


def test_a_hold_never_outlives_its_lease() -> None:
    lm = make_lm()
    reserve(lm, (make_task(3, 3), 0), lease=2.0, now=1.0)
    lm.handle(Heartbeat(), 2.9)
    assert len(lm.reservations) == 1
    lm.handle(Heartbeat(), 3.0)
    assert len(lm.reservations) == 0
    assert lm.free[0] == [4, 4]
    assert lm.reservations.expired == 1


def test_commit_starts_what_is_held_and_a_late_commit_is_refused() -> None:
    lm = make_lm()
    a, b = make_task(2, 2), make_task(2, 2)
    reserve(lm, (a, 0), (b, 1), lease=3.0)
    resp, effects = commit(lm, a, b, now=2.0)
    assert [r.accepted for r in resp.results] == [True, True]
    assert {s.spec.task_id for s in starts(effects)} == {a.task_id, b.task_id}
    assert set(lm.active) == {key(a), key(b)}
    assert not lm.reservations.by_task
    conserved(lm)
    lm2 = make_lm()
    reserve(lm2, (a, 0), lease=1.0, now=1.0)
    late, effects = commit(lm2, a, now=2.5)
    assert [r.reason for r in late.results] == ["hold_expired"]
    assert not starts(effects)


def test_release_gives_every_hold_back() -> None:
    lm = make_lm()
    reserve(lm, (make_task(2, 2), 0), (make_task(2, 2), 1))
    lm.handle(ReleaseGang(gm=GM0, lm=lm.lm_id, user=U0, job_id=JOB, stage=0), 2.0)
    assert lm.free == [[4, 4], [4, 4]]
    assert not lm.reservations.by_task


def launch(lm: LocalMaster, spec: TaskSpec, node: int, now: float) -> LaunchResponse:
    req = LaunchRequest(
        gm=GM0, lm=lm.lm_id, request_id=3, known_version=-1,
        placements=(Placement(spec=spec, attempt=1, node=NodeIndex(node)),),
    )  # fmt: skip
    reply = lm.handle(req, now)[0]
    assert isinstance(reply, Reply)
    assert isinstance(reply.msg, LaunchResponse)
    return reply.msg


def test_backfill_only_for_tasks_that_end_before_the_hold_is_due() -> None:
    lm = make_lm(nodes=((4, 4),))
    gang = make_task(4, 4)
    reserve(lm, (gang, 0), now=1.0, lease=10.0)  # due at 11
    long = make_task(2, 2, duration=20.0)
    assert launch(lm, long, 0, 2.0).results[0].reason == "insufficient_resources"
    short = make_task(2, 2, duration=5.0)
    assert launch(lm, short, 0, 2.0).results[0].accepted
    assert lm.reservations.backfilled == 1
    conserved(lm)
    # the gang commits while the backfill runs: its task starts once the loan is back
    resp, effects = commit(lm, gang, now=3.0)
    assert resp.results[0].accepted
    assert not starts(effects)
    conserved(lm)
    effects = lm.handle(report(lm.lm_id, ReportKind.FINISHED, short, 0, 7.0), 7.0)
    assert [s.spec.task_id for s in starts(effects)] == [gang.task_id]
    assert key(gang) in lm.active
    conserved(lm)


def test_a_backfill_task_still_running_when_the_hold_is_due_is_stopped() -> None:
    lm = make_lm(nodes=((4, 4),))
    reserve(lm, (make_task(4, 4), 0), now=1.0, lease=10.0, due=4.0)  # due at 5
    short = make_task(1, 1, duration=2.0)
    assert launch(lm, short, 0, 2.0).results[0].accepted
    effects = lm.handle(Heartbeat(), 5.0)
    stops = [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StopTask)]
    assert [s.task_id for s in stops] == [short.task_id]
    assert lm.reservations.backfill_stopped == 1
    conserved(lm)
