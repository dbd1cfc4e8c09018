"""A durable LM's gang holds outlive its restart (issue 34 item 1: no partial gang).

An LM that restarts between a gang's hold and its GM's commit takes the hold back from
its journal: once its pool registered, it holds the same room again, and the commit
starts the part (before the holds were journaled the new incarnation refused it
``hold_expired`` while the other LMs' parts started: a partial start).  A hold whose
lease ended before the restore is not taken back.
"""

from __future__ import annotations

from common.effects import Effect, Reply, ToLm, ToWorker
from common.ids import GmId, JobId, LmId, NodeIndex
from common.messages import (
    AdmitJob,
    CommitGang,
    JournalHeld,
    JournalHold,
    JournalHoldGone,
    LaunchResponse,
    PlacedRef,
    Placement,
    RegisterWorkers,
    ReserveRequest,
    ReserveResponse,
    StageSpec,
    StartTask,
    SubmitJob,
)
from common.model import NodeSpec, TaskSpec
from local_master.core import LocalMaster
from tests.conftest import ALL, decide, launch_req, make_gm, make_task, sync_views
from tests.unit.test_lm_journal import GM0, LM0, durable_lm, reborn, records, register


def reserve(
    lm: LocalMaster, *placed: tuple[TaskSpec, int], now: float, lease: float
) -> list[Effect]:
    first = placed[0][0]
    req = ReserveRequest(
        gm=GM0, lm=LM0, request_id=1, user=first.user, job_id=first.job_id, stage=0,
        placements=tuple(Placement(spec=t, attempt=1, node=NodeIndex(n)) for t, n in placed),
        lease_s=lease, due_s=lease, known_version=-1,
    )  # fmt: skip
    effects = lm.handle(req, now)
    (reply,) = [e.msg for e in effects if isinstance(e, Reply)]
    assert isinstance(reply, ReserveResponse)
    assert all(r.accepted for r in reply.results)
    return effects


def commit(lm: LocalMaster, *specs: TaskSpec, now: float) -> tuple[LaunchResponse, list[Effect]]:
    msg = CommitGang(
        gm=GM0, lm=LM0, request_id=2, user=specs[0].user, job_id=specs[0].job_id, stage=0,
        tasks=tuple(PlacedRef(user=s.user, task_id=s.task_id, attempt=1) for s in specs),
        known_version=-1,
    )  # fmt: skip
    effects = lm.handle(msg, now)
    (reply,) = [e.msg for e in effects if isinstance(e, Reply)]
    assert isinstance(reply, LaunchResponse)
    return reply, effects


def test_a_hold_outlives_a_restart_and_the_commit_after_it_starts_the_part() -> None:
    lm = durable_lm()
    a, b = make_task(2, 3, job="g"), make_task(4, 1, job="g")
    journal = records(reserve(lm, (a, 0), (b, 1), now=1.0, lease=30.0))
    assert [type(r) for r in journal] == [JournalHold, JournalHold]
    new = reborn(journal, 5.0)
    assert len(new.reservations.pending) == 2
    assert not new.reservations.by_task
    register(new, 6.0)  # the pool says what runs: the holds take their room again
    assert [new.nodes.free[0], new.nodes.free[1]] == [[2, 1], [0, 3]]
    assert {(h.gm, h.node, h.held, h.lease_until) for h in new.nodes.gang_holds} == {
        (GM0, 0, (2, 3), 31.0), (GM0, 1, (4, 1), 31.0)
    }  # fmt: skip
    # the room is held: a launch that needs it (and ends after the hold is due) is refused
    long = launch_req(make_task(3, 3, duration=100.0), node=0)
    (full,) = [e.msg for e in new.handle(long, 6.5) if isinstance(e, Reply)]
    assert isinstance(full, LaunchResponse)
    assert not full.results[0].accepted
    answer, effects = commit(new, a, b, now=7.0)
    assert [r.reason for r in answer.results] == ["ok", "ok"]  # was: hold_expired, twice
    started = [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StartTask)]
    assert sorted((s.spec.task_id, s.node, s.attempt) for s in started) == sorted(
        [(a.task_id, 0, 1), (b.task_id, 1, 1)]
    )
    assert not new.reservations.by_task
    written = records(effects)
    assert sum(isinstance(r, JournalHoldGone) for r in written) == 2
    assert sum(isinstance(r, JournalHeld) for r in written) == 2
    # and a third incarnation holds the started attempts, no hold
    third = reborn([*journal, *records(register(new, 6.0)), *written], 8.0)
    assert set(third.nodes.active) == {(a.user, a.task_id), (b.user, b.task_id)}
    assert not third.reservations.pending


