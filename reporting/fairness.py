"""Fairness over a run: each user's dominant share of the federation sampled over time
(``usage_samples``), and Jain's index of (dominant share / configured share) per 60-s
window (``jain_windows``), as the Carbyne comparison reports it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence

from common.ids import UserId
from common.model import Task


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values`` (1 = perfectly even)."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


Span = tuple[float, float, UserId, Sequence[int]]
"""A task's run for ``usage_samples``: start, finish, user, demand."""


def usage_samples(
    spans: Iterable[Span], capacity: Sequence[int], first: float, last: float, step: float = 1.0
) -> list[tuple[float, dict[UserId, float]]]:
    """Each user's dominant share of the federation, sampled every ``step`` seconds from
    ``first`` to ``last``: a run counts at the samples in [start, finish) (runs that
    never started or end before they start, none), a user from its first start on."""
    times: list[float] = []
    now = first
    while now <= last:
        times.append(now)
        now += step
    n, width = len(times), len(capacity)
    delta: dict[UserId, list[list[int]]] = {}  # per user: change of use at each sample
    since: dict[UserId, int] = {}
    for start, finish, user, demand in spans:
        if start < 0 or finish < start:
            continue
        lo, hi = bisect_left(times, start), bisect_left(times, finish)
        since[user] = min(since.get(user, n), lo)
        rows = delta.get(user)
        if rows is None:
            rows = delta[user] = [[0] * width for _ in range(n + 1)]
        for r, x in enumerate(demand):
            rows[lo][r] += x
            rows[hi][r] -= x
    order = sorted(since, key=lambda u: since[u])
    out: list[tuple[float, dict[UserId, float]]] = [(t, {}) for t in times]
    for user in order:
        used = [0] * width
        rows = delta[user]
        for k in range(since[user], n):
            for r in range(width):
                used[r] += rows[k][r]
            out[k][1][user] = max(
                (x / c for x, c in zip(used, capacity, strict=True) if c > 0), default=0
            )
    return out


def usage_from_tasks(
    tasks: Sequence[Task], capacity: Sequence[int], first: float, last: float, step: float = 1.0
) -> list[tuple[float, dict[UserId, float]]]:
    """``usage_samples`` of the tasks' measured start and finish times."""
    return usage_samples(
        ((t.started_at, t.finished_at, t.user, t.demand) for t in tasks),
        capacity,
        first,
        last,
        step,
    )


JAIN_WINDOW_S = 60.0


def jain_windows(
    samples: Sequence[tuple[float, Mapping[UserId, float]]],
    spans: Mapping[UserId, Sequence[tuple[float, float]]],
    shares: Mapping[UserId, float],
    window_s: float = JAIN_WINDOW_S,
) -> dict[str, float]:
    """Jain's index of (dominant share / configured share) per window, over the users
    with a job in the system during that window (``spans``: per user, each job's
    arrival and completion)."""
    if not samples:
        return {"mean": 1.0, "min": 1.0, "max": 1.0}
    t0 = samples[0][0]
    windows: dict[int, list[Mapping[UserId, float]]] = {}
    for t, use in samples:
        windows.setdefault(int((t - t0) // window_s), []).append(use)
    idx: list[float] = []
    for w, pts in sorted(windows.items()):
        lo, hi = t0 + w * window_s, t0 + (w + 1) * window_s
        active = [
            u for u, sp in spans.items() if u in shares and any(a < hi and e > lo for a, e in sp)
        ]
        if len(active) < 2:
            continue
        xs = [sum(use.get(u, 0.0) for use in pts) / len(pts) / shares[u] for u in active]
        idx.append(jain(xs))
    if not idx:
        return {"mean": 1.0, "min": 1.0, "max": 1.0}
    return {"mean": sum(idx) / len(idx), "min": min(idx), "max": max(idx)}
