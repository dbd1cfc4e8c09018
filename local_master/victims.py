"""Choosing preemption victims on one LM (Alg. 2's LM side, §IV-C): which attempts of
the victim user to stop so that a waiting task fits, throwing away the least work.

Invariants of a ``Choice``:

* It is verified on the true state: on its node (alive, meeting the task's
  constraints), the free resources plus the victims' demands cover the task's demand.
* No more victims than the room needs: on a node they are taken lowest priority class
  first, then altruistic ones, then by least work run, and taking stops as soon as the
  task fits.  No victim is of a higher class than the task.
* Among nodes: the least work thrown away, then the fewest victims, then the node whose
  first candidate comes first.
* No victims at all means the room is free already (the task needs no preemption).

Pure: candidates and nodes come in as values, the choice goes out as a value; nothing
is changed here (the core stops the victims).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from common.ids import NodeIndex, UserId
from common.model import TaskSpec, satisfies


class Candidate(Protocol):
    """What victim choice reads of a running attempt."""

    @property
    def spec(self) -> TaskSpec: ...
    @property
    def node(self) -> NodeIndex: ...
    @property
    def altruistic(self) -> bool: ...
    @property
    def started_at(self) -> float: ...


C = TypeVar("C", bound=Candidate)


def work(a: Candidate, now: float) -> float:
    """What preempting ``a`` now throws away: CPU-seconds run (0 if not started)."""
    if a.started_at < 0:
        return 0.0
    return max(0.0, now - a.started_at) * (a.spec.demand[0] if a.spec.demand else 1)


@dataclass(frozen=True, slots=True)
class Choice(Generic[C]):
    """Stop ``victims`` on ``node`` to make room; ``lost`` CPU-seconds are thrown away."""

    node: int
    victims: tuple[C, ...]
    lost: float


def choose(
    spec: TaskSpec,
    victim: UserId,
    candidates: Iterable[C],
    free: Sequence[Sequence[int]],
    alive: Sequence[bool],
    constraints: Sequence[int],
    now: float,
    younger_than: float | None = None,
    lower_only: bool = False,
) -> Choice[C] | None:
    """Where stopping attempts of ``victim`` makes room for ``spec`` at least cost; None
    if nowhere.  With ``younger_than``, only attempts that ran for at most that long are
    candidates (preempting one throws away no more work than the wait it ends).  An
    attempt of a higher priority class than ``spec``'s is never a candidate; with
    ``lower_only`` (a higher class's preemption) the candidates are every user's
    attempts of a lower class, and the lowest class goes first."""
    by_node: dict[int, list[C]] = {}
    cls = spec.priority
    for a in candidates:
        if lower_only:
            if a.spec.priority >= cls:
                continue
        elif a.spec.user != victim or a.spec.priority > cls:
            continue
        if younger_than is not None and a.started_at >= 0 and now - a.started_at > younger_than:
            continue
        by_node.setdefault(a.node, []).append(a)
    demand = spec.demand
    best: Choice[C] | None = None
    for node, victims in by_node.items():
        if not alive[node] or not satisfies(constraints[node], spec.constraints):
            continue
        victims.sort(key=lambda a: (a.spec.priority, not a.altruistic, work(a, now)))
        room = list(free[node])
        chosen: list[C] = []
        lost = 0.0
        for a in victims:
            if all(f >= d for f, d in zip(room, demand, strict=True)):
                break
            chosen.append(a)
            lost += work(a, now)
            for r, d in enumerate(a.spec.demand):
                room[r] += d
        if all(f >= d for f, d in zip(room, demand, strict=True)) and (
            best is None or (lost, len(chosen)) < (best.lost, len(best.victims))
        ):
            best = Choice(node, tuple(chosen), lost)
    return best
