"""The task state-transition table (``common.transitions``) and the GM core consulting
it: a move the table forbids raises where it happens, and a copy of a task's end that
used to end it twice is ignored."""

from __future__ import annotations

import pytest

from common.ids import LmId
from common.messages import ReportKind, TaskEvents
from common.model import Task, TaskSpec, TaskState
from common.transitions import NEXT, TransitionError, check
from global_master.core import GlobalMaster
from global_master.ledger import InFlight
from tests.conftest import (
    alive,
    as_events,
    decide,
    events,
    key,
    launches,
    make_gm,
    make_lm,
    make_task,
    outcomes,
    replies,
    report,
    state,
    submit,
    sync_views,
)

HELD = (TaskState.QUEUED, TaskState.DISPATCHED, TaskState.PLACED)
ENDS = (TaskState.FINISHED, TaskState.FAILED)


def test_every_held_state_may_end_and_an_ended_task_is_never_held_again() -> None:
    for s in HELD:
        assert set(ENDS) <= NEXT[s]
    for s in ENDS:
        assert NEXT[s] == {None}  # only forgotten, with its job
    assert TaskState.DISPATCHED not in NEXT[None]  # nothing is sent before it is queued
    assert all(s not in NEXT[s] for s in NEXT)


def test_check_names_the_move_it_refuses() -> None:
    with pytest.raises(TransitionError, match="FINISHED -> DISPATCHED"):
        check(("u0", "t0"), TaskState.FINISHED, TaskState.DISPATCHED)
    check(("u0", "t0"), TaskState.QUEUED, TaskState.DISPATCHED)


def _placed_and_finished() -> tuple[GlobalMaster, TaskSpec, TaskSpec, TaskEvents]:
    """A GM and an LM; a job of two tasks, the first placed, run and finished (its end
    event not yet at the GM)."""
    gm, lm = make_gm(), make_lm("lm0", [(4, 4)])
    alive(lm, 0.0)
    sync_views(gm, lm)
    t0, t1 = (make_task(1, 1, task_id=f"t{i}", job="j") for i in range(2))
    submit(gm, [t0, t1], 0.0)
    (req,) = launches(decide(gm, 0.1))
    (resp,) = replies(lm.handle(req, 0.2))
    gm.handle(resp, 0.3)
    assert state(gm, t0) is TaskState.PLACED
    evs = events(lm.handle(report(LmId("lm0"), ReportKind.FINISHED, t0, 0, 1.0), 1.0))
    return gm, t0, t1, as_events(LmId("lm0"), evs)


def test_a_copy_of_a_task_s_end_is_told_once_and_leaves_its_job_open() -> None:
    gm, t0, t1, ev = _placed_and_finished()
    first = outcomes(gm.handle(ev, 1.1))
    assert [o.task.task_id for o in first] == [t0.task_id]
    assert state(gm, t0) is TaskState.FINISHED
    again = gm.handle(ev, 1.2)  # the broker redelivers the same events
    assert outcomes(again) == []
    assert state(gm, t0) is TaskState.FINISHED
    assert state(gm, t1) is TaskState.QUEUED  # its job still waits for it
    assert gm.jobs[(t0.user, t0.job_id)].left == 1


def test_the_ledger_refuses_to_end_a_task_twice_or_send_an_ended_one() -> None:
    gm, t0, _, ev = _placed_and_finished()
    gm.handle(ev, 1.1)
    with pytest.raises(TransitionError, match="FINISHED -> FINISHED"):
        gm.ledger.end(key(t0), finished=True, reason="")
    with pytest.raises(TransitionError, match="FINISHED -> DISPATCHED"):
        gm.ledger.dispatch(InFlight(Task(spec=t0), LmId("lm0"), 0, False))
    assert key(t0) not in gm.inflight
