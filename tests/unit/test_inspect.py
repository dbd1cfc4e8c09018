"""What operators are told: a task's timeline and why it waits (GM), users' queues and
shares (GM), partitions as bit-vectors and repartitions (LM), and who may ask.  Pure
functions over cores driven by hand; no event loop, no sleeps."""

from __future__ import annotations

import gc

import pytest
from msgspec.structs import replace

from common.effects import Effect, Reply, ToLm
from common.ids import GmId, LmId, TaskId, UserId
from common.messages import LaunchRequest, LaunchResponse
from common.model import WaitReason, new_task
from global_master import inspect as gm_inspect
from global_master.core import GlobalMaster
from global_master.journal import Journal
from local_master import inspect as lm_inspect
from local_master.core import LocalMaster
from security.identity import OPERATOR, gm, lm, workers
from security.signing import may_call
from tests.conftest import (
    Network,
    decide,
    key,
    launch_req,
    launches,
    make_gm,
    make_lm,
    make_task,
    submit,
    sync_views,
)

GM0, GM1 = GmId("gm0"), GmId("gm1")
LM0 = LmId("lm0")


def journaled(**kw: object) -> GlobalMaster:
    core = make_gm(**kw)  # type: ignore[arg-type]
    core.journal = Journal()
    return core


def steps(answer: dict[str, object]) -> list[tuple[object, ...]]:
    timeline = answer["timeline"]
    assert isinstance(timeline, list)
    return [
        (s["what"], s.get("lm", ""), s.get("partition", ""), s.get("detail", "")) for s in timeline
    ]


def deliver(
    lmc: LocalMaster, core: GlobalMaster, effects: list[Effect], now: float
) -> list[Effect]:
    out: list[Effect] = []
    for e in effects:
        if isinstance(e, ToLm) and isinstance(e.msg, LaunchRequest):
            for answer in lmc.handle(replace(e.msg, sent_at=now), now):
                if isinstance(answer, Reply):
                    out.extend(core.handle(answer.msg, now))
    return out


# ---------------------------------------------------------------- journal
def test_a_repeated_step_is_counted_and_a_long_timeline_drops_its_oldest() -> None:
    j = Journal(per_task=3, ended=2)
    k = (UserId("u"), TaskId("t"))
    for at in (1.0, 2.0, 3.0):
        j.note(k, at, "waits", detail="no_free_resources")
    (only,) = j.trail(k).steps
    assert (only.count, only.at, only.last_at) == (3, 1.0, 3.0)
    for n in range(4):
        j.note(k, 4.0 + n, "launch", lm="lm0", node=n)
    trail = j.trail(k)
    assert [s.node for s in trail.steps] == [1, 2, 3]
    assert trail.dropped == 2


def test_the_reasons_of_one_decision_are_one_step_and_repeats_count() -> None:
    j = Journal()
    k = (UserId("u"), TaskId("t"))
    for at in (1.0, 2.0, 3.0):
        j.wait(k, at, "no_free_resources")
        j.wait(k, at, "user_at_share")
    j.wait(k, 4.0, "no_free_resources")
    j.wait(k, 5.0, "refused_by_lm: node_down", lm="lm0")
    got = [(s.detail, s.count, s.at, s.last_at, s.lm) for s in j.trail(k).steps]
    assert got == [
        ("no_free_resources, user_at_share", 3, 1.0, 3.0, ""),
        ("no_free_resources", 1, 4.0, 4.0, ""),
        ("refused_by_lm: node_down", 1, 5.0, 5.0, "lm0"),
    ]


def test_only_the_latest_ended_tasks_are_kept() -> None:
    j = Journal(ended=2)
    tasks = [make_task() for _ in range(3)]
    for spec in tasks:
        j.note(key(spec), 1.0, "launch", lm="lm0", node=0)
        j.close(new_task(spec, 0.0), 5.0, finished=True, reason="")
    assert list(j.ended) == [key(s) for s in tasks[1:]]
    assert j.trails == {}


