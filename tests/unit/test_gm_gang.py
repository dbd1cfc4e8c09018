"""The GM's gang flow on hand-built clusters, through ``handle``: a gang stage is
reserved across LMs and committed whole; one that does not fit in the view reserves
nothing and waits ``gang_incomplete``; one that can never fit fails
``gang_unschedulable``; a reservation refused in part is released and retried after a
jittered back-off, and fails after ``max_tries``; a task that fits only reserved room
backfills it when it ends before the hold is due, else waits ``reserved_for_gang``."""

from __future__ import annotations

from collections.abc import Sequence

from common.effects import After, Effect, Reply, ToAllGms, ToLm, ToUser
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.messages import (
    AdmitJob,
    CommitGang,
    GangRetry,
    Heartbeat,
    LaunchRequest,
    Placement,
    ReleaseGang,
    ReserveRequest,
    StageSpec,
    StateUpdated,
    SubmitJob,
)
from common.model import TaskSpec, WaitReason
from global_master.core import GlobalMaster
from global_master.gang import Gangs, GangSettings
from local_master.core import LocalMaster
from tests.conftest import decide, make_gm, make_lm, make_task, sync_views, task_of

U0 = UserId("u0")


def gang_job(specs: Sequence[TaskSpec], need: int = 0, job: str = "g") -> AdmitJob:
    stage = StageSpec(stage_id=0, count=len(specs), gang=True, min_count=need)
    sub = SubmitJob(job_id=JobId(job), user=U0, token="", submitted_at=0.0,
                    tasks=tuple(specs), stages=(stage,))  # fmt: skip
    return AdmitJob(job=sub)


def gang_specs(n: int, cpu: int = 2, job: str = "g") -> list[TaskSpec]:
    return [make_task(cpu, 1, job=job, duration=10.0) for _ in range(n)]


def route(
    gm: GlobalMaster, lms: dict[LmId, LocalMaster], effects: Sequence[Effect], now: float
) -> list[Effect]:
    """Deliver every request to its LM and every answer back, until none is left;
    returns what else the cores asked for (timers, outcomes, worker starts)."""
    rest: list[Effect] = []
    todo = list(effects)
    while todo:
        e = todo.pop(0)
        if isinstance(e, ToLm) and e.lm in lms:
            for a in lms[e.lm].handle(e.msg, now):
                if isinstance(a, Reply):
                    todo.extend(gm.handle(a.msg, now))
                else:
                    rest.append(a)
        else:
            rest.append(e)
    return rest


def two_lms() -> tuple[GlobalMaster, dict[LmId, LocalMaster]]:
    lms = {LmId("lm0"): make_lm("lm0", nodes=((4, 4), (4, 4))),
           LmId("lm1"): make_lm("lm1", nodes=((4, 4), (4, 4)))}  # fmt: skip
    gm = make_gm(lms=("lm0", "lm1"))
    sync_views(gm, *lms.values())
    return gm, lms


def filled_lms() -> tuple[GlobalMaster, dict[LmId, LocalMaster]]:
    """``two_lms`` with one 4x4 task of job ``f`` running: a gang of 8 does not fit now."""
    gm, lms = two_lms()
    filler = make_task(4, 4, job="f")
    gm.handle(AdmitJob(job=SubmitJob(job_id=JobId("f"), user=U0, token="", submitted_at=0.0,
                                     tasks=(filler,))), 0.0)  # fmt: skip
    route(gm, lms, decide(gm, 0.5), 0.5)
    return gm, lms


def sent(effects: Sequence[Effect], kind: type) -> list[object]:
    return [e.msg for e in effects if isinstance(e, ToLm) and isinstance(e.msg, kind)]


