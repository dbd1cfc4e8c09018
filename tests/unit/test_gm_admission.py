"""A large job is admitted in slices (``GlobalMaster.admit_slice``): every task is
checked first, its id reserved, then the tasks are queued a slice at a time, each step
one message (``AdmitMore`` timers), so one submission of many tasks does not hold its
GM for the whole of it.  No event loop: the tests feed the timers back themselves."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from common.effects import After, Effect, JobRefused, JobSettled, Reply, ToGm, ToUser
from common.errors import ConfigError
from common.ids import JobId, UserId
from common.messages import AdmitJob, AdmitMore, ReportKind, StageSpec, SubmitJob, TaskEvents
from common.model import TaskSpec, TaskState
from global_master.core import AdmissionLimits, GlobalMaster
from tests.conftest import (
    decide,
    jobs_of,
    launch_req,
    launches,
    make_gm,
    make_lm,
    make_task,
    queued,
    report,
    state,
    submit,
    sync_views,
    task_of,
)


def gm_with(admit_slice: int) -> GlobalMaster:
    gm = make_gm(admit_slice=admit_slice)
    sync_views(gm, make_lm(nodes=[(4, 4)] * 2))
    return gm


def tasks(n: int, job: str = "big", first: int = 0) -> list[TaskSpec]:
    return [make_task(job=job, task_id=f"t{first + i}") for i in range(n)]


def timers(effects: Sequence[Effect]) -> list[AdmitMore]:
    return [e.msg for e in effects if isinstance(e, After) and isinstance(e.msg, AdmitMore)]


def step(gm: GlobalMaster, effects: Sequence[Effect], now: float) -> list[Effect]:
    """Feed back the one ``AdmitMore`` among ``effects`` (its delay is 0)."""
    (more,) = timers(effects)
    assert all(e.delay == 0.0 for e in effects if isinstance(e, After))
    return gm.handle(more, now)


def admit_all(gm: GlobalMaster, effects: Sequence[Effect], now: float) -> list[Effect]:
    """Step until the job needs no more steps; every effect of the steps."""
    out: list[Effect] = []
    while timers(effects):
        effects = step(gm, effects, now)
        out += effects
    return out


def test_a_large_job_is_checked_whole_then_queued_a_slice_at_a_time() -> None:
    gm = gm_with(admit_slice=3)
    specs = tasks(7)
    effects = submit(gm, specs, 0.0)
    steps = 1
    assert queued(gm) == []
    assert timers(effects)
    while timers(effects):
        effects = step(gm, effects, float(steps))
        steps += 1
        if len(queued(gm)) == 3:
            assert list(gm.admitting) == [(UserId("u0"), JobId("big"))]
    # 3 steps to check 7 tasks, 3 to queue them
    assert steps == 6
    assert queued(gm) == specs  # in the job's order
    assert not gm.admitting
    assert gm.counters.jobs_admitted == 1
    # queueing started when the job came, not when its slice was queued
    assert {t.submitted_at for t in gm.queues} == {0.0}


def test_a_small_job_is_admitted_in_one_step() -> None:
    gm = gm_with(admit_slice=3)
    effects = submit(gm, tasks(3), 0.0)
    assert not timers(effects)
    assert len(queued(gm)) == 3
    assert not gm.admitting


def test_a_refusal_in_a_late_slice_queues_nothing() -> None:
    gm = gm_with(admit_slice=2)
    specs = tasks(6)
    specs[5] = make_task(cpu=0, mem=0, job="big", task_id="t5")
    out = admit_all(gm, submit(gm, specs, 0.0), 1.0)
    (refused,) = [e for e in out if isinstance(e, JobRefused)]
    assert refused.reason == "zero_demand"
    assert queued(gm) == []
    assert not gm.admitting
    assert not gm.jobs
    assert not gm.held_admissions
    # its ids were never taken: a job may use them
    again = tasks(6, job="again")
    out = admit_all(gm, submit(gm, again, 2.0), 2.0)
    assert not [e for e in out if isinstance(e, JobRefused)]
    assert queued(gm) == again


def test_the_user_s_next_jobs_wait_behind_a_job_being_admitted() -> None:
    gm = make_gm(users=(("u0", "gm0", 0.5), ("u1", "gm0", 0.5)), admit_slice=2)
    sync_views(gm, make_lm(nodes=[(4, 4)] * 2))
    big = tasks(5)
    first = submit(gm, big, 0.0)
    after = [make_task(job="next", task_id="n0"), make_task(job="next", task_id="n1")]
    clash = [make_task(job="clash", task_id="t1")]  # an id of the big job
    assert submit(gm, after, 0.5) == []
    assert submit(gm, clash, 0.5) == []
    other = [make_task(job="other", task_id="t1", user="u1")]  # another user's: at once
    assert submit(gm, other, 0.5) == []
    assert queued(gm) == other
    out = admit_all(gm, first, 1.0)
    assert [t for t in queued(gm) if t.user == "u0"] == [*big, *after]  # in the order they came
    (refused,) = [e for e in out if isinstance(e, JobRefused)]
    assert refused.job_id == "clash"
    assert refused.reason == "duplicate_task_id"
    assert not gm.held_admissions
    assert not gm.admitting
    # the held job's queueing started when it came, not when it was let through
    assert {t.submitted_at for t in gm.queues if t.job_id == "next"} == {0.5}


def test_a_large_job_held_behind_another_is_sliced_in_its_turn() -> None:
    gm = gm_with(admit_slice=2)
    first = submit(gm, tasks(3), 0.0)
    second_specs = tasks(5, job="second", first=100)
    third_specs = tasks(1, job="third", first=200)
    assert submit(gm, second_specs, 0.0) == []
    assert submit(gm, third_specs, 0.0) == []
    out = admit_all(gm, first, 1.0)
    assert not [e for e in out if isinstance(e, JobRefused)]
    assert [t.job_id for t in queued(gm)] == ["big"] * 3 + ["second"] * 5 + ["third"]


def test_the_same_job_again_while_it_is_admitted() -> None:
    gm = gm_with(admit_slice=2)
    (job,) = jobs_of(tasks(5), 0.0)
    first = gm.handle(AdmitJob(job=job), 0.0)
    (dup,) = gm.handle(AdmitJob(job=job), 0.0)
    assert isinstance(dup, JobRefused)
    assert dup.reason == "duplicate_job_id"
    assert gm.handle(AdmitJob(job=job, redelivered=True), 0.0) == []  # settled later
    admit_all(gm, first, 1.0)
    assert len(queued(gm)) == 5
    assert gm.counters.jobs_admitted == 1


def test_decisions_go_on_between_slices_and_the_job_settles_when_all_are_placed() -> None:
    gm = gm_with(admit_slice=2)
    effects = submit(gm, tasks(6), 0.0)
    while len(queued(gm)) < 2:
        effects = step(gm, effects, 0.0)
    assert gm.admitting  # four tasks still to queue
    sent = launches(decide(gm, 0.0, max_tasks=2))
    assert sum(len(r.placements) for r in sent) == 2
    out = admit_all(gm, effects, 0.0)
    assert not [e for e in out if isinstance(e, JobSettled)]  # four not yet accepted
    assert gm.jobs[(UserId("u0"), JobId("big"))].left == 6


def test_a_timer_for_a_job_no_longer_admitted_does_nothing() -> None:
    gm = gm_with(admit_slice=2)
    assert gm.handle(AdmitMore(user=UserId("u0"), job_id=JobId("gone")), 0.0) == []


def test_admit_slice_must_be_at_least_one() -> None:
    with pytest.raises(ConfigError):
        make_gm(admit_slice=0)


def dag_job(n: int, *, cyclic: bool = False) -> SubmitJob:
    """Two stages of ``n`` tasks in all, the second after the first (and, ``cyclic``,
    the first after the second too)."""
    (job,) = jobs_of(tasks(n, job="dag"), 0.0)
    return SubmitJob(
        job_id=job.job_id, user=job.user, token="", submitted_at=0.0, tasks=job.tasks,
        stages=(StageSpec(stage_id=0, parents=(1,) if cyclic else (), count=n // 2),
                StageSpec(stage_id=1, parents=(0,), count=n - n // 2)),
    )  # fmt: skip


def test_a_large_dag_job_is_checked_and_made_in_slices_and_queued_whole() -> None:
    gm = gm_with(admit_slice=2)
    effects = gm.handle(AdmitJob(job=dag_job(6)), 0.0)
    steps = 1
    while timers(effects):
        assert not queued(gm)  # nothing of it is queued before the last step
        effects = step(gm, effects, float(steps))
        steps += 1
    # 3 steps check 6 tasks, 3 make their records, 1 queues them all
    assert steps == 7
    assert not gm.admitting
    assert len(queued(gm)) == 3  # the root stage; the other waits for it
    assert all(task_of(gm, s).submitted_at == 0.0 for s in queued(gm))  # when it came


def test_a_dag_whose_stages_do_not_fit_together_is_refused_after_its_checks() -> None:
    gm = gm_with(admit_slice=2)
    first = gm.handle(AdmitJob(job=dag_job(6, cyclic=True)), 0.0)
    assert submit(gm, tasks(1, job="next", first=100), 0.0) == []  # held behind it
    out = admit_all(gm, first, 1.0)
    (refused,) = [e for e in out if isinstance(e, JobRefused)]
    assert refused.reason == "bad_dag"
    assert not gm.admitting
    assert not gm.held_admissions
    assert [t.job_id for t in queued(gm)] == ["next"]


def test_a_large_job_redelivered_after_a_restart_runs_none_of_its_tasks_twice() -> None:
    """A GM restarted while some tasks of a large job ran: the job comes back (its ack
    was never sent); re-admitted in slices, the running tasks are adopted in their
    slice, the others queued, and the job settles only when every task is accounted."""
    lm = make_lm(nodes=[(4, 4)] * 2)
    specs = tasks(7)
    for i in (1, 4, 6):  # running before the restart, one in each of three slices
        (reply, *_) = lm.handle(launch_req(specs[i], i % 2), 0.0)
        assert isinstance(reply, Reply)
    fresh = make_gm(admit_slice=3)
    sync_views(fresh, lm)
    (job,) = jobs_of(specs, 0.0)
    out = admit_all(fresh, fresh.handle(AdmitJob(job=job, redelivered=True), 1.0), 1.0)
    assert fresh.counters.redelivered_skipped == 3
    assert [state(fresh, s) for s in specs].count(TaskState.PLACED) == 3
    assert queued(fresh) == [specs[i] for i in (0, 2, 3, 5)]
    assert not [e for e in out if isinstance(e, JobSettled)]  # four still to place


def test_a_task_of_a_redelivered_job_ending_before_its_slice_is_queued_runs_once() -> None:
    """After a restart the GM knows a running task of a large job from its LM before
    the job comes back; the task ends between the job's slices.  Its slice must find it
    ended, not queue it to run again (found in review)."""
    lm = make_lm(nodes=[(4, 4)] * 2)
    specs = tasks(7)
    (reply, *_) = lm.handle(launch_req(specs[6], 0), 0.0)  # t6 runs before the restart
    assert isinstance(reply, Reply)
    fresh = make_gm(admit_slice=3)
    sync_views(fresh, lm)
    assert state(fresh, specs[6]) is TaskState.PLACED  # known from the LM's snapshot
    (job,) = jobs_of(specs, 0.0)
    effects = fresh.handle(AdmitJob(job=job, redelivered=True), 1.0)  # check t0-t2
    for _ in range(3):  # check t3-t5, t6; queue t0-t2 (the job's record is made)
        effects = step(fresh, effects, 1.0)
    ended = lm.handle(report(lm.lm_id, ReportKind.FINISHED, specs[6], 0, 2.0), 2.0)
    evs = tuple(e.msg for e in ended if isinstance(e, ToGm))
    told = fresh.handle(TaskEvents(lm=lm.lm_id, events=evs), 2.0)
    assert [e.msg.task.task_id for e in told if isinstance(e, ToUser)] == ["t6"]
    out = admit_all(fresh, effects, 2.0)
    assert specs[6] not in queued(fresh)  # finished: not run again
    assert not [e for e in out if isinstance(e, ToUser)]  # and its user not told twice
    assert fresh.jobs[(UserId("u0"), JobId("big"))].left == 6


# ------------------------------------------------------------ a user's task limit
def two_users(limit: int, admit_slice: int = 1000) -> GlobalMaster:
    gm = make_gm(users=(("u0", "gm0", 0.5), ("u1", "gm0", 0.5)), admit_slice=admit_slice)
    gm.admission.limits = AdmissionLimits(max_user_tasks=limit)
    sync_views(gm, make_lm(nodes=[(4, 4)] * 2))
    return gm


def test_a_job_past_the_user_s_task_limit_is_refused_and_others_are_not() -> None:
    gm = two_users(limit=5)
    assert submit(gm, tasks(4, job="a"), 0.0) == []
    (refused,) = submit(gm, tasks(2, job="b", first=10), 0.0)  # 4 + 2 > 5
    assert isinstance(refused, JobRefused)
    assert refused.reason == "user_task_limit"
    assert "max_user_tasks" in refused.detail
    assert submit(gm, [make_task(user="u1", job="c", task_id=f"c{i}") for i in range(5)], 0.0) == []
    assert submit(gm, tasks(1, job="d", first=20), 0.0) == []  # 4 + 1: within it
    assert gm.live.per_user == {"u0": 5, "u1": 5}


def test_ended_tasks_give_their_room_back() -> None:
    gm = two_users(limit=3)
    specs = tasks(3, job="a")
    submit(gm, specs, 0.0)
    for spec in specs:  # fail them (no node ever runs them, say): they have ended
        gm._fail(task_of(gm, spec), "test", [])
    assert gm.live.per_user == {}
    assert submit(gm, tasks(3, job="b", first=10), 1.0) == []


def test_a_job_held_behind_a_large_one_is_checked_against_the_limit_in_its_turn() -> None:
    gm = two_users(limit=6, admit_slice=2)
    first = submit(gm, tasks(5, job="a"), 0.0)
    assert submit(gm, tasks(2, job="b", first=10), 0.0) == []  # held
    out = admit_all(gm, first, 1.0)
    (refused,) = [e for e in out if isinstance(e, JobRefused)]
    assert refused.job_id == "b"
    assert refused.reason == "user_task_limit"


def test_a_redelivered_job_is_not_refused_for_the_limit() -> None:
    gm = two_users(limit=2)
    (job,) = jobs_of(tasks(3, job="a"), 0.0)
    (refused,) = gm.handle(AdmitJob(job=job), 0.0)
    assert isinstance(refused, JobRefused)
    assert gm.handle(AdmitJob(job=job, redelivered=True), 0.0) == []
    assert gm.live.per_user == {"u0": 3}
