"""Queue policies for a GM's user queues: plain FIFO, DRF, Tetris, SJF and Carbyne.

Theory of operation (seed ``carbyne-paper.txt`` §3, Pseudocode 1; SPEC §2 "Carbyne"):

* A policy is a ``UserQueues``: the GM core pops tasks from it and runs Megha's
  decision path on each (match, repartition, fairness).  The policy only decides
  *which* runnable tasks may be tried now and in what order; placement stays in
  ``global_master/core.py``.  The simulator and the live GM therefore run the same code.
* Job-aware policies (``JobQueues``) track per job its runnable (queued) tasks, its
  running tasks and their usage, and the DAG (``common.dag.DagProgress``).  At each
  scheduling event -- job arrival, task completion, a task coming back -- they build a
  **plan**: the ordered tasks admitted until the next event.  Between events the GM
  pops the plan; a task that could not be placed is blocked until the GM's view
  changes (a new epoch), then tried again.
* The capacity a GM's users are **entitled** to is the federation's capacity times
  the sum of their configured shares (at most all of it).
* **drf**: weighted DRF by progressive filling over the entitled capacity; a job gets
  ``A_k`` (jobs of one user split the user's weight), capped by its demand (running +
  runnable); tasks are admitted breadth-first while they fit in ``A_k`` -- strict
  shares, as in the paper's Fig. 2b.  ``drf-wc`` then gives what is left, lowest
  dominant share first (work conserving, as a Mesos/YARN DRF would).
* **tetris**: every runnable task, ordered by the alignment of its demand with the
  free entitled resources (packing score); no fairness.
* **sjf**: jobs by remaining critical path, shortest first; breadth-first within.
* **carbyne**: DRF gives ``A_k``; forward packing of the job's remaining DAG within
  ``A_k`` gives its completion ``T_k``; reverse packing from ``T_k`` finds the runnable
  tasks that must start now (DEFAULT, within ``A_k``); all other runnable tasks are
  ALTRUISTIC (``task.altruistic = True``).  The leftover -- entitled capacity minus
  what runs minus the DEFAULT tasks -- goes to ALTRUISTIC tasks, jobs with the least
  remaining work first (SRTF) and by packing score within a job; ``packing_first``
  orders all of them by packing score instead.  With probability ``1 - p_altruism``
  (drawn per job per event from the injected ``random.Random``) a job is not
  altruistic: all its runnable tasks within ``A_k`` are DEFAULT and it gets no
  leftover; ``p_altruism = 0`` is exactly ``drf``.
* ALTRUISTIC tasks never trigger a fairness preemption (GM core) and are the first
  victims of one (LM core).  Carbyne and Tetris choose nodes by packing score too.

No clocks: the time of a plan is the ``now`` of the last event the GM reported.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.config import QUEUE_POLICIES
from common.dag import DagJob, DagProgress
from common.errors import ConfigError
from common.ids import GmId, JobId, TaskId, UserId
from common.model import Resources, Task, UserConfig
from global_master.queues import UserQueues

if TYPE_CHECKING:
    from global_master.view import LmView

EPS = 1e-9
Vec = list[float]


# --------------------------------------------------------------------- vectors
def dominant(demand: Sequence[float], capacity: Sequence[float]) -> float:
    """The largest fraction of any resource that ``demand`` takes of ``capacity``."""
    return max((d / c for d, c in zip(demand, capacity, strict=True) if c > 0), default=0.0)


def fits_in(demand: Sequence[float], room: Sequence[float]) -> bool:
    return all(d <= r + EPS for d, r in zip(demand, room, strict=True))


def alignment(demand: Sequence[float], free: Sequence[float], capacity: Sequence[float]) -> float:
    """Tetris's packing score: the dot product of demand and free resources, normalised."""
    return sum((d / c) * (f / c) for d, f, c in zip(demand, free, capacity, strict=True) if c > 0)


