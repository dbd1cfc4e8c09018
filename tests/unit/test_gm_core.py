"""The GM core on small hand-built clusters: match, repartition, inconsistency,
fairness (Alg. 2), infeasible tasks, task events, deltas, parking, the ledger, job
admission and settlement.  No event loop, no sleeps: every ``now`` is chosen by the
test, and every input goes through ``handle``."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from msgspec.structs import replace

from common.effects import Effect, JobRefused, JobSettled, Reply, ToLm
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.messages import (
    AdmitJob,
    CancelJob,
    EventKind,
    LaunchRequest,
    LaunchResponse,
    PlacementResult,
    PreemptResponse,
    ReportKind,
    RequestFailed,
    SnapshotRequest,
    StartTask,
    StateDelta,
    TaskEvent,
)
from common.model import TaskSpec, TaskState, UserConfig, WaitReason
from common.overload import OVERLOAD_DEFAULTS, OverloadPolicy
from global_master.core import AdmissionLimits, GlobalMaster
from global_master.core_users import CANCELLED
from local_master.core import LocalMaster
from tests.conftest import (
    Network,
    alive,
    as_events,
    check_workers,
    confirm_stops,
    decide,
    events,
    failures,
    heartbeat,
    jobs_of,
    key,
    launch_req,
    launches,
    make_gm,
    make_lm,
    make_task,
    outcomes,
    preempts,
    queued,
    replies,
    report,
    state,
    submit,
    sync_views,
    task_of,
)

GM0, GM1 = GmId("gm0"), GmId("gm1")
LM0, LM1 = LmId("lm0"), LmId("lm1")


def deliver(
    lm: LocalMaster, gm: GlobalMaster, effects: Sequence[Effect], now: float
) -> list[Effect]:
    """Hand every GM request in ``effects`` to ``lm``, and every answer back to ``gm``.

    Returns the GM's requests made while handling the answers (its retries)."""
    out: list[Effect] = []
    for e in effects:
        if isinstance(e, ToLm) and e.lm == lm.lm_id:
            msg = e.msg
            if isinstance(msg, LaunchRequest):
                msg = replace(msg, sent_at=now)
            for answer in lm.handle(msg, now):
                if isinstance(answer, Reply):
                    out.extend(gm.handle(answer.msg, now))
    return [e for e in out if not isinstance(e, JobSettled)]


def refusal(gm: GlobalMaster, lm: LmId, request_id: int) -> LaunchResponse:
    """A refusal carrying no news: the GM's view stays as stale as it was."""
    view = gm.views[lm]
    return LaunchResponse(
        gm=gm.gm_id,
        lm=lm,
        request_id=request_id,
        results=(PlacementResult(accepted=False, reason="insufficient_resources"),),
        delta=StateDelta(
            lm=lm,
            version=view.version,
            base_version=view.version,
            nodes=(),
            free=(),
            node_versions=(),
            usage=dict(view.usage),
        ),
    )


def occupy(lm: LocalMaster, spec: TaskSpec, node: int = 0, gm: GmId = GM0) -> None:
    """Another party's task holds ``spec.demand`` on ``node``."""
    (reply, *_) = lm.handle(launch_req(spec, node, gm=gm), 0.0)
    assert isinstance(reply, Reply)
    assert isinstance(reply.msg, LaunchResponse)
    assert reply.msg.results[0].accepted


# --------------------------------------------------------------------- match
def test_match_ands_the_constraint_vectors_and_fits_every_resource() -> None:
    lm = make_lm(nodes=[(8, 8, 0b001), (1, 8, 0b011), (8, 1, 0b111), (8, 8, 0b011)])
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task(2, 2, constraints=0b011)
    submit(gm, [t], 0.0)
    (req,) = launches(decide(gm, 1.0))
    assert [(p.spec, p.node, p.repartition) for p in req.placements] == [(t, 3, False)]
    assert state(gm, t) is TaskState.DISPATCHED
    assert gm.views[LM0].free[3] == [6, 6]  # reserved in the view until the answer


def test_internal_partitions_are_walked_round_robin_over_lms() -> None:
    """A decision round fills one LM (one launch request); the next round starts at the
    next LM; a round that fills an LM goes on with the next."""
    lm0, lm1 = make_lm("lm0"), make_lm("lm1")
    gm = make_gm(lms=["lm0", "lm1"])
    sync_views(gm, lm0, lm1)
    submit(gm, [make_task() for _ in range(4)], 0.0)
    first = launches(decide(gm, 1.0, max_tasks=2))
    second = launches(decide(gm, 1.0, max_tasks=2))
    assert [(r.lm, len(r.placements)) for r in first + second] == [(LM0, 2), (LM1, 2)]
    submit(gm, [make_task(3, 3, job="j1"), make_task(3, 3, job="j1")], 2.0)
    reqs = launches(decide(gm, 3.0, max_tasks=2))  # lm0's turn, with room for one
    assert [(r.lm, len(r.placements)) for r in reqs] == [(LM0, 1), (LM1, 1)]


def test_internal_partition_is_preferred_to_repartition() -> None:
    lm = make_lm(nodes=[(8, 8), (8, 8)], home=["gm1", "gm0"])
    gm = make_gm()
    sync_views(gm, lm)
    submit(gm, [make_task()], 0.0)
    (req,) = launches(decide(gm, 1.0))
    assert req.placements[0].node == 1
    assert not req.placements[0].repartition