def test_an_ended_task_is_kept_as_atoms_the_collector_stops_walking() -> None:
    j = Journal()
    spec = make_task()
    task = new_task(spec, 0.0)
    task.waits[WaitReason.NO_FREE_RESOURCES] = 2
    j.note(key(spec), 1.0, "waits", detail="no_free_resources")
    j.note(key(spec), 2.0, "launch", lm="lm0", node=3)
    task.start(2.5)
    j.close(task, 5.0, finished=True, reason="")
    ended = j.ended[key(spec)]
    assert [(s.what, s.node) for s in ended.trail().steps] == [
        ("waits", -1),
        ("launch", 3),
        ("finished", -1),
    ]
    assert ended.components() == task.components()
    assert ended.waits[WaitReason.NO_FREE_RESOURCES] == 2
    gc.collect()
    gc.collect()  # a tuple is untracked once what it holds is: the steps, then the outer
    assert not gc.is_tracked(ended.steps)
    assert not gc.is_tracked(ended.waits)
    assert not gc.is_tracked(ended.components_s)


def test_journal_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Journal(per_task=0)


# -------------------------------------------------------------- one task
def test_an_inconsistency_shows_as_a_refusal_then_a_repartition_then_running() -> None:
    lmc = make_lm(nodes=[(4, 4), (4, 4)], home=["gm0", "gm1"])
    core = journaled()
    sync_views(core, lmc)
    lmc.handle(launch_req(make_task(4, 4, user="x"), 0, gm="gm1"), 0.0)  # behind gm0's back
    t = make_task(3, 3)
    submit(core, [t], 0.5)
    first = decide(core, 1.0)
    retry = deliver(lmc, core, first, 2.0)
    assert launches(retry)[0].placements[0].repartition
    deliver(lmc, core, retry, 3.0)
    answer = gm_inspect.task_answer(core, key(t))
    assert answer is not None
    assert answer["state"] == "running"
    assert answer["attempt"] == 2
    assert answer["waits"] == {"refused_by_lm": 1}
    assert steps(answer) == [
        ("submitted", "", "", ""),
        ("launch", "lm0", "gm0", "attempt 1"),
        ("waits", "lm0", "", "refused_by_lm: insufficient_resources"),
        ("repartition", "lm0", "gm1", "attempt 2"),
        ("accepted", "lm0", "", "ok"),
    ]
    assert answer["timeline"][0]["at"] == 0.5
    assert any("refused_by_lm x1" in line for line in answer["why"])


def test_a_task_that_finished_is_answered_from_the_ring_with_start_and_end() -> None:
    lmc = make_lm(nodes=[(4, 4)])
    core = journaled()
    net = Network({GM0: core}, {LM0: lmc})
    net.start(0.0)
    t = make_task()
    net.submit(GM0, [t], 0.0)
    net.place_and_start(GM0, 1.0, 2.0)
    net.finish(t.task_id, 3.0)
    net.run(3.0)
    assert key(t) not in core.live
    assert core.jobs == {}
    answer = gm_inspect.task_answer(core, key(t))
    assert answer is not None
    assert answer["state"] == "finished"
    whats = [s[0] for s in steps(answer)]
    assert whats == ["submitted", "launch", "accepted", "started", "finished"]
    assert answer["finished_at"] == 3.0
    assert answer["started_at"] >= 0


def test_a_queued_task_says_why_it_waits_and_an_unknown_one_is_none() -> None:
    lmc = make_lm(nodes=[(2, 2)])
    core = journaled()
    sync_views(core, lmc)
    lmc.handle(launch_req(make_task(2, 2, user="x"), 0), 0.0)
    core.handle(lmc.snapshot(GM0), 0.1)  # the GM sees the node full
    t = make_task(1, 1)
    submit(core, [t], 0.0)
    assert launches(decide(core, 1.0)) == []
    answer = gm_inspect.task_answer(core, key(t))
    assert answer is not None
    assert answer["state"] == "queued"
    # below its share, but nobody over theirs to preempt
    assert answer["waits"] == {"no_free_resources": 1, "preemption_failed": 1}
    assert answer["why"][0].startswith("in u0's queue (1 tasks")
    assert any(line.startswith("no_free_resources x1") for line in answer["why"])
    assert gm_inspect.task_answer(core, (UserId("u0"), TaskId("nope"))) is None


