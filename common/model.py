"""The shared model: resources, constraints, tasks and their allocation-time ledger.

Resources are vectors of non-negative integers aligned with a federation-wide list
of resource names (``("slots",)`` when replaying traces, ``("cpu_m", "mem_mb")`` for
the paper's 64-core/16 GB nodes).  Integers keep conservation exact.

Placement constraints are numbered ``0..N_CONSTRAINTS-1``; a task's constraints and a
machine's constraints are both bit masks (Python ints).  A node matches a task when
``task_mask & ~node_mask == 0``.

A task is two things: its **spec** (``TaskSpec``: what the user asked for; immutable,
it travels GM -> LM -> worker) and its **ledger** (``Task``: kept by the GM that owns
the task's queue, the only place where a task's whole story is known).  Every hop
reports *when* it handled the task; the GM records each report as a *mark*
``(time, phase entered)``.  Marks may arrive in any order (an event can overtake a
response): they are kept sorted by time, and the components are the intervals
between consecutive marks.  The components therefore add up exactly to
``started_at - submitted_at`` (SPEC §3), where ``started_at`` is the **final** start,
the one that ran to completion; time spent running before a preemption is its own
component (``preempted_running``) so no wait disappears.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated

import msgspec

from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.reasons import WaitReason as WaitReason  # (its home; re-exported)
from common.schema import Text, UInt, Wire, finite, in_range, n_items

N_CONSTRAINTS = 21
"""Machine/task placement constraints, as in the paper (bit i of a mask = constraint i)."""
MAX_RESOURCES = 16
MAX_COMMAND = 64
MAX_ENV = 64
"""Environment variables a task may name (``common.taskenv``)."""

Resources = Annotated[tuple[UInt, ...], n_items(1, MAX_RESOURCES)]
Mask = Annotated[int, in_range(0, (1 << N_CONSTRAINTS) - 1, above="unknown_constraint")]
Seconds = Annotated[float, finite(0)]
"""A non-negative duration."""
Time = Annotated[float, finite()]
"""A timestamp (seconds; ``-1`` where something has not happened)."""


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
    """Where a task's time goes before its final start (SPEC §3)."""

    QUEUEING = 0  # waiting in a GM user queue
    PROCESSING = 1  # GM decision, LM validation (incl. inconsistency retries)
    COMMUNICATION = 2  # on the wire between components
    WORKER_QUEUEING = 3  # accepted by a worker, waiting to start
    RUNNING = 4  # running (before a preemption: work thrown away, still a wait)


COMPONENTS = ("queueing", "processing", "communication", "worker_queueing", "preempted_running")
"""Allocation-time components, in `Phase` order (index i is ``Task.components()[i]``)."""


class TaskState(IntEnum):
    """Each task is in exactly one of these, as the GM that owns its queue sees it."""

    QUEUED = 0
    DISPATCHED = 1  # a launch / repartition / preemption request is in flight
    PLACED = 2  # accepted by an LM (starting or running)
    FINISHED = 3
    FAILED = 4  # explicit failure: infeasible, refused, lost for good


MAX_PRIORITY = 1000
"""The highest priority class a job may name."""


class TaskSpec(Wire, frozen=True, kw_only=True):
    """What a task needs, as its user submitted it.  Immutable; decoded once at the GM
    and carried as the same object into every placement of the task."""

    task_id: TaskId
    job_id: JobId
    user: UserId
    demand: Resources
    duration: Seconds
    constraints: Mask = 0
    command: Annotated[tuple[Text, ...], n_items(0, MAX_COMMAND)] = ()
    priority: Annotated[int, in_range(0, MAX_PRIORITY)] = 0
    """The job's priority class: a higher class is served first and preempts lower ones
    (``global_master.policy.classes``, ``global_master.classes``); 0 is the lowest."""
    env: Annotated[tuple[Text, ...], n_items(0, MAX_ENV)] = ()
    """Variables for its ``command``'s environment, ``NAME=value`` each: passed only if
    the operator allows each name (``task_env_allow``, ``common.taskenv``)."""