def test_a_gang_is_reserved_across_lms_and_committed_whole() -> None:
    gm, lms = two_lms()
    specs = gang_specs(8)  # 16 cpu: every node of both LMs
    gm.handle(gang_job(specs), 0.0)
    effects = decide(gm, 1.0)
    reserves = sent(effects, ReserveRequest)
    assert {r.lm for r in reserves} == {"lm0", "lm1"}  # type: ignore[attr-defined]
    assert not sent(effects, LaunchRequest)
    rest = route(gm, lms, effects, 1.0)
    assert sum(len(lm.active) for lm in lms.values()) == 8
    assert gm.gang.stats["committed"] == 1
    assert all(gm.state_of((s.user, s.task_id)).name == "PLACED" for s in specs)  # type: ignore[union-attr]
    assert not any(isinstance(e, ToUser) for e in rest)


def test_a_gang_that_does_not_fit_now_reserves_nothing_and_waits() -> None:
    gm, _ = filled_lms()
    specs = gang_specs(8)
    gm.handle(gang_job(specs), 1.0)
    effects = decide(gm, 1.0, max_tasks=8)
    assert not sent(effects, ReserveRequest)
    assert any(task_of(gm, s).waits[WaitReason.GANG_INCOMPLETE] for s in specs)


def test_a_gang_that_cannot_fit_the_federation_fails_unschedulable() -> None:
    gm, _lms = two_lms()
    specs = gang_specs(9)  # 18 cpu > 16
    gm.handle(gang_job(specs), 0.0)
    effects = decide(gm, 1.0)
    failed = [e.msg for e in effects if isinstance(e, ToUser)]
    assert len(failed) == 9
    assert all(o.reason.startswith("gang_unschedulable") for o in failed)  # type: ignore[attr-defined]


def test_a_min_gang_commits_its_min_and_the_rest_become_ordinary_tasks() -> None:
    gm, lms = two_lms()
    lms[LmId("lm1")].handle(_hold_all(lms[LmId("lm1")]), 0.0)  # unseen by this GM
    specs = gang_specs(8)
    gm.handle(gang_job(specs, need=4), 0.0)
    rest = route(gm, lms, decide(gm, 1.0), 1.0)
    assert gm.gang.stats["committed"] == 1
    assert len(lms[LmId("lm0")].active) == 4
    assert not any(isinstance(e, ToUser) for e in rest)


def _hold_all(lm: LocalMaster) -> ReserveRequest:
    """A hold of another gang on every node of ``lm``."""
    ps = tuple(Placement(spec=make_task(4, 4, job="x"), attempt=1, node=NodeIndex(n))
               for n in range(lm.n_nodes))  # fmt: skip
    return ReserveRequest(gm=GmId("gm0"), lm=lm.lm_id, request_id=98, user=U0,
                          job_id=JobId("x"), stage=0, placements=ps, lease_s=100.0,
                          due_s=100.0, known_version=-1)  # fmt: skip


def test_a_reservation_refused_in_part_is_released_and_backs_off_then_fails() -> None:
    lms = {LmId("lm0"): make_lm("lm0", nodes=((4, 4), (4, 4))),
           LmId("lm1"): make_lm("lm1", nodes=((4, 4), (4, 4)))}  # fmt: skip
    gm = make_gm(lms=("lm0", "lm1"))
    gm.gang = Gangs(gm.gm_id, GangSettings(max_tries=2, refills=0))
    gm._gang_of = gm.gang.member
    sync_views(gm, *lms.values())
    # another GM's gang holds all of lm1 (this GM's view does not know it yet)
    lms[LmId("lm1")].handle(_hold_all(lms[LmId("lm1")]), 0.5)
    gm.handle(gang_job(gang_specs(8)), 0.0)
    now = 1.0
    rest = route(gm, lms, decide(gm, now), now)
    assert lms[LmId("lm0")].reservations.by_task  # lm0 holds its part, filling
    while timers := [e for e in rest if isinstance(e, After) and isinstance(e.msg, GangRetry)]:
        # fill until the lease nearly ends, release, back off; then wait holding nothing
        now += timers[0].delay
        rest = route(gm, lms, gm.handle(timers[0].msg, now), now)
    assert gm.gang.stats["backoffs"] == 1
    assert gm.gang.stats["released"] >= 1
    assert not lms[LmId("lm0")].reservations.by_task  # released: nothing held
    assert not any(lm.active for lm in lms.values())  # no partial gang ran
    assert not any(isinstance(e, ToUser) for e in rest)  # it waits: it fits the federation
    # the other gang's lease ends: the room shows in lm1's update, and the gang commits
    now = 101.0
    for lm in lms.values():
        for e in lm.handle(Heartbeat(), now):
            if isinstance(e, ToAllGms):
                gm.handle(e.msg, now)
    route(gm, lms, decide(gm, now, max_tasks=8), now)
    assert sum(len(lm.active) for lm in lms.values()) == 8
    assert gm.gang.stats["committed"] == 1