def test_without_a_journal_the_ledger_still_answers() -> None:
    lmc = make_lm(nodes=[(4, 4)])
    core = make_gm()
    sync_views(core, lmc)
    t = make_task()
    submit(core, [t], 0.0)
    answer = gm_inspect.task_answer(core, key(t))
    assert answer is not None
    assert (answer["state"], answer["timeline_dropped"]) == ("queued", 0)
    assert [s[0] for s in steps(answer)] == ["submitted"]


# ------------------------------------------------------- find: any user, any id
def test_find_answers_a_job_by_its_id_with_each_task_and_a_task_of_any_user() -> None:
    lmc = make_lm(nodes=[(4, 4)])
    core = journaled(users=[("u0", "gm0", 0.5), ("u1", "gm0", 0.5)])
    net = Network({GM0: core}, {LM0: lmc})
    net.start(0.0)
    ran, waits = make_task(3, 3, job="j17"), make_task(3, 3, job="j17")
    other = make_task(1, 1, user="u1", task_id="solo", job="j18")
    net.submit(GM0, [ran, waits], 0.0)
    net.submit(GM0, [other], 0.5)
    net.place_and_start(GM0, 1.0, 2.0, max_tasks=3)
    net.finish(ran.task_id, 3.0)
    net.run(3.0)
    found = gm_inspect.find(core, "j17")
    assert found is not None
    assert (found["gm"], found["id"], found["tasks_found"], found["tasks_shown"]) == (
        "gm0", "j17", 2, 2,
    )  # fmt: skip
    ((job),) = found["jobs"]
    assert (job["user"], job["job_id"], job["tasks"], job["left"]) == ("u0", "j17", 2, 1)
    states = {t["task_id"]: t["state"] for t in found["tasks"]}
    assert states[ran.task_id] == "finished"
    assert states[waits.task_id] in ("queued", "in_flight", "running")
    finished = next(t for t in found["tasks"] if t["task_id"] == ran.task_id)
    assert [s["what"] for s in finished["timeline"]][-2:] == ["started", "finished"]
    # a task id alone, whatever its user; the job of that task is another id
    solo = gm_inspect.find(core, "solo")
    assert solo is not None
    assert [(t["user"], t["job_id"]) for t in solo["tasks"]] == [("u1", "j18")]
    assert solo["jobs"] == []
    assert gm_inspect.find(core, "nothing-here") is None


def test_find_lists_a_large_job_by_count_beyond_its_limit() -> None:
    core = journaled()
    sync_views(core, make_lm(nodes=[(4, 4)]))
    submit(core, [make_task(job="big") for _ in range(5)], 0.0)
    found = gm_inspect.find(core, "big", limit=3)
    assert found is not None
    assert (found["tasks_found"], found["tasks_shown"], len(found["tasks"])) == (5, 3, 3)
    assert all(t["state"] == "queued" for t in found["tasks"])
    assert found["tasks"][0]["why"][0] == "in u0's queue (5 tasks queued there)"


# -------------------------------------------------------------- overview
def test_overview_counts_states_reasons_and_shares_per_user() -> None:
    lmc = make_lm(nodes=[(4, 4)])
    core = journaled(users=[("a", "gm0", 0.5), ("b", "gm0", 0.5), ("z", "gm1", 1.0)])
    lmc.handle(launch_req(make_task(2, 2, user="a"), 0), 0.0)
    lmc.handle(launch_req(make_task(2, 2, user="b", job="o"), 0), 0.0)
    sync_views(core, lmc)
    t1, t2 = make_task(2, 2, user="b"), make_task(1, 1, user="a", job="j2")
    submit(core, [t1, t2], 0.0)
    assert decide(core, 1.0, max_tasks=2) == []
    ov = gm_inspect.overview(core)
    assert set(ov["users"]) == {"a", "b"}  # z is gm1's
    b = ov["users"]["b"]
    # the tasks already on the LM are gm0's: adopted from its snapshot, running
    assert (b["queued"], b["in_flight"], b["running"]) == (1, 0, 1)
    assert b["wait_reasons"] == {"no_free_resources": 1, "user_at_share": 1}
    assert b["dominant_share"] == pytest.approx(0.5)
    assert b["share"] == 0.5
    assert ov["totals"]["queued"] == 2
    assert ov["wait_reasons"]["user_at_share"] == core.wait_reasons[WaitReason.USER_AT_SHARE] == 2
    assert ov["ready"]
    assert ov["lms_in_view"] == 1


