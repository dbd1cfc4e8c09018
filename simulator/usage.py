"""Each user's dominant share of the federation over a run, sampled on a fixed grid and
kept as a step function.

The simulator samples every ``every`` seconds of virtual time (``SimConfig.
sample_usage_every_s``), the ticks falling where ticking puts them (``t += every``
from the first).  Consecutive equal samples form a *run*, stored once with its first
and last tick and how many it holds, so a span where nothing changes costs one run
whatever its length (and the simulator need not tick through it: it adds the run's
samples at once).  Iterating a series gives every sample, the same times and values as
a list of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from common.ids import UserId

Shares = dict[UserId, float]


@dataclass(slots=True)
class UsageRun:
    """``count`` consecutive samples equal to ``shares``, from tick ``first`` to ``last``."""

    first: float
    last: float
    count: int
    shares: Shares


class UsageSeries:
    """The samples of one run as runs of equal ones (module docstring)."""

    __slots__ = ("_n", "every", "runs")

    def __init__(self, every: float) -> None:
        self.every = every
        self.runs: list[UsageRun] = []
        self._n = 0

    def add(self, t: float, shares: Shares, count: int = 1, last: float | None = None) -> None:
        """``count`` samples equal to ``shares`` at the ticks from ``t`` to ``last``
        (``t`` for one)."""
        if count <= 0:
            return
        end = t if last is None else last
        self._n += count
        runs = self.runs
        if runs and runs[-1].shares == shares:
            run = runs[-1]
            run.last = end
            run.count += count
        else:
            runs.append(UsageRun(t, end, count, shares))

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[tuple[float, Shares]]:
        """Every sample: (time, each user's dominant share), in time order."""
        every = self.every
        for run in self.runs:
            t, shares = run.first, run.shares
            for _ in range(run.count):
                yield t, shares
                t += every

    def corners(self) -> Iterator[tuple[float, Shares]]:
        """Each run's first and last sample: the line through every sample, without the
        samples inside a run (on it, flat); what a plot needs, whatever the run's
        length."""
        for run in self.runs:
            yield run.first, run.shares
            if run.count > 1:
                yield run.last, run.shares
