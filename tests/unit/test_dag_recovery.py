"""A DAG job redelivered to a restarted GM (its delivery is held until every task was
accepted, so a GM killed mid-job always gets it back) runs none of its tasks twice and
keeps its stage order, under every queue policy: tasks found running on an LM, on their
way to one, or kept on the broker as returned (``resumes``) are never released by the
DAG again.  No event loop, no sleeps."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.effects import JobSettled, Reply, ToGm, ToLm, ToUser, ToWorker
from common.ids import GmId, JobId, LmId, UserId
from common.messages import (
    AdmitJob,
    Heartbeat,
    JobKeep,
    KeepEnds,
    LaunchResponse,
    Refused,
    ReportKind,
    StageSpec,
    StateUpdated,
    SubmitJob,
    TaskEvents,
)
from common.model import TaskSpec, TaskState, UserConfig
from global_master.core import GlobalMaster
from global_master.policy import POLICIES, make_policy
from global_master.recovery import resume_id
from local_master.core import LocalMaster
from tests.conftest import (
    decide,
    key,
    launch_req,
    launches,
    make_lm,
    make_task,
    report,
    state,
    submit,
)

U0 = UserId("u0")


def fresh_gm(policy: str, lm: LocalMaster) -> GlobalMaster:
    """A GM that has just restarted: it knows only what its LM's snapshot says."""
    users = [UserConfig(user=U0, gm=GmId("gm0"), share=1.0)]
    gm = GlobalMaster(GmId("gm0"), [lm.lm_id], users)
    gm.queues = make_policy(policy, users)(GmId("gm0"), [U0])
    gm.handle(lm.snapshot(gm.gm_id), 0.0)
    return gm


def two_stages(job: str) -> tuple[SubmitJob, list[TaskSpec]]:
    """Roots a, b; child c after both."""
    specs = [make_task(job=job) for _ in range(3)]
    stages = (StageSpec(stage_id=0, count=2), StageSpec(stage_id=1, parents=(0,), count=1))
    sub = SubmitJob(
        job_id=specs[0].job_id, user=U0, token="", submitted_at=0.0, tasks=tuple(specs),
        stages=stages,
    )  # fmt: skip
    return sub, specs


def kept_on_broker(spec: TaskSpec) -> SubmitJob:
    """The message a GM persisted when ``spec`` (attempt 1) came back to its queue."""
    return SubmitJob(
        job_id=resume_id(spec.task_id, 1), user=U0, token="", submitted_at=1.0,
        tasks=(spec,), resumes=spec.job_id, attempt=1,
    )  # fmt: skip


class Run:
    """Drives a GM and its LM: every launch the LM accepts, and task ends."""

    def __init__(self, gm: GlobalMaster, lm: LocalMaster) -> None:
        self.gm, self.lm = gm, lm
        self.launched: list[str] = []
        self.told: list[str] = []
        """The tasks whose end the GM told their user, in order."""
        self.node: dict[str, tuple[int, int]] = {}
        """Where each task was launched, and as which attempt."""

    def place(self, now: float) -> list[str]:
        got: list[str] = []
        for _ in range(4):
            for req in launches(decide(self.gm, now, max_tasks=8)):
                got += [p.spec.task_id for p in req.placements]
                self.node.update({p.spec.task_id: (p.node, p.attempt) for p in req.placements})
                (answer, *_) = self.lm.handle(req, now)
                self.gm.handle(answer.msg, now)  # type: ignore[attr-defined]
        self.launched += got
        return got

    def finish(self, spec: TaskSpec, now: float) -> None:
        node, attempt = self.node[spec.task_id]
        ended = report(self.lm.lm_id, ReportKind.FINISHED, spec, node, now, attempt=attempt)
        out = self.lm.handle(ended, now)
        events = tuple(e.msg for e in out if isinstance(e, ToGm))
        told = self.gm.handle(TaskEvents(lm=self.lm.lm_id, events=events), now)
        self.told += [e.msg.task.task_id for e in told if isinstance(e, ToUser)]