def test_no_internal_match_asks_for_a_repartition_round_robin_over_lms() -> None:
    lm0 = make_lm("lm0", nodes=[(2, 2), (8, 8)], home=["gm0", "gm1"])
    lm1 = make_lm("lm1", nodes=[(8, 8)], home=["gm1"])
    gm = make_gm(lms=["lm0", "lm1"])
    sync_views(gm, lm0, lm1)
    a, b = make_task(4, 4), make_task(4, 4)
    submit(gm, [a, b], 0.0)
    reqs = launches(decide(gm, 1.0)) + launches(decide(gm, 1.0))  # two rounds
    got = {r.lm: [(p.spec, p.node, p.repartition) for p in r.placements] for r in reqs}
    assert got == {LM0: [(a, 1, True)], LM1: [(b, 0, True)]}
    assert gm.counters.repartition_requests == 2
    # the LM carves a logical node out of gm1's node and launches
    retries = deliver(lm0, gm, [ToLm(LM0, reqs[0])], 2.0)
    assert retries == []
    assert state(gm, a) is TaskState.PLACED
    assert lm0.logical_nodes() == [(key(a), 1, GM0, (4, 4))]


def test_infeasible_task_fails_explicitly() -> None:
    lm = make_lm(nodes=[(4, 4, 0b01)])
    gm = make_gm()
    sync_views(gm, lm)
    too_big, unmet = make_task(5, 1, job="big"), make_task(1, 1, constraints=0b10)
    assert isinstance(submit(gm, [too_big], 0.0)[0], JobRefused)  # no node is that big
    submit(gm, [unmet], 0.0)
    effects = decide(gm, 1.0)
    (f,) = failures(effects)
    assert (f.task.spec, f.task.gm) == (unmet, GM0)
    assert "infeasible" in f.reason
    assert f.task.waits[WaitReason.NO_CONSTRAINT_MATCH] == 1
    assert gm.counters.failed == 1
    assert len(gm.queues) == 0
    # its job is settled (the failure is explicit) and done: nothing is kept of it
    assert any(isinstance(e, JobSettled) for e in effects)
    assert gm.jobs == {}


# ------------------------------------------------------------- inconsistency
@pytest.mark.parametrize("external", [False, True])
def test_inconsistency_refreshes_the_view_and_retries_at_once(external: bool) -> None:
    home = ["gm1", "gm1"] if external else ["gm0", "gm0"]
    lm = make_lm(nodes=[(4, 4), (4, 4)], home=home)
    gm = make_gm()
    sync_views(gm, lm)
    # another GM fills node 0 behind gm0's back: gm0's view is now stale
    occupy(lm, make_task(4, 4, user="x"), 0, gm=GM1)
    t = make_task(3, 3)
    submit(gm, [t], 0.0)
    first = decide(gm, 1.0)
    assert launches(first)[0].placements[0].node == 0
    retry = deliver(lm, gm, first, 2.0)
    # the refusal's delta corrected the view; the retry goes to node 1 right away
    assert gm.views[LM0].free[0][0] <= 0
    (again,) = launches(retry)
    assert again.placements[0].node == 1
    assert again.placements[0].repartition is external
    assert again.placements[0].attempt == 2  # a new attempt
    if external:
        assert gm.counters.external_inconsistencies == 1
    else:
        assert gm.counters.internal_inconsistencies == 1
    assert task_of(gm, t).waits[WaitReason.REFUSED_BY_LM] == 1
    assert deliver(lm, gm, retry, 3.0) == []
    assert state(gm, t) is TaskState.PLACED


@pytest.mark.parametrize("external", [False, True])
def test_a_rerouted_placement_counts_the_inconsistency_and_is_placed_without_retry(
    external: bool,
) -> None:
    home = ["gm1", "gm1"] if external else ["gm0", "gm0"]
    lm = make_lm(nodes=[(4, 4), (4, 4)], home=home, reroute=True)
    gm = make_gm()
    sync_views(gm, lm)
    occupy(lm, make_task(4, 4, user="x"), 0, gm=GM1)  # behind gm0's back
    t = make_task(3, 3)
    submit(gm, [t], 0.0)
    first = decide(gm, 1.0)
    assert launches(first)[0].placements[0].node == 0
    assert deliver(lm, gm, first, 2.0) == []  # nothing to send again
    assert state(gm, t) is TaskState.PLACED
    assert lm.active[key(t)].node == 1
    assert list(gm.views[LM0].free[1]) == [1, 1]  # the answer's delta says where it went
    counted = (gm.counters.internal_inconsistencies, gm.counters.external_inconsistencies)
    assert counted == ((0, 1) if external else (1, 0))
    assert gm.counters.rerouted == 1
    assert task_of(gm, t).waits[WaitReason.REFUSED_BY_LM] == 0


