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
    """The largest fraction of any resource that ``demand`` takes of ``capacity`` (DRF).

    ``max`` of the fractions as a loop (called for every job at every plan): the first
    largest, as ``max`` keeps it, and 0.0 if no resource has a capacity."""
    out: float | None = None
    for d, c in zip(demand, capacity, strict=True):
        if c > 0:
            x = d / c
            if out is None or x > out:
                out = x
    return 0.0 if out is None else out


def fits_in(demand: Sequence[float], room: Sequence[float]) -> bool:
    # a loop, not all() over a generator: the same answer, at a fraction of the cost
    for d, r in zip(demand, room, strict=True):  # noqa: SIM110
        if not d <= r + EPS:
            return False
    return True


def take(room: Vec, demand: Sequence[float]) -> None:
    """``room -= demand``, in place."""
    for r, x in enumerate(demand):
        room[r] -= x


def give(room: Vec, demand: Sequence[float]) -> None:
    """``room += demand``, in place."""
    for r, x in enumerate(demand):
        room[r] += x
