"""An LM takes a GM's launches and preemptions only for that GM's own users (issue 32
item 7): gm0 cannot supersede, stop or run anything as gm1's user."""

from __future__ import annotations

from common.effects import Reply
from common.ids import GmId, LmId, NodeIndex, UserId
from common.messages import (
    LaunchRequest,
    LaunchResponse,
    Placement,
    PreemptRequest,
    PreemptResponse,
    StartTask,
    StopTask,
)
from common.model import NodeSpec, TaskSpec
from local_master.core import LocalMaster
from tests.conftest import make_task

GM0, GM1 = GmId("gm0"), GmId("gm1")
OWNERS = {UserId("alice"): GM0, UserId("bob"): GM1}


def make(owners: dict[UserId, GmId | None] | None = OWNERS) -> LocalMaster:
    nodes = [NodeSpec(capacity=(4, 4), constraints=0xFFFFFFFF) for _ in range(2)]
    return LocalMaster(LmId("lm0"), nodes, [GM0, GM1], gms=[GM0, GM1], owners=owners)


def launch(lm: LocalMaster, t: TaskSpec, node: int, gm: GmId, attempt: int) -> list[object]:
    req = LaunchRequest(
        gm=gm, lm=lm.lm_id, request_id=attempt, known_version=-1,
        placements=(Placement(spec=t, attempt=attempt, node=NodeIndex(node)),),
    )  # fmt: skip
    return [e.msg if isinstance(e, Reply) else getattr(e, "msg", e) for e in lm.handle(req, 1.0)]


def test_a_gm_cannot_supersede_another_gms_users_running_task() -> None:
    lm = make()
    bobs = make_task(2, 2, user="bob", task_id="t1")
    out = launch(lm, bobs, 1, GM1, attempt=1)
    assert isinstance(out[0], LaunchResponse)
    assert out[0].results[0].reason == "ok"
    out = launch(lm, bobs, 0, GM0, attempt=7)  # gm0 names bob's task, a newer attempt
    resp = out[0]
    assert isinstance(resp, LaunchResponse)
    assert (resp.results[0].accepted, resp.results[0].reason) == (False, "foreign_user")
    assert not [m for m in out[1:] if isinstance(m, StopTask | StartTask)]
    held = lm.nodes.active[(bobs.user, bobs.task_id)]
    assert (held.attempt, held.gm, held.node) == (1, GM1, 1)
    assert lm.counters.refused_foreign == 1


def test_a_gm_cannot_run_tasks_as_another_gms_user_or_an_unknown_one() -> None:
    lm = make()
    for user in ("bob", "mallory"):
        resp = launch(lm, make_task(1, 1, user=user), 0, GM0, attempt=1)[0]
        assert isinstance(resp, LaunchResponse)
        assert resp.results[0].reason == "foreign_user"
    assert not lm.nodes.active
    ok = launch(lm, make_task(1, 1, user="alice"), 0, GM0, attempt=1)[0]
    assert isinstance(ok, LaunchResponse)
    assert ok.results[0].reason == "ok"


def test_a_gm_cannot_preempt_in_the_name_of_another_gms_user() -> None:
    lm = make()
    launch(lm, make_task(4, 4, user="alice"), 0, GM0, attempt=1)
    req = PreemptRequest(
        gm=GM0, lm=lm.lm_id, request_id=9, spec=make_task(4, 4, user="bob"),
        attempt=1, victim=UserId("alice"), known_version=-1,
    )  # fmt: skip
    (reply,) = lm.handle(req, 2.0)
    assert isinstance(reply, Reply)
    assert isinstance(reply.msg, PreemptResponse)
    assert (reply.msg.accepted, reply.msg.reason) == (False, "foreign_user")
    assert len(lm.nodes.active) == 1


def test_without_owners_nothing_is_checked() -> None:
    """The simulator's LMs (every GM is the same trusted code) take any user."""
    lm = make(owners=None)
    resp = launch(lm, make_task(1, 1, user="bob"), 0, GM0, attempt=1)[0]
    assert isinstance(resp, LaunchResponse)
    assert resp.results[0].reason == "ok"


def test_an_lm_refuses_a_revoked_users_launch_and_preemption() -> None:
    """Issue 32 item 2, after a restart: the users file marks alice revoked, so an LM
    (started after the revocation, with nothing of hers held) runs nothing of hers,
    whichever GM asks (its owners map her to no GM)."""
    lm = make({UserId("alice"): None, UserId("bob"): GM1})
    resp = launch(lm, make_task(1, 1, user="alice"), 0, GM0, attempt=1)[0]
    assert isinstance(resp, LaunchResponse)
    assert (resp.results[0].accepted, resp.results[0].reason) == (False, "user_revoked")
    assert not lm.nodes.active
    out = launch(lm, make_task(4, 4, user="bob"), 0, GM1, attempt=1)[0]
    assert isinstance(out, LaunchResponse)
    assert out.results[0].reason == "ok"  # bob runs on
    req = PreemptRequest(
        gm=GM0, lm=lm.lm_id, request_id=9, spec=make_task(4, 4, user="alice"),
        attempt=1, victim=UserId("bob"), known_version=-1,
    )  # fmt: skip
    (reply,) = lm.handle(req, 2.0)
    assert isinstance(reply, Reply)
    assert isinstance(reply.msg, PreemptResponse)
    assert (reply.msg.accepted, reply.msg.reason) == (False, "user_revoked")
    assert len(lm.nodes.active) == 1  # bob's task untouched