def drf_allocation(
    capacity: Sequence[float], demands: Sequence[Sequence[float]], weights: Sequence[float]
) -> list[Vec]:
    """Weighted DRF by progressive filling, each job capped at its demand.

    Every job's allocation grows along its demand vector, its dominant share at a
    rate proportional to its weight, until its demand is met or a resource it uses is
    exhausted.  Returns one allocation vector per job (exact, no iteration tolerance
    beyond ``EPS``).
    """
    n, m = len(demands), len(capacity)
    alloc: list[Vec] = [[0.0] * m for _ in range(n)]
    dirs: list[Vec] = []
    caps: list[float] = []
    share = [0.0] * n
    active: set[int] = set()
    for k, d in enumerate(demands):
        dom = dominant(d, capacity)
        caps.append(dom)
        dirs.append([x / dom for x in d] if dom > 0 else [0.0] * m)
        if dom > 0 and weights[k] > 0:
            active.add(k)
    used = [0.0] * m
    while active:
        step = min((caps[k] - share[k]) / weights[k] for k in active)
        for r in range(m):
            rate = sum(weights[k] * dirs[k][r] for k in active)
            if rate > 0:
                step = min(step, max(0.0, (capacity[r] - used[r]) / rate))
        for k in active:
            share[k] += weights[k] * step
        used = [sum(share[k] * dirs[k][r] for k in range(n)) for r in range(m)]
        full = {r for r in range(m) if used[r] >= capacity[r] - EPS * max(1.0, capacity[r])}
        for k in list(active):
            if share[k] >= caps[k] - EPS or any(dirs[k][r] > 0 for r in full):
                active.discard(k)
    for k in range(n):
        alloc[k] = [share[k] * x for x in dirs[k]]
    return alloc


# ---------------------------------------------------------------- packing
@dataclass(slots=True)
class _Stage:
    parents: tuple[int, ...]
    waiting: list[Task]  # not started (runnable or not yet released)
    running: int  # tasks of this stage still running


def _fits(in_use: Sequence[float], d: Resources, cap: Sequence[float]) -> bool:
    return all(u + x <= c + EPS for u, x, c in zip(in_use, d, cap, strict=True))