def test_a_gang_whose_reservations_keep_coming_short_fails_after_max_tries() -> None:
    gm, lms = two_lms()
    gm.gang = Gangs(gm.gm_id, GangSettings(max_tries=1, refills=0))
    gm._gang_of = gm.gang.member
    lms[LmId("lm1")].handle(_hold_all(lms[LmId("lm1")]), 0.5)  # unseen by this GM
    gm.handle(gang_job(gang_specs(8)), 0.0)
    now = 1.0
    rest = route(gm, lms, decide(gm, now), now)
    while timers := [e for e in rest if isinstance(e, After) and isinstance(e.msg, GangRetry)]:
        now += timers[0].delay  # fill until the lease nearly ends: no back-off left
        rest = route(gm, lms, gm.handle(timers[0].msg, now), now)
    failed = [e.msg for e in rest if isinstance(e, ToUser)]
    assert len(failed) == 8
    assert all(o.reason.startswith("gang_unschedulable") for o in failed)  # type: ignore[attr-defined]
    assert not lms[LmId("lm0")].reservations.by_task


def test_jitter_comes_from_the_gms_seeded_rng() -> None:
    a = Gangs(GmId("gm0"))
    b = Gangs(GmId("gm0"))
    c = Gangs(GmId("gm1"))
    assert a.rng.random() == b.rng.random() != c.rng.random()


def test_backfill_only_for_tasks_that_end_before_the_hold_is_due() -> None:
    lm = make_lm("lm0", nodes=((4, 4),))
    gm = make_gm(lms=("lm0",))
    sync_views(gm, lm)
    hold = _hold_all(lm)
    lm.handle(hold, 0.0)  # held until 100
    gm.handle(StateUpdated(delta=lm.delta_since(-1)), 1.0)
    long = TaskSpec(task_id=make_task().task_id, job_id=JobId("l"), user=U0, demand=(2, 2),
                    duration=500.0)  # fmt: skip
    short = TaskSpec(task_id=make_task().task_id, job_id=JobId("s"), user=U0, demand=(2, 2),
                     duration=5.0)  # fmt: skip
    for spec in (long, short):
        gm.handle(AdmitJob(job=SubmitJob(job_id=spec.job_id, user=U0, token="",
                                         submitted_at=1.0, tasks=(spec,))), 1.0)  # fmt: skip
    effects = decide(gm, 2.0, max_tasks=2)
    (launch,) = sent(effects, LaunchRequest)
    assert [p.spec.task_id for p in launch.placements] == [short.task_id]  # type: ignore[attr-defined]
    assert task_of(gm, long).waits[WaitReason.RESERVED_FOR_GANG] == 1
    route(gm, {lm.lm_id: lm}, effects, 2.0)
    assert (short.user, short.task_id) in lm.active
    assert lm.reservations.backfilled == 1
    assert not sent(effects, CommitGang)
    assert not sent(effects, ReleaseGang)