@pytest.mark.parametrize("window", [0, 1])
def test_with_a_launch_window_placements_wait_for_the_answer_and_share_the_next_request(
    window: int,
) -> None:
    lm = make_lm(nodes=[(4, 4)] * 4)
    gm = make_gm(overload=OverloadPolicy(launch_window=window))
    sync_views(gm, lm)
    a, b, c = make_task(), make_task(), make_task()
    submit(gm, [a, b, c], 0.0)
    first = decide(gm, 1.0)
    second = decide(gm, 1.1) + decide(gm, 1.2)  # before the first request is answered
    if not window:  # every decision round sends its own request
        assert [len(r.placements) for r in launches(first + second)] == [1, 1, 1]
        return
    assert launches(second) == []
    assert {state(gm, t) for t in (b, c)} == {TaskState.DISPATCHED}  # decided, held
    assert gm.views[LM0].pending[0] == [3, 3]  # all three stay reserved on node 0
    after = deliver(lm, gm, first, 2.0)  # the answer opens the window
    (held,) = launches(after)
    assert [p.spec.task_id for p in held.placements] == [b.task_id, c.task_id]
    assert gm.counters.launch_requests == 2
    assert deliver(lm, gm, after, 3.0) == []
    assert {state(gm, t) for t in (a, b, c)} == {TaskState.PLACED}


def test_a_full_batch_of_held_placements_leaves_without_waiting_for_the_answer() -> None:
    # Nagle's full segment: a trickle waits for the answer, a burst does not wait a
    # round trip; one request beyond the window at most
    lm = make_lm(nodes=[(8, 8)] * 4)
    gm = make_gm(overload=OverloadPolicy(launch_window=1, launch_full_batch=2))
    sync_views(gm, lm)
    tasks = [make_task() for _ in range(6)]
    submit(gm, tasks, 0.0)
    first = decide(gm, 1.0)
    assert launches(decide(gm, 1.1)) == []  # one held: it waits for company
    (burst,) = launches(decide(gm, 1.2))  # two held: a full batch leaves at once
    assert [p.spec.task_id for p in burst.placements] == [t.task_id for t in tasks[1:3]]
    assert launches(decide(gm, 1.3) + decide(gm, 1.4) + decide(gm, 1.5)) == []  # 2 open
    (held,) = launches(deliver(lm, gm, first, 2.0))  # an answer opens the window
    assert [p.spec.task_id for p in held.placements] == [t.task_id for t in tasks[3:]]


def test_by_default_a_burst_of_placements_does_not_wait_for_the_answer() -> None:
    lm = make_lm(nodes=[(16, 16)] * 4)
    gm = make_gm(overload=OVERLOAD_DEFAULTS)
    sync_views(gm, lm)
    n = OVERLOAD_DEFAULTS.launch_full_batch
    submit(gm, [make_task() for _ in range(1 + n)], 0.0)
    first = decide(gm, 1.0)
    second = decide(gm, 1.1, n)  # before the first request is answered
    assert [len(r.placements) for r in launches(first + second)] == [1, n]


def test_refused_too_often_the_task_goes_to_the_back_of_its_queue() -> None:
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm(max_retries=2)
    sync_views(gm, lm)
    t, other = make_task(), make_task()
    submit(gm, [t, other], 0.0)
    (req,) = launches(decide(gm, 1.0))
    for attempt in range(3):
        effects = gm.handle(refusal(gm, LM0, req.request_id), 2.0 + attempt)
        if attempt < 2:
            (req,) = launches(effects)
            assert state(gm, t) is TaskState.DISPATCHED
        else:
            assert effects == []
    assert state(gm, t) is TaskState.QUEUED
    assert queued(gm) == [other, t]
    assert gm.counters.requeues == 1
    assert task_of(gm, t).decisions == 3
    assert gm.views[LM0].pending == [None]  # every reservation released


def test_a_request_that_gets_no_answer_is_a_refusal_and_requeues() -> None:
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task()
    submit(gm, [t], 0.0)
    (req,) = launches(decide(gm, 1.0))
    assert gm.handle(RequestFailed(lm=LM0, request_id=req.request_id, reason="x"), 2.0) == []
    assert state(gm, t) is TaskState.QUEUED
    assert gm.views[LM0].pending == [None]


# ------------------------------------------------------------------ fairness
def fairness_gm(shares: dict[str, float]) -> GlobalMaster:
    users = [(u, "gm0", s) for u, s in shares.items()]
    return make_gm(users=users)


def test_under_share_user_preempts_the_largest_violator() -> None:
    lm = make_lm(nodes=[(10, 10)])
    gm = fairness_gm({"a": 0.2, "c": 0.2, "b": 0.6})
    for user, cpu in (("a", 4), ("c", 6)):  # both remain richer than b after the move
        occupy(lm, make_task(cpu, cpu, user=user))
    sync_views(gm, lm)
    t = make_task(2, 2, user="b")
    submit(gm, [t], 0.0)
    effects = decide(gm, 1.0)
    (req,) = preempts(effects)
    assert req.victim == UserId("c")
    assert req.spec is t
    assert state(gm, t) is TaskState.DISPATCHED
    assert task_of(gm, t).waits[WaitReason.NO_FREE_RESOURCES] == 1
    deliver(lm, gm, effects, 2.0)
    assert state(gm, t) is TaskState.PLACED
    assert gm.counters.preemptions_granted == 1


