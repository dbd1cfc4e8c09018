"""A durable LM's and pool's journal records: written as state changes, read back whole.

A restart of every process at once (host reboot, ``megha down``/``up``) must lose no
accepted task and run none twice: a new LM incarnation takes back from its journal what
the former one held, stopped and saw end, and its pool's registration settles it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from common import codec
from common.effects import Effect, Record, ToGm, ToLm, ToWorker
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    CheckWorkers,
    CommitGang,
    EndedAttempt,
    EventKind,
    Heartbeat,
    JobKeep,
    JournalDropped,
    JournalEnded,
    JournalHeld,
    KeepEnds,
    LaunchResponse,
    PlacedRef,
    Placement,
    PreemptRequest,
    RegisterWorkers,
    ReleaseGang,
    ReportKind,
    ReportsTaken,
    ReserveRequest,
    StartTask,
    StartTasks,
    TaskDue,
    WorkerReport,
    WorkerReports,
)
from common.model import NodeSpec, TaskSpec
from local_master.core import LocalMaster
from local_master.ends import Ends
from tests.conftest import ALL, launch_req, make_task
from worker.core import WorkerPool

LM0 = LmId("lm0")
GM0, GM1 = GmId("gm0"), GmId("gm1")
NODES = [NodeSpec(capacity=(4, 4), constraints=ALL)] * 3


def durable_lm(*, epoch: int = 1, awaiting: bool = False) -> LocalMaster:
    return LocalMaster(
        LM0, NODES, [GM0, GM0, GM1], gms=[GM0, GM1], epoch=epoch, durable=True,
        awaiting_workers=awaiting,
    )  # fmt: skip


def records(effects: Iterable[Effect]) -> list[object]:
    """The journal records among ``effects``, as the disk gives them back (encoded)."""
    out: list[object] = []
    for e in effects:
        if isinstance(e, Record):
            out.extend(codec.decode(codec.encode(r)) for r in e.records)
    return out


def report(kind: ReportKind, spec: TaskSpec, node: int, attempt: int, at: float) -> WorkerReport:
    return WorkerReport(
        kind=kind, node=NodeIndex(node), user=spec.user, task_id=spec.task_id, attempt=attempt,
        gm=GM0, at=at, worker_at=at, started_at=at, job_id=spec.job_id,
    )  # fmt: skip


def state(lm: LocalMaster) -> tuple[object, ...]:
    """What a restart must keep: held attempts, stopping ones, ends, keeps."""
    n = lm.nodes
    return (
        {k: (a.attempt, a.node, a.gm, a.accepted_at) for k, a in n.active.items()},
        {k: (a.node, a.gm) for k, a in n.stopping.items()},
        {k: (g, row, at) for k, (g, row, at) in lm.ends.done.items()},
        set(lm.ends.keep_ends),
        {j: dict(v) for j, v in lm.ends.kept.items()},
    )


def reborn(journal: Sequence[object], now: float) -> LocalMaster:
    lm = durable_lm(epoch=2, awaiting=True)
    lm.restore(journal, now)
    return lm


def register(lm: LocalMaster, now: float, ended: Sequence[EndedAttempt] = ()) -> list[Effect]:
    nodes = tuple(NodeIndex(i) for i in range(len(NODES)))
    return lm.handle(RegisterWorkers(lm=LM0, nodes=nodes, at=now, ended=tuple(ended)), now)


def test_a_launch_and_an_end_are_written_before_anything_leaves() -> None:
    lm = durable_lm()
    t = make_task(job="j1")
    effects = lm.handle(launch_req(t, node=0), 1.0)
    assert isinstance(effects[-1], Record)
    (held,) = records(effects)
    assert isinstance(held, JournalHeld)
    assert (held.start.spec, held.start.attempt, held.start.node) == (t, 1, 0)
    effects = lm.handle(
        WorkerReports(lm=LM0, reports=(report(ReportKind.FINISHED, t, 0, 1, 2.0),)), 2.0
    )
    dropped, ended = records(effects)
    assert isinstance(dropped, JournalDropped)
    assert dropped.attempt == 1
    assert isinstance(ended, JournalEnded)
    assert ended.held.ok
    assert ended.learnt_at == 2.0


def test_an_lm_that_is_not_durable_writes_nothing() -> None:
    lm = LocalMaster(LM0, NODES, [GM0, GM0, GM1], gms=[GM0, GM1])
    effects = lm.handle(launch_req(make_task(), node=0), 1.0)
    assert not [e for e in effects if isinstance(e, Record)]


def test_after_every_process_died_the_held_attempts_run_again_once() -> None:
    lm = durable_lm()
    running, finished, victim = make_task(job="j"), make_task(job="j"), make_task(user="u1")
    journal = records(lm.handle(launch_req(running, node=0), 1.0))
    journal += records(lm.handle(launch_req(finished, node=1), 1.0))
    journal += records(lm.handle(launch_req(victim, node=2, gm="gm1"), 1.0))
    rep = report(ReportKind.FINISHED, finished, 1, 1, 3.0)
    journal += records(lm.handle(WorkerReports(lm=LM0, reports=(rep,)), 3.0))
    big = make_task(cpu=4, mem=4, user="u0")
    pre = PreemptRequest(
        gm=GM1, lm=LM0, request_id=1, spec=big, attempt=1, victim=UserId("u1"), known_version=-1
    )
    journal += records(lm.handle(pre, 4.0))
    assert lm.nodes.stopping  # the victim's stop is not confirmed when everything dies
    # every process dies; the new incarnation reads the journal back
    new = reborn(journal, 10.0)
    assert state(new)[0].keys() == state(lm)[0].keys()
    assert state(new)[1:3] == state(lm)[1:3]
    refused = new.handle(launch_req(make_task(), node=0), 10.0)
    assert "not_ready" in repr(refused)  # nothing placed before the pool registered
    effects = register(new, 11.0)
    evs = [e.msg for e in effects if isinstance(e, ToGm)]
    starts = [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StartTask)]
    # what ran when the pool died runs again, as a newer attempt, once
    relaunched = {(ev.task_id, ev.attempt) for ev in evs if ev.kind == EventKind.RELAUNCHED}
    assert relaunched == {(running.task_id, 2), (big.task_id, 2)}
    assert sorted(s.spec.task_id for s in starts) == sorted([running.task_id, big.task_id])
    # the preempted victim goes back to its GM; the finished task is not run again
    assert [ev.task_id for ev in evs if ev.kind == EventKind.PREEMPTED] == [victim.task_id]
    again = new.handle(launch_req(finished, node=1), 12.0)
    (answer,) = [e.msg for e in again if isinstance(e.msg, LaunchResponse)]
    assert answer.results[0].reason == "finished"


def test_an_attempt_the_pool_reports_ended_is_settled_not_run_again() -> None:
    lm = durable_lm()
    t = make_task(job="j")
    journal = records(lm.handle(launch_req(t, node=0), 1.0))
    new = reborn(journal, 5.0)
    start = StartTask(node=NodeIndex(0), spec=t, attempt=1, gm=GM0)
    ended = EndedAttempt(start=start, report=report(ReportKind.FINISHED, t, 0, 1, 4.0))
    effects = register(new, 6.0, [ended])
    evs = [e.msg for e in effects if isinstance(e, ToGm)]
    assert [(ev.kind, ev.attempt) for ev in evs] == [(EventKind.FINISHED, 1)]
    assert not [e for e in effects if isinstance(e, ToWorker)]
    assert not new.nodes.active
    assert (t.user, t.task_id) in new.ends.done


def test_an_end_restored_is_kept_retain_s_after_the_restore() -> None:
    # a whole-federation restart that takes long: the restarted GMs ask the LM about a
    # redelivered job's tasks well after the restore; an end learnt shortly before the
    # restart must still be there, or its task is placed again (attempt 1 twice)
    lm = durable_lm()
    t, at = make_task(job="j"), 10.0
    journal = records(lm.handle(launch_req(t, node=0), at - 1.0))
    rep = report(ReportKind.FINISHED, t, 0, 1, at)
    journal += records(lm.handle(WorkerReports(lm=LM0, reports=(rep,)), at))
    retain = lm.ends.retain_s
    new = reborn(journal, at + 100.0)
    register(new, at + 101.0)
    new.handle(Heartbeat(), at + 150.0)
    assert [(h.spec.task_id, h.attempt, h.ok) for h in new.snapshot(GM0).held] == [
        (t.task_id, 1, True)
    ]
    again = new.handle(launch_req(t, node=1), at + 150.0)
    (answer,) = [e.msg for e in again if isinstance(e.msg, LaunchResponse)]
    assert answer.results[0].reason == "finished"
    # kept retain_s after the restore, not for ever
    new.handle(Heartbeat(), at + 100.0 + retain)
    assert not new.snapshot(GM0).held


def known(ends: Ends) -> dict[object, object]:
    """Every end ``ends`` remembers (retained or kept), by task."""
    out: dict[object, object] = dict(ends.done)
    for kept in ends.kept.values():
        out.update(kept)
    return out


def restored_like(born: LocalMaster, live: LocalMaster, now: float) -> None:
    """``born`` (restored ``now``) holds what ``live`` holds; of the ends, all that
    ``live`` remembers, and those it forgot by their age (a restored end is kept
    ``retain_s`` after the restore); once both are ``retain_s`` older, the same."""
    b, lv = state(born), state(live)
    assert (b[0], b[1], b[3]) == (lv[0], lv[1], lv[3])
    kb, kl = known(born.ends), known(live.ends)
    assert kl.items() <= kb.items()
    assert all(kb[k][2] <= now - live.ends.retain_s for k in kb.keys() - kl.keys())  # type: ignore[index]
    aged_born, aged_live = copy.deepcopy(born.ends), copy.deepcopy(live.ends)
    for ends in (aged_born, aged_live):
        ends.expire(now + ends.retain_s)
    assert (aged_born.done, aged_born.keep_ends, aged_born.kept) == (
        aged_live.done, aged_live.keep_ends, aged_live.kept
    )  # fmt: skip


ops = st.lists(
    st.one_of(
        st.tuples(st.just("launch"), st.integers(0, 7), st.integers(0, 2), st.integers(1, 3)),
        st.tuples(st.just("end"), st.integers(0, 7), st.booleans(), st.just(0)),
        st.tuples(st.just("preempt"), st.integers(0, 7), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("stopped"), st.integers(0, 7), st.just(0), st.just(0)),
        st.tuples(st.just("keep"), st.integers(0, 1), st.booleans(), st.just(0)),
        st.tuples(st.just("tick"), st.integers(1, 200), st.just(0), st.just(0)),
        st.tuples(st.just("reserve"), st.integers(0, 7), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("commit"), st.integers(0, 7), st.just(0), st.just(0)),
        st.tuples(st.just("release"), st.integers(0, 7), st.just(0), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops)
# an end that expired at a heartbeat, then a keep of its job: the live LM had dropped it,
# the reborn one replayed the keep first and kept it (found by this test)
@example(seq=[("launch", 0, 0, 1), ("end", 0, False, 0), ("tick", 119, 0, 0), ("keep", 0, True, 0)])
# a hold lends to a backfill task, is committed while lent, starts once the loan is back
@example(seq=[("reserve", 2, 3, 0), ("launch", 1, 0, 1), ("commit", 2, 0, 0), ("end", 1, True, 0)])
# a kept end (past retain_s) and a late launch of its attempt: the live LM ran it again,
# and held two ends of one task where its journal's replay held one
@example(seq=[("keep", 1, True, 0), ("launch", 5, 0, 1), ("end", 5, False, 0),
              ("tick", 119, 0, 0), ("launch", 5, 0, 1), ("end", 5, False, 0)])  # fmt: skip
def test_the_journal_and_its_compaction_give_back_the_same_state(
    seq: list[tuple[str, int, object, int]],
) -> None:
    lm = durable_lm()
    specs = [
        TaskSpec(
            task_id=TaskId(f"t{i}"),
            job_id=JobId(f"j{i % 2}"),
            user=UserId(f"u{i % 2}"),
            demand=(1 + i % 3, 1),
            duration=5.0,
        )
        for i in range(8)
    ]
    now, journal = 1.0, []
    for op, i, arg, attempt in seq:
        now += 1.0
        spec = specs[i % len(specs)]
        key = (spec.user, spec.task_id)
        if op == "launch":
            effects = lm.handle(launch_req(spec, node=int(arg), attempt=attempt), now)  # type: ignore[call-overload]
        elif op == "end" and key in lm.nodes.active:
            a = lm.nodes.active[key]
            kind = ReportKind.FINISHED if arg else ReportKind.FAILED
            rep = report(kind, spec, a.node, a.attempt, now)
            effects = lm.handle(WorkerReports(lm=LM0, reports=(rep,)), now)
        elif op == "preempt":
            big = TaskSpec(
                task_id=TaskId(f"p{now}"), job_id=JobId("p"), user=UserId("u9"),
                demand=(4, 4), duration=1.0,
            )  # fmt: skip
            req = PreemptRequest(
                gm=GM0, lm=LM0, request_id=1, spec=big, attempt=1, victim=spec.user,
                known_version=-1,
            )  # fmt: skip
            effects = lm.handle(req, now)
        elif op == "stopped" and lm.nodes.stopping:
            (k, att), a = next(iter(lm.nodes.stopping.items()))
            rep = WorkerReport(
                kind=ReportKind.STOPPED, node=a.node, user=k[0], task_id=k[1], attempt=att,
                gm=a.gm, at=now, worker_at=now,
            )  # fmt: skip
            effects = lm.handle(WorkerReports(lm=LM0, reports=(rep,)), now)
        elif op == "keep":
            msg = KeepEnds(
                gm=GM0,
                lm=LM0,
                jobs=(JobKeep(user=UserId(f"u{i}"), job_id=JobId(f"j{i}"), keep=bool(arg)),),
            )
            effects = lm.handle(msg, now)
        elif op == "tick":
            now += i
            effects = lm.handle(Heartbeat(), now)
        elif op in ("reserve", "commit", "release"):
            effects = gang_op(lm, op, spec, int(arg), now)  # type: ignore[call-overload]
        else:
            continue
        journal += records(effects)
        # the live LM forgets the ends past retain_s at its next heartbeat: compared as
        # after it; a new incarnation keeps what it restores retain_s more
        lm.ends.expire(now)
        born = reborn(journal, now)
        restored_like(born, lm, now)
        assert holds(born, now) == holds(lm, now)
        registered_like(born, lm, now)
    compacted = [codec.decode(codec.encode(r)) for r in lm.records()]
    born = reborn(compacted, now)
    restored_like(born, lm, now)
    assert holds(born, now) == holds(lm, now)
    registered_like(born, lm, now)


def holds(lm: LocalMaster, now: float) -> dict[object, object]:
    """Every gang hold of ``lm`` (taken back and pending too) a restart at ``now`` keeps:
    committed, or under its lease."""
    res = lm.reservations
    return {
        h.key: (h.gang, h.placement, h.lease_until, h.due, h.lent, h.borrowers, h.committed)
        for h in (*res.by_task.values(), *res.pending)
        if h.committed or now < h.lease_until
    }


def registered_like(born: LocalMaster, live: LocalMaster, now: float) -> None:
    """Once its pool registered what runs (what ``live`` holds), ``born`` holds again
    every hold ``live`` keeps, and on every node free + held + running = capacity."""
    n = born.nodes
    running = tuple(a.start() for a in live.nodes.active.values())
    born.handle(RegisterWorkers(lm=LM0, nodes=tuple(map(NodeIndex, range(len(NODES)))),
                                at=now, running=running), now)  # fmt: skip
    assert not born.reservations.pending
    assert holds(born, now) == holds(live, now)
    for node in range(n.n_nodes):
        total = list(n.free[node])
        assert min(total) >= 0
        for h in born.reservations.by_task.values():
            if h.node == node:
                total = [t + x for t, x in zip(total, h.held, strict=True)]
        for a in n.active.values():
            if a.node == node:
                total = [t + d for t, d in zip(total, a.spec.demand, strict=True)]
        assert tuple(total) == n.capacity[node]


def gang_op(lm: LocalMaster, op: str, spec: TaskSpec, arg: int, now: float) -> list[Effect]:
    """Hold ``spec`` on node ``arg`` (a lease of 5 to 30), commit it, or release its gang."""
    gang = {"gm": GM0, "lm": LM0, "user": spec.user, "job_id": spec.job_id, "stage": 0}
    if op == "reserve":
        lease = 5.0 + 5 * arg
        placed = Placement(spec=spec, attempt=1 + arg % 2, node=NodeIndex(arg % 3))
        return lm.handle(ReserveRequest(**gang, request_id=1, placements=(placed,), lease_s=lease,
                                        due_s=lease, known_version=-1), now)  # fmt: skip
    if op == "commit":
        hold = lm.reservations.by_task.get((spec.user, spec.task_id))
        attempt = hold.placement.attempt if hold is not None else 1
        ref = PlacedRef(user=spec.user, task_id=spec.task_id, attempt=attempt)
        msg = CommitGang(**gang, request_id=2, tasks=(ref,), known_version=-1)
        return lm.handle(msg, now)
    return lm.handle(ReleaseGang(**gang), now)


def test_a_pool_keeps_its_unreported_ends_across_its_death() -> None:
    pool = WorkerPool(LM0, 2, commands=False, durable=True)
    t = make_task()
    start = StartTask(node=NodeIndex(0), spec=t, attempt=1, gm=GM0)
    journal = records(pool.handle(StartTasks(lm=LM0, epoch=1, tasks=(start,)), 1.0))
    assert journal == []  # what runs dies with the pool: its LM runs it again
    effects = pool.handle(TaskDue(user=t.user, task_id=t.task_id, attempt=1), 6.0)
    journal += records(effects)
    (ended_report,) = [e.msg for e in effects if isinstance(e, ToLm)]
    reborn_pool = WorkerPool(LM0, 2, commands=False, durable=True)
    reborn_pool.restore(journal)
    assert [e.report.task_id for e in reborn_pool.unreported.values()] == [t.task_id]
    # the LM took it: gone from the journal too
    journal += records(pool.handle(ReportsTaken(reports=(ended_report,)), 7.0))
    again = WorkerPool(LM0, 2, commands=False, durable=True)
    again.restore(journal)
    assert again.unreported == {}
    again.restore([codec.decode(codec.encode(r)) for r in pool.records()])
    assert again.unreported == {}


def test_a_restored_attempt_is_held_lost_after_from_the_restart_not_from_time_zero() -> None:
    """On the live clock (wall seconds) a restored node's ``last_seen`` was 0: the LM's
    first check after a restart found every node silent for decades and gave up what
    its pool might still run, at once (`megha chaos --random 2`: an LM restarted while
    its pool was down 1.3 s of its 8-s ``node_lost_after_s`` gave up six nodes, and a
    task ran to its end twice).  The silence now counts from the restore."""
    now = 1_700_000_000.0
    lm = durable_lm()
    t = make_task(job="j")
    journal = records(lm.handle(launch_req(t, node=0), now))
    new = reborn(journal, now + 1.0)
    check = CheckWorkers(timeout=1.5, lost_after=8.0)
    for later in (1.3, 2.3, 3.3, 4.3, 5.3, 6.3, 7.3, 8.3, 8.9):  # within lost_after
        assert [e for e in new.handle(check, now + later) if not isinstance(e, Record)] == []
    assert (t.user, t.task_id) in new.nodes.active
    assert new.counters.nodes_given_up == 0
    gave_up = new.handle(check, now + 9.5)  # silent past lost_after since the restart
    assert new.counters.nodes_given_up == 1
    assert [e.msg.kind for e in gave_up if isinstance(e, ToGm)] == [EventKind.REQUEUED]