def policies() -> Iterator[str]:
    yield from POLICIES


@pytest.mark.parametrize("policy", policies())
def test_a_root_kept_on_the_broker_and_its_dag_redelivered_runs_once(policy: str) -> None:
    """The returned root's own message came first (another queue): queued from it; then
    the DAG itself: the root is not queued a second time."""
    lm = make_lm(nodes=[(4, 4)] * 4)
    gm = fresh_gm(policy, lm)
    job, (a, b, c) = two_stages("ja")
    assert gm.handle(AdmitJob(job=kept_on_broker(a), redelivered=True), 1.0) == []
    gm.handle(AdmitJob(job=job, redelivered=True), 1.1)
    run = Run(gm, lm)
    assert sorted(run.place(2.0)) == sorted([a.task_id, b.task_id])
    run.finish(a, 3.0)
    run.finish(b, 3.0)
    assert run.place(4.0) == [c.task_id]
    assert sorted(run.launched) == sorted(t.task_id for t in (a, b, c))


@pytest.mark.parametrize("policy", policies())
def test_a_child_kept_on_the_broker_waits_for_its_redelivered_dag_s_stages(policy: str) -> None:
    """A returned child's message queued it before its DAG came back: the DAG takes it
    over and releases it after its parents, once."""
    lm = make_lm(nodes=[(4, 4)] * 4)
    gm = fresh_gm(policy, lm)
    job, (a, b, c) = two_stages("jb")
    gm.handle(AdmitJob(job=kept_on_broker(c), redelivered=True), 1.0)
    gm.handle(AdmitJob(job=job, redelivered=True), 1.1)
    run = Run(gm, lm)
    assert sorted(run.place(2.0)) == sorted([a.task_id, b.task_id])
    run.finish(a, 3.0)
    assert run.place(3.5) == []
    run.finish(b, 4.0)
    assert run.place(5.0) == [c.task_id]
    assert gm.tasks_of([key(c)])[0].attempt > 1  # newer than the attempt it ran as


@pytest.mark.parametrize("policy", policies())
def test_a_child_found_running_is_not_run_again_when_its_parents_end(policy: str) -> None:
    """The child ran when the GM restarted (its parents had ended, unknown to the new GM,
    which runs them again): their ends must not release the child a second time."""
    lm = make_lm(nodes=[(4, 4)] * 4)
    job, (a, b, c) = two_stages("jc")
    lm.handle(launch_req(c, 3), 0.0)
    gm = fresh_gm(policy, lm)
    gm.handle(AdmitJob(job=job, redelivered=True), 1.0)
    assert state(gm, c) is TaskState.PLACED
    run = Run(gm, lm)
    assert sorted(run.place(2.0)) == sorted([a.task_id, b.task_id])
    run.finish(a, 3.0)
    run.finish(b, 3.0)
    assert run.place(4.0) == []
    run.node[c.task_id] = (3, 1)
    run.finish(c, 5.0)
    assert sorted(run.told) == sorted(t.task_id for t in (a, b, c))
    assert (U0, job.job_id) not in gm.jobs  # every task accounted: the job is done
    assert not gm.queues.has_work()