def test_failed_verification_tries_the_next_victim_then_requeues() -> None:
    lm = make_lm(nodes=[(10, 10)])
    gm = fairness_gm({"a": 0.2, "c": 0.2, "b": 0.6})
    for user, cpu in (("a", 4), ("c", 6)):  # both remain richer than b after the move
        occupy(lm, make_task(cpu, cpu, user=user))
    sync_views(gm, lm)
    t = make_task(2, 2, user="b")
    submit(gm, [t], 0.0)
    (req,) = preempts(decide(gm, 1.0))
    victims = [req.victim]
    for _ in range(2):
        view = gm.views[LM0]
        refused = PreemptResponse(
            gm=GM0,
            lm=LM0,
            request_id=req.request_id,
            accepted=False,
            reason="no_victim",
            node=None,
            preempted=(),
            delta=StateDelta(
                lm=LM0,
                version=view.version,
                base_version=view.version,
                nodes=(),
                free=(),
                node_versions=(),
                usage=dict(view.usage),
            ),
        )
        nxt = preempts(gm.handle(refused, 2.0))
        if not nxt:
            break
        req = nxt[0]
        victims.append(req.victim)
    assert victims == [UserId("c"), UserId("a")]
    assert state(gm, t) is TaskState.QUEUED
    assert task_of(gm, t).waits[WaitReason.PREEMPTION_FAILED] == 1


def _refusal(gm: GlobalMaster, request_id: int, delta: StateDelta | None = None) -> PreemptResponse:
    """``lm0``'s refusal of preemption request ``request_id`` (no victim there), with
    ``delta`` (default: nothing new)."""
    view = gm.views[LM0]
    if delta is None:
        delta = StateDelta(lm=LM0, version=view.version, base_version=view.version, nodes=(),
                           free=(), node_versions=(), usage=dict(view.usage))  # fmt: skip
    return PreemptResponse(gm=GM0, lm=LM0, request_id=request_id, accepted=False,
                           reason="no_victim", node=None, preempted=(), delta=delta)  # fmt: skip


def test_a_refused_preemption_of_a_cancelled_job_ends_its_task_and_asks_no_other_victim() -> None:
    """Found by ``test_cancel_stateful``: a refusal used to try the next victim even
    when the task's job had been cancelled meanwhile (a request left after the cancel)."""
    lm = make_lm(nodes=[(10, 10)])
    gm = fairness_gm({"a": 0.2, "c": 0.2, "b": 0.6})
    for user, cpu in (("a", 4), ("c", 6)):
        occupy(lm, make_task(cpu, cpu, user=user))
    sync_views(gm, lm)
    t = make_task(2, 2, user="b", job="jb")
    submit(gm, [t], 0.0)
    (req,) = preempts(decide(gm, 1.0))
    assert gm.handle(CancelJob(user=UserId("b"), job_id=JobId("jb")), 1.5) == []  # in flight
    effects = gm.handle(_refusal(gm, req.request_id), 2.0)
    assert preempts(effects) == []
    assert launches(effects) == []
    (out,) = outcomes(effects)
    assert (out.task.key, out.finished, out.reason) == (key(t), False, CANCELLED)
    assert state(gm, t) is None


def test_a_refused_preemption_whose_answer_frees_room_places_the_task_there() -> None:
    """Found by ``test_cancel_stateful`` (a task queued for ever on an idle
    federation): the refusal's delta changed the view (a node freed) before the task
    went back to its queue, and the queue parked until the *next* change; and before
    that, the next victim was asked for though the node had room.  The task is placed
    on the room the answer's view shows."""
    lm = make_lm(nodes=[(10, 10)])
    gm = fairness_gm({"a": 0.2, "c": 0.2, "b": 0.6})
    occupy(lm, make_task(4, 4, user="a"))
    c = make_task(6, 6, user="c")
    occupy(lm, c)
    sync_views(gm, lm)
    t = make_task(2, 2, user="b")
    submit(gm, [t], 0.0)
    (req,) = preempts(decide(gm, 1.0))
    assert req.victim == UserId("c")
    # c's task ends on its own before the preemption request comes: no victim there
    lm.handle(report(LM0, ReportKind.FINISHED, c, 0, 1.5), 1.5)
    delta = lm.nodes.delta_since(gm.views[LM0].version)
    effects = gm.handle(_refusal(gm, req.request_id, delta), 2.0)
    assert preempts(effects) == []  # not a (needless) preemption of a's task
    (launch,) = launches(effects)
    assert [p.spec for p in launch.placements] == [t]
    assert state(gm, t) is TaskState.DISPATCHED


def test_at_share_user_is_requeued_at_the_back() -> None:
    lm = make_lm(nodes=[(4, 4)])
    gm = fairness_gm({"a": 0.5, "b": 0.5})
    occupy(lm, make_task(2, 2, user="a"))
    occupy(lm, make_task(2, 2, user="b", job="other"))
    sync_views(gm, lm)
    t1, t2 = make_task(2, 2, user="b"), make_task(1, 1, user="b")
    submit(gm, [t1, t2], 0.0)
    assert decide(gm, 1.0) == []
    assert queued(gm) == [t2, t1]
    assert task_of(gm, t1).waits[WaitReason.USER_AT_SHARE] == 1
    assert gm.counters.requeues == 1


def test_fairness_is_never_checked_while_resources_are_free() -> None:
    lm = make_lm(nodes=[(8, 8), (2, 2)], home=["gm0", "gm1"])
    gm = fairness_gm({"a": 0.3, "b": 0.7})
    occupy(lm, make_task(6, 6, user="a"))
    sync_views(gm, lm)
    t = make_task(2, 2, user="b")
    submit(gm, [t], 0.0)
    effects = decide(gm, 1.0)
    assert preempts(effects) == []
    assert len(launches(effects)) == 1
    assert gm.counters.preemption_attempts == 0


