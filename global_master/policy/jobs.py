"""Job-aware user queues: the per-job state and the plan every DAG policy shares.

Theory of operation (seed ``carbyne-paper.txt`` §3; SPEC §2 "Carbyne"):

* A policy is a ``UserQueues``: the GM core pops tasks from it and runs Megha's
  decision path on each (match, repartition, fairness).  The policy decides only
  *which* runnable tasks may be tried now and in what order; placement stays in the
  GM core, so the simulator and the live GM run the same code.
* The policy never reads the GM.  The GM tells it what the federation holds
  (``set_cluster``: total capacity and the distinct node capacities) whenever its
  view is rebuilt from a snapshot, and reports every task's fate through the hooks
  (``on_dispatched``, ``on_finished``, ``on_returned``, ``abandon``).
* Per job (``JobState``) the queues own: the DAG's stages not yet finished (their
  waiting tasks and how many run), the runnable (queued) tasks, the running tasks
  and since when.  ``version`` is bumped on every change and keys cached results.
* At each scheduling event -- job arrival, task completion, a task coming back --
  the queues are *dirty* and the next ``pop`` builds a **plan**: the ordered tasks
  admitted until the next event, never more than the entitled capacity left.  A task
  the GM could not place is *blocked* until the GM's view changes (``new_epoch``).
* The capacity a GM's users are **entitled** to is the federation's capacity times
  the sum of their configured shares (at most all of it).

No clocks: the time of a plan is the ``now`` of the last event the GM reported.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.dag import DagJob, DagProgress, longest_path, topological_order
from common.ids import JobId, TaskId, UserId
from common.model import Resources, Task
from global_master.policy.vectors import Vec, dominant, fits_in, give, take
from global_master.queues import UserQueues

Running = tuple[float, Resources, int]
"""A started task as the packers see it: (end time, demand, stage id)."""


@dataclass(slots=True)
class StageState:
    """One unfinished stage of a job."""

    parents: tuple[int, ...]
    waiting: list[Task]
    """Not started: runnable, or not yet released by the parent stages."""
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
    running: dict[TaskId, tuple[Task, float]] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change of the job's tasks: keys the cached results."""
    packed: tuple[tuple[int, tuple[int, ...]], list[tuple[float, Task]]] | None = None
    """Carbyne's last reverse packing, keyed by (version, allocation)."""
    cached: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def memo(self, name: str) -> Any:
        """A value cached under ``name`` at the current version, or None."""
        hit = self.cached.get(name)
        return hit[1] if hit is not None and hit[0] == self.version else None

    def usage(self, m: int) -> Vec:
        """What the job's running tasks hold (a fresh list)."""
        hit = self.memo("usage")
        if hit is None:
            hit = [0.0] * m
            for t, _ in self.running.values():
                give(hit, t.demand)
            self.cached["usage"] = (self.version, hit)
        return list(hit)

    def parents(self) -> dict[int, tuple[int, ...]]:
        return {s: st.parents for s, st in self.stages.items()}

    def critical_path(self, now: float) -> float:
        """Longest remaining chain of stage durations (running tasks end when they end)."""
        ends: dict[int, float] = {}
        for t, since in self.running.values():
            s = self.stage_of[t.task_id]
            ends[s] = max(ends.get(s, now), since + t.duration)
        length = {
            s: max((t.duration for t in st.waiting), default=0.0) for s, st in self.stages.items()
        }
        return longest_path(self.parents(), length, start=now, not_before=ends) - now

    def running_list(self) -> list[Running]:
        return [
            (since + t.duration, t.demand, self.stage_of[t.task_id])
            for t, since in self.running.values()
        ]

    def breadth_first(self) -> list[Task]:
        """Runnable tasks in the DAG's topological order of their stages."""
        order = {s: k for k, s in enumerate(topological_order(self.parents()))}
        return sorted(
            self.queued.values(), key=lambda t: (order.get(self.stage_of[t.task_id], 0), t.task_id)
        )


def admit(tasks: Iterable[Task], room: Vec, *, force_first: bool = False) -> list[Task]:
    """Tasks that fit in ``room`` (first fit, in order); ``room`` is consumed.

    ``force_first`` admits the first task even if it does not fit (a job that holds
    nothing must be able to start, whatever its share).
    """
    out: list[Task] = []
    for t in tasks:
        if fits_in(t.demand, room) or (force_first and not out):
            out.append(t)
            take(room, t.demand)
        force_first = False
    return out