@pytest.mark.parametrize("policy", policies())
def test_a_root_on_its_way_to_an_lm_when_its_dag_comes_back_is_sent_once(policy: str) -> None:
    """Queued from its own message and sent to the LM before the DAG came back: the DAG
    must not queue it again while the LM's answer is awaited."""
    lm = make_lm(nodes=[(4, 4)] * 4)
    gm = fresh_gm(policy, lm)
    job, (a, b, c) = two_stages("jd")
    gm.handle(AdmitJob(job=kept_on_broker(a), redelivered=True), 1.0)
    (req,) = launches(decide(gm, 1.5, max_tasks=8))
    assert [p.spec.task_id for p in req.placements] == [a.task_id]
    gm.handle(AdmitJob(job=job, redelivered=True), 1.6)
    assert state(gm, a) is TaskState.DISPATCHED
    run = Run(gm, lm)
    run.node[a.task_id] = (req.placements[0].node, req.placements[0].attempt)
    (answer, *_) = lm.handle(req, 2.0)
    gm.handle(answer.msg, 2.0)  # type: ignore[attr-defined]
    assert run.place(2.0) == [b.task_id]
    run.finish(a, 3.0)
    run.finish(b, 3.0)
    assert run.place(4.0) == [c.task_id]


@pytest.mark.parametrize("policy", policies())
def test_a_gm_killed_mid_dag_finds_the_parents_ended_and_the_child_running(policy: str) -> None:
    """The common case of a GM killed mid-DAG: its LM's snapshot says the roots ended
    (it keeps recent ends) and the child runs.  Nothing runs again; the child's end
    completes the job."""
    lm = make_lm(nodes=[(4, 4)] * 4)
    job, (a, b, c) = two_stages("je")
    for n, spec in enumerate((a, b)):
        lm.handle(launch_req(spec, n), 0.0)
        lm.handle(report(lm.lm_id, ReportKind.FINISHED, spec, n, 1.0), 1.0)
    lm.handle(launch_req(c, 3), 1.5)
    gm = fresh_gm(policy, lm)
    gm.handle(AdmitJob(job=job, redelivered=True), 2.0)
    assert gm.counters.redelivered_skipped == 3
    run = Run(gm, lm)
    assert run.place(3.0) == []
    assert not gm.queues.has_work()
    run.node[c.task_id] = (3, 1)
    run.finish(c, 4.0)
    assert run.told == [c.task_id]  # the roots' ends were told before the restart
    assert (U0, job.job_id) not in gm.jobs


# ------------------------------------------------- ends kept while a job is held
def keep(lm: LocalMaster, job: str, on: bool, gm: str = "gm0", at: float = 0.0) -> list[object]:
    msg = KeepEnds(gm=GmId(gm), lm=lm.lm_id, jobs=(JobKeep(user=U0, job_id=JobId(job), keep=on),))
    return lm.handle(msg, at)  # type: ignore[return-value]


def snapshot_ends(lm: LocalMaster) -> set[str]:
    return {h.spec.task_id for h in lm.snapshot(GmId("gm0")).held if h.ended_at >= 0}


def test_an_lm_keeps_the_ends_of_a_job_its_gm_holds_past_its_retention() -> None:
    lm = make_lm(nodes=[(4, 4)] * 2)
    lm.ends.retain_s = 10.0
    held, other = make_task(job="held"), make_task(job="other")
    assert keep(lm, "held", True) == []
    for n, spec in enumerate((held, other)):
        lm.handle(launch_req(spec, n), 0.0)
        lm.handle(report(lm.lm_id, ReportKind.FINISHED, spec, n, 1.0), 1.0)
    lm.handle(Heartbeat(), 5.0)
    assert snapshot_ends(lm) == {held.task_id, other.task_id}
    lm.handle(Heartbeat(), 20.0)  # past retention: only the held job's end stays
    assert snapshot_ends(lm) == {held.task_id}
    assert keep(lm, "held", False) == []  # settled: let go at once
    assert snapshot_ends(lm) == set()
    assert not lm.ends.keep_ends
    assert not lm.ends.kept