def test_preempted_tasks_go_back_to_the_front_of_their_own_queue() -> None:
    lm = make_lm(nodes=[(4, 4)])
    gm = fairness_gm({"a": 0.5, "b": 0.5})
    sync_views(gm, lm)
    # a holds the whole node with two tasks; b asks for half: after the move both
    # sit exactly at their share, so the preemption makes the allocation fairer
    victim, other = make_task(2, 2, user="a"), make_task(2, 2, user="a")
    waiting = make_task(1, 1, user="a", job="j1")
    submit(gm, [victim, other], 0.0)
    assert deliver(lm, gm, decide(gm, 1.0, max_tasks=2), 1.0) == []
    submit(gm, [waiting], 1.5)
    assert decide(gm, 2.0) == []  # a is over its share: its own task waits
    t = make_task(2, 2, user="b")
    submit(gm, [t], 2.0)
    effects = decide(gm, 3.0)
    assert preempts(effects)[0].victim == UserId("a")
    for e in effects:
        assert isinstance(e, ToLm)
        answers = lm.handle(e.msg, 4.0)
        for r in replies(answers):
            gm.handle(r, 5.0)
        gm.handle(as_events(LM0, events(answers)), 5.0)
        assert state(gm, victim) is not TaskState.QUEUED  # its stop is not confirmed yet
        gm.handle(as_events(LM0, events(confirm_stops(lm, answers, 4.5))), 5.0)
    # accepted together and neither started: the LM takes the first of a's it finds
    assert state(gm, victim) is TaskState.QUEUED
    assert queued(gm) == [victim, waiting]
    assert gm.counters.preempted_requeued == 1
    marks = task_of(gm, victim).marks
    assert marks[-1][1] == 0  # back in the queue (Phase.QUEUEING)


# ------------------------------------------------------------- task events
def test_task_events_move_tasks_between_states_and_tell_the_user() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4)])
    gm = make_gm()
    net = Network({GM0: gm}, {LM0: lm})
    net.start(0.0)
    a, b = make_task(), make_task()
    net.submit(GM0, [a, b], 0.0)
    net.place_and_start(GM0, 1.0, 2.0, max_tasks=2)
    net.finish(a.task_id, 3.0)
    net.finish(b.task_id, 3.0, kind="failed")
    net.run(3.0)
    assert net.outcomes[key(a)].finished
    assert not net.outcomes[key(b)].finished
    assert "failed on worker" in net.outcomes[key(b)].reason
    assert gm.views[LM0].free == [(4, 4), (4, 4)]  # learnt from the events, not a heartbeat
    assert gm.jobs == {}  # the job is done: nothing of it stays behind
    assert len(net.settled) == 1


def test_a_lost_worker_without_room_returns_its_task_to_the_front() -> None:
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm()
    net = Network({GM0: gm}, {LM0: lm})
    net.start(0.0)
    t, later = make_task(), make_task(job="j1")
    net.submit(GM0, [t], 0.0)
    net.place_and_start(GM0, 1.0, 1.0)
    net.submit(GM0, [later], 1.5)
    net.lose_node(LM0, NodeIndex(0))
    net.send(check_workers(lm, 10.0, timeout=5.0), 10.0, src_lm=LM0)
    net.run(10.0)
    assert state(gm, t) is TaskState.QUEUED
    assert queued(gm) == [t, later]
    alive(lm, 11.0, 0)
    net.heartbeat(LM0, 11.0)
    net.run(11.0)
    net.decide(GM0, 12.0)
    net.run(12.0)
    assert state(gm, t) is TaskState.PLACED
    assert task_of(gm, t).attempt == 2


# -------------------------------------------------------- submission checks
def test_unknown_users_and_duplicate_ids_are_refused_whole() -> None:
    lm = make_lm()
    gm = make_gm(users=[("u0", "gm0", 1.0), ("other", "gm1", 1.0)])
    sync_views(gm, lm)
    (refused,) = submit(gm, [make_task(user="other")], 0.0)
    assert isinstance(refused, JobRefused)
    assert refused.reason == "unknown_user"
    assert len(gm.queues) == 0
    t = make_task()
    (refused,) = submit(gm, [t, make_task(task_id=t.task_id)], 0.0)
    assert isinstance(refused, JobRefused)
    assert refused.reason == "duplicate_task_id"
    assert len(gm.queues) == 0


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (make_task(0, 0), "zero_demand"),
        (make_task(9, 1), "impossible_resources"),
        (make_task(duration=1e300), "duration_too_long"),
    ],
)
def test_impossible_or_unbounded_tasks_are_refused_with_the_reason(
    spec: TaskSpec, reason: str
) -> None:
    gm = make_gm()
    sync_views(gm, make_lm())
    (refused,) = submit(gm, [spec], 0.0)
    assert isinstance(refused, JobRefused)
    assert refused.reason == reason
    assert gm.jobs == {}