def _children(stages: dict[int, _Stage]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for s, st in stages.items():
        for p in st.parents:
            if p in stages:
                children.setdefault(p, []).append(s)
    return children


def forward_pack(
    now: float,
    cap: Sequence[float],
    capacity: Sequence[float],
    stages: dict[int, _Stage],
    running: Sequence[tuple[float, Resources, int]],
) -> float:
    """T_k: when the job's remaining DAG would finish, given the allocation ``cap``.

    List scheduling in time: at each completion, start the ready tasks that fit
    (longest first).  ``running`` are ``(end, demand, stage)`` of started tasks.
    """
    left = {s: len(st.waiting) + st.running for s, st in stages.items()}
    children = _children(stages)
    blocked = {
        s: sum(1 for p in st.parents if p in stages and left[p] > 0) for s, st in stages.items()
    }
    ready: list[tuple[Task, int]] = []
    for s, st in stages.items():
        if blocked[s] == 0:
            ready.extend((t, s) for t in st.waiting)
    heap: list[tuple[float, int, Resources, int]] = []
    in_use = [0.0] * len(cap)
    seq = 0
    for end, d, s in running:
        heapq.heappush(heap, (max(end, now), seq, d, s))
        seq += 1
        for r, x in enumerate(d):
            in_use[r] += x
    clock = now
    finish = now
    order = _order_pairs(ready, capacity)
    while order or heap:
        rest: list[tuple[Task, int]] = []
        failed: set[Resources] = set()
        for pair in order:
            task = pair[0]
            d = task.demand
            if d in failed:
                rest.append(pair)
            elif _fits(in_use, d, cap) or (not heap and not any(u > EPS for u in in_use)):
                heapq.heappush(heap, (clock + task.duration, seq, d, pair[1]))
                seq += 1
                for r, x in enumerate(d):
                    in_use[r] += x
            else:
                failed.add(d)
                rest.append(pair)
        order = rest
        if not heap:
            break
        clock, released = _complete_next(
            heap, in_use, left, blocked, stages, lambda s: children.get(s, ())
        )
        finish = max(finish, clock)
        if released:
            order = _order_pairs(order + released, capacity)
    return finish


def _complete_next(
    heap: list[tuple[float, int, Resources, int]],
    in_use: list[float],
    left: dict[int, int],
    blocked: dict[int, int],
    stages: Mapping[int, _Stage],
    waiting_on: Callable[[int], Iterable[int]],
) -> tuple[float, list[tuple[Task, int]]]:
    """Pop every packed task that ends at the next completion time, free its resources,
    and release the stages that were waiting only on the stages just finished
    (``waiting_on(s)``: children when packing forward, parents when packing in reverse)."""
    released: list[tuple[Task, int]] = []
    t = heap[0][0]
    while heap and heap[0][0] <= t + EPS:
        _, _, d, s = heapq.heappop(heap)
        for r, x in enumerate(d):
            in_use[r] -= x
        left[s] -= 1
        if left[s] == 0:
            for n in waiting_on(s):
                if n in blocked:
                    blocked[n] -= 1
                    if blocked[n] == 0:
                        released.extend((task, n) for task in stages[n].waiting)
    return t, released


def _order_pairs(
    pairs: list[tuple[Task, int]], capacity: Sequence[float]
) -> list[tuple[Task, int]]:
    """``_order`` for (task, stage) pairs; one dominant share per distinct demand."""
    doms: dict[Resources, float] = {}
    for t, _ in pairs:
        if t.demand not in doms:
            doms[t.demand] = dominant(t.demand, capacity)
    return sorted(pairs, key=lambda p: (-p[0].duration, -doms[p[0].demand]))


def must_start(
    now: float,
    horizon_end: float,
    cap: Sequence[float],
    capacity: Sequence[float],
    stages: dict[int, _Stage],
    running: Sequence[tuple[float, Resources, int]],
    runnable: set[TaskId],
) -> list[tuple[float, Task]]:
    """Reverse packing from ``T_k`` (Pseudocode 1, lines 17-21): the latest start of
    each runnable task that still meets ``T_k`` (absolute times, earliest first); the
    tasks whose latest start is now must start now.

    The DAG is reversed (children first) and tasks are packed as close to ``T_k`` as
    the allocation allows; running tasks hold their resources until they end.
    """
    m = len(cap)
    # held(x): what running tasks hold at reverse time x (they sit at the end)
    reserved = sorted((horizon_end - max(end, now), d) for end, d, _ in running)
    starts = [x for x, _ in reserved]
    prefix: list[list[float]] = [[0.0] * m]
    for _, d in reserved:
        prefix.append([a + b for a, b in zip(prefix[-1], d, strict=True)])

    def held(x: float) -> list[float]:
        return prefix[bisect.bisect_right(starts, x)]

    children = _children(stages)
    # reversed: a stage waits for its children; running tasks count as done
    left = {s: len(st.waiting) for s, st in stages.items()}
    blocked = {s: sum(1 for c in children.get(s, ()) if left[c] > 0) for s in stages}
    order = _order_pairs(
        [(t, s) for s, st in stages.items() if blocked[s] == 0 for t in st.waiting], capacity
    )
    heap: list[tuple[float, int, Resources, int]] = []
    in_use = [0.0] * m
    seq = 0
    tau = 0.0
    latest: list[tuple[float, Task]] = []
    while order or heap:
        rest: list[tuple[Task, int]] = []
        failed: set[Resources] = set()
        for pair in order:
            task = pair[0]
            d = task.demand
            if d in failed:
                rest.append(pair)
                continue
            h = held(tau + task.duration - EPS)
            ok = True
            for u, x, v, c in zip(in_use, d, h, cap, strict=True):
                if u + x + v > c + EPS:
                    ok = False
                    break
            if ok or (not heap and not any(u > EPS for u in in_use)):
                heapq.heappush(heap, (tau + task.duration, seq, d, pair[1]))
                seq += 1
                for r, x in enumerate(d):
                    in_use[r] += x
                if task.task_id in runnable:
                    latest.append((horizon_end - tau - task.duration, task))
            else:
                failed.add(d)
                rest.append(pair)
        order = rest
        if not heap:
            break
        tau, released = _complete_next(
            heap, in_use, left, blocked, stages, lambda s: stages[s].parents
        )
        if released:
            order = _order_pairs(order + released, capacity)
    latest.sort(key=lambda p: p[0])
    return latest


# ------------------------------------------------------------------ job state
@dataclass(slots=True)
class JobState:
    """What a job-aware policy knows about one job."""

    job_id: JobId
    user: UserId
    arrival: float
    progress: DagProgress | None
    stages: dict[int, _Stage] = field(default_factory=dict)
    stage_of: dict[TaskId, int] = field(default_factory=dict)
    queued: dict[TaskId, Task] = field(default_factory=dict)
    running: dict[TaskId, tuple[Task, float]] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change of the job's tasks: keys the cached packing."""
    packed: tuple[tuple[int, tuple[int, ...]], list[tuple[float, Task]]] | None = None

    cached: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def _memo(self, name: str) -> Any:
        hit = self.cached.get(name)
        return hit[1] if hit is not None and hit[0] == self.version else None

    def usage(self, m: int) -> Vec:
        hit = self._memo("usage")
        if hit is None:
            hit = [0.0] * m
            for t, _ in self.running.values():
                for r, x in enumerate(t.demand):
                    hit[r] += x
            self.cached["usage"] = (self.version, hit)
        return list(hit)

    def remaining_work(self, now: float, capacity: Sequence[float]) -> float:
        """Work left (dominant share x seconds): SRTF's measure."""
        w = self._memo("waiting_work")
        if w is None:
            w = sum(
                dominant(t.demand, capacity) * t.duration
                for st in self.stages.values()
                for t in st.waiting
            )
            self.cached["waiting_work"] = (self.version, w)
        total = float(w)
        for t, since in self.running.values():
            total += dominant(t.demand, capacity) * max(0.0, since + t.duration - now)
        return total

    def critical_path(self, now: float) -> float:
        """Longest remaining chain of stage durations."""
        finish: dict[int, float] = {}
        ends: dict[int, float] = {}
        for t, since in self.running.values():
            s = self.stage_of[t.task_id]
            ends[s] = max(ends.get(s, now), since + t.duration)
        for s in _topo(self.stages):
            st = self.stages[s]
            start = max((finish.get(p, now) for p in st.parents), default=now)
            dur = max((t.duration for t in st.waiting), default=0.0)
            finish[s] = max(start + dur, ends.get(s, now))
        return max(finish.values(), default=now) - now

    def running_list(self) -> list[tuple[float, Resources, int]]:
        return [
            (since + t.duration, t.demand, self.stage_of[t.task_id])
            for t, since in self.running.values()
        ]


def _topo(stages: dict[int, _Stage]) -> list[int]:
    order: list[int] = []
    seen: set[int] = set()
    for s in stages:
        stack = [s]
        while stack:
            cur = stack[-1]
            if cur in seen:
                stack.pop()
                continue
            todo = [p for p in stages[cur].parents if p in stages and p not in seen]
            if todo:
                stack.extend(todo)
                continue
            seen.add(cur)
            order.append(cur)
            stack.pop()
    return order


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
        self._capacity: list[float] | None = [float(x) for x in capacity] if capacity else None
        self._gm: Any = None
        self._node_caps: set[Resources] | None = None
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

    # ------------------------------------------------------------ the seam
    def bind(self, gm: object) -> None:
        self._gm = gm
        users = getattr(gm, "users", {})
        for u in self.queues:
            if u not in self.shares and u in users:
                self.shares[u] = users[u].share

    @property
    def capacity(self) -> list[float]:
        """What this GM's users are entitled to: federation capacity x their shares."""
        if self._capacity is None:
            views = getattr(self._gm, "views", {}) if self._gm is not None else {}
            lms = getattr(self._gm, "lms", ())
            if not views or len(views) < len(lms):
                return []
            total: list[float] | None = None
            for v in views.values():
                cap = v.total_capacity()
                total = cap if total is None else [a + b for a, b in zip(total, cap, strict=True)]
            assert total is not None
            frac = min(1.0, sum(self.shares.get(u, 1.0) for u in self.queues))
            self._capacity = [x * frac for x in total]
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
                st = job.stages[sid] = _Stage((), [], 0)
            st.waiting.append(task)
            job.stage_of[task.task_id] = sid
        return job

    def add_job(self, job: DagJob, now: float) -> None:
        self.now = max(self.now, now)
        progress = DagProgress(job)
        state = JobState(job.job_id, job.user, now, progress)
        for s in job.stages:
            state.stages[s.stage_id] = _Stage(s.parents, list(s.tasks), 0)
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
            if not job.stages and not job.queued and not job.running:
                del self.jobs[job.job_id]
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
            if not job.stages and not job.queued and not job.running:
                del self.jobs[job.job_id]
        self._dirty = True

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
        free = self._free(cap, self.jobs.values())
        idle = not any(j.running for j in self.jobs.values())
        # a task no share or node could ever hold goes to the GM anyway: it either
        # fails there explicitly (infeasible) or runs on what is free beyond the share
        oversize = [
            t for j in self.jobs.values() for t in j.queued.values() if self._never_fits(t, cap)
        ]
        big = {t.task_id for t in oversize}
        rest = [t for t in plan if t.task_id not in big]
        self._plan = oversize + self._admit(rest, free, force_first=idle and not oversize)
        self._alt = alt

    def _never_fits(self, task: Task, cap: Sequence[float]) -> bool:
        if not fits_in(task.demand, cap):
            return True
        if self._node_caps is None:
            views = getattr(self._gm, "views", {}) if self._gm is not None else {}
            if not views or len(views) < len(getattr(self._gm, "lms", ())):
                return False
            self._node_caps = {c for v in views.values() for c in v.capacity}
        return bool(self._node_caps) and not any(fits_in(task.demand, c) for c in self._node_caps)

    def plan(self, now: float, cap: list[float]) -> tuple[list[Task], set[TaskId]]:
        """The admitted tasks in order, and which of them are ALTRUISTIC."""
        raise NotImplementedError

    def _active(self) -> list[JobState]:
        return [j for j in self.jobs.values() if j.queued or j.running]

    def _free(self, cap: Sequence[float], jobs: Iterable[JobState]) -> Vec:
        free = list(cap)
        for j in jobs:
            for r, x in enumerate(j.usage(len(cap))):
                free[r] -= x
        return free

    def _allocations(self, jobs: list[JobState], cap: list[float]) -> list[Vec]:
        m = len(cap)
        per_user: dict[UserId, int] = {}
        demands: list[Vec] = []
        for j in jobs:
            d = j.usage(m)
            for t in j.queued.values():
                for r, x in enumerate(t.demand):
                    d[r] += x
            demands.append(d)
            per_user[j.user] = per_user.get(j.user, 0) + 1
        weights = [self.shares.get(j.user, 1.0) / per_user[j.user] for j in jobs]
        return drf_allocation(cap, demands, weights)

    @staticmethod
    def _breadth_first(job: JobState) -> list[Task]:
        order = {s: k for k, s in enumerate(_topo(job.stages))}
        return sorted(
            job.queued.values(), key=lambda t: (order.get(job.stage_of[t.task_id], 0), t.task_id)
        )

    @staticmethod
    def _admit(tasks: Iterable[Task], room: Vec, *, force_first: bool = False) -> list[Task]:
        """Tasks that fit in ``room`` (first fit, in order); ``room`` is consumed."""
        out: list[Task] = []
        for t in tasks:
            if fits_in(t.demand, room) or (force_first and not out):
                out.append(t)
                for r, x in enumerate(t.demand):
                    room[r] -= x
            force_first = False
        return out


def _round_robin(lists: Sequence[list[Task]]) -> list[Task]:
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


class DrfQueues(JobQueues):
    """Weighted DRF across jobs (strict shares), breadth-first within a job."""

    name = "drf"

    def __init__(self, *args: Any, work_conserving: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.work_conserving = work_conserving

    def plan(self, now: float, cap: list[float]) -> tuple[list[Task], set[TaskId]]:
        jobs = self._active()
        allocs = self._allocations(jobs, cap)
        m = len(cap)
        lists: list[list[Task]] = []
        for j, a in zip(jobs, allocs, strict=True):
            use = j.usage(m)
            room = [x - u for x, u in zip(a, use, strict=True)]
            lists.append(self._admit(self._breadth_first(j), room, force_first=not j.running))
        plan = _round_robin(lists)
        if self.work_conserving:
            plan.extend(self._fill(jobs, cap, plan))
        return plan, set()

    def _fill(self, jobs: list[JobState], cap: list[float], taken: list[Task]) -> list[Task]:
        """What is left, lowest dominant share first (one task at a time)."""
        m = len(cap)
        free = self._free(cap, jobs)
        held = {j.job_id: j.usage(m) for j in jobs}
        chosen = {t.task_id for t in taken}
        for t in taken:
            for r, x in enumerate(t.demand):
                free[r] -= x
                held[t.job_id][r] += x
        # free only shrinks here: a task that does not fit now never will, drop it
        waiting = {
            j.job_id: deque(t for t in self._breadth_first(j) if t.task_id not in chosen)
            for j in jobs
        }
        out: list[Task] = []
        while True:
            best: tuple[float, JobId] | None = None
            for jid, ts in waiting.items():
                while ts and not fits_in(ts[0].demand, free):
                    ts.popleft()
                if not ts:
                    continue
                w = self.shares.get(self.jobs[jid].user, 1.0) or 1.0
                ds = dominant(held[jid], cap) / w
                if best is None or ds < best[0]:
                    best = (ds, jid)
            if best is None:
                return out
            jid = best[1]
            t = waiting[jid].popleft()
            out.append(t)
            for r, x in enumerate(t.demand):
                free[r] -= x
                held[jid][r] += x


class TetrisQueues(JobQueues):
    """Packing: runnable tasks by alignment with the free resources; no fairness."""

    name = "tetris"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.choose_node = packing_node

    def plan(self, now: float, cap: list[float]) -> tuple[list[Task], set[TaskId]]:
        jobs = self._active()
        free = self._free(cap, jobs)
        tasks = [t for j in jobs for t in j.queued.values()]
        return _pack(tasks, free, cap), set()


def _pack(tasks: list[Task], free: Vec, cap: Sequence[float]) -> list[Task]:
    """Greedy packing: repeatedly a fitting task best aligned with what is free
    (tasks with equal demands score alike: one candidate per distinct demand)."""
    groups: dict[Resources, list[Task]] = {}
    for t in tasks:
        groups.setdefault(t.demand, []).append(t)
    for g in groups.values():
        g.reverse()  # pop() from the end keeps the original order
    out: list[Task] = []
    while groups:
        fitting = [d for d in groups if fits_in(d, free)]
        if not fitting:
            break
        best = max(fitting, key=lambda d: alignment(d, free, cap))
        g = groups[best]
        out.append(g.pop())
        if not g:
            del groups[best]
        for r, x in enumerate(best):
            free[r] -= x
    return out


class SjfQueues(JobQueues):
    """Shortest job first by remaining critical path; breadth-first within a job."""

    name = "sjf"

    def plan(self, now: float, cap: list[float]) -> tuple[list[Task], set[TaskId]]:
        jobs = sorted(self._active(), key=lambda j: (j.critical_path(now), j.arrival, j.job_id))
        free = self._free(cap, jobs)
        out: list[Task] = []
        for j in jobs:
            out.extend(self._admit(self._breadth_first(j), free))
        return out, set()


class CarbyneQueues(JobQueues):
    """Altruistic DAG scheduling (Pseudocode 1) on a GM's user queues."""

    name = "carbyne"

    def __init__(
        self,
        *args: Any,
        p_altruism: float = 1.0,
        packing_first: bool = False,
        rng: random.Random | None = None,
        trace_yields: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.yields: list[tuple[float, dict[JobId, Vec]]] | None = [] if trace_yields else None
        """With ``trace_yields``: (time, per-job yield) of every plan (tests, small runs)."""
        if not 0.0 <= p_altruism <= 1.0:
            raise ConfigError(
                f"p_altruism must be in [0, 1], got {p_altruism}", reason="bad_policy"
            )
        self.p_altruism = p_altruism
        self.packing_first = packing_first
        self.rng = rng if rng is not None else random.Random(0)
        self.choose_node = packing_node
        self.last_leftover: Vec = []
        self.last_yield: dict[JobId, Vec] = {}
        """Per altruistic job at the last plan: A_k minus what runs minus its DEFAULT tasks."""
        self._yield_rate = 0.0
        self._yield_since = 0.0

    def plan(self, now: float, cap: list[float]) -> tuple[list[Task], set[TaskId]]:
        # leftover yielded, in dominant share x seconds, since the previous plan
        self.counters["leftover_yielded"] += self._yield_rate * max(0.0, now - self._yield_since)
        self._yield_since = now
        self.last_yield = {}
        rate = 0.0
        jobs = self._active()
        allocs = self._allocations(jobs, cap)
        m = len(cap)
        free = self._free(cap, jobs)
        defaults: list[list[Task]] = []
        candidates: list[tuple[JobState, list[Task]]] = []
        for j, a in zip(jobs, allocs, strict=True):
            use = j.usage(m)
            room = [x - u for x, u in zip(a, use, strict=True)]
            altruistic = self.p_altruism >= 1.0 or (
                self.p_altruism > 0.0 and self.rng.random() < self.p_altruism
            )
            if not altruistic:
                defaults.append(
                    self._admit(self._breadth_first(j), room, force_first=not j.running)
                )
                continue
            # intra-job: T_k by forward packing within A_k, then reverse packing from T_k
            # (unchanged job and allocation: the absolute plan is the same, reuse it)
            key = (j.version, tuple(round(x * 1000 / c) for x, c in zip(a, cap, strict=True)))
            if j.packed is None or j.packed[0] != key:
                t_k = forward_pack(now, a, cap, j.stages, j.running_list())
                latest = must_start(now, t_k, a, cap, j.stages, j.running_list(), set(j.queued))
                j.packed = (key, latest)
            must = [t for start, t in j.packed[1] if start <= now + EPS and t.task_id in j.queued]
            chosen = self._admit(must, room, force_first=not j.running)
            defaults.append(chosen)
            picked = {t.task_id for t in chosen}
            self.last_yield[j.job_id] = [max(0.0, x) for x in room]
            rate += dominant(self.last_yield[j.job_id], cap)
            candidates.append((j, [t for t in j.queued.values() if t.task_id not in picked]))
        self._yield_rate = rate
        if self.yields is not None:
            self.yields.append((now, dict(self.last_yield)))
        plan = _round_robin(defaults)
        for t in plan:
            for r, x in enumerate(t.demand):
                free[r] -= x
        leftover = [max(0.0, f) for f in free]
        self.last_leftover = list(leftover)
        # leftover: SRTF over jobs (packing score within a job), or packing first
        alt: list[Task] = []
        if self.packing_first:
            alt = _pack([t for _, ts in candidates for t in ts], leftover, cap)
        else:
            candidates.sort(key=lambda c: (c[0].remaining_work(now, cap), c[0].arrival))
            for _, ts in candidates:
                ordered = sorted(ts, key=lambda t: -alignment(t.demand, leftover, cap))
                alt.extend(self._admit(ordered, leftover))
        return plan + alt, {t.task_id for t in alt}


# --------------------------------------------------------------- node choice
def packing_node(view: LmView, eligible: Any, demand: Resources) -> int:
    """The eligible node that fits ``demand`` with the best alignment score (Tetris)."""
    best, best_score = -1, -1.0
    free, capacity = view.free, view.capacity
    for i in (eligible & view.avail).search(1):
        f = free[i]
        if all(x >= d for x, d in zip(f, demand, strict=True)):
            score = alignment(demand, f, capacity[i])
            if score > best_score:
                best, best_score = i, score
    return best


# ------------------------------------------------------------------ selection
POLICIES = QUEUE_POLICIES

QueuesFactory = Callable[[GmId, list[UserId]], UserQueues]


def make_policy(
    name: str,
    users: Sequence[UserConfig],
    *,
    p_altruism: float | dict[GmId, float] = 1.0,
    seed: int = 0,
    patience: int = 8,
) -> QueuesFactory:
    """A ``queues_factory`` for the simulator and the live GM, by policy name."""
    if name not in POLICIES:
        raise ConfigError(
            f"unknown queue policy {name!r} (known: {', '.join(POLICIES)})",
            reason="unknown_policy",
        )
    shares = {u.user: u.share for u in users}

    def factory(gm: GmId, mine: list[UserId]) -> UserQueues:
        mine_shares = {u: shares.get(u, 1.0) for u in mine}
        if name == "fifo":
            return UserQueues(mine, patience=patience)
        if name in ("drf", "drf-wc"):
            return DrfQueues(mine, shares=mine_shares, work_conserving=name == "drf-wc")
        if name == "tetris":
            return TetrisQueues(mine, shares=mine_shares)
        if name == "sjf":
            return SjfQueues(mine, shares=mine_shares)
        p = p_altruism.get(gm, 1.0) if isinstance(p_altruism, dict) else p_altruism
        rng = random.Random(f"{seed}:{gm}")
        return CarbyneQueues(
            mine,
            shares=mine_shares,
            p_altruism=p,
            packing_first=name == "carbyne-pack",
            rng=rng,
        )

    return factory
