"""Carbyne's intra-job scheduler (seed §3.3, Pseudocode 1 lines 17-24).

Given a job's allocation ``A_k``:

* **forward packing** (``forward_pack``) list-schedules the job's remaining DAG in
  time within ``A_k`` -- at each completion, start the ready tasks that fit, longest
  first -- and returns ``T_k``, when the job would finish;
* **reverse packing** (``must_start``) reverses the DAG (children first) and packs the
  tasks as close to ``T_k`` as ``A_k`` allows; a runnable task's latest start is
  ``T_k`` minus its reverse finish.  The tasks whose latest start is now *must* start
  now (DEFAULT); every other runnable task may wait (ALTRUISTIC), and what ``A_k``
  holds beyond the DEFAULT tasks is the job's **leftover**.

Both are one list scheduler (``_pack_in_time``) run in opposite directions; running
tasks hold their resources until they end (forward: from now; reverse: at the end).
The chain a job's DAG ends with is packed by recipes kept per job and allocation
(``altruism_tail``): the same floats, without walking it at every plan.
Pure functions of their arguments: no clock, no randomness.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial

from common.dag import children_of
from common.ids import TaskId
from common.model import Resources, Task
from global_master.policy.altruism_tail import TailRun, chain_tail
from global_master.policy.altruism_tail import stretch as _stretch
from global_master.policy.jobs import JobState, Running, StageState
from global_master.policy.vectors import EPS, dominant, give, take

_Packed = tuple[float, int, Resources, int]
"""A task packed in time: (end, tie-breaker, demand, stage id)."""


def _fits(
    in_use: Sequence[float], d: Resources, cap: Sequence[float], held: Sequence[float] | None
) -> bool:
    for r in range(len(cap)):
        x = in_use[r] + d[r] + (held[r] if held is not None else 0.0)
        if x > cap[r] + EPS:
            return False
    return True


def _fits_at(
    d: Resources,
    duration: float,
    *,
    clock: float,
    in_use: Sequence[float],
    cap: Sequence[float],
    held: Callable[[float], Sequence[float]] | None,
    failed: set[Resources],
) -> bool:
    """``d`` fits for ``duration`` from ``clock``; a demand that did not fit is not
    asked again (room only shrinks until the next completion)."""
    if d in failed:
        return False
    if _fits(in_use, d, cap, held(clock + duration - EPS) if held is not None else None):
        return True
    failed.add(d)
    return False


class _Ready:
    """The ready tasks, longest first, then largest dominant share, then first ready.

    Tasks are grouped by demand (a stage's tasks share one): what fits is decided per
    group, so a list-scheduling step costs the number of groups, not of tasks.
    """

    __slots__ = ("_dom", "_groups", "_seq", "capacity")

    def __init__(self, capacity: Sequence[float]) -> None:
        self.capacity = capacity
        self._groups: dict[Resources, list[tuple[float, int, Task, int]]] = {}
        self._dom: dict[Resources, float] = {}
        self._seq = 0

    def __bool__(self) -> bool:
        return bool(self._groups)

    def add(self, tasks: Iterable[Task], stage: int) -> None:
        for t in tasks:
            d = t.demand
            g = self._groups.get(d)
            if g is None:
                g = self._groups[d] = []
                if d not in self._dom:
                    self._dom[d] = dominant(d, self.capacity)
            heapq.heappush(g, (-t.duration, self._seq, t, stage))
            self._seq += 1

    def doms(self, demands: Iterable[Resources]) -> dict[Resources, float]:
        """The dominant shares of ``demands`` (kept per demand), as the order uses them."""
        dom = self._dom
        for d in demands:
            if d not in dom:
                dom[d] = dominant(d, self.capacity)
        return dom

    def _key(self, d: Resources) -> tuple[float, float, int]:
        head = self._groups[d][0]
        return (head[0], -self._dom[d], head[1])

    def first(self, fits: Callable[[Resources, float], bool]) -> Resources | None:
        """The demand whose next task comes first among those that ``fits(demand,
        duration)``; None if none does."""
        best: tuple[float, float, int] | None = None
        found: Resources | None = None
        for d in self._groups:
            key = self._key(d)
            if (best is None or key < best) and fits(d, -key[0]):
                best, found = key, d
        return found

    def first_any(self) -> Resources:
        return min(self._groups, key=self._key)

    def pop(self, d: Resources) -> tuple[Task, int]:
        g = self._groups[d]
        _, _, t, s = heapq.heappop(g)
        if not g:
            del self._groups[d]
        return t, s


def _pack_in_time(
    stages: Mapping[int, StageState],
    left: dict[int, int],
    waiting_on: Mapping[int, Iterable[int]],
    cap: Sequence[float],
    capacity: Sequence[float],
    start: float,
    heap: list[_Packed],
    in_use: list[float],
    held: Callable[[float], Sequence[float]] | None = None,
    started: Callable[[float, float, Task], None] | None = None,
    *,
    stretch: bool = True,
    tail: TailRun | None = None,
) -> float:
    """List scheduling in time: at ``start`` and at each completion, start the ready
    tasks that fit in ``cap`` (beside ``in_use`` and ``held(end)``), longest first.

    A stage is ready once every stage it waits on (``left[...] == 0``) is done;
    ``waiting_on[s]`` are the stages that wait on ``s``.  A task bigger than ``cap``
    starts alone; with ``stretch`` it time-shares the allocation and takes ``_stretch``
    times longer (a job whose fair share is smaller than one of its tasks gets that
    task for a fraction of the time, as DRF's processor sharing gives it), without it
    it runs at full speed.  Returns the last completion time; ``started(time, length,
    task)`` sees every task packed.  With ``tail`` (``altruism_tail``), ``stages`` and
    ``left`` are the stages before the job's chain tail, and the tail is packed by its
    recipes where it is released alone.
    """
    p = _Packing(stages, left, waiting_on, cap, capacity, heap, in_use, held, started, stretch)
    if tail is not None:
        p.attach(tail)
    return p.run(start)


class _Packing:
    """One run of ``_pack_in_time``: its state and its steps.

    A stage released alone while nothing is packed or ready (a chain's next link) is
    packed by ``_alone``: the same starts, ends and completion batches as the list
    scheduler's, in the same float operations, without its heaps -- a deep chain
    costs a few operations per stage, not a scheduler step per task."""

    __slots__ = (
        "blocked", "cap", "clock", "finish", "head", "heap", "held", "in_use", "left",
        "ready", "seq", "stages", "started", "stretch", "tail", "waiting_on",
    )  # fmt: skip

    def __init__(
        self,
        stages: Mapping[int, StageState],
        left: dict[int, int],
        waiting_on: Mapping[int, Iterable[int]],
        cap: Sequence[float],
        capacity: Sequence[float],
        heap: list[_Packed],
        in_use: list[float],
        held: Callable[[float], Sequence[float]] | None,
        started: Callable[[float, float, Task], None] | None,
        stretch: bool,
    ) -> None:
        self.stages, self.left, self.waiting_on = stages, left, waiting_on
        self.cap, self.heap, self.in_use, self.held = cap, heap, in_use, held
        self.started, self.stretch = started, stretch
        self.seq = len(heap)
        self.ready = _Ready(capacity)
        blocked = self.blocked = dict.fromkeys(stages, 0)
        for s in stages:
            for n in waiting_on.get(s, ()):
                if left[s] > 0 and n in blocked:  # (else: a chain tail's link, ``attach``)
                    blocked[n] += 1
        self.clock = self.finish = 0.0
        self.head: Mapping[int, StageState] = stages
        self.tail: TailRun | None = None

    def attach(self, tail: TailRun) -> None:
        """The job's chain tail follows ``stages`` (``head``): its first link waits on
        the head's stages that lead to it (forward), its last link holds back those it
        waits for (reverse); the full stages are the job's, for the links' tasks."""
        self.tail = tail
        entry = tail.entry
        blocked = self.blocked
        blocked[entry] = 0
        if tail.forward:  # its parents left in the head, with tasks left
            left = self.left
            for s in tail.tail.states[tail.front].parents:
                if left.get(s, 0) > 0:
                    blocked[entry] += 1
        else:
            for n in self.waiting_on.get(tail.last, ()):
                blocked[n] += 1
        self.stages = tail.stages

    def run(self, start: float) -> float:
        self.clock = self.finish = start
        roots = [s for s in self.head if self.blocked[s] == 0]
        if self.tail is not None and self.blocked[self.tail.entry] == 0:
            roots.append(self.tail.entry)
        self._release(roots)
        heap = self.heap
        while self.ready or heap:
            self._start_ready()
            if not heap:
                break
            self._complete_batch()
        return self.finish

    def _release(self, stages: list[int]) -> None:
        """``stages`` are ready: packed alone if they are a chain's next link, else
        added to the ready tasks."""
        tail, skip = self.tail, None
        while len(stages) == 1 and not self.heap and not self.ready:
            s = stages[0]
            j = tail.index(s) if tail is not None else None
            if j is not None and s != skip:
                assert tail is not None
                stages, stop = tail.pack(self, j)
                if stop is not None:  # the list scheduler takes link ``stop``
                    skip = tail.tail.links[stop]
                    stages = [skip]
                continue
            after = self._alone(s)
            if after is None:
                break
            stages = after
        st = self.stages
        for s in stages:
            if tail is not None:
                j = tail.index(s)
                if j is not None:
                    tail.expand(self, j)
            self.ready.add(st[s].waiting.values(), s)

    def _start_ready(self) -> None:
        """Start the ready tasks that fit now, first in the ready order."""
        ready, heap, in_use, cap, clock = self.ready, self.heap, self.in_use, self.cap, self.clock
        fits = partial(_fits_at, clock=clock, in_use=in_use, cap=cap, held=self.held, failed=set())
        while ready:
            d = ready.first(fits)
            length = 1.0
            if d is None:
                if heap or any(u > EPS for u in in_use):
                    break  # nothing more starts before the next completion
                d = ready.first_any()
                length = _stretch(d, cap) if self.stretch else 1.0
            task, s = ready.pop(d)
            length *= task.duration
            heapq.heappush(heap, (clock + length, self.seq, d, s))
            self.seq += 1
            give(in_use, d)
            if self.started is not None:
                self.started(clock, length, task)

    def _complete_batch(self) -> None:
        """Every packed task ending at the next completion time frees its resources and
        releases the stages that waited only on the stages just finished."""
        heap, left, blocked = self.heap, self.left, self.blocked
        clock = self.clock = heap[0][0]
        released: list[int] = []
        while heap and heap[0][0] <= clock + EPS:
            _, _, d, s = heapq.heappop(heap)
            take(self.in_use, d)
            left[s] -= 1
            if left[s] == 0:
                for n in self.waiting_on.get(s, ()):
                    blocked[n] -= 1
                    if blocked[n] == 0:
                        released.append(n)
        self.finish = max(self.finish, clock)
        if released:
            self._release(released)

    def _alone(self, s: int) -> list[int] | None:
        """Pack stage ``s`` with nothing else packed or ready, if all its tasks fit at
        once (None if not: left to the list scheduler): the stages it releases.

        Demands are integers, so what the stage's tasks take from ``in_use`` and give
        back leaves it as it was, to the bit."""
        waiting = self.stages[s].waiting
        n = len(waiting)
        if not n or self.left[s] != n:
            return None
        specs = [(t.spec.duration, t.spec.demand, t) for t in waiting.values()]
        if n > 1:
            dom = self.ready.doms(d for _, d, _ in specs)
            # the ready order: longest first, then largest dominant share, then first added
            specs.sort(key=lambda x: (-x[0], -dom[x[1]]))
        clock, cap, held = self.clock, self.cap, self.held
        in_use = list(self.in_use)
        for duration, d, _ in specs:
            h = held(clock + duration - EPS) if held is not None else None
            if not _fits(in_use, d, cap, h):
                at = self._one_by_one(specs)
                if at is None:
                    return None
                break
            give(in_use, d)
        else:
            started = self.started
            if started is not None:
                for duration, _, t in specs:
                    started(clock, 1.0 * duration, t)
            self.seq += n
            # completion batches: each at its first end, taking the ends within EPS of it
            ends = sorted([clock + duration for duration, _, _ in specs])
            at = ends[0]
            for end in ends:
                if end > at + EPS:
                    at = end
        self.clock = at
        if at > self.finish:
            self.finish = at
        self.left[s] = 0
        released = []
        blocked = self.blocked
        for c in self.waiting_on.get(s, ()):
            blocked[c] -= 1
            if blocked[c] == 0:
                released.append(c)
        return released

    def _one_by_one(self, specs: list[tuple[float, Resources, Task]]) -> float | None:
        """A stage released alone none of whose tasks fits ``cap`` even alone, with
        nothing held (forward packing): the list scheduler runs its tasks one at a time,
        in the ready order, each stretched (``_stretch``) -- the time the last one ends
        (None if that is not the case)."""
        cap, in_use = self.cap, self.in_use
        if self.held is not None or any(u > EPS for u in in_use):
            return None
        if any(_fits(in_use, d, cap, None) for d in {d for _, d, _ in specs}):
            return None
        clock, started = self.clock, self.started
        for duration, d, t in specs:
            length = (_stretch(d, cap) if self.stretch else 1.0) * duration
            if started is not None:
                started(clock, length, t)
            clock = clock + length  # its own completion batch: nothing else is packed
            if clock > self.finish:
                self.finish = clock
        self.seq += len(specs)
        return clock


def forward_pack(
    now: float,
    cap: Sequence[float],
    capacity: Sequence[float],
    stages: dict[int, StageState],
    running: Sequence[Running],
    children: Mapping[int, list[int]] | None = None,
    tail: TailRun | None = None,
) -> float:
    """T_k: when the job's remaining DAG would finish, given the allocation ``cap``.

    ``running`` are ``(end, demand, stage)`` of started tasks; ``children``, the
    stages' (``common.dag.children_of``), if known; with ``tail``, ``stages`` are
    those before the job's chain tail (``altruism_tail``).
    """
    left = {s: len(st.waiting) + st.running for s, st in stages.items()}
    heap: list[_Packed] = []
    in_use = [0.0] * len(cap)
    for k, (end, d, s) in enumerate(running):
        heapq.heappush(heap, (max(end, now), k, d, s))
        give(in_use, d)
    if children is None:
        children = children_of({s: st.parents for s, st in stages.items()})
    return _pack_in_time(stages, left, children, cap, capacity, now, heap, in_use, tail=tail)


def job_finish(now: float, cap: Sequence[float], capacity: Sequence[float], job: JobState) -> float:
    """``forward_pack`` of ``job`` (the same float), without walking the running tasks
    the packing only watches end.

    While no stage is ready, forward packing only pops completions until the batch in
    which a stage with children finishes; every batch before it starts nothing and
    frees nothing that matters.  So the packing starts at that batch, from the job's
    running tasks kept in end order (``JobState.by_end``): one stage of N running
    tasks costs the last batch, not N.  A chain the job ends with is packed by its
    recipes (``altruism_tail``): only the stages before it are walked."""
    stages: dict[int, StageState] = job.stages
    children = job.children()
    found = chain_tail(job, capacity)
    tail = None
    if found is not None:
        tail = TailRun(job, found, cap, forward=True)
        stages = tail.head(stages)
    rest = _from_last_release(now, stages, children, job.by_end)
    if rest is None:
        return forward_pack(now, cap, capacity, stages, job.running_list(), children, tail)
    left = {s: len(st.waiting) for s, st in stages.items()}
    in_use = [0.0] * len(cap)
    heap: list[_Packed] = []
    for k, (end, _, d, s) in enumerate(rest):  # by (end, stamp): already a heap
        heap.append((end, k, d, s))
        left[s] += 1
        give(in_use, d)
    return _pack_in_time(stages, left, children, cap, capacity, now, heap, in_use, tail=tail)


def _from_last_release(
    now: float,
    stages: Mapping[int, StageState],
    children: Mapping[int, list[int]],
    by_end: Sequence[tuple[float, int, Resources, int]],
) -> Sequence[tuple[float, int, Resources, int]] | None:
    """The running tasks from the first completion batch of ``_pack_in_time`` that may
    release a stage; None if that is the first batch (nothing to skip) or a stage is
    ready from the start."""
    m = len(by_end)
    if m == 0:
        return None
    busy = {s for s, st in stages.items() if st.waiting or st.running}
    blocked = {n for s in busy for n in children.get(s, ())}
    if any(st.waiting and s not in blocked for s, st in stages.items()):
        return None  # a stage is ready now: the packing starts tasks from the start
    # the stages whose last completion releases their children
    need = {s for s, st in stages.items() if not st.waiting and st.running and children.get(s)}
    first = bisect.bisect_right(by_end, (now, float("inf")))  # ends <= now count as now
    j = m - 1
    k = m - 1
    while need and k >= first:
        s = by_end[k][3]
        if s in need:
            need.discard(s)
            j = k
        k -= 1
    if need:
        return None  # released among the tasks already due: no batch to skip

    def at(i: int) -> float:
        return by_end[i][0] if i >= first else now

    # batches chain while ends are within EPS of each other: find where j's chain
    # starts (a gap beyond EPS always starts a batch), then batch forward to j
    i = j
    while i > 0:
        if i < first:
            i = 0
            break
        if at(i) > at(i - 1) + EPS:
            break
        i -= 1
    while True:
        nxt = bisect.bisect_right(by_end, (at(i) + EPS, float("inf")), lo=i)
        if nxt > j:
            break
        i = nxt
    return by_end[i:] if i > 0 else None


def must_start(
    now: float,
    horizon_end: float,
    cap: Sequence[float],
    capacity: Sequence[float],
    stages: dict[int, StageState],
    running: Sequence[Running],
    runnable: set[TaskId],
    parents: Mapping[int, list[int]] | None = None,
    job: JobState | None = None,
) -> list[tuple[float, Task]]:
    """Reverse packing from ``T_k`` (= ``horizon_end``): the latest start of each
    runnable task that still meets ``T_k`` (absolute times, earliest first); the tasks
    whose latest start is now must start now.

    A task larger than ``cap`` is packed alone at full speed: the job need not
    time-share it from now on (as the forward packing that gave ``T_k`` assumed) but
    may run it whole later, when the leftover of others or its own share returns it
    -- the area it is owed is the same.

    With ``job`` (whose ``stages`` these are), the chain it ends with is packed by its
    recipes (``altruism_tail``) while none of its tasks is runnable."""
    m = len(cap)
    # held(x): what running tasks hold at reverse time x (they sit at the end)
    reserved = sorted((horizon_end - max(end, now), d) for end, d, _ in running)
    starts = [x for x, _ in reserved]
    prefix: list[list[float]] = [[0.0] * m]
    for _, d in reserved:
        prefix.append([a + b for a, b in zip(prefix[-1], d, strict=True)])

    def held(x: float) -> list[float]:
        return prefix[bisect.bisect_right(starts, x)]

    latest: list[tuple[float, Task]] = []

    def started(tau: float, length: float, task: Task) -> None:
        if task.task_id in runnable:
            latest.append((horizon_end - tau - length, task))

    # reversed: a stage waits for its children; running tasks count as done
    if parents is None:  # (``JobState.live_parents``)
        parents = {s: [p for p in st.parents if p in stages] for s, st in stages.items()}
    tail = _reverse_tail(job, cap, capacity, runnable, starts[0] if starts else float("inf"))
    if tail is not None:
        stages = tail.head(stages)
    left = {s: len(st.waiting) for s, st in stages.items()}
    _pack_in_time(
        stages, left, parents, cap, capacity, 0.0, [], [0.0] * m, held, started,
        stretch=False, tail=tail,
    )  # fmt: skip
    latest.sort(key=lambda p: p[0])
    return latest


def _reverse_tail(
    job: JobState | None,
    cap: Sequence[float],
    capacity: Sequence[float],
    runnable: set[TaskId],
    limit: float,
) -> TailRun | None:
    """The job's chain tail for a reverse packing: none of its tasks is runnable (no
    latest start to give), and what running tasks hold is nothing before ``limit``."""
    found = chain_tail(job, capacity) if job is not None else None
    if job is None or found is None:
        return None
    tail, front = found
    pos, stage_of = tail.pos, job.stage_of
    if any(pos.get(stage_of.get(t, -1), -1) >= front for t in runnable):
        return None
    return TailRun(job, found, cap, forward=False, limit=limit)