def test_commands_are_refused_where_the_federation_runs_none() -> None:
    """Without ``task_commands`` a task with a command is refused at admission, not run
    as if it had none (and reported finished)."""
    users = [UserConfig(user=UserId("u0"), gm=GmId("gm0"), share=1.0)]
    with_command = replace(make_task(), command=("/bin/true",))
    for commands, refusal in ((False, "commands_disabled"), (True, None)):
        gm = GlobalMaster(GmId("gm0"), [LmId("lm0")], users,
                          limits=AdmissionLimits(commands=commands))  # fmt: skip
        sync_views(gm, make_lm())
        out = submit(gm, [with_command], 0.0)
        assert [e.reason for e in out if isinstance(e, JobRefused)] == (
            [refusal] if refusal else []
        )


def test_a_user_s_job_may_not_carry_a_returned_task_s_attempt() -> None:
    gm = make_gm()
    sync_views(gm, make_lm())
    (job,) = jobs_of([make_task()], 0.0)
    (refused,) = gm.handle(AdmitJob(job=replace(job, attempt=3)), 0.0)
    assert isinstance(refused, JobRefused)
    assert refused.reason == "reserved_field"


def test_a_reused_job_id_is_refused_and_a_redelivery_is_recognised() -> None:
    lm = make_lm()
    gm = make_gm()
    sync_views(gm, lm)
    submit(gm, [make_task(job="j9")], 0.0)
    (refused,) = submit(gm, [make_task(job="j9")], 1.0)
    assert isinstance(refused, JobRefused)
    assert refused.reason == "duplicate_job_id"
    # the same job delivered again (its ack was lost) changes nothing
    assert submit(gm, [make_task(job="j9")], 1.0, redelivered=True) == []
    assert len(gm.queues) == 1


def test_a_task_already_running_before_a_restart_is_adopted_not_queued_again() -> None:
    lm = make_lm()
    t = make_task()
    occupy(lm, t)
    fresh = make_gm()
    sync_views(fresh, lm)
    effects = submit(fresh, [t], 1.0, redelivered=True)
    assert len(fresh.queues) == 0
    assert fresh.counters.redelivered_skipped == 1
    assert state(fresh, t) is TaskState.PLACED
    assert effects == [JobSettled(t.job_id, t.user)]
    # its events reach the GM that adopted it
    (ev,) = events(lm.handle(report(LM0, ReportKind.FINISHED, t, 0, 2.0), 2.0))
    (out,) = outcomes(fresh.handle(as_events(LM0, [ev]), 2.5))
    assert out.finished


# -------------------------------------------------------------------- deltas
def test_deltas_apply_in_any_order_and_a_gap_asks_for_a_snapshot() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4)])
    a, b = make_gm(), make_gm()
    sync_views(a, lm)
    sync_views(b, lm)
    occupy(lm, make_task(1, 1), 0)
    (h1,) = heartbeat(lm, 1.0)
    occupy(lm, make_task(2, 2), 1)
    occupy(lm, make_task(1, 1), 0)
    (h2,) = heartbeat(lm, 2.0)
    assert a.handle(h1.msg, 3.0) == []
    assert a.handle(h2.msg, 3.0) == []
    gap = b.handle(h2.msg, 3.0)
    assert [type(e.msg) for e in gap if isinstance(e, ToLm)] == [SnapshotRequest]
    assert b.handle(h2.msg, 3.0) == []  # asked once, not again
    b.handle(h1.msg, 3.0)
    for gm in (a, b):
        assert gm.views[LM0].free == [(2, 2), (2, 2)]
        assert gm.views[LM0].node_version == [3, 2]
    assert a.views[LM0].version == 3
    assert b.counters.gaps == 2  # h2 was delivered twice
    assert b.views[LM0].version == 1  # incomplete until the snapshot arrives
    (snap,) = lm.handle(gap[0].msg, 3.0)
    assert isinstance(snap, Reply)
    b.handle(snap.msg, 3.0)
    assert b.views[LM0].version == 3
    # an old update never takes the view back
    a.handle(h1.msg, 4.0)
    assert a.views[LM0].free == [(2, 2), (2, 2)]
    assert a.views[LM0].version == 3


# ----------------------------------------------------------- queue parking
def test_queues_park_until_the_view_changes() -> None:
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm(patience=2)
    blocker = make_task(4, 4, job="blocker")
    occupy(lm, blocker)
    sync_views(gm, lm)
    submit(gm, [make_task(), make_task(), make_task()], 0.0)
    assert gm.has_work()
    decide(gm, 1.0, max_tasks=5)
    assert gm.counters.decisions == 2
    assert not gm.has_work()
    # a report about a task the LM does not hold changes nothing
    lm.handle(report(LM0, ReportKind.FINISHED, make_task(), 0, 1.0), 1.0)
    lm.handle(report(LM0, ReportKind.FINISHED, blocker, 0, 2.0), 2.0)
    (hb,) = heartbeat(lm, 2.0)
    gm.handle(hb.msg, 2.0)
    assert gm.has_work()
    assert len(launches(decide(gm, 3.0, max_tasks=5))) == 1


