"""The per-job state of the job-aware policies (``jobs.JobQueues``): a job's stages left,
its runnable and running tasks, and what its plans keep between plans.

Split from ``jobs.py`` (the queues' plan and budgets stay there); ``jobs`` re-exports
every name here."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from operator import attrgetter
from typing import Any

from common.dag import DagProgress, children_of, finish_times
from common.ids import JobId, TaskId, UserId
from common.model import Resources, Task
from global_master.policy.vectors import Vec, dominant, give, take

_waiting = attrgetter("waiting")

PLAN_TASKS = 256
"""A job's plans (Carbyne's packings, SJF's finish time and order, its remaining work)
are made afresh at every one of its task ends while it has fewer than twice this many
tasks left (waiting or running); a larger job's serve ``left // PLAN_TASKS`` ends
(``JobState.stride``), so a task end costs about this many tasks' planning whatever the
job's size: re-planned at every end, a job of n tasks cost O(n^2 log n).  A task of the
job arriving or coming back (a released stage, a preemption) and, for Carbyne, a change
of its allocation re-plan at once."""

PLAN_WINDOW = PLAN_TASKS
"""A plan asks for at most this many of a job's runnable tasks, the first in the
policy's order (``JobState.window``): what one plan can hand out of a large job is
bounded by the room anyway, and listing every task made each plan -- one per task end --
linear in the job's size, so a job of n tasks cost O(n^2).  A plan that ran out of asks
after handing a window's worth out, with a job cut short, is made afresh at once."""

Running = tuple[float, Resources, int]
"""A started task as the packers see it: (end time, demand, stage id)."""

Started = tuple[float, int, Resources, int]
"""A started task in ``JobState.by_end``: (end time, start stamp, demand, stage id)."""


@dataclass(slots=True)
class StageState:
    """One unfinished stage of a job."""

    parents: tuple[int, ...]
    waiting: dict[TaskId, Task]
    """Not started: runnable, or not yet released by the parent stages (in the order
    they came; a task id, not a list scan, says whether one is here)."""
    running: int
    """Tasks of this stage still running."""


