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
Pure functions of their arguments: no clock, no randomness.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence

from common.dag import children_of
from common.ids import TaskId
from common.model import Resources, Task
from global_master.policy.jobs import Running, StageState
from global_master.policy.vectors import EPS, dominant, give, take

_Packed = tuple[float, int, Resources, int]
"""A task packed in time: (end, tie-breaker, demand, stage id)."""


def _order_pairs(
    pairs: list[tuple[Task, int]], capacity: Sequence[float]
) -> list[tuple[Task, int]]:
    """Longest first, then largest dominant share (one share per distinct demand)."""
    doms: dict[Resources, float] = {}
    for t, _ in pairs:
        if t.demand not in doms:
            doms[t.demand] = dominant(t.demand, capacity)
    return sorted(pairs, key=lambda p: (-p[0].duration, -doms[p[0].demand]))


def _fits(
    in_use: Sequence[float], d: Resources, cap: Sequence[float], held: Sequence[float] | None
) -> bool:
    if held is None:
        return all(u + x <= c + EPS for u, x, c in zip(in_use, d, cap, strict=True))
    return all(u + x + v <= c + EPS for u, x, v, c in zip(in_use, d, held, cap, strict=True))


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
    started: Callable[[float, Task], None] | None = None,
) -> float:
    """List scheduling in time: at ``start`` and at each completion, start the ready
    tasks that fit in ``cap`` (beside ``in_use`` and ``held(end)``), longest first.

    A stage is ready once every stage it waits on (``left[...] == 0``) is done;
    ``waiting_on[s]`` are the stages that wait on ``s``.  A task bigger than ``cap``
    starts alone.  Returns the last completion time.
    """
    blocked = dict.fromkeys(stages, 0)
    for s in stages:
        for n in waiting_on.get(s, ()):
            if left[s] > 0:
                blocked[n] += 1
    order = _order_pairs(
        [(t, s) for s, st in stages.items() if blocked[s] == 0 for t in st.waiting], capacity
    )
    seq = len(heap)
    clock = finish = start
    while order or heap:
        rest: list[tuple[Task, int]] = []
        failed: set[Resources] = set()
        for pair in order:
            task = pair[0]
            d = task.demand
            if d in failed:
                rest.append(pair)
                continue
            h = held(clock + task.duration - EPS) if held is not None else None
            if _fits(in_use, d, cap, h) or (not heap and not any(u > EPS for u in in_use)):
                heapq.heappush(heap, (clock + task.duration, seq, d, pair[1]))
                seq += 1
                give(in_use, d)
                if started is not None:
                    started(clock, task)
            else:
                failed.add(d)
                rest.append(pair)
        order = rest
        if not heap:
            break
        # every packed task ending at the next completion time frees its resources
        # and releases the stages that waited only on the stages just finished
        clock = heap[0][0]
        released: list[tuple[Task, int]] = []
        while heap and heap[0][0] <= clock + EPS:
            _, _, d, s = heapq.heappop(heap)
            take(in_use, d)
            left[s] -= 1
            if left[s] == 0:
                for n in waiting_on.get(s, ()):
                    blocked[n] -= 1
                    if blocked[n] == 0:
                        released.extend((task, n) for task in stages[n].waiting)
        finish = max(finish, clock)
        if released:
            order = _order_pairs(order + released, capacity)
    return finish


def forward_pack(
    now: float,
    cap: Sequence[float],
    capacity: Sequence[float],
    stages: dict[int, StageState],
    running: Sequence[Running],
) -> float:
    """T_k: when the job's remaining DAG would finish, given the allocation ``cap``.

    ``running`` are ``(end, demand, stage)`` of started tasks.
    """
    left = {s: len(st.waiting) + st.running for s, st in stages.items()}
    heap: list[_Packed] = []
    in_use = [0.0] * len(cap)
    for k, (end, d, s) in enumerate(running):
        heapq.heappush(heap, (max(end, now), k, d, s))
        give(in_use, d)
    children = children_of({s: st.parents for s, st in stages.items()})
    return _pack_in_time(stages, left, children, cap, capacity, now, heap, in_use)


def must_start(
    now: float,
    horizon_end: float,
    cap: Sequence[float],
    capacity: Sequence[float],
    stages: dict[int, StageState],
    running: Sequence[Running],
    runnable: set[TaskId],
) -> list[tuple[float, Task]]:
    """Reverse packing from ``T_k`` (= ``horizon_end``): the latest start of each
    runnable task that still meets ``T_k`` (absolute times, earliest first); the tasks
    whose latest start is now must start now."""
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

    def started(tau: float, task: Task) -> None:
        if task.task_id in runnable:
            latest.append((horizon_end - tau - task.duration, task))

    # reversed: a stage waits for its children; running tasks count as done
    left = {s: len(st.waiting) for s, st in stages.items()}
    parents = {s: [p for p in st.parents if p in stages] for s, st in stages.items()}
    _pack_in_time(stages, left, parents, cap, capacity, 0.0, [], [0.0] * m, held, started)
    latest.sort(key=lambda p: p[0])
    return latest