# -------------------------------------------------------------------- ledger
def test_allocation_time_components_add_up_to_start_minus_submit() -> None:
    lm = make_lm()
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task()
    submit(gm, [t], 0.0)
    (req,) = launches(decide(gm, 1.0))  # queueing 0 -> 1
    req = replace(req, sent_at=1.5)  # GM processing 1 -> 1.5 (stamped by the driver)
    reply, start = lm.handle(req, 3.0)  # the LM answers at 3
    assert isinstance(reply, Reply)
    assert isinstance(reply.msg, LaunchResponse)
    # it received the request at 2: wire 1.5 -> 2, LM processing 2 -> 3
    gm.handle(replace(reply.msg, received_at=2.0), 3.2)
    assert isinstance(start.msg, StartTask)
    # wire 3 -> 3.5; the worker starts it at 5: worker queueing 3.5 -> 5; it ends at 6
    ended = report(LM0, ReportKind.FINISHED, t, start.msg.node, 6.0, worker_at=3.5, started_at=5.0)
    (ev,) = events(lm.handle(ended, 6.0))
    (out,) = outcomes(gm.handle(as_events(LM0, [ev]), 6.5))
    task = out.task
    assert task.components()[:4] == pytest.approx([1.0, 1.5, 1.0, 1.5])
    assert task.allocation_time == pytest.approx(task.started_at - task.submitted_at) == 5.0
    # the end reached the GM 0.5 s after it happened: its view held the slot that long
    assert (gm.counters.ends_seen, gm.counters.end_lag_s) == (1, pytest.approx(0.5))


def test_the_ledger_adds_up_through_an_inconsistency_retry() -> None:
    lm = make_lm(nodes=[(4, 4), (4, 4)])
    gm = make_gm()
    sync_views(gm, lm)
    occupy(lm, make_task(4, 4, user="x"), 0, gm=GM1)
    t = make_task(4, 4)
    submit(gm, [t], 0.0)
    (first,) = launches(decide(gm, 1.0))
    (answer, *_) = lm.handle(replace(first, sent_at=1.1), 1.4)
    assert isinstance(answer, Reply)
    retry = gm.handle(replace(answer.msg, received_at=1.2), 1.6)  # type: ignore[type-var]
    (req,) = launches(retry)
    reply, start = lm.handle(replace(req, sent_at=1.7), 2.0)
    assert isinstance(reply, Reply)
    gm.handle(replace(reply.msg, received_at=1.9), 2.1)  # type: ignore[type-var]
    assert isinstance(start.msg, StartTask)
    rep = report(
        LM0, ReportKind.FINISHED, t, start.msg.node, 3.0, attempt=2, worker_at=2.2, started_at=2.5
    )
    (out,) = outcomes(gm.handle(as_events(LM0, events(lm.handle(rep, 3.0))), 3.1))
    task = out.task
    spent = task.components()
    assert task.allocation_time == pytest.approx(2.5)
    assert spent[0] == pytest.approx(1.0)
    # wire 1.1->1.2, 1.4->1.6, 1.7->1.9, 2.0->2.2; processing the rest
    assert spent[2] == pytest.approx(0.1 + 0.2 + 0.2 + 0.2)
    assert spent[3] == pytest.approx(0.3)
    assert spent[1] == pytest.approx(0.1 + 0.2 + 0.1 + 0.1)


def test_a_preempted_task_counts_its_lost_run_and_its_second_wait() -> None:
    """Allocation time runs to the final start; the run thrown away is its own component."""
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm()
    net = Network({GM0: gm}, {LM0: lm})
    net.start(0.0)
    t = make_task(4, 4)
    net.submit(GM0, [t], 0.0)
    net.place_and_start(GM0, 1.0, 2.0)  # starts at 2
    a = lm.active[key(t)]
    ev = TaskEvent(
        kind=EventKind.PREEMPTED, lm=LM0, gm=GM0, user=t.user, task_id=t.task_id,
        attempt=a.attempt, node=a.node, node_free=(4, 4), node_version=lm.version + 1,
        at=5.0, worker_at=2.0, started_at=2.0,
    )  # fmt: skip
    lm.active.clear()
    lm.free[0] = [4, 4]
    gm.handle(as_events(LM0, [ev]), 5.0)
    net.place_and_start(GM0, 6.0, 7.0)
    net.finish(t.task_id, 9.0)
    net.run(9.0)
    task = net.outcomes[key(t)].task
    assert task.first_allocation_time == pytest.approx(2.0)
    assert task.allocation_time == pytest.approx(7.0)
    assert task.components()[4] == pytest.approx(3.0)  # ran 2 -> 5, thrown away
    assert sum(task.components()) == pytest.approx(7.0)


# ------------------------------------------------ events overtaking answers
def test_an_event_that_overtakes_the_answer_settles_the_request() -> None:
    """The task finished before the LM's answer arrived (HTTP reply vs AMQP event)."""
    lm = make_lm()
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task(2, 2)
    submit(gm, [t], 0.0)
    (req,) = launches(decide(gm, 1.0))
    answer, *_ = lm.handle(req, 2.0)
    assert isinstance(answer, Reply)
    a = lm.active[key(t)]
    (ev,) = events(lm.handle(report(LM0, ReportKind.FINISHED, t, a.node, 3.0), 3.0))
    (out,) = outcomes(gm.handle(as_events(LM0, [ev]), 3.5))
    assert out.finished
    assert state(gm, t) is None  # finished, its job done: forgotten
    assert gm.views[LM0].pending == [None, None]
    gm.handle(answer.msg, 4.0)  # the late answer changes nothing
    assert state(gm, t) is None
    assert key(t) not in gm.placed