def test_a_gangs_started_part_is_no_lone_victim_after_a_restart() -> None:
    """A gang runs whole or not at all: the attempts its commit started stay out of the
    preemption victims in the next incarnation, restored from the journal as written and
    from a compacted one (before, the restored attempts were ordinary victims)."""
    lm = durable_lm()
    a, b = make_task(2, 3, job="g"), make_task(4, 1, job="g")
    loner = make_task(1, 1, job="solo")
    journal = records(reserve(lm, (a, 0), (b, 1), now=1.0, lease=30.0))
    _, effects = commit(lm, a, b, now=2.0)
    journal += records(effects) + records(lm.handle(launch_req(loner, node=2), 2.5))
    gang = {(a.user, a.task_id), (b.user, b.task_id)}
    keys = {(loner.user, loner.task_id), *gang}
    for written in (journal, list(lm.records())):
        new = reborn(written, 5.0)
        assert set(new.nodes.active) == keys
        victims = {
            (v.spec.user, v.spec.task_id) for v in new.reservations.victims(new.nodes.active)
        }
        assert victims == {(loner.user, loner.task_id)}
        # and the incarnation after it, from what this one compacts
        third = reborn(list(new.records()), 6.0)
        assert new.reservations.gang_tasks == third.reservations.gang_tasks == gang


def test_a_hold_whose_lease_ended_before_the_restore_is_not_taken_back() -> None:
    lm = durable_lm()
    a = make_task(2, 2, job="g")
    journal = records(reserve(lm, (a, 0), now=1.0, lease=3.0))
    new = reborn(journal, 4.0)
    assert not new.reservations.pending
    register(new, 5.0)
    assert new.nodes.free[0] == [4, 4]
    answer, effects = commit(new, a, now=5.0)
    assert [r.reason for r in answer.results] == ["hold_expired"]
    assert not [e for e in effects if isinstance(e, ToWorker)]


def test_a_hold_whose_room_the_pool_runs_something_in_is_dropped_at_registration() -> None:
    lm = durable_lm()
    a = make_task(3, 3, job="g")
    journal = records(reserve(lm, (a, 0), now=1.0, lease=30.0))
    new = reborn(journal, 2.0)
    other = make_task(2, 2, user="u1")
    running = StartTask(node=NodeIndex(0), spec=other, attempt=1, gm=GM0)
    nodes = tuple(NodeIndex(i) for i in range(3))
    effects = new.handle(RegisterWorkers(lm=LM0, nodes=nodes, at=3.0, running=(running,)), 3.0)
    assert not new.reservations.by_task
    assert not new.nodes.gang_holds
    assert new.nodes.free[0] == [2, 2]
    assert any(isinstance(r, JournalHoldGone) for r in records(effects))


def federation_lm(lm: str, *, epoch: int = 1, awaiting: bool = False) -> LocalMaster:
    nodes = [NodeSpec(capacity=(4, 4), constraints=ALL)] * 2
    gms = [GmId(f"gm{i}") for i in range(3)]
    return LocalMaster(
        LmId(lm), nodes, [GM0, GM0], gms=gms, epoch=epoch, durable=True, awaiting_workers=awaiting
    )  # fmt: skip


def test_a_gm_commit_after_an_lm_restart_starts_the_whole_gang_no_partial_start() -> None:
    lms = {LmId("lm0"): federation_lm("lm0"), LmId("lm1"): federation_lm("lm1")}
    gm = make_gm(lms=("lm0", "lm1"))
    sync_views(gm, *lms.values())
    specs = [make_task(2, 1, job="g", duration=10.0) for _ in range(8)]  # every node of both
    stage = StageSpec(stage_id=0, count=8, gang=True)
    job = SubmitJob(job_id=JobId("g"), user=specs[0].user, token="", submitted_at=0.0,
                    tasks=tuple(specs), stages=(stage,))  # fmt: skip
    gm.handle(AdmitJob(job=job), 0.0)
    journal1: list[object] = []
    todo, commits = list(decide(gm, 1.0)), []
    while todo:  # the reserve round; the commits are held back
        e = todo.pop(0)
        if isinstance(e, ToLm) and isinstance(e.msg, CommitGang):
            commits.append(e)
        elif isinstance(e, ToLm):
            out = lms[e.lm].handle(e.msg, 1.0)
            journal1 += records(out) if e.lm == "lm1" else []
            todo += [x for a in out if isinstance(a, Reply) for x in gm.handle(a.msg, 1.0)]
    assert {c.lm for c in commits} == {"lm0", "lm1"}
    # lm1 restarts between its holds and the GM's commit: a new incarnation, its journal
    lms[LmId("lm1")] = new = federation_lm("lm1", epoch=2, awaiting=True)
    new.restore(journal1, 1.5)
    nodes = (NodeIndex(0), NodeIndex(1))
    new.handle(RegisterWorkers(lm=LmId("lm1"), nodes=nodes, at=1.6), 1.6)
    for c in commits:
        for a in lms[c.lm].handle(c.msg, 2.0):
            if isinstance(a, Reply):
                gm.handle(a.msg, 2.0)
    assert [len(lm.active) for lm in lms.values()] == [4, 4]
    assert gm.gang.stats["partial_starts"] == 0  # was 1: lm1 refused hold_expired
