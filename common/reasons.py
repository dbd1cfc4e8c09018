"""Reasons as data: why a request is refused, how an LM answered a placement, why a job
is not admitted, why a decision left a task waiting, why a task failed for good.

Every reason that crosses a process boundary is a ``StrEnum`` member whose value is
the wire string, so msgspec writes the same bytes as the plain string did and a
decoded reason (a ``str``) compares equal to the member.  Cores write members; the
drivers, ``megha why``, the dashboard and the summaries read the same names.  The
values are the wire's: never renamed (``runtime.http`` maps them to statuses, the
worker pool registers on ``register_first``, users read them in dead letters).

``WaitReason`` is an ``IntEnum``: it indexes the per-task counts that travel in
``Task.waits``; its ``key`` is the name reports and operators see.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum, StrEnum

__all__ = ["Answer", "JobReason", "RequestReason", "TaskFailure", "WaitReason"]


class RequestReason(StrEnum):
    """Why a core refuses a whole request (``Refused.reason``)."""

    WRONG_LM = "wrong_lm"  # sent to another LM (or a pool of another LM)
    NOT_READY = "not_ready"  # the LM's pool has not registered yet: ask again later
    REGISTER_FIRST = "register_first"  # a pool's report before its registration
    UNKNOWN_GM = "unknown_gm"  # not a GM of this federation
    STALE_EPOCH = "stale_epoch"  # a pool hears from an LM incarnation older than its own
    UNKNOWN_NODE = "unknown_node"  # a node the receiver does not hold
    WRONG_RESOURCES = "wrong_resources"  # a demand of the wrong number of amounts
    DUPLICATE_TASK_ID = "duplicate_task_id"  # one task twice in one request


class Answer(StrEnum):
    """An LM's answer to one placement (``PlacementResult.reason``) or preemption
    (``PreemptResponse.reason``)."""

    OK = "ok"
    ROOM_FREE = "room_free"  # a preemption found room free: placed, nobody preempted
    REROUTED = "rerouted"  # the node asked for had no room: placed on another
    DUPLICATE = "duplicate"  # the LM holds this or a newer attempt (idempotent)
    FINISHED = "finished"  # that attempt already ended here, finished
    FAILED = "failed"  # that attempt already ended here, failed
    # refused (an inconsistency: the GM's view was wrong)
    INSUFFICIENT_RESOURCES = "insufficient_resources"
    NODE_DOWN = "node_down"
    CONSTRAINTS_UNMET = "constraints_unmet"
    WRONG_RESOURCES = "wrong_resources"
    UNKNOWN_NODE = "unknown_node"
    NO_VICTIM = "no_victim"  # nothing of the victim there would make room
    MISSING_RESULT = "missing_result"  # (GM side) a response shorter than its request


ENDED_ANSWERS = frozenset({Answer.FINISHED, Answer.FAILED})
"""Answers that are an outcome: the attempt asked for already ended on the LM."""
NO_ROOM = (Answer.INSUFFICIENT_RESOURCES, Answer.NODE_DOWN)
"""Refusals another node could avoid (rerouting); a broken placement is not."""


class JobReason(StrEnum):
    """Why a GM does not admit a job (``JobRefused.reason``, ``JobRefusal.reason``, the
    dead letter's reason header)."""

    DUPLICATE_JOB_ID = "duplicate_job_id"
    UNKNOWN_USER = "unknown_user"
    NOT_READY = "not_ready"
    RESERVED_FIELD = "reserved_field"
    USER_TASK_LIMIT = "user_task_limit"
    WRONG_JOB = "wrong_job"
    DUPLICATE_TASK_ID = "duplicate_task_id"
    WRONG_RESOURCES = "wrong_resources"
    ZERO_DEMAND = "zero_demand"
    COMMANDS_DISABLED = "commands_disabled"
    IMPOSSIBLE_RESOURCES = "impossible_resources"
    DURATION_TOO_LONG = "duration_too_long"
    BAD_DAG = "bad_dag"
    ENV_NOT_ALLOWED = "env_not_allowed"
    BAD_ENV = "bad_env"


class TaskFailure(StrEnum):
    """Why a task failed for good (``TaskOutcome.reason``; a worker's detail may follow
    ``ON_WORKER`` after a colon)."""

    ON_WORKER = "failed on worker"
    INFEASIBLE = "infeasible: no node satisfies the constraints and demand"
    STALE_INCARNATION = "stale incarnation"  # (a refusal's why: the LM was replaced)

    @staticmethod
    def on_worker(detail: str = "") -> str:
        """``failed on worker``, with the worker's detail if it gave one."""
        return f"{TaskFailure.ON_WORKER}: {detail}" if detail else TaskFailure.ON_WORKER

    @staticmethod
    def parent_failed(task_id: str) -> str:
        """A DAG task abandoned because a task of a stage it needs failed."""
        return f"parent task {task_id} failed"


class WaitReason(IntEnum):
    """Why a decision did not place a task (reported per task and counted per GM)."""

    NO_CONSTRAINT_MATCH = 0  # no node anywhere satisfies the task's constraints
    NO_FREE_RESOURCES = 1  # nodes match, none has the resources free (in the GM's view)
    USER_AT_SHARE = 2  # contention and the user is at/above its share: re-queued
    REFUSED_BY_LM = 3  # inconsistency: the LM's true state refused the request
    PREEMPTION_FAILED = 4  # no victim could be verified by any LM
    GANG_INCOMPLETE = 5  # a gang stage's task: not enough of its gang fits (or holds) yet
    RESERVED_FOR_GANG = 6  # the room it fits is held for a gang due before it would end

    @property
    def key(self) -> str:
        """The name summaries, the dashboard, ``megha why`` and the journal show."""
        return _WAIT_KEYS[self]

    @property
    def text(self) -> str:
        """What it means, for operators (``megha why``)."""
        return _WAIT_TEXT[self]

    @staticmethod
    def counts(counts: Sequence[int], *, nonzero: bool = False) -> dict[str, int]:
        """``counts`` (indexed by ``WaitReason``) by key, every one or the non-zero."""
        return {_WAIT_KEYS[r]: counts[r] for r in WaitReason if counts[r] or not nonzero}


_WAIT_KEYS = {r: r.name.lower() for r in WaitReason}
_WAIT_TEXT = {
    WaitReason.NO_CONSTRAINT_MATCH: "no node anywhere satisfies its constraints and demand",
    WaitReason.NO_FREE_RESOURCES: "nodes match, none had the resources free (in the GM's view)",
    WaitReason.USER_AT_SHARE: "no room, and its user is at or above its share: no preemption",
    WaitReason.REFUSED_BY_LM: "an LM refused the placement (its true state differed)",
    WaitReason.PREEMPTION_FAILED: "no victim over its share could be preempted on any LM",
    WaitReason.GANG_INCOMPLETE: "a gang stage's task: not enough of its gang fits or holds yet",
    WaitReason.RESERVED_FOR_GANG: "the room it fits is held for a gang due before it would end",
}