def test_a_late_answer_does_not_settle_a_newer_request_of_the_same_task() -> None:
    """Accepted, then its worker died and the LM returned it, all before the answer
    came: the task is re-dispatched, and the old answer must not be taken for the new
    request's (that would mark it placed while no LM runs it)."""
    lm0 = make_lm("lm0", nodes=[(4, 4)])
    lm1 = make_lm("lm1", nodes=[(4, 4)])
    gm = make_gm(lms=["lm0", "lm1"])
    sync_views(gm, lm0, lm1)
    t = make_task(2, 2)
    submit(gm, [t], 0.0)
    (req,) = launches(decide(gm, 1.0))
    assert req.lm == LM0
    old_answer, *_ = lm0.handle(req, 1.5)
    alive(lm0, 0.0)
    (returned,) = events(check_workers(lm0, 10.0, timeout=1.0))
    gm.handle(as_events(LM0, [returned]), 10.5)
    assert state(gm, t) is TaskState.QUEUED
    (again,) = launches(decide(gm, 11.0))
    assert again.lm == LM1
    assert isinstance(old_answer, Reply)
    gm.handle(old_answer.msg, 11.5)
    assert state(gm, t) is TaskState.DISPATCHED
    assert deliver(lm1, gm, [ToLm(LM1, again)], 12.0) == []
    assert state(gm, t) is TaskState.PLACED
    assert key(t) in lm1.active
    assert gm.views[LM0].pending == [None]
    assert gm.views[LM1].pending == [None]


def test_a_snapshot_overtaken_by_a_newer_update_does_not_take_the_view_back() -> None:
    """Within one LM incarnation versions never go back: a snapshot answered before an
    update the view has applied since is merged node by node, not taken wholesale."""
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm()
    sync_views(gm, lm)
    snap = lm.snapshot(GM0)  # the answer to a snapshot request, still on the wire
    occupy(lm, make_task(2, 2))
    (hb,) = heartbeat(lm, 1.0)
    gm.handle(hb.msg, 1.5)
    assert list(map(list, gm.views[LM0].free)) == [[2, 2]]
    gm.handle(snap, 2.0)
    assert list(map(list, gm.views[LM0].free)) == [[2, 2]]


def test_a_redelivered_preempted_event_does_not_queue_the_task_twice() -> None:
    """Events carry the attempt: a second copy is about an attempt no longer placed."""
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task(4, 4)
    submit(gm, [t], 0.0)
    deliver(lm, gm, decide(gm, 1.0), 1.0)
    ev = TaskEvent(
        kind=EventKind.PREEMPTED, lm=LM0, gm=GM0, user=t.user, task_id=t.task_id,
        attempt=1, node=NodeIndex(0), node_free=(4, 4), node_version=lm.version + 1, at=2.0,
    )  # fmt: skip
    gm.handle(as_events(LM0, [ev]), 2.0)
    gm.handle(as_events(LM0, [ev]), 2.5)
    assert len(gm.queues) == 1
    assert gm.counters.stale_events == 1


def test_the_end_of_a_relaunched_attempt_that_overtakes_its_relaunch_still_ends_the_task() -> None:
    """An LM relaunches a task of a lost node (attempt 2) and the new attempt finishes;
    its FINISHED reaches the GM before the RELAUNCHED: the task still ends, once."""
    lm = make_lm(nodes=[(4, 4), (4, 4)])
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task(2, 2)
    submit(gm, [t], 0.0)
    deliver(lm, gm, decide(gm, 1.0), 1.0)
    assert state(gm, t) is TaskState.PLACED
    node = lm.active[key(t)].node
    alive(lm, 1.0)
    alive(lm, 5.0, 1 - node)
    relaunch = events(check_workers(lm, 6.0, timeout=2.0))
    assert [(e.kind, e.attempt) for e in relaunch] == [(EventKind.RELAUNCHED, 2)]
    ended = events(lm.handle(report(LM0, ReportKind.FINISHED, t, 1 - node, 7.0, attempt=2), 7.0))
    done = gm.handle(as_events(LM0, ended), 7.5)
    assert [o.task.attempt for o in outcomes(done)] == [2]
    assert gm.handle(as_events(LM0, relaunch), 8.0) == []  # late: stale
    assert state(gm, t) is not TaskState.PLACED


def test_a_request_is_awaited_until_its_answer_or_an_event_settles_its_tasks() -> None:
    """What the driver asks before sending an unanswered launch again: a GM never places
    elsewhere a task its LM may have accepted."""
    lm = make_lm(nodes=[(4, 4)])
    gm = make_gm()
    sync_views(gm, lm)
    t = make_task(2, 2)
    submit(gm, [t], 0.0)
    (req,) = launches(decide(gm, 1.0))
    assert gm.awaits(req.request_id)
    answers = lm.handle(replace(req, sent_at=1.0), 1.0)
    ended = events(lm.handle(report(LM0, ReportKind.FINISHED, t, 0, 1.5), 1.5))
    assert ended
    gm.handle(as_events(LM0, ended), 2.0)  # the event overtook the LM's answer
    assert not gm.awaits(req.request_id)
    for r in replies(answers):
        gm.handle(r, 2.5)
    assert state(gm, t) is not TaskState.PLACED
    assert not gm.awaits(req.request_id + 1000)