def test_a_gang_job_held_behind_a_job_admitted_in_slices_is_still_a_gang() -> None:
    lms = {LmId("lm0"): make_lm("lm0", nodes=((8, 8), (8, 8)))}
    gm = make_gm(lms=("lm0",), admit_slice=2)
    sync_views(gm, *lms.values())
    flat = [make_task(1, 1, job="flat") for _ in range(5)]
    effects = gm.handle(AdmitJob(job=SubmitJob(job_id=JobId("flat"), user=U0, token="",
                                               submitted_at=0.0, tasks=tuple(flat))), 0.0)  # fmt: skip
    specs = gang_specs(4)
    effects += gm.handle(gang_job(specs), 0.0)  # held: its user's job is being admitted
    while more := [e for e in effects if isinstance(e, After)]:
        effects = [x for e in more for x in gm.handle(e.msg, 0.0)]
    effects = decide(gm, 1.0, max_tasks=16)
    launched = {p.spec.task_id for m in sent(effects, LaunchRequest) for p in m.placements}  # type: ignore[attr-defined]
    assert not launched & {s.task_id for s in specs}
    route(gm, lms, effects, 1.0)
    assert gm.gang.stats["committed"] == 1


def test_megha_why_says_a_gang_task_waits_for_its_gang() -> None:
    from global_master.inspect import task_answer

    gm, _ = filled_lms()
    specs = gang_specs(8)
    gm.handle(gang_job(specs), 1.0)
    decide(gm, 1.0, max_tasks=8)
    answers = [task_answer(gm, (s.user, s.task_id)) for s in specs]
    why = [line for a in answers if a is not None for line in a["why"]]
    assert any("gang_incomplete" in line for line in why)
    assert any(line.startswith("gang_incomplete x") for line in why)


def test_gang_settings_that_could_never_commit_are_refused() -> None:
    import pytest

    from common.errors import ConfigError

    with pytest.raises(ConfigError, match="commit margin"):
        GangSettings(lease_s=1.0, commit_margin_s=1.0)


def test_a_gang_committed_before_a_gm_restart_leaves_its_rest_ordinary_tasks() -> None:
    """A ``min`` gang committed 8 of 10 (the other 2 ordinary tasks, waiting for room);
    its GM restarts and its job is delivered again.  The restarted GM learns the 8 that
    run from the LMs' snapshots; the 2 left are ordinary tasks, as they were: made a
    gang again they waited for 8 ready tasks that never come (live: a job of the e2e
    gang test never finished after its GM's process was restarted)."""
    gm, lms = two_lms()
    lm0, lm1 = lms[LmId("lm0")], lms[LmId("lm1")]
    lm1.handle(_hold_all(lm1), 0.0)  # unseen by this GM
    specs = gang_specs(10, cpu=1)
    job = gang_job(specs, need=8)
    gm.handle(job, 0.0)
    route(gm, lms, decide(gm, 1.0), 1.0)
    assert gm.gang.stats["committed"] == 1
    assert len(lm0.active) == 8
    left = [t for t in specs if (t.user, t.task_id) not in lm0.active]
    again = make_gm(lms=("lm0", "lm1"))  # the GM's process restarted
    sync_views(again, *lms.values())  # snapshots: what runs
    again.handle(AdmitJob(job=job.job, redelivered=True), 2.0)  # its delivery, again
    # room comes (the foreign hold goes): the 2 are placed as any task is
    lm1.handle(ReleaseGang(gm=GmId("gm0"), lm=lm1.lm_id, user=U0, job_id=JobId("x"), stage=0), 3.0)
    sync_views(again, *lms.values())
    for now in (4.0, 5.0, 6.0):
        assert not sent(route(again, lms, decide(again, now), now), ReserveRequest)
    assert {(t.user, t.task_id) for t in left} <= set(lm1.active)
    assert again.gang.stats["committed_before"] == 1
    for t in left:
        assert again.gang.describe((t.user, t.task_id)) is None  # no gang waits for them