@dataclass(slots=True)
class JobState:
    """What a job-aware policy knows about one job."""

    job_id: JobId
    user: UserId
    arrival: float
    progress: DagProgress | None
    stages: dict[int, StageState] = field(default_factory=dict)
    stage_of: dict[TaskId, int] = field(default_factory=dict)
    queued: dict[TaskId, Task] = field(default_factory=dict)
    """Runnable tasks (changed only through ``enqueue`` and ``dequeue``)."""
    queued_demands: dict[Resources, int] = field(default_factory=dict)
    """How many runnable tasks there are of each demand."""
    running: dict[TaskId, tuple[Task, float]] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change of the job's tasks: keys the cached results."""
    events: int = 0
    """Bumped when a task of the job ends, comes back or arrives -- the events at which
    Carbyne re-plans a job (seed §3.3), not when one starts as planned."""
    ended: int = 0
    """Tasks of the job that finished (each also an event)."""
    deadline: tuple[float, int] | None = None
    """Carbyne's T_k and how many jobs had arrived when it was promised: until another
    job arrives, a job's own altruism never moves T_k later."""
    cached: dict[str, tuple[int, int, int, Any]] = field(default_factory=dict)
    """Per name: (version, events other than ends, ends, value) when it was made."""
    level: dict[int, int] = field(default_factory=dict)
    """Each stage's depth in the whole DAG (0: a root)."""
    by_end: list[Started] = field(default_factory=list)
    """The running tasks, earliest end first, then in the order they started (the
    order of ``running``): kept as tasks start and stop, never re-sorted."""
    _started: dict[TaskId, Started] = field(default_factory=dict)
    _stamps: int = 0
    _held: Vec = field(default_factory=list)
    """What the running tasks hold, kept as they start and stop (integer demands: the
    sums are exact, so they equal a fresh sum)."""
    _edges: tuple[tuple[int, ...], dict[int, list[int]], dict[int, list[int]]] | None = None
    """(the stages left, in order; ``children``; ``live_parents``) -- see ``children``."""
    _work: tuple[tuple[float, int, tuple[float, ...]] | None, float] = (None, 0.0)
    """``remaining_work`` at (now, version, capacity): a plan asks for it twice."""
    stamp: int = 0
    """Bumped whenever ``queued`` or ``running`` changes: keys what a plan reads of the
    job that depends on nothing else (``per_stamp``), so a GM holding many jobs does not
    rebuild it for every job at every plan, only for the jobs that changed."""
    per_stamp: dict[str, tuple[int, Any]] = field(default_factory=dict)
    """Per name: (``stamp`` when it was made, value)."""
    _stride: tuple[tuple[int, int, int], int] = ((-1, -1, -1), 1)
    """``stride`` at (version, running tasks, stages left): a plan asks for it often."""
    chain: Any = None
    """The chain of stages the job's DAG ends with, as the packings reuse it
    (``altruism_tail.Tail``; None until a packing looks for it)."""

    def enqueue(self, task: Task) -> None:
        """``task`` is runnable."""
        old = self.queued.get(task.task_id)
        if old is not None:
            self._uncount(old.demand)
        self.stamp += 1
        self.queued[task.task_id] = task
        d = task.demand
        self.queued_demands[d] = self.queued_demands.get(d, 0) + 1

    def dequeue(self, task_id: TaskId) -> Task | None:
        """``task_id`` is no longer runnable: the task, or None if it was not."""
        task = self.queued.pop(task_id, None)
        if task is not None:
            self.stamp += 1
            self._uncount(task.demand)
        return task

    def _uncount(self, d: Resources) -> None:
        n = self.queued_demands[d] - 1
        if n:
            self.queued_demands[d] = n
        else:
            del self.queued_demands[d]

    def queued_demand(self, m: int) -> Vec:
        """What the runnable tasks ask for, summed (integer demands: exact)."""
        total = [0.0] * m
        for d, n in self.queued_demands.items():
            for r, x in enumerate(d):
                total[r] += x * n
        return total

    def demand(self, m: int) -> Vec:
        """What the job runs plus what is runnable (DRF's demand): ``usage`` with
        ``queued_demand`` added, kept until ``stamp`` changes.  Shared: do not change it."""
        hit = self.per_stamp.get("demand")
        if hit is not None and hit[0] == self.stamp and len(hit[1]) == m:
            return hit[1]  # type: ignore[no-any-return]
        d = self.usage(m)
        give(d, self.queued_demand(m))
        self.per_stamp["demand"] = (self.stamp, d)
        return d

    def kept(self, name: str) -> Any:
        """The value kept under ``name`` at the current ``stamp``, or None."""
        hit = self.per_stamp.get(name)
        return hit[1] if hit is not None and hit[0] == self.stamp else None

    def keep_for_stamp(self, name: str, value: Any) -> None:
        self.per_stamp[name] = (self.stamp, value)

    def window(self, name: str, order: Callable[[], list[Task]]) -> list[Task]:
        """The first ``PLAN_WINDOW`` runnable tasks in the order ``order()`` gives -- an
        order a task's start or end does not change (only one arriving or coming back):
        the list is kept under ``name`` (``memo``), and once more than a window of tasks
        that left it lead it, it is kept without them."""
        hit: list[Task] | None = self.memo(name, across_starts=True)
        if hit is None:
            hit = order()
            self.keep(name, hit)
        queued = self.queued
        out: list[Task] = []
        gone = 0
        for t in hit:
            if t.task_id in queued:
                out.append(t)
                if len(out) == PLAN_WINDOW:
                    break
            else:
                gone += 1
        if gone > PLAN_WINDOW:
            self.keep(name, [t for t in hit if t.task_id in queued])
        return out

    def start(self, task: Task, now: float) -> None:
        """``task`` runs from ``now``."""
        self.stamp += 1
        self.running[task.task_id] = (task, now)
        entry = (now + task.duration, self._stamps, task.demand, self.stage_of[task.task_id])
        self._stamps += 1
        self._started[task.task_id] = entry
        bisect.insort(self.by_end, entry)
        if not self._held:
            self._held = [0.0] * len(task.demand)
        give(self._held, task.demand)

    def stop(self, task_id: TaskId) -> Task | None:
        """``task_id`` no longer runs: the task, or None if it was not running."""
        hit = self.running.pop(task_id, None)
        if hit is None:
            return None
        self.stamp += 1
        entry = self._started.pop(task_id)
        del self.by_end[bisect.bisect_left(self.by_end, entry)]
        take(self._held, entry[2])
        return hit[0]

    def stride(self) -> int:
        """How many of this job's task ends one of its plans serves (``PLAN_TASKS``;
        1: every end re-plans)."""
        key = (self.version, len(self.running), len(self.stages))
        if self._stride[0] != key:  # (every change of the waiting tasks bumps ``version``)
            left = len(self.running) + sum(map(len, map(_waiting, self.stages.values())))
            self._stride = (key, max(1, left // PLAN_TASKS))
        return self._stride[1]

    def memo(self, name: str, *, across_starts: bool = False) -> Any:
        """A value kept under ``name`` (``keep``) that still holds, or None: one made at
        the current version -- or, for a large job (``stride`` > 1) or one whose value
        holds ``across_starts``, one made since the last task of the job arrived or came
        back and fewer than ``stride`` task ends ago (a list of tasks in it may then
        name tasks that have started since)."""
        hit = self.cached.get(name)
        if hit is None:
            return None
        version, others, ended, value = hit
        if version == self.version:
            return value
        if self.events - self.ended != others:
            return None
        stride = self.stride()
        return value if (stride > 1 or across_starts) and self.ended - ended < stride else None

    def keep(self, name: str, value: Any) -> None:
        self.cached[name] = (self.version, self.events - self.ended, self.ended, value)

    def usage(self, m: int) -> Vec:
        """What the job's running tasks hold (a fresh list)."""
        return list(self._held) if self._held else [0.0] * m

    def remaining_work(self, now: float, capacity: Sequence[float]) -> float:
        """Work left, in dominant share x seconds: the measure of SRTF (Carbyne's
        leftover order, Tetris's remaining-work term)."""
        key = (now, self.version, tuple(capacity))
        if self._work[0] == key:  # asked again in the same plan
            return self._work[1]
        doms: dict[Resources, float] = {}

        def dom(d: Resources) -> float:
            x = doms.get(d)
            if x is None:
                x = doms[d] = dominant(d, capacity)
            return x

        w = self.memo("waiting_work")
        if w is None:
            stages: Iterable[StageState] = self.stages.values()
            rest: Iterable[float] = ()
            tail = self.chain
            front = tail.check(self) if tail is not None else None
            if front is not None and front < len(tail.links):  # (its products kept)
                stages = islice(stages, len(self.stages) - (len(tail.links) - front))
                rest = tail.work(front, capacity, dom)
            head = (dom(t.demand) * t.duration for st in stages for t in st.waiting.values())
            w = sum(chain(head, rest))
            self.keep("waiting_work", w)
        total = float(w)
        for t, since in self.running.values():
            total += dom(t.demand) * max(0.0, since + t.duration - now)
        self._work = (key, total)
        return total

    def parents(self) -> dict[int, tuple[int, ...]]:
        return {s: st.parents for s, st in self.stages.items()}

    def children(self) -> dict[int, list[int]]:
        """``common.dag.children_of`` the stages left: stage -> stages left waiting on
        it.  Kept while the stages left are the same ones (a stage's parents never
        change): Carbyne packs the job at every plan, and rebuilding it walked every
        edge of the DAG each time.  Shared: do not change it."""
        return self._edges_now()[1]

    def live_parents(self) -> dict[int, list[int]]:
        """Each stage left's parents that are left too (kept as ``children`` is)."""
        return self._edges_now()[2]

    def _edges_now(self) -> tuple[tuple[int, ...], dict[int, list[int]], dict[int, list[int]]]:
        stages = self.stages
        key = tuple(stages)
        hit = self._edges
        if hit is None or hit[0] == key:
            pass
        elif len(key) < len(hit[0]) and tuple(filter(stages.__contains__, hit[0])) == key:
            self._drop_edges(set(hit[0]).difference(stages))
            hit = self._edges = (key, hit[1], hit[2])
        else:
            hit = None
        if hit is None:
            parents = {s: [p for p in st.parents if p in stages] for s, st in stages.items()}
            hit = self._edges = (key, children_of(self.parents()), parents)
        return hit

    def _drop_edges(self, gone: set[int]) -> None:
        """The kept edges without the stages ``gone`` (the stages left are the kept
        ones but these, in the same order): the same lists as made afresh, by touching
        the stages next to those gone only -- a chain's link ending costs O(1), not a
        walk of every edge left.  (A stage left with no child left has no entry in
        ``children``, as in ``children_of``.)"""
        assert self._edges is not None
        _, children, parents = self._edges
        around = [(x, parents.pop(x), children.pop(x, [])) for x in gone]
        for x, ps, cs in around:
            for c in cs:
                if c in parents:
                    parents[c] = [p for p in parents[c] if p != x]
            for p in ps:
                kept = children.get(p)
                if kept is not None:
                    rest = [c for c in kept if c != x]
                    if rest:
                        children[p] = rest
                    else:
                        del children[p]

    def critical_path(self, now: float) -> float:
        """Longest remaining chain of stage durations (running tasks end when they end)."""
        ends: dict[int, float] = {}
        for t, since in self.running.values():
            s = self.stage_of[t.task_id]
            ends[s] = max(ends.get(s, now), since + t.duration)
        length = {
            s: max((t.duration for t in st.waiting.values()), default=0.0)
            for s, st in self.stages.items()
        }
        finish = finish_times(self.parents(), length, start=now, not_before=ends)
        return max(finish.values(), default=now) - now

    def running_list(self) -> list[Running]:
        return [
            (since + t.duration, t.demand, self.stage_of[t.task_id])
            for t, since in self.running.values()
        ]

    def breadth_first(self) -> list[Task]:
        """Runnable tasks, shallowest stage of the DAG first (Tez's default order)."""
        level, stage_of = self.level, self.stage_of

        def key(t: Task) -> tuple[int, int, TaskId]:
            s = stage_of[t.task_id]
            return (level.get(s, 0), s, t.task_id)

        return sorted(self.queued.values(), key=key)