TaskKey = tuple[UserId, TaskId]
"""Task ids are unique per user: every table of tasks is keyed by (user, task id)."""


def key_of(spec: TaskSpec) -> TaskKey:
    return (spec.user, spec.task_id)


class Task(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A task as the GM that owns its queue knows it: spec, attempt, ledger.  Mutable
    (the GM updates it in place); on the wire inside a ``TaskOutcome``.

    ``attempt`` numbers placements: every launch request (and every relaunch by an LM)
    is a new attempt, and events of a superseded attempt are ignored.  ``decisions``
    counts how often a GM ran its decision path on the task; ``waits`` counts the
    reasons of the decisions that did not place it.
    """

    spec: TaskSpec
    altruistic: bool = False
    gm: GmId | None = None
    lm: LmId | None = None
    """The LM that holds its current attempt (set once an LM accepted it)."""
    attempt: UInt = 0
    submitted_at: Time = 0.0
    first_started_at: Time = -1.0
    started_at: Time = -1.0
    finished_at: Time = -1.0
    marks: Annotated[list[tuple[Time, Phase]], n_items()] = msgspec.field(default_factory=list)
    decisions: UInt = 0
    waits: Annotated[list[UInt], n_items(len(WaitReason), len(WaitReason))] = msgspec.field(
        default_factory=lambda: [0] * len(WaitReason)
    )

    # the spec's fields, for the hot path and for readers
    @property
    def task_id(self) -> TaskId:
        return self.spec.task_id

    @property
    def job_id(self) -> JobId:
        return self.spec.job_id

    @property
    def user(self) -> UserId:
        return self.spec.user

    @property
    def demand(self) -> Resources:
        return self.spec.demand

    @property
    def duration(self) -> float:
        return self.spec.duration

    @property
    def constraints(self) -> int:
        return self.spec.constraints

    @property
    def key(self) -> TaskKey:
        return (self.spec.user, self.spec.task_id)

    # ------------------------------------------------------------- the ledger
    def mark(self, phase: Phase, at: float) -> None:
        """From ``at`` on, the task is in ``phase`` (marks may arrive out of order)."""
        marks = self.marks
        if not marks or at >= marks[-1][0]:
            marks.append((at, phase))
        else:
            bisect.insort_right(marks, (at, phase), key=lambda m: m[0])

    def submit(self, now: float) -> None:
        """The task enters its user's queue at the GM."""
        self.submitted_at = now
        self.marks = [(now, Phase.QUEUEING)]

    def start(self, at: float) -> None:
        """The task starts on a worker (a later start supersedes an earlier one)."""
        self.mark(Phase.RUNNING, at)
        if at > self.started_at:
            self.started_at = at
        if self.first_started_at < 0 or at < self.first_started_at:
            self.first_started_at = at

    def components(self) -> list[float]:
        """Seconds in each `Phase` from submission to the final start (or to the last
        mark, if the task never started): the allocation-time split."""
        out = [0.0] * len(Phase)
        marks = self.marks
        end = self.started_at if self.started_at >= 0 else None
        for (t0, p0), (t1, _) in itertools.pairwise(marks):
            if end is not None and t0 >= end:
                break
            out[p0] += t1 - t0
        return out

    @property
    def allocation_time(self) -> float:
        """Final start - submission (the paper's metric for a task that runs)."""
        return self.started_at - self.submitted_at if self.started_at >= 0 else -1.0

    @property
    def first_allocation_time(self) -> float:
        """First start - submission."""
        return self.first_started_at - self.submitted_at if self.first_started_at >= 0 else -1.0


def new_task(spec: TaskSpec, now: float, *, gm: GmId | None = None) -> Task:
    """A task entering its user's queue at ``now``."""
    t = Task(spec=spec, gm=gm, submitted_at=now)
    t.marks.append((now, Phase.QUEUEING))
    return t


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
