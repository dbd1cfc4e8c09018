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
  and since when.
* At each scheduling event -- job arrival, task completion, a task coming back --
  the queues are *dirty* and the next ``pop`` builds a **plan**: every runnable task
  as an ``Ask``, in the policy's order, with the budgets it spends -- what the entitled
  capacity has free and, for a task within its job's fair share, the job's
  allocation ``A_k`` left.  ``pop`` hands out the first ask its budgets afford, so the
  plan is work conserving within what the policy allows.  ``version`` and ``events``
  (``JobState``) say which cached results still hold.
* A task the GM could not place (no node fits it in the GM's view) gets its budgets
  back and is *blocked* until the view changes (``new_epoch``); until then so is every
  task with the same constraints and a demand at least as large (it cannot fit
  either).  The budgets it gave back go to the next asks: a large task stuck on
  fragmented nodes never holds the room that smaller ones could use.  As plain FIFO
  queues park, ``patience`` such misses in a row end the plan's turn until the view
  changes (each miss costs the GM a decision; the next completion changes the view).
* An ask with no fair share behind it (Carbyne's ALTRUISTIC tasks, the tasks of
  policies without fairness, work-conserving extras) is handed out as ``altruistic``:
  it uses only what is free, so the GM never preempts for it.
* The capacity a GM's users are **entitled** to is the federation's capacity times
  the sum of their configured shares (at most all of it).

No clocks: the time of a plan is the ``now`` of the last event the GM reported.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from common.dag import DagJob, DagProgress, levels
from common.ids import JobId, TaskId, UserId
from common.model import N_CONSTRAINTS, Resources, Task
from global_master.policy.job_state import (
    PLAN_TASKS,
    PLAN_WINDOW,
    JobState,
    Running,
    StageState,
    Started,
)
from global_master.policy.vectors import Vec, dominant, fits_in, give, take
from global_master.queues import UserQueues

EVERY_CONSTRAINT = (1 << N_CONSTRAINTS) - 1
"""The constraint bits a node's view reads (``global_master.view``)."""

__all__ = [
    "PLAN_TASKS",
    "PLAN_WINDOW",
    "Ask",
    "JobQueues",
    "JobState",
    "Running",
    "StageState",
    "Started",
    "admit",
    "breadth_first",
    "breadth_first_asks",
    "job_asks",
    "round_robin",
]

T = TypeVar("T")


def breadth_first(job: JobState) -> list[Task]:
    """The job's plan window in breadth-first order (``JobState.breadth_first``): the
    first ``PLAN_WINDOW`` runnable tasks in that order, a function of ``queued`` alone,
    so kept until ``stamp`` changes.  Shared between plans: do not change the list."""
    hit: list[Task] | None = job.kept("breadth_first")
    if hit is None:
        hit = job.window("breadth_first", job.breadth_first)
        job.keep_for_stamp("breadth_first", hit)
    return hit


@dataclass(slots=True)
class Ask:
    """A runnable task in a plan (YARN's ask, as Carbyne extends it, seed §4.2)."""

    task: Task
    job: JobId | None = None
    """Charged to this job's allocation A_k as well (DEFAULT); None: only to what the
    entitled capacity has free."""
    altruistic: bool = False
    """ALTRUISTIC: no fair share behind it, it only uses what is free."""
    force: bool = False
    """May exceed its job's allocation: the first task of a job that holds nothing."""


def job_asks(job: JobState, tasks: Iterable[Task]) -> list[Ask]:
    """DEFAULT asks charged to ``job``'s allocation; the first is forced if the job holds
    nothing (whatever its share, a job must be able to start)."""
    return [Ask(t, job.job_id, force=k == 0 and not job.running) for k, t in enumerate(tasks)]


def breadth_first_asks(job: JobState) -> list[Ask]:
    """``job_asks`` of the job's breadth-first window, kept until ``stamp`` changes (an
    ask is never changed once made).  Shared between plans: do not change the list."""
    hit: list[Ask] | None = job.kept("breadth_first_asks")
    if hit is None:
        hit = job_asks(job, breadth_first(job))
        job.keep_for_stamp("breadth_first_asks", hit)
    return hit


def admit(tasks: Iterable[Task], room: Vec, *, force_first: bool = False) -> list[Task]:
    """Tasks that fit in ``room`` (first fit, in order); ``room`` is consumed.

    ``force_first`` admits the first task even if it does not fit (a job that holds
    nothing must be able to start, whatever its share).
    """
    out: list[Task] = []
    failed: set[Resources] = set()  # room only shrinks: a demand that failed fails again
    for t in tasks:
        d = t.spec.demand  # (not the property: a call per task)
        if (d not in failed and fits_in(d, room)) or (force_first and not out):
            out.append(t)
            take(room, d)
        else:
            failed.add(d)
        force_first = False
    return out


def round_robin(lists: Sequence[list[T]]) -> list[T]:
    """One item of each list in turn."""
    out = [lst[0] for lst in lists if lst]
    longer = [lst for lst in lists if len(lst) > 1]
    k = 1
    while longer:
        out += [lst[k] for lst in longer]
        k += 1
        longer = [lst for lst in longer if len(lst) > k]
    return out


class JobQueues(UserQueues):
    """Job-aware queues: the shared bookkeeping of every policy but plain FIFO."""

    name = "job"
    kind = "job_aware"

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
        self.arrivals = 0
        """Jobs that have arrived so far (Carbyne: a new one may move every T_k later)."""
        self.shares: dict[UserId, float] = dict(shares or {})
        self._capacity: list[float] = []
        self._node_caps: set[Resources] = set()
        self._oversize_memo: dict[Resources, bool] = {}
        self._node_classes: tuple[tuple[int, Resources], ...] = ()
        self._no_node_memo: dict[tuple[int, Resources], bool] = {}
        self._no_node: list[Task] = []  # to the GM first (``_no_node_for_ever``)
        self.now = 0.0
        self._dirty = True
        self._plan: list[Ask] = []
        self._oversize: list[Task] = []
        self._parked: list[Task] = []
        """Oversize tasks that found no node: back to ``_oversize`` at the next epoch."""
        self._room: Vec = []
        """What the entitled capacity has free for this plan's asks."""
        self._pools: dict[JobId, Vec] = {}
        """Per job: its allocation A_k minus what it holds and what this plan handed out."""
        self._scan = 0
        """Asks before this index cannot be handed out until a refund or a new epoch."""
        self._spent = False
        self._idle = False
        self._short: set[tuple[JobId | None, Resources]] = set()
        """(job or None for the entitled capacity, demand) its budget cannot afford."""
        self._afford_left: set[Resources] | None = None  # (``_next_ask``)
        self._misses = 0
        """Tasks in a row that found no node in this epoch (``patience`` of them park)."""
        self._handed = 0
        """Asks handed out since the plan was made."""
        self._cut_short = False
        """A job had more runnable tasks than the plan's window of it."""
        self._blocked: set[TaskId] = set()
        self._no_fit: dict[int, list[Resources]] = {}
        """Per constraint mask, the smallest demands that found no node in this epoch."""
        self._fit_memo: dict[tuple[int, Resources], bool] = {}
        self._popped: dict[TaskId, tuple[Ask | None, int]] = {}
        """Tasks handed to the GM (or back from an LM) whose fate is not known yet: the
        ask handed out and the plan (``_plan_no``) it came from."""
        self._plan_no = 0
        """Plans made so far: an ask is spent from, and refunded to, its own plan's budgets."""
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
        self,
        capacity: Sequence[int],
        node_capacities: Collection[tuple[int, ...]],
        node_classes: Collection[tuple[int, Resources]] = (),
    ) -> None:
        """The federation's total capacity, its distinct node capacities and its nodes'
        distinct (constraint mask, capacity)."""
        frac = min(1.0, sum(self.shares.get(u, 1.0) for u in self.queues))
        self._capacity = [x * frac for x in capacity]
        self._node_caps = set(node_capacities)
        self._node_classes = tuple(node_classes)
        self._oversize_memo.clear()
        self._no_node_memo.clear()
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
            self.arrivals += 1
        if task.task_id not in job.stage_of:
            sid = 0
            if job.progress is not None:
                found = job.progress.stage_of(task.task_id)
                sid = found if found is not None else 0
            st = job.stages.get(sid)
            if st is None:
                st = job.stages[sid] = StageState((), {}, 0)
            st.waiting[task.task_id] = task
            job.stage_of[task.task_id] = sid
        return job

    def add_job(self, job: DagJob, now: float, started: Collection[TaskId] = ()) -> None:
        self.now = max(self.now, now)
        progress = DagProgress(job, started)
        state = JobState(job.job_id, job.user, now, progress)
        state.level = levels({s.stage_id: s.parents for s in job.stages})
        for s in job.stages:
            state.stages[s.stage_id] = StageState(s.parents, {t.task_id: t for t in s.tasks}, 0)
            for t in s.tasks:
                state.stage_of[t.task_id] = s.stage_id
        self.jobs[job.job_id] = state
        self.arrivals += 1
        self._dags[job.job_id] = progress
        for t in progress.roots():
            t.submit(now)
            self.push_back(t)

    def push_back(self, task: Task) -> None:
        job = self._job_for(task)
        job.enqueue(task)
        popped = self._popped.pop(task.task_id, None)
        if popped is not None and popped[1] != self._plan_no and popped[0] is not None:
            # handed out by a plan made over since (a gang held the task meanwhile): the
            # budgets it was spent from are gone, and the new plan counted it neither
            # queued nor held: it is queued anew, for the next plan to weigh
            popped = None
        if popped is not None:  # could not be placed: wait for a new epoch
            # the job is as it was before the pop: its cached results still hold
            ask = popped[0]
            if ask is None:
                ask = Ask(task, altruistic=task.altruistic)
            else:
                self._refund(ask)
            self._blocked.add(task.task_id)
            self._no_node_for(task)
            if self._never_fits(task.demand):
                # no budget would ever afford it in the plan: it goes to the GM as an
                # oversize task again once the view changes (another GM's tasks may
                # hold the nodes, and their ends make no new plan here)
                self._parked.append(task)
            else:
                self._plan.append(ask)
                if self._afford_left is not None and (None, task.demand) not in self._short:
                    self._afford_left.add(task.demand)
        else:
            job.version += 1
            job.events += 1
            self._dirty = True
            if self._node_classes and self._no_node_for_ever(task):
                self._no_node.append(task)

    def _no_node_for_ever(self, task: Task) -> bool:
        """No node of the federation (as the last snapshots have it) meets ``task``'s
        constraints with the capacity for its demand: what the GM's placer finds
        infeasible (``LmView.feasible``), asked once per (constraints, demand).  Such a
        task (``_no_node``) goes to the GM before any plan's ask, which fails it at once,
        as FIFO does: it does not wait for its turn in a plan behind a backlog."""
        spec = task.spec
        key = (spec.constraints & EVERY_CONSTRAINT, spec.demand)
        hit = self._no_node_memo.get(key)
        if hit is None:
            mask, d = key
            hit = self._no_node_memo[key] = not any(
                mask & ~m == 0 and all(c >= x for c, x in zip(cap, d, strict=True))
                for m, cap in self._node_classes
            )
        return hit

    def push_front(self, task: Task) -> None:
        self._popped.pop(task.task_id, None)
        job = self._job_for(task)
        job.enqueue(task)
        job.version += 1
        job.events += 1
        self._dirty = True

    def remove(self, task: Task) -> bool:
        job = self.jobs.get(task.job_id)
        if job is None or job.dequeue(task.task_id) is None:
            return False
        self._dirty = True
        return True

    def abandon(self, task: Task, now: float) -> list[Task]:
        lost = super().abandon(task, now)
        self._popped.pop(task.task_id, None)
        job = self._unrun(task)  # a task that failed on its worker was running
        if job is not None:
            job.version += 1
            for t in (task, *lost):
                job.dequeue(t.task_id)
                st = job.stages.get(job.stage_of.get(t.task_id, -1))
                if st is not None:
                    st.waiting.pop(t.task_id, None)
            for sid in [s for s, st in job.stages.items() if not st.waiting and not st.running]:
                del job.stages[sid]
            self._forget_if_done(job)
        self._dirty = True
        return lost

    def may_preempt_for(self, task: Task) -> bool:
        """Never: a job-aware policy keeps fair shares by what it admits (each job's
        ``A_k``), as the paper's YARN schedulers do; killing running work to place a
        task costs the work lost and buys nothing the next completion does not."""
        del task
        return False

    def new_epoch(self) -> None:
        if self._parked:
            self._oversize[:0] = self._parked[::-1]
            self._parked.clear()
        self._blocked.clear()
        self._no_fit.clear()
        self._fit_memo.clear()
        self._scan = 0
        self._misses = 0

    def failed(self, user: UserId) -> None:
        del user
        self._misses += 1

    def placed(self, user: UserId) -> None:
        del user
        self._misses = 0

    def has_work(self) -> bool:
        if self._dirty:
            self._replan()
        if self._oversize or self._no_node:
            return True
        return self._misses < self.patience and self._next_ask_or_replan() is not None

    def pop(self) -> Task | None:
        if self._dirty:
            self._replan()
        # tasks no node admits (in the order they came), then oversize ones: outside
        # any plan, to the GM, which fails them or places them on what is free
        task = self._outside_plan(self._no_node, 0) or self._outside_plan(self._oversize, -1)
        if task is not None:
            return task
        i = self._next_ask_or_replan() if self._misses < self.patience else None
        if i is None:
            return None
        self._handed += 1
        ask = self._plan.pop(i)
        task = ask.task
        self._take_from_queue(task)
        self._spend(ask)
        task.altruistic = ask.altruistic
        self._popped[task.task_id] = (ask, self._plan_no)
        return task

    def _outside_plan(self, tasks: list[Task], at: int) -> Task | None:
        """The first of ``tasks`` (taken from ``at``) still queued, out of its queue."""
        while tasks:
            task = tasks.pop(at)
            if self._take_from_queue(task):
                task.altruistic = False
                self._popped[task.task_id] = (None, self._plan_no)
                return task
        return None

    def _take_from_queue(self, task: Task) -> bool:
        job = self.jobs.get(task.job_id)
        return job is not None and job.dequeue(task.task_id) is not None

    def _next_ask_or_replan(self) -> int | None:
        """``_next_ask``; a plan that ran out after handing out a window's worth of asks
        while a job had more runnable tasks than its window is made afresh (the job's
        next window; fewer handed out, the budgets ran out first)."""
        i = self._next_ask()
        if i is None and self._cut_short and self._handed >= PLAN_WINDOW:
            self._replan()
            i = self._next_ask()
        return i

    def _next_ask(self) -> int | None:
        """Index of the first ask that may be handed out now (stale asks are dropped).
        ``_afford_left``: of the plan's demands, those the entitled capacity was not
        found short of since ``_short`` was cleared (None: none found short yet); once
        none is left, no ask can be handed out before a refund or a new plan."""
        plan = self._plan
        i = self._scan
        jobs, blocked, fit_memo, short = self.jobs, self._blocked, self._fit_memo, self._short
        while i < len(plan):
            ask = plan[i]
            spec = ask.task.spec
            tid = spec.task_id
            job = jobs.get(spec.job_id)
            if job is None or tid not in job.queued:
                del plan[i]  # dispatched, removed or abandoned meanwhile
                continue
            # (the tests of _cannot_fit and _affordable that fail, read first from
            # their memos: the same answers, without the calls)
            if (
                tid not in blocked
                and fit_memo.get((spec.constraints, spec.demand)) is not True
                and (None, spec.demand) not in short
                and not self._cannot_fit(ask.task)
                and self._affordable(ask)
            ):
                self._scan = i
                return i
            left = self._afford_left
            if left is not None and not left:  # the capacity affords none of the rest
                i = len(plan)  # (stale asks left in: skipped, or dropped, when met)
                break
            i += 1
        self._scan = i
        return None

    def _cannot_fit(self, task: Task) -> bool:
        """A demand at least as large as one that found no node this epoch."""
        key = (task.constraints, task.demand)
        hit = self._fit_memo.get(key)
        if hit is None:
            d = task.demand
            hit = self._fit_memo[key] = any(
                all(x >= y for x, y in zip(d, f, strict=True))
                for f in self._no_fit.get(task.constraints, ())
            )
        return hit

    def _no_node_for(self, task: Task) -> None:
        """``task`` found no node: keep the smallest such demands per constraint mask."""
        d = task.demand
        failed = self._no_fit.setdefault(task.constraints, [])
        if any(all(x >= y for x, y in zip(d, f, strict=True)) for f in failed):
            return
        failed[:] = [f for f in failed if not all(x >= y for x, y in zip(f, d, strict=True))]
        failed.append(d)
        memo = self._fit_memo
        for key in [k for k, v in memo.items() if not v and k[0] == task.constraints]:
            memo[key] = all(x >= y for x, y in zip(key[1], d, strict=True))

    def _affordable(self, ask: Ask) -> bool:
        """Its budgets hold its demand (budgets only shrink between refunds: a demand
        found too large stays too large until then)."""
        d = ask.task.spec.demand
        short = self._short
        if (None, d) in short:
            return False
        if not fits_in(d, self._room) and (self._spent or not self._idle):
            short.add((None, d))
            left = self._afford_left
            if left is None:  # the first found short since ``_short`` was cleared
                left = self._afford_left = {a.task.spec.demand for a in self._plan}
            left.discard(d)
            return False
        if ask.job is None or ask.force:
            return True
        key = (ask.job, d)
        if key in short:
            return False
        if fits_in(d, self._pools[ask.job]):
            return True
        short.add(key)
        return False

    def _spend(self, ask: Ask) -> None:
        self._spent = True
        take(self._room, ask.task.demand)
        if ask.job is not None:  # every ask of a plan has its job's pool (``_within_pools``)
            take(self._pools[ask.job], ask.task.demand)

    def _refund(self, ask: Ask) -> None:
        give(self._room, ask.task.demand)
        pool = self._pools.get(ask.job) if ask.job is not None else None
        if pool is not None:
            give(pool, ask.task.demand)
        self._short.clear()
        self._afford_left = None
        self._scan = 0

    def on_dispatched(self, task: Task, now: float) -> None:
        self.now = max(self.now, now)
        self._popped.pop(task.task_id, None)
        job = self._job_for(task)
        job.dequeue(task.task_id)
        job.version += 1
        if task.task_id not in job.running:
            st = job.stages[job.stage_of[task.task_id]]
            if st.waiting.pop(task.task_id, None) is not None:
                st.running += 1
            job.start(task, now)
            self.counters["altruistic_started" if task.altruistic else "default_started"] += 1
            if task.altruistic:
                self.counters["leftover_reused"] += self._dom(task.demand) * task.duration

    def _unrun(self, task: Task) -> JobState | None:
        job = self.jobs.get(task.job_id)
        if job is not None:
            job.version += 1
            job.events += 1
        if job is None or job.stop(task.task_id) is None:
            return job
        job.stages[job.stage_of[task.task_id]].running -= 1
        return job

    def on_returned(self, task: Task, now: float) -> None:
        self.now = max(self.now, now)
        job = self._unrun(task)
        if job is not None and task.task_id in job.stage_of:
            st = job.stages[job.stage_of[task.task_id]]
            st.waiting.setdefault(task.task_id, task)
        self._popped[task.task_id] = (None, self._plan_no)
        self._dirty = True

    def on_finished(self, task: Task, now: float) -> None:
        self.now = max(self.now, now)
        job = self._unrun(task)
        self.release_children(task, now)
        if job is not None:
            job.ended += 1
            sid = job.stage_of.get(task.task_id)
            if sid is not None:
                st = job.stages[sid]
                st.waiting.pop(task.task_id, None)  # it ended unseen (a GM restarted)
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
        self._plan_no += 1
        self._scan = 0
        self._short.clear()
        self._spent = False
        cap = self.capacity
        if not cap:
            self._plan, self._oversize, self._pools = [], [], {}
            return
        self.counters["plans"] += 1
        self._handed = 0
        jobs = self.jobs.values()
        self._cut_short = any(len(j.queued) > PLAN_WINDOW for j in jobs)
        # a task no share or node could ever hold goes to the GM anyway: it either
        # fails there explicitly (infeasible) or runs on what is free beyond the share
        oversize: list[Task] = []
        memo, never_fits = self._oversize_memo, self._never_fits
        for j in jobs:
            for d in j.queued_demands:
                hit = memo.get(d)
                if hit is None:
                    hit = never_fits(d)
                if hit:
                    oversize += [t for t in j.queued.values() if never_fits(t.demand)]
                    break
        self._oversize = oversize[::-1]
        self._parked.clear()  # queued, so among them
        asks, self._pools = self.plan(self.now, cap)
        if oversize:
            big = {t.task_id for t in oversize}
            asks = [a for a in asks if a.task.task_id not in big]
        self._plan = self._within_pools(asks)
        self._afford_left = None
        # never hand out more than the entitled capacity, whatever the policy
        self._room = self.free(cap, jobs)
        self._idle = not oversize and not any(j.running for j in jobs)

    def _within_pools(self, asks: list[Ask]) -> list[Ask]:
        """The asks that do not exceed their job's allocation, first fit in plan order
        (a job's allocation only grows back when one of its own tasks finds no node)."""
        pools = self._pools
        left: dict[JobId, Vec] = {}
        out: list[Ask] = []
        for a in asks:
            jid = a.job
            if jid is not None:
                room = left.get(jid)
                if room is None:
                    room = left[jid] = list(pools[jid])
                d = a.task.spec.demand
                if not a.force and not fits_in(d, room):
                    continue
                for r, x in enumerate(d):
                    room[r] -= x
            out.append(a)
        return out

    def _never_fits(self, d: Resources) -> bool:
        """No share (the entitled capacity) or node could ever hold demand ``d``."""
        hit = self._oversize_memo.get(d)
        if hit is None:
            hit = not fits_in(d, self.capacity) or (
                bool(self._node_caps) and not any(fits_in(d, c) for c in self._node_caps)
            )
            self._oversize_memo[d] = hit
        return hit

    def plan(self, now: float, cap: list[float]) -> tuple[list[Ask], dict[JobId, Vec]]:
        """Every runnable task as an ask, in the order to hand them out, and each job's
        budget (its allocation left) for the asks charged to it."""
        raise NotImplementedError

    def active(self) -> list[JobState]:
        """Jobs with a runnable or a running task."""
        return [j for j in self.jobs.values() if j.queued or j.running]

    @staticmethod
    def free(cap: Sequence[float], jobs: Iterable[JobState]) -> Vec:
        """``cap`` minus what the running tasks of ``jobs`` hold (a job that holds nothing
        takes nothing: ``x - 0.0`` is ``x``)."""
        free = list(cap)
        for j in jobs:
            held = j._held
            if held:
                for r, x in enumerate(held):
                    free[r] -= x
        return free
