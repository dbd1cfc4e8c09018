"""What happened to each task at a GM, for operators asking why a task waits.

A GM core given a ``Journal`` notes, per task, the steps of its decision path as they
happen: each placement attempt (the LM, the node, the partition it was carved from),
each refusal with the LM's reason, each wait reason (the ``WaitReason`` the core noted),
preemptions, start and end.  Memory is bounded twice over: a task keeps at most
``per_task`` steps (a repeated step is counted, not appended; beyond the bound the
oldest go and are counted as dropped), and only the ``ended`` most recently ended
tasks are kept once they finished or failed.  A task that was never tried has no
entry at all (its submission time is the task's own).

Pure: times are the core's ``now``; nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Final

import msgspec

from common.messages import EventKind, TaskEvent
from common.model import Phase, Task, TaskKey

PER_TASK = 32
ENDED = 4096


@dataclass(slots=True)
class Step:
    """One step of a task's timeline (``count`` times in a row, the last at ``last_at``)."""

    at: float
    what: str
    lm: str = ""
    node: int = -1
    partition: str = ""
    """The GM whose partition the node is in (another GM's: a repartition)."""
    detail: str = ""
    count: int = 1
    last_at: float = 0.0

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"at": self.at, "what": self.what}
        if self.lm:
            out["lm"] = self.lm
        if self.node >= 0:
            out["node"] = self.node
        if self.partition:
            out["partition"] = self.partition
        if self.detail:
            out["detail"] = self.detail
        if self.count > 1:
            out["count"] = self.count
            out["last_at"] = self.last_at
        return out


@dataclass(slots=True)
class Trail:
    """The steps of one task (the latest ``PER_TASK``) and how many older ones went."""

    steps: list[Step] = field(default_factory=list)
    dropped: int = 0


StepRow = tuple[float, str, str, int, str, str, int, float]
"""A ``Step`` as a tuple of atoms (the fields in order)."""
_ROW = attrgetter("at", "what", "lm", "node", "partition", "detail", "count", "last_at")
"""A ``Step``'s ``StepRow`` (one C call per step)."""
# a ``StepRow``'s fields
_AT: Final = 0
_WHAT: Final = 1
_LM: Final = 2
_NODE: Final = 3
_PART: Final = 4
_DETAIL: Final = 5
_COUNT: Final = 6


@dataclass(slots=True)
class Rows:
    """A task's timeline as the journal keeps it while the task lives: ``StepRow``s
    (a ``Trail`` of ``Step``s when read, ``Journal.trail``).  Tuples of atoms: made
    without a call each (a ``Step`` is a Python ``__init__``), moved whole into the
    task's ``EndedTask``, and the collector stops tracking them once it has seen them
    (a busy GM holds a timeline for every task it holds)."""

    steps: list[StepRow]
    dropped: int = 0


_NOTED_AT_END = frozenset((EventKind.STARTED, EventKind.FINISHED, EventKind.FAILED))
"""Event kinds not noted as steps of their own (a start is its own step; an end is
noted when the task ends)."""
_PHASES = len(Phase)


def _components(task: Task) -> tuple[float, ...]:
    """``tuple(task.components())``, the same sums in the same order (once per ended
    task: ``len(Phase)`` asked of the enum class each time was a tenth of it)."""
    out = [0.0] * _PHASES
    marks = task.marks
    end = task.started_at
    if end < 0:
        end = math.inf
    t0, p0 = marks[0] if marks else (0.0, 0)
    for i in range(1, len(marks)):
        if t0 >= end:
            break
        t1, p1 = marks[i]
        out[p0] += t1 - t0
        t0, p0 = t1, p1
    return tuple(out)


class EndedTask(msgspec.Struct, gc=False):
    """What is kept of a task once it finished or failed (never changed once made):
    atoms and tuples of atoms only.  A GM keeps thousands: the collector untracks
    tuples of atoms, and this struct is never tracked (``gc=False``: it holds no
    container that could hold it back), so no collection walks an ended task (a
    ``Task`` and its ``Trail`` were ~17 objects; a full collection took 0.14-0.22 s in
    a busy GM).  A struct, not a frozen dataclass: that sets each field through
    ``object.__setattr__``, 2-3x the cost of making one, and a GM makes one per task."""

    user: str
    task_id: str
    job_id: str
    attempt: int
    lm: str
    submitted_at: float
    started_at: float
    finished_at: float
    decisions: int
    waits: tuple[int, ...]
    components_s: tuple[float, ...]
    finished: bool
    reason: str
    steps: tuple[StepRow, ...]
    dropped: int

    @classmethod
    def of(cls, task: Task, trail: Trail | Rows, *, finished: bool, reason: str) -> EndedTask:
        rows: tuple[StepRow, ...] = (
            tuple(trail.steps) if isinstance(trail, Rows) else tuple(map(_ROW, trail.steps))
        )
        spec = task.spec
        return cls(
            spec.user, spec.task_id, spec.job_id, task.attempt, task.lm or "",
            task.submitted_at, task.started_at, task.finished_at, task.decisions,
            tuple(task.waits), _components(task), finished, reason, rows, trail.dropped,
        )  # fmt: skip

    def components(self) -> list[float]:
        return list(self.components_s)

    def trail(self) -> Trail:
        return Trail([Step(*row) for row in self.steps], self.dropped)


