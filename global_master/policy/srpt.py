"""Shortest remaining processing time across jobs, within each user's share (``srpt``).

Megha's GM serves its user queues round-robin and preempts for users below their
share (Alg. 2); ``srpt`` changes only the order *within* a user: the task served next
is one of the job with the least remaining work, aged (below), ties by the job's arrival.  A flat
job (a trace's, a live ``megha submit``'s) is ordered as well as a DAG's released
stages, so the policy serves trace replays and live runs alike.

* A job's **remaining work** is the sum of the durations of its tasks the queues hold
  (queued, waiting for room, or back from an LM): not yet started.  A task of unknown
  duration (0) counts as ``UNKNOWN_DURATION_S``: a live job's remaining work is then its
  count of tasks not started.  It falls as the job's tasks leave for an LM and rises
  again when one comes back (``Remaining``).
* The GM's waiting index (``WaitingTasks``) keeps each class in the same order, and
  offers a freed node to its classes by the least remaining work each would serve next
  (``class_order``), so freed room goes to the least remaining work of all the classes
  that fit, not to the oldest task or class: under overload most tasks wait there.
* **Aging** keeps the largest jobs from starving (plain SRPT serves them only once no
  smaller work waits: under overload, never until the arrivals stop).  A job is ranked
  by its remaining work halved for every ``half_life_s`` since it arrived (its first
  task's submission):

      rank = log2(remaining work) + arrival / half_life_s

  the log of ``remaining * 2 ** -((now - arrival) / half_life_s)`` plus ``now /
  half_life_s``, the same for every job at once: the order changes only when a job's
  remaining work does, so the heaps stay valid as time passes (as the priority classes'
  aging, a rank is a static key).  A job ``k`` times larger than a fresh one goes ahead
  of it once it has waited ``log2(k) * half_life_s``: the **aging bound** (a job of
  2,000 tasks of 60 s against one of one 1 s task: 17 half-lives).
  ``half_life_s = inf`` is plain SRPT.  The default (``SRPT_HALF_LIFE_S``) was chosen on
  the ideal queue (``benchmarks/srpt_bound.py --half-lives``): on the Google-like trace
  at 130% of 1,000 slots and YH1 at 130% of 10,000 it keeps mean JCT within 6% of plain
  SRPT's while the tasks' p99 wait falls by half (1,145 to 547 s; 1,272 to 706 s, below
  FIFO's 787 s on YH1, above its 366 s on the Google-like).  The half-life is in the
  trace's seconds: where waits are much longer than it (the same trace's first 1,000
  jobs on 250 slots: FIFO waits p99 827 s), it serves the large jobs nearly in arrival
  order (mean JCT 0.54x FIFO's against plain SRPT's 0.25x), a knob as ``aging_s`` is.
* Each queue (``JobHeap``) is a heap of jobs with lazy deletion: a job's change of
  remaining work pushes a fresh entry to every queue that holds it (``Remaining``
  knows which), and stale entries are dropped when they surface.  A decision costs
  O(log n) in the jobs held.

The kind is ``fifo``: the GM's waiting index and its preemption for shares apply as to
plain Megha (a task of ``srpt`` is never ALTRUISTIC).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator
from typing import ClassVar

from common.ids import JobId, UserId
from common.model import Task, TaskKey
from common.overload import SRPT_HALF_LIFE_S as SRPT_HALF_LIFE_S
from global_master.queues import QueueKind, TaskQueue, UserQueues, WaitClass, WaitingTasks

JobKey = tuple[UserId, JobId]

UNKNOWN_DURATION_S = 1.0
"""What a task of unknown duration (0: a live job that gave none) counts as."""

Rank = tuple[float, int]
"""A job's place in a queue: (aged remaining work, arrival order), smaller first."""


def work_of(task: Task) -> float:
    """The work ``task`` adds to its job's remaining work."""
    return task.duration if task.duration > 0 else UNKNOWN_DURATION_S