@pytest.mark.parametrize("finished", [True, False])
def test_a_late_launch_of_an_attempt_whose_end_is_kept_does_not_run_it_again(
    finished: bool,
) -> None:
    """Past ``retain_s`` a held job's end is only in ``kept``: a late copy of its
    launch (the GM's, redelivered) is answered with the end, as within ``retain_s``, and
    starts nothing; a later attempt's end then replaces the kept one (one end a task)."""
    lm = make_lm(nodes=[(4, 4)])
    lm.ends.retain_s = 10.0
    spec = make_task(job="held")
    keep(lm, "held", True)
    lm.handle(launch_req(spec, 0), 0.0)
    kind = ReportKind.FINISHED if finished else ReportKind.FAILED
    lm.handle(report(lm.lm_id, kind, spec, 0, 1.0), 1.0)
    lm.handle(Heartbeat(), 20.0)  # past retention: kept, no longer in done
    assert (spec.user, spec.task_id) not in lm.ends.done
    again = lm.handle(launch_req(spec, 0), 21.0)
    (answer,) = [e.msg for e in again if isinstance(e.msg, LaunchResponse)]
    assert answer.results[0].reason == ("finished" if finished else "failed")
    assert not lm.nodes.active
    assert not [e for e in again if isinstance(e, ToWorker)]
    lm.handle(launch_req(spec, 0, attempt=2), 22.0)  # the GM's retry: a new attempt
    lm.handle(report(lm.lm_id, ReportKind.FINISHED, spec, 0, 23.0, attempt=2), 23.0)
    assert [h.attempt for h in lm.snapshot(GmId("gm0")).held] == [2]
    assert not lm.ends.kept


def test_a_keep_held_back_until_after_the_let_go_is_ignored() -> None:
    """A GM keeps a job's ends once, then lets them go once: a keep that comes after
    the let-go (held back on the way while its signature was still fresh) would keep
    the job's ends for ever.  It is ignored while the let-go is remembered
    (``retain_s``); the memory of let-gos is bounded by that too."""
    lm = make_lm(nodes=[(4, 4)])
    lm.ends.retain_s = 10.0
    spec = make_task(job="j")
    lm.handle(launch_req(spec, 0), 0.0)
    lm.handle(report(lm.lm_id, ReportKind.FINISHED, spec, 0, 1.0), 1.0)
    assert keep(lm, "j", False, at=2.0) == []
    assert keep(lm, "j", True, at=3.0) == []  # the late keep
    assert not lm.ends.keep_ends
    assert lm.counters.stale_keep_ends == 1
    lm.handle(Heartbeat(), 20.0)
    assert snapshot_ends(lm) == set()  # gone after its retention, as any other job's
    keep(lm, "k", True, at=30.0)  # anything after the let-go's memory: taken as it is
    assert not lm.ends.let_go
    assert keep(lm, "j", True, at=31.0) == []
    assert lm.ends.keep_ends == {(GmId("gm0"), U0, JobId("j")), (GmId("gm0"), U0, JobId("k"))}


def test_an_lm_takes_keep_ends_only_from_a_gm_of_its_own_and_for_itself() -> None:
    lm = make_lm(nodes=[(4, 4)])
    other = KeepEnds(
        gm=GmId("gm0"), lm=LmId("lm9"), jobs=(JobKeep(user=U0, job_id=JobId("j"), keep=True),)
    )
    for msg, reason in (
        (keep(lm, "j", True, gm="gm9"), "unknown_gm"),
        (lm.handle(other, 0.0), "wrong_lm"),
    ):
        assert msg == [Reply(Refused(reason=reason, detail=msg[0].msg.detail))]  # type: ignore[attr-defined]
    assert not lm.ends.keep_ends