class Journal:
    """Bounded per-task timelines of one GM, and a ring of recently ended tasks."""

    def __init__(self, per_task: int = PER_TASK, ended: int = ENDED) -> None:
        if per_task < 1 or ended < 1:
            raise ValueError("a journal keeps at least one step and one ended task")
        self.per_task = per_task
        self.limit = ended
        self.trails: dict[TaskKey, Rows] = {}
        """The timelines of the tasks held (as rows: ``trail`` reads one as steps)."""
        self.ended: OrderedDict[TaskKey, EndedTask] = OrderedDict()

    def note(
        self,
        key: TaskKey,
        at: float,
        what: str,
        *,
        lm: str = "",
        node: int = -1,
        partition: str = "",
        detail: str = "",
    ) -> None:
        """Append a step to ``key``'s timeline (the same step again only counts)."""
        trail = self.trails.get(key)
        if trail is None:  # a task's first step (the bound keeps at least one)
            self.trails[key] = Rows([(at, what, lm, node, partition, detail, 1, at)])
            return
        steps = trail.steps
        if steps:
            last = steps[-1]
            if (
                last[_WHAT] == what
                and last[_LM] == lm
                and last[_NODE] == node
                and last[_PART] == partition
                and last[_DETAIL] == detail
            ):
                steps[-1] = (last[_AT], what, lm, node, partition, detail, last[_COUNT] + 1, at)
                return
        steps.append((at, what, lm, node, partition, detail, 1, at))
        if len(steps) > self.per_task:
            del steps[0]
            trail.dropped += 1

    def wait(self, key: TaskKey, at: float, reason: str, lm: str = "") -> None:
        """A decision at ``at`` did not place the task, for ``reason``.  The reasons of
        one decision make one step (``no_free_resources, user_at_share``), and the same
        reasons decision after decision count as one step."""
        trail = self.trails.get(key)
        steps = trail.steps if trail is not None else []
        last = steps[-1] if steps else None
        if (
            last is None
            or last[_WHAT] != "waits"
            or last[_AT] != at
            or last[_COUNT] != 1
            or last[_LM] != lm
            or reason in last[_DETAIL].split(", ")
        ):
            self.note(key, at, "waits", lm=lm, detail=reason)
            return
        detail = f"{last[_DETAIL]}, {reason}"
        if len(steps) > 1:
            before = steps[-2]
            if before[_WHAT] == "waits" and before[_LM] == lm and before[_DETAIL] == detail:
                b_at, _, _, b_node, b_part, _, b_count, _ = before
                steps[-2] = (b_at, "waits", lm, b_node, b_part, detail, b_count + 1, at)
                steps.pop()
                return
        l_at, _, _, l_node, l_part, _, l_count, l_last = last
        steps[-1] = (l_at, "waits", lm, l_node, l_part, detail, l_count, l_last)

    def started(self, key: TaskKey, at: float, lm: str, node: int) -> None:
        """The task started at ``at`` (said by several events: noted once)."""
        trail = self.trails.get(key)
        if trail is not None:
            for s in trail.steps:
                if s[_AT] == at and s[_WHAT] == "started":
                    return
        self.note(key, at, "started", lm=lm, node=node)

    def event(self, key: TaskKey, ev: TaskEvent) -> None:
        """An LM's event about task ``key`` (an end is noted when the task ends)."""
        at = ev.started_at
        if at >= 0:  # (``started``, inline: every task's end event passes here)
            trail = self.trails.get(key)
            for s in trail.steps if trail is not None else ():
                if s[_AT] == at and s[_WHAT] == "started":
                    break
            else:
                self.note(key, at, "started", lm=ev.lm, node=ev.node)
        if ev.kind not in _NOTED_AT_END:
            self.note(key, ev.at, ev.kind.name.lower(), lm=ev.lm, node=ev.node, detail=ev.detail)

    def close_task(self, task: Task, *, finished: bool, reason: str) -> None:
        """``task`` ended: ``close`` at its end, or, if it failed before it ran
        (infeasible, a parent failed), at its last mark."""
        at = task.finished_at
        if at < 0:
            at = task.marks[-1][0] if task.marks else task.submitted_at
        self.close(task, at, finished=finished, reason=reason)

    def close(self, task: Task, at: float, *, finished: bool, reason: str) -> None:
        """``task`` ended: its timeline moves to the ring of ended tasks."""
        spec = task.spec
        key = (spec.user, spec.task_id)
        self.note(key, at, "finished" if finished else "failed", lm=task.lm or "", detail=reason)
        trail = self.trails.pop(key)
        ended = self.ended
        ended.pop(key, None)  # (ended again: to the newest end)
        ended[key] = EndedTask.of(task, trail, finished=finished, reason=reason)
        while len(ended) > self.limit:
            ended.popitem(last=False)

    def trail(self, key: TaskKey) -> Trail:
        """The timeline of a task this GM holds (empty if it was never tried)."""
        rows = self.trails.get(key)
        if rows is None:
            return Trail()
        return Trail([Step(*row) for row in rows.steps], rows.dropped)