class Remaining:
    """Per job: the remaining work of the tasks the queues hold, and which queues hold
    the job (to tell them when its rank changes)."""

    def __init__(self, half_life_s: float = SRPT_HALF_LIFE_S) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be > 0, not {half_life_s!r}")
        self.half_life_s = half_life_s
        self.work: dict[JobKey, float] = {}
        self.arrival: dict[JobKey, float] = {}
        self.tasks: dict[JobKey, int] = {}
        self.version: dict[JobKey, int] = {}
        self.order: dict[JobKey, int] = {}
        self.holders: dict[JobKey, list[JobHeap]] = {}
        self.held: set[TaskKey] = set()
        self._arrivals = 0
        self._stamp = 0
        """Versions for every job's ranks, never reused: a job that leaves and comes back
        (all its tasks out, one returned) must not match a stale heap entry of before."""

    def rank(self, jk: JobKey) -> Rank:
        return (self.aged(jk), self.order[jk])

    def aged(self, jk: JobKey) -> float:
        """The job's remaining work, aged: ``log2(work) + arrival / half_life_s`` (the
        work itself with no aging, ``half_life_s = inf``: the same order)."""
        work = self.work[jk]
        if math.isinf(self.half_life_s):
            return work
        return math.log2(max(work, 1e-9)) + self.arrival[jk] / self.half_life_s

    def add(self, task: Task) -> None:
        """``task`` is held (again): its work counts."""
        key = task.key
        if key in self.held:
            return
        self.held.add(key)
        jk = (task.user, task.job_id)
        if jk not in self.order:
            self.order[jk] = self._arrivals
            self._arrivals += 1
            self.work[jk], self.tasks[jk], self.version[jk] = 0.0, 0, 0
            self.arrival[jk] = task.submitted_at
        elif task.submitted_at < self.arrival[jk]:
            self.arrival[jk] = task.submitted_at
        self.tasks[jk] += 1
        self._moved(jk, self.work[jk] + work_of(task))

    def drop(self, task: Task) -> None:
        """``task`` left for an LM or ended: its work no longer counts."""
        key = task.key
        if key not in self.held:
            return
        self.held.discard(key)
        jk = (task.user, task.job_id)
        left = self.tasks[jk] - 1
        if left == 0:  # no task of the job held: no queue holds it either
            del self.work[jk], self.tasks[jk], self.version[jk], self.order[jk]
            del self.arrival[jk]
            self.holders.pop(jk, None)
            return
        self.tasks[jk] = left
        self._moved(jk, max(0.0, self.work[jk] - work_of(task)))

    def _moved(self, jk: JobKey, work: float) -> None:
        self.work[jk] = work
        self._stamp += 1
        version = self.version[jk] = self._stamp
        entry = (self.aged(jk), self.order[jk], version, jk)
        for heap in self.holders.get(jk, ()):
            heap.push(entry)


Entry = tuple[float, int, int, JobKey]
"""(aged remaining work, arrival order, version, job) in a ``JobHeap``."""