def test_an_lm_applies_a_gm_s_keeps_in_one_message_in_the_order_given() -> None:
    """One ``KeepEnds`` carries a turn's keeps and let-gos of several jobs: applied in
    order, a job kept then let go in it is let go; a keep after its let-go is late
    (ignored, counted); another GM's job of the same user and id is not touched."""
    lm = make_lm(nodes=[(4, 4)])
    gm0, gm1 = GmId("gm0"), GmId("gm1")
    assert keep(lm, "j", True, gm="gm1") == []

    def word(job: str, on: bool) -> JobKeep:
        return JobKeep(user=U0, job_id=JobId(job), keep=on)

    jobs = (word("j", True), word("j", False), word("k", False), word("k", True), word("m", True))
    assert lm.handle(KeepEnds(gm=gm0, lm=lm.lm_id, jobs=jobs), 1.0) == []
    assert lm.ends.keep_ends == {(gm1, U0, JobId("j")), (gm0, U0, JobId("m"))}
    assert set(lm.ends.let_go) == {(gm0, U0, JobId("j")), (gm0, U0, JobId("k"))}
    assert lm.counters.stale_keep_ends == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("jkm"), st.booleans(), st.integers(1, 4)), min_size=1, max_size=12
    ),
)
def test_a_batch_of_keeps_does_what_its_jobs_one_message_each_do(
    words: list[tuple[str, bool, int]],
) -> None:
    """Whatever the words and however the service groups them into messages (its turns):
    the same ends kept, let go and ignored as one message per word (the core's own)."""
    one, grouped = make_lm(nodes=[(4, 4)]), make_lm(nodes=[(4, 4)])
    for i, (job, on, _) in enumerate(words):
        keep(one, job, on, at=float(i))
    at, batch = 0.0, list[JobKeep]()
    for i, (job, on, cut) in enumerate(words):
        batch.append(JobKeep(user=U0, job_id=JobId(job), keep=on))
        if cut == 1 or i == len(words) - 1:  # the turn ends: its words leave together
            grouped.handle(KeepEnds(gm=GmId("gm0"), lm=grouped.lm_id, jobs=tuple(batch)), at)
            at, batch = float(i + 1), []
    # (the let-gos' times differ by when each message came: compare what is kept)
    assert grouped.ends.keep_ends == one.ends.keep_ends
    assert set(grouped.ends.let_go) == set(one.ends.let_go)
    assert grouped.counters.stale_keep_ends == one.counters.stale_keep_ends


def keeps(effects: Sequence[object]) -> list[tuple[str, str, bool]]:
    return [
        (e.lm, j.job_id, j.keep)
        for e in effects
        if isinstance(e, ToLm) and isinstance(e.msg, KeepEnds)
        for j in e.msg.jobs
    ]


def test_a_gm_has_every_lm_keep_the_ends_of_a_job_it_holds_long_until_it_settles() -> None:
    lm0, lm1 = make_lm("lm0", nodes=[(4, 4)]), make_lm("lm1", nodes=[(4, 4)])
    users = [UserConfig(user=U0, gm=GmId("gm0"), share=1.0)]
    gm = GlobalMaster(GmId("gm0"), [lm0.lm_id, lm1.lm_id], users, keep_ends_after_s=30.0)
    for lm in (lm0, lm1):
        gm.handle(lm.snapshot(gm.gm_id), 0.0)
    quick = make_task(job="quick")
    a, b = make_task(4, 4, job="long"), make_task(4, 4, job="long")
    submit(gm, [quick], 0.0)
    submit(gm, [a, b], 0.0)
    for req in launches(decide(gm, 1.0, max_tasks=8)):
        (answer, *_) = (lm0 if req.lm == "lm0" else lm1).handle(req, 1.0)
        gm.handle(answer.msg, 1.0)  # type: ignore[attr-defined]
    # quick settled at once; long has a task that found no room: held
    assert gm.jobs[(U0, JobId("quick"))].settled
    assert not gm.jobs[(U0, JobId("long"))].settled
    beat = lm0.snapshot(gm.gm_id).state
    assert keeps(gm.handle(StateUpdated(delta=beat), 29.0)) == []
    assert gm.unchanged_until() == 30.0
    assert keeps(gm.handle(StateUpdated(delta=beat), 30.0)) == [
        ("lm0", "long", True), ("lm1", "long", True),
    ]  # fmt: skip
    assert gm.counters.jobs_keeping_ends == 1
    assert keeps(gm.handle(StateUpdated(delta=beat), 40.0)) == []  # asked once
    # its last task placed: acknowledged, the LMs let its ends go
    placed = next(s for s in (a, b) if state(gm, s) is TaskState.PLACED)
    lm_of = gm.tasks_of([key(placed)])[0].lm
    holder = lm0 if lm_of == "lm0" else lm1
    ended = holder.handle(report(holder.lm_id, ReportKind.FINISHED, placed, 0, 41.0), 41.0)
    gm.handle(TaskEvents(lm=holder.lm_id, events=tuple(e.msg for e in ended if isinstance(e, ToGm))), 41.0)  # fmt: skip
    out: list[object] = []
    for _ in range(3):
        for req in launches(decide(gm, 42.0, max_tasks=8)):
            (answer, *_) = (lm0 if req.lm == "lm0" else lm1).handle(req, 42.0)
            out += gm.handle(answer.msg, 42.0)  # type: ignore[attr-defined]
    assert JobSettled(JobId("long"), U0) in out
    assert keeps(out) == [("lm0", "long", False), ("lm1", "long", False)]