# -------------------------------------------------------------------- LM
def test_lm_overview_has_partition_bits_and_recent_repartitions() -> None:
    lmc = make_lm(nodes=[(4, 4), (4, 4), (4, 4)], home=["gm0", "gm1", "gm1"])
    lmc.handle(launch_req(make_task(4, 4), 0), 1.0)  # gm0's node 0 full
    t = make_task(1, 1)
    req = launch_req(t, 2)
    (reply, *_) = lmc.handle(
        replace(req, placements=(replace(req.placements[0], repartition=True),)), 2.0
    )
    assert isinstance(reply, Reply)
    assert isinstance(reply.msg, LaunchResponse)
    assert reply.msg.results[0].accepted
    ov = lm_inspect.overview(lmc)
    p0, p1 = ov["partitions"]["gm0"], ov["partitions"]["gm1"]
    assert (p0["members"], p0["free"], p0["nodes"], p0["free_nodes"]) == ("100", "000", 1, 0)
    assert (p1["members"], p1["free"]) == ("011", "011")
    assert (p0["logical_nodes_held"], p1["logical_nodes_lent"]) == (1, 1)
    assert ov["running_tasks"] == 2
    assert ov["repartitions_total"] == 1
    (r,) = ov["recent_repartitions"]
    assert (r["task_id"], r["node"], r["from"], r["to"], r["at"]) == (
        t.task_id,
        2,
        "gm1",
        "gm0",
        2.0,
    )


def test_recent_repartitions_are_bounded() -> None:
    lmc = make_lm(nodes=[(1000, 1000)], home=["gm1"])
    for _ in range(100):
        lmc.handle(launch_req(make_task(), 0), 1.0)
    assert lmc.counters.repartitions == 100
    assert len(lm_inspect.overview(lmc)["recent_repartitions"]) == 64


# ----------------------------------------------------------------- access
@pytest.mark.parametrize(
    ("service", "path", "allowed"),
    [
        (gm("gm0"), "/v1/tasks/u0/t1", True),
        (gm("gm0"), "/v1/inspect", True),
        (gm("gm0"), "/v1/find/j17", True),
        (gm("gm0"), "/v1/find/", False),
        (gm("gm0"), "/v1/find/a/b", False),
        (lm("lm0"), "/v1/find/j17", False),
        (gm("gm0"), "/v1/tasks/u0", False),
        (gm("gm0"), "/v1/tasks/u0/t1/x", False),
        (gm("gm0"), "/v1/tasks//t1", False),
        (lm("lm0"), "/v1/inspect", True),
        (lm("lm0"), "/v1/tasks/u0/t1", False),
        (workers("lm0"), "/v1/inspect", False),
    ],
)
def test_operators_may_inspect_gms_and_lms_and_nothing_else(
    service: object, path: str, allowed: bool
) -> None:
    assert may_call(OPERATOR, service, "GET", path) is allowed  # type: ignore[arg-type]
    assert not may_call(OPERATOR, service, "POST", path)  # type: ignore[arg-type]
    assert not may_call(gm("gm1"), service, "GET", path)  # type: ignore[arg-type]


def test_an_infeasible_task_is_answered_as_failed_with_its_reason() -> None:
    lmc = make_lm(nodes=[(4, 4, 0b01)])
    core = journaled()
    sync_views(core, lmc)
    t = make_task(1, 1, constraints=0b10)
    submit(core, [t], 0.0)
    decide(core, 2.0)
    answer = gm_inspect.task_answer(core, key(t))
    assert answer is not None
    assert answer["state"] == "failed"
    assert "infeasible" in answer["reason"]
    assert [s[0] for s in steps(answer)] == ["submitted", "waits", "failed"]
    assert answer["timeline"][-1]["at"] == 2.0
    assert answer["why"][0].startswith("failed: infeasible")
    assert gm_inspect.overview(core)["recently_ended"] == {"finished": 0, "failed": 1, "kept": 4096}
