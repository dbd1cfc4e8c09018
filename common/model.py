"""The shared model: resources, constraints, tasks and their allocation-time ledger.

Resources are vectors of non-negative integers aligned with a federation-wide list
of resource names (``("slots",)`` when replaying traces, ``("cpu_m", "mem_mb")`` for
the paper's 64-core/16 GB nodes).  Integers keep conservation exact.

Placement constraints are numbered ``0..N_CONSTRAINTS-1``; a task's constraints and a
machine's constraints are both bit masks (Python ints).  A node matches a task when
``task_mask & ~node_mask == 0``.

Allocation time (SPEC §3) is measured by a ledger that travels with the task: every
hop moves the task into a phase at a timestamp, and the time since the previous
stamp is charged to the phase being left.  The four components therefore add up to
``started_at - submitted_at`` exactly (minus time spent running before a preemption).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from common.ids import GmId, JobId, TaskId, UserId

N_CONSTRAINTS = 21
"""Machine/task placement constraints, as in the paper (bit i of a mask = constraint i)."""

Resources = tuple[int, ...]


def fits(free: Sequence[int], demand: Sequence[int]) -> bool:
    """Every resource type of ``demand`` is available in ``free``."""
    return all(f >= d for f, d in zip(free, demand, strict=True))


def add(a: Resources, b: Resources) -> Resources:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def sub(a: Resources, b: Resources) -> Resources:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def constraint_ids(mask: int) -> tuple[int, ...]:
    """The constraint numbers set in ``mask``."""
    return tuple(i for i in range(N_CONSTRAINTS) if mask >> i & 1)


def satisfies(node_mask: int, task_mask: int) -> bool:
    """A machine with ``node_mask`` meets every constraint of ``task_mask``."""
    return task_mask & ~node_mask == 0


class Phase(IntEnum):
    """Where a task's time goes before it starts (SPEC §3)."""

    QUEUEING = 0  # waiting in a GM user queue
    PROCESSING = 1  # GM decision, LM validation (incl. inconsistency retries)
    COMMUNICATION = 2  # on the wire between components
    WORKER_QUEUEING = 3  # accepted by a worker, waiting to start
    RUNNING = 4  # ran, then was preempted: not allocation time


COMPONENTS = ("queueing", "processing", "communication", "worker_queueing")
"""Allocation-time components, in `Phase` order (index i is `Task.spent[i]`)."""


class TaskState(IntEnum):
    """Each task is in exactly one of these, as the GM that owns its queue sees it."""

    QUEUED = 0
    DISPATCHED = 1  # a launch / repartition / preemption request is in flight
    PLACED = 2  # accepted by an LM (starting or running)
    FINISHED = 3
    FAILED = 4  # explicit failure: infeasible or too many attempts


class WaitReason(IntEnum):
    """Why a decision did not place a task (reported per task and counted per GM)."""

    NO_CONSTRAINT_MATCH = 0  # no node anywhere satisfies the task's constraints
    NO_FREE_RESOURCES = 1  # nodes match, none has the resources free (in the GM's view)
    USER_AT_SHARE = 2  # contention and the user is at/above its share: re-queued
    REFUSED_BY_LM = 3  # inconsistency: the LM's true state refused the request
    PREEMPTION_FAILED = 4  # no victim could be verified by any LM


@dataclass(slots=True)
class Task:
    """One task: what it needs, where it may run, and its timing ledger.

    Mutable on purpose: the ledger is stamped at every hop.  ``attempts`` counts
    decisions; ``waits`` counts the reasons of failed ones.
    """

    task_id: TaskId
    job_id: JobId
    user: UserId
    demand: Resources
    duration: float
    constraints: int = 0
    command: tuple[str, ...] = ()
    altruistic: bool = False
    gm: GmId | None = None
    submitted_at: float = 0.0
    started_at: float = -1.0
    finished_at: float = -1.0
    phase: int = Phase.QUEUEING
    phase_since: float = 0.0
    spent: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    attempts: int = 0
    waits: list[int] = field(default_factory=lambda: [0, 0, 0, 0, 0])

    def enter(self, phase: int, now: float) -> None:
        """Charge the time since the last stamp to the current phase; move to ``phase``."""
        if now > self.phase_since:
            self.spent[self.phase] += now - self.phase_since
            self.phase_since = now
        self.phase = phase

    def submit(self, now: float) -> None:
        self.submitted_at = now
        self.phase = Phase.QUEUEING
        self.phase_since = now

    def start(self, now: float) -> None:
        """The task starts on a worker: the allocation-time ledger closes."""
        self.enter(Phase.RUNNING, now)
        self.started_at = now

    @property
    def allocation_time(self) -> float:
        return self.spent[0] + self.spent[1] + self.spent[2] + self.spent[3]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A worker node as its LM knows it: capacity and machine constraints."""

    capacity: Resources
    constraints: int = (1 << N_CONSTRAINTS) - 1


@dataclass(frozen=True, slots=True)
class UserConfig:
    """A user's queue: which GM serves it and the share of the federation it is promised."""

    user: UserId
    gm: GmId
    share: float = 1.0