class JobHeap:
    """A queue of tasks served job by job, least remaining work first; within a job in
    the order the tasks came (``appendleft``: first).  Behaves as the ``deque`` of a
    plain user queue (``TaskQueue``)."""

    __slots__ = ("heap", "jobs", "remaining", "size")

    def __init__(self, remaining: Remaining) -> None:
        self.remaining = remaining
        self.jobs: dict[JobKey, deque[Task]] = {}
        self.heap: list[Entry] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self) -> Iterator[Task]:
        """The tasks in the order they would be served (as things stand)."""
        rank = self.remaining.rank
        for jk in sorted(self.jobs, key=rank):
            yield from self.jobs[jk]

    def __contains__(self, task: object) -> bool:
        if not isinstance(task, Task):
            return False
        q = self.jobs.get((task.user, task.job_id))
        return q is not None and task in q

    def push(self, entry: Entry) -> None:
        """A fresh rank for a job held here (``Remaining`` calls this)."""
        heapq.heappush(self.heap, entry)
        if len(self.heap) > 4 * len(self.jobs) + 64:
            self._compact()

    def _compact(self) -> None:
        r = self.remaining
        self.heap = [(r.aged(jk), r.order[jk], r.version[jk], jk) for jk in self.jobs]
        heapq.heapify(self.heap)

    def _job(self, task: Task) -> deque[Task]:
        jk = (task.user, task.job_id)
        q = self.jobs.get(jk)
        if q is None:
            r = self.remaining
            q = self.jobs[jk] = deque()
            r.holders.setdefault(jk, []).append(self)
            self.push((r.aged(jk), r.order[jk], r.version[jk], jk))
        return q

    def append(self, task: Task) -> None:
        self._job(task).append(task)
        self.size += 1

    def appendleft(self, task: Task) -> None:
        self._job(task).appendleft(task)
        self.size += 1

    def head_key(self) -> tuple[float, ...]:
        """(aged remaining work, arrival order) of the job served next (inf: empty)."""
        heap, version = self.heap, self.remaining.version
        while heap:
            work, order, v, jk = heap[0]
            if jk in self.jobs and version.get(jk) == v:
                return (work, order)
            heapq.heappop(heap)
        return (math.inf,)

    def popleft(self) -> Task:
        """A task of the job with the least remaining work."""
        heap, version = self.heap, self.remaining.version
        while heap:
            _, _, v, jk = heap[0]
            q = self.jobs.get(jk)
            if q is None or version.get(jk) != v:
                heapq.heappop(heap)
                continue
            task = q.popleft()
            self.size -= 1
            if not q:
                self._gone(jk)
            return task
        raise IndexError("pop from an empty JobHeap")

    def remove(self, task: Task) -> None:
        jk = (task.user, task.job_id)
        q = self.jobs.get(jk)
        if q is None:
            raise ValueError("task not in queue")
        q.remove(task)
        self.size -= 1
        if not q:
            self._gone(jk)

    def _gone(self, jk: JobKey) -> None:
        del self.jobs[jk]
        holders = self.remaining.holders.get(jk)
        if holders is not None:
            holders.remove(self)


class SrptWaiting(WaitingTasks):
    """The GM's waiting index, each class and user's tasks least remaining work first."""

    def __init__(self, remaining: Remaining) -> None:
        super().__init__()
        self.remaining = remaining

    def new_queue(self) -> TaskQueue:
        return JobHeap(self.remaining)

    def class_order(self) -> list[WaitClass]:
        """The classes whose next job has the least remaining work first: freed room
        goes to the least remaining work across classes, not to the oldest class."""
        return sorted(self.by_class, key=lambda c: class_key(self.by_class[c].values()))


def class_key(queues: Iterable[TaskQueue]) -> tuple[float, ...]:
    """The smallest ``head_key`` of a waiting class's queues (one per user)."""
    return min((q.head_key() for q in queues if isinstance(q, JobHeap)), default=(math.inf,))


class SrptQueues(UserQueues):
    """Round-robin over users (their shares kept by Alg. 2, as in plain Megha); within a
    user, least remaining work first."""

    name = "srpt"
    kind: ClassVar[QueueKind] = "fifo"
    """Tasks that found no room wait in the GM's waiting index (kept in this order)."""

    def __init__(
        self,
        users: Iterable[UserId],
        *,
        patience: int = 8,
        half_life_s: float = SRPT_HALF_LIFE_S,
    ) -> None:
        self.remaining = Remaining(half_life_s)
        super().__init__(users, patience=patience)
        self.waiting = SrptWaiting(self.remaining)

    def new_queue(self) -> TaskQueue:
        return JobHeap(self.remaining)

    def push_back(self, task: Task) -> None:
        self.remaining.add(task)
        super().push_back(task)

    def push_front(self, task: Task) -> None:
        self.remaining.add(task)
        super().push_front(task)

    def on_dispatched(self, task: Task, now: float) -> None:
        self.remaining.drop(task)

    def on_returned(self, task: Task, now: float) -> None:
        self.remaining.add(task)

    def abandon(self, task: Task, now: float) -> list[Task]:
        self.remaining.drop(task)
        return super().abandon(task, now)

    def remove(self, task: Task) -> bool:
        removed = super().remove(task)
        if removed:
            self.remaining.drop(task)
        return removed