def round_robin(lists: Sequence[list[Task]]) -> list[Task]:
    """One task of each list in turn."""
    out: list[Task] = []
    k = 0
    while True:
        added = False
        for lst in lists:
            if k < len(lst):
                out.append(lst[k])
                added = True
        if not added:
            return out
        k += 1


class JobQueues(UserQueues):
    """Job-aware queues: the shared bookkeeping of every policy but plain FIFO."""

    name = "job"

    def __init__(
        self,
        users: Iterable[UserId],
        *,
        shares: dict[UserId, float] | None = None,
        capacity: Sequence[int] | None = None,
        patience: int = 8,
    ) -> None:
        super().__init__(users, patience=patience)
        self.jobs: dict[JobId, JobState] = {}
        self.shares: dict[UserId, float] = dict(shares or {})
        self._capacity: list[float] = []
        self._node_caps: set[Resources] = set()
        self.now = 0.0
        self._dirty = True
        self._plan: list[Task] = []
        self._alt: set[TaskId] = set()
        self._blocked: set[TaskId] = set()
        self._popped: set[TaskId] = set()
        self.counters: dict[str, float] = {
            "plans": 0,
            "default_started": 0,
            "altruistic_started": 0,
            "leftover_yielded": 0.0,
            "leftover_reused": 0.0,
        }
        if capacity:
            self.set_cluster(capacity, ())

    # ------------------------------------------------------------ the seam
    def set_cluster(
        self, capacity: Sequence[int], node_capacities: Collection[tuple[int, ...]]
    ) -> None:
        """The federation's total capacity and its distinct node capacities."""
        frac = min(1.0, sum(self.shares.get(u, 1.0) for u in self.queues))
        self._capacity = [x * frac for x in capacity]
        self._node_caps = set(node_capacities)
        self._dirty = True

    @property
    def capacity(self) -> list[float]:
        """What this GM's users are entitled to: federation capacity x their shares."""
        return self._capacity

    def __len__(self) -> int:
        return sum(len(j.queued) for j in self.jobs.values())

    def __iter__(self) -> Iterator[Task]:
        for j in self.jobs.values():
            yield from j.queued.values()

    def _job_for(self, task: Task) -> JobState:
        job = self.jobs.get(task.job_id)
        if job is None:  # a plain job: one stage, its tasks arrive through submit
            job = self.jobs[task.job_id] = JobState(task.job_id, task.user, self.now, None)
        if task.task_id not in job.stage_of:
            sid = 0
            if job.progress is not None:
                found = job.progress.stage_of(task.task_id)
                sid = found if found is not None else 0
            st = job.stages.get(sid)
            if st is None:
                st = job.stages[sid] = StageState((), [], 0)
            st.waiting.append(task)
            job.stage_of[task.task_id] = sid
        return job

    def add_job(self, job: DagJob, now: float) -> None:
        self.now = max(self.now, now)
        progress = DagProgress(job)
        state = JobState(job.job_id, job.user, now, progress)
        for s in job.stages:
            state.stages[s.stage_id] = StageState(s.parents, list(s.tasks), 0)
            for t in s.tasks:
                state.stage_of[t.task_id] = s.stage_id
        self.jobs[job.job_id] = state
        self._dags[job.job_id] = progress
        for t in progress.roots():
            t.submit(now)
            self.push_back(t)

    def push_back(self, task: Task) -> None:
        job = self._job_for(task)
        job.queued[task.task_id] = task
        job.version += 1
        if task.task_id in self._popped:  # could not be placed: wait for a new epoch
            self._popped.discard(task.task_id)
            self._blocked.add(task.task_id)
            self._plan.append(task)
        else:
            self._dirty = True

    def push_front(self, task: Task) -> None:
        self._popped.discard(task.task_id)
        job = self._job_for(task)
        job.queued[task.task_id] = task
        job.version += 1
        self._dirty = True

    def remove(self, task: Task) -> bool:
        job = self.jobs.get(task.job_id)
        if job is None or job.queued.pop(task.task_id, None) is None:
            return False
        self._dirty = True
        return True

    def abandon(self, task: Task, now: float) -> list[Task]:
        lost = super().abandon(task, now)
        self._popped.discard(task.task_id)
        job = self._unrun(task)  # a task that failed on its worker was running
        if job is not None:
            job.version += 1
            for t in (task, *lost):
                job.queued.pop(t.task_id, None)
                st = job.stages.get(job.stage_of.get(t.task_id, -1))
                if st is not None and t in st.waiting:
                    st.waiting.remove(t)
            for sid in [s for s, st in job.stages.items() if not st.waiting and not st.running]:
                del job.stages[sid]
            self._forget_if_done(job)
        self._dirty = True
        return lost

    def new_epoch(self) -> None:
        self._blocked.clear()

    def failed(self, user: UserId) -> None:
        del user

    def placed(self, user: UserId) -> None:
        del user

    def has_work(self) -> bool:
        if self._dirty:
            self._replan()
        return any(t.task_id not in self._blocked for t in self._plan)

    def pop(self) -> Task | None:
        if self._dirty:
            self._replan()
        for i, task in enumerate(self._plan):
            if task.task_id in self._blocked:
                continue
            del self._plan[i]
            job = self.jobs.get(task.job_id)
            if job is None or job.queued.pop(task.task_id, None) is None:
                return self.pop()  # stale entry (removed meanwhile)
            task.altruistic = task.task_id in self._alt
            self._popped.add(task.task_id)
            return task
        return None

    def on_dispatched(self, task: Task, now: float) -> None:
        self.now = max(self.now, now)
        self._popped.discard(task.task_id)
        job = self._job_for(task)
        job.queued.pop(task.task_id, None)
        job.version += 1
        if task.task_id not in job.running:
            st = job.stages[job.stage_of[task.task_id]]
            if task in st.waiting:
                st.waiting.remove(task)
                st.running += 1
            job.running[task.task_id] = (task, now)
            self.counters["altruistic_started" if task.altruistic else "default_started"] += 1
            if task.altruistic:
                self.counters["leftover_reused"] += self._dom(task.demand) * task.duration

    def _unrun(self, task: Task) -> JobState | None:
        job = self.jobs.get(task.job_id)
        if job is not None:
            job.version += 1
        if job is None or job.running.pop(task.task_id, None) is None:
            return job
        job.stages[job.stage_of[task.task_id]].running -= 1
        return job

    def on_returned(self, task: Task, now: float) -> None:
        self.now = max(self.now, now)
        job = self._unrun(task)
        if job is not None and task.task_id in job.stage_of:
            st = job.stages[job.stage_of[task.task_id]]
            if task not in st.waiting:
                st.waiting.append(task)
        self._popped.add(task.task_id)
        self._dirty = True

    def on_finished(self, task: Task, now: float) -> None:
        self.now = max(self.now, now)
        job = self._unrun(task)
        self.release_children(task, now)
        if job is not None:
            sid = job.stage_of.get(task.task_id)
            if sid is not None:
                st = job.stages[sid]
                if not st.waiting and not st.running:
                    del job.stages[sid]
            self._forget_if_done(job)
        self._dirty = True

    def _forget_if_done(self, job: JobState) -> None:
        if not job.stages and not job.queued and not job.running:
            del self.jobs[job.job_id]

    # ------------------------------------------------------------- planning
    def _dom(self, demand: Sequence[float]) -> float:
        cap = self.capacity
        return dominant(demand, cap) if cap else 0.0

    def _replan(self) -> None:
        self._dirty = False
        cap = self.capacity
        if not cap:
            self._plan, self._alt = [], set()
            return
        self.counters["plans"] += 1
        plan, alt = self.plan(self.now, cap)
        # never hand out more than the entitled capacity, whatever the policy
        free = self.free(cap, self.jobs.values())
        idle = not any(j.running for j in self.jobs.values())
        # a task no share or node could ever hold goes to the GM anyway: it either
        # fails there explicitly (infeasible) or runs on what is free beyond the share
        oversize = [
            t for j in self.jobs.values() for t in j.queued.values() if self._never_fits(t, cap)
        ]
        big = {t.task_id for t in oversize}
        rest = [t for t in plan if t.task_id not in big]
        self._plan = oversize + admit(rest, free, force_first=idle and not oversize)
        self._alt = alt

    def _never_fits(self, task: Task, cap: Sequence[float]) -> bool:
        if not fits_in(task.demand, cap):
            return True
        caps = self._node_caps
        return bool(caps) and not any(fits_in(task.demand, c) for c in caps)

    def plan(self, now: float, cap: list[float]) -> tuple[list[Task], set[TaskId]]:
        """The admitted tasks in order, and which of them are ALTRUISTIC."""
        raise NotImplementedError

    def active(self) -> list[JobState]:
        """Jobs with a runnable or a running task."""
        return [j for j in self.jobs.values() if j.queued or j.running]

    @staticmethod
    def free(cap: Sequence[float], jobs: Iterable[JobState]) -> Vec:
        """``cap`` minus what the running tasks of ``jobs`` hold."""
        free = list(cap)
        for j in jobs:
            take(free, j.usage(len(cap)))
        return free
