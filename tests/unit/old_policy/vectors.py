# Frozen copy of global_master/policy/vectors.py at ac0bb2b, before the many-jobs work:
# the reference tests/unit/test_many_jobs.py holds the new code to.  Do not edit.
"""Resource vectors as the policies reason about them: fractional, one entry per resource.

Demands and capacities are integer ``Resources`` on the wire; shares and rooms are
floats here (a DRF allocation is a real-valued vector).  ``EPS`` absorbs the float
error of progressive filling: a demand fits a room it exceeds by less than ``EPS``.
"""

from __future__ import annotations

from collections.abc import Sequence

EPS = 1e-9
Vec = list[float]


def dominant(demand: Sequence[float], capacity: Sequence[float]) -> float:
    """The largest fraction of any resource that ``demand`` takes of ``capacity`` (DRF)."""
    return max((d / c for d, c in zip(demand, capacity, strict=True) if c > 0), default=0.0)


def fits_in(demand: Sequence[float], room: Sequence[float]) -> bool:
    return all(d <= r + EPS for d, r in zip(demand, room, strict=True))


def take(room: Vec, demand: Sequence[float]) -> None:
    """``room -= demand``, in place."""
    for r, x in enumerate(demand):
        room[r] -= x


def give(room: Vec, demand: Sequence[float]) -> None:
    """``room += demand``, in place."""
    for r, x in enumerate(demand):
        room[r] += x
