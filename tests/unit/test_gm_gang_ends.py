"""A gang stage whose tasks end out of turn -- their job cancelled, their user revoked,
a parent stage failed -- goes with them: nothing of it is reserved or committed after
the end its user was told, what the LMs hold of it is released, and the GM forgets it
(found probing a live federation: a DAG job cancelled while its gang stage held part
of itself still started the whole gang when the fill timer fired)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from common.effects import After, Effect, ToAllGms, ToUser
from common.ids import JobId, LmId, UserId
from common.messages import (
    AdmitJob,
    CancelJob,
    CommitGang,
    GangRetry,
    Heartbeat,
    ReleaseGang,
    ReserveRequest,
    StageSpec,
    SubmitJob,
    UserAccess,
)
from common.model import TaskSpec
from global_master.core import GlobalMaster
from global_master.gang import Gangs, GangSettings
from local_master.core import LocalMaster
from tests.conftest import decide, make_gm, make_lm, make_task, sync_views
from tests.unit.test_gm_gang import (
    U0,
    _hold_all,
    filled_lms,
    gang_job,
    gang_specs,
    route,
    sent,
    two_lms,
)

G = JobId("g")


def _told(effects: Sequence[Effect]) -> list[str]:
    return [e.msg.reason for e in effects if isinstance(e, ToUser)]  # type: ignore[attr-defined]


def _holding_part() -> tuple[GlobalMaster, dict[LmId, LocalMaster], list[Effect], float]:
    """A gang of 8 of which lm0 holds 4, filling: lm1 is held by another gang for
    1.5 s (unseen by this GM), so the gang's fill timer is set."""
    lms = {LmId("lm0"): make_lm("lm0", nodes=((4, 4), (4, 4))),
           LmId("lm1"): make_lm("lm1", nodes=((4, 4), (4, 4)))}  # fmt: skip
    gm = make_gm(lms=("lm0", "lm1"))
    gm.gang = Gangs(gm.gm_id, GangSettings(refills=0))
    gm._gang_of = gm.gang.member
    sync_views(gm, *lms.values())
    other = msgspec.structs.replace(_hold_all(lms[LmId("lm1")]), lease_s=1.5, due_s=1.5)
    lms[LmId("lm1")].handle(other, 0.5)
    gm.handle(gang_job(gang_specs(8)), 0.0)
    rest = route(gm, lms, decide(gm, 1.0), 1.0)
    assert len(lms[LmId("lm0")].reservations.by_task) == 4
    return gm, lms, rest, 1.0


def _run_timers(
    gm: GlobalMaster, lms: dict[LmId, LocalMaster], rest: list[Effect], now: float
) -> list[Effect]:
    """Fire the gang's timers (the LMs' state updates in between) until none is left."""
    seen: list[Effect] = []
    while timers := [e for e in rest if isinstance(e, After) and isinstance(e.msg, GangRetry)]:
        now += timers[0].delay
        for lm in lms.values():
            for e in lm.handle(Heartbeat(), now):
                if isinstance(e, ToAllGms):
                    gm.handle(e.msg, now)
        rest = route(gm, lms, gm.handle(timers[0].msg, now), now)
        seen += rest
    return seen


def test_a_gang_cancelled_while_it_holds_part_of_itself_never_starts() -> None:
    gm, lms, rest, now = _holding_part()
    cancel = gm.handle(CancelJob(user=U0, job_id=G), now + 0.05)
    assert _told(cancel) == ["cancelled"] * 8
    assert sent(cancel, ReleaseGang)  # lm0's hold goes back at once
    route(gm, lms, cancel, now + 0.05)
    later = _run_timers(gm, lms, rest, now + 0.05)
    assert not any(lm.active for lm in lms.values())  # nothing of it started
    assert not _told(later)  # told once
    assert not lms[LmId("lm0")].reservations.by_task
    assert not gm.gang.gangs
    assert not gm.gang.member


def test_a_gang_cancelled_while_its_reservation_is_out_is_never_committed() -> None:
    gm, lms = two_lms()
    gm.handle(gang_job(gang_specs(8)), 0.0)
    asked = decide(gm, 1.0)
    assert sent(asked, ReserveRequest)
    cancel = gm.handle(CancelJob(user=U0, job_id=G), 1.1)
    assert _told(cancel) == ["cancelled"] * 8  # a reservation starts nothing: ended now
    answers = route(gm, lms, asked, 1.2)  # the LMs hold it; their answers find no gang
    assert not sent(answers, CommitGang)
    assert not any(lm.active for lm in lms.values())
    assert not any(lm.reservations.by_task for lm in lms.values())  # released on answer
    assert not gm.inflight
    assert not gm.gang.gangs


def test_a_waiting_gang_cancelled_is_forgotten() -> None:
    gm, _ = filled_lms()
    gm.handle(gang_job(gang_specs(8)), 1.0)
    decide(gm, 1.0, max_tasks=8)  # it does not fit now: it waits
    assert _told(gm.handle(CancelJob(user=U0, job_id=G), 1.1)) == ["cancelled"] * 8
    assert not gm.gang.gangs
    assert not gm.gang.member


def test_a_revoked_users_gang_ends_and_never_starts() -> None:
    gm, lms, rest, now = _holding_part()
    revoked = gm.handle(UserAccess(user=U0, revoked=True), now + 0.05)
    assert _told(revoked) == ["user_revoked"] * 8  # its job ends: none left waiting
    route(gm, lms, revoked, now + 0.05)
    _run_timers(gm, lms, rest, now + 0.05)
    assert not any(lm.active for lm in lms.values())
    assert not gm.gang.gangs


def _dag_with_gang_child(specs: list[TaskSpec]) -> AdmitJob:
    """Stage 0: one task; stage 1 (a gang): the rest, after stage 0."""
    stages = (StageSpec(stage_id=0, count=1),
              StageSpec(stage_id=1, count=len(specs) - 1, parents=(0,), gang=True))  # fmt: skip
    sub = SubmitJob(job_id=G, user=U0, token="", submitted_at=0.0, tasks=tuple(specs),
                    stages=stages)  # fmt: skip
    return AdmitJob(job=sub)


def test_a_gang_stage_whose_parent_failed_is_forgotten() -> None:
    gm = make_gm(lms=("lm0",))
    sync_views(gm, make_lm("lm0", nodes=((4, 4),)))
    specs = [make_task(1, 1, job="g") for _ in range(4)]
    gm.handle(_dag_with_gang_child(specs), 0.0)
    assert gm.gang.gangs  # known from admission
    root = gm.live[(UserId("u0"), specs[0].task_id)]
    effects: list[Effect] = []
    gm._fail(root, "failed on worker: exit_status: exit status 1", effects)
    assert len(_told(effects)) == 4  # the root, and the gang stage's 3 after it
    assert not gm.gang.gangs
    assert not gm.gang.member
