"""Which task state may follow which, as the GM that owns a task's queue sees it.

The table is data (as h11's ``_state.py``): the GM core consults it each time it moves
a task between its ledger's tables (``global_master.ledger``), and the property tests
check every state change of every run against it.  A move the table does not allow is
a bug, surfaced as ``TransitionError`` where it happens, never silently applied.

``None`` is "not held": before its job is admitted, or after its job retired.

* not held -> QUEUED (admitted, or returned after a restart), PLACED (adopted from an
  LM after a restart), FINISHED / FAILED (an end learnt of a task not held: an orphan
  event, an LM's snapshot, a resumed task that cannot run).
* QUEUED -> DISPATCHED (a launch, repartition or preemption request), FINISHED (an end
  recovery found for a redelivered task), FAILED (infeasible, a parent failed).
* DISPATCHED -> PLACED (accepted, or an event overtook the answer), QUEUED (refused,
  unanswered: decided again), FINISHED / FAILED (that attempt had already ended).
* PLACED -> QUEUED (preempted, requeued, lost with its LM), FINISHED, FAILED.
* FINISHED, FAILED -> not held (its job retired): an ended task never runs again.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.model import TaskKey, TaskState

__all__ = ["NEXT", "TransitionError", "check"]

_Q, _D, _P = TaskState.QUEUED, TaskState.DISPATCHED, TaskState.PLACED
_F, _X = TaskState.FINISHED, TaskState.FAILED

NEXT: Mapping[TaskState | None, frozenset[TaskState | None]] = {
    None: frozenset({_Q, _P, _F, _X}),
    _Q: frozenset({_D, _F, _X}),
    _D: frozenset({_Q, _P, _F, _X}),
    _P: frozenset({_Q, _F, _X}),
    _F: frozenset({None}),
    _X: frozenset({None}),
}
"""The states that may follow each state (a state is not listed as following itself)."""


class TransitionError(AssertionError):
    """A core tried to move a task where the table does not allow: a bug."""

    def __init__(self, key: TaskKey, was: TaskState | None, to: TaskState | None) -> None:
        allowed = ", ".join(sorted(_name(s) for s in NEXT[was])) or "nothing"
        super().__init__(
            f"task {key[1]!r} of {key[0]!r}: {_name(was)} -> {_name(to)} is not a move "
            f"of common.transitions.NEXT (after {_name(was)}: {allowed})"
        )
        self.key, self.was, self.to = key, was, to


def check(key: TaskKey, was: TaskState | None, to: TaskState | None) -> None:
    """Raise ``TransitionError`` unless ``to`` may follow ``was``."""
    if to not in NEXT[was]:
        raise TransitionError(key, was, to)


def _name(state: TaskState | None) -> str:
    return "not held" if state is None else state.name