@pytest.mark.parametrize("policy", ["fifo", "carbyne"])
def test_a_dag_held_past_the_lms_retention_runs_nothing_again_after_a_gm_restart(
    policy: str,
) -> None:
    """The roots ended minutes before the GM died; its LM would have forgotten them by
    then, but the GM had asked it to keep them: the restarted GM runs only the child."""
    lm = make_lm(nodes=[(4, 4)] * 4)
    old = fresh_gm(policy, lm)
    job, (a, b, c) = two_stages("jf")
    old.handle(AdmitJob(job=job), 0.0)
    run = Run(old, lm)
    assert sorted(run.place(0.5)) == sorted([a.task_id, b.task_id])
    run.finish(a, 5.0)
    t = 5.0
    while t < 400.0:  # heartbeats: the LM's state to the GM, the GM's asks to the LM
        t += 10.0
        for e in lm.handle(Heartbeat(), t):
            for ask in old.handle(e.msg, t):  # type: ignore[attr-defined]
                if isinstance(ask, ToLm):
                    assert lm.handle(ask.msg, t) == []
    assert a.task_id in snapshot_ends(lm)  # kept long past retain_s
    new = fresh_gm(policy, lm)
    new.handle(AdmitJob(job=job, redelivered=True), 401.0)
    assert Run(new, lm).place(402.0) == []  # a ended, b runs: nothing to run again
    again = Run(new, lm)
    again.node[b.task_id] = run.node[b.task_id]
    again.finish(b, 403.0)
    assert again.place(404.0) == [c.task_id]


def test_an_lm_restart_is_counted_once_however_many_updates_precede_its_snapshot() -> None:
    old = make_lm("lm0", nodes=[(4, 4)])
    gm = GlobalMaster(GmId("gm0"), [old.lm_id], [UserConfig(user=U0, gm=GmId("gm0"), share=1.0)])
    gm.handle(old.snapshot(gm.gm_id), 0.0)
    new = make_lm("lm0", nodes=[(4, 4)])
    new.epoch = old.epoch + 1  # the same LM, restarted
    beat = new.snapshot(gm.gm_id).state
    asked = [gm.handle(StateUpdated(delta=beat), 1.0 + i) for i in range(5)]
    assert gm.counters.lm_restarts_seen == 1
    assert [len(a) for a in asked] == [1, 0, 0, 0, 0]  # one snapshot asked for
    gm.handle(new.snapshot(gm.gm_id), 7.0)
    newer = make_lm("lm0", nodes=[(4, 4)])
    newer.epoch = old.epoch + 2
    gm.handle(StateUpdated(delta=newer.snapshot(gm.gm_id).state), 8.0)
    assert gm.counters.lm_restarts_seen == 2
