"""The chain a job's DAG ends with, packed by Carbyne's and SJF's packings without the
list scheduler and without walking it link by link (issue 35 item 4).

A deep chain's links are released one at a time, and every plan of the job packs every
link left twice (forward for ``T_k``, in reverse for the latest starts): through the
list scheduler that cost a scheduler step per task and a few dictionaries per link, at
every plan.  The **tail** of a job is the longest run of stages at the end of its DAG
(the last ones in stage order) that is a chain: each link untouched (none of its tasks
started), waiting on one that is left (the first link: on at least one), the link
before it its only parent left and it that link's only child, the last one a sink.
While nothing else is packed or ready when a packing releases one of its links (in a
chain: always), what the packing does with it depends only on the allocation and the
clock at which the link is released, so per job and allocation a link is a *recipe*:

* every task fits at once (``_Packing._alone``): they all start at the release time and
  the link ends at the completion batch of its longest task -- the single addition
  ``clock + top`` when no other task ends within ``GAP`` of it (ends that far apart are
  never batched together while the clock is below ``SAFE``);
* none fits even alone (forward: ``_Packing._one_by_one``; in reverse the list
  scheduler does the same at full speed), or a link of two tasks that do not fit
  together: its tasks run one after the other, in the ready order (the one that fits
  first), each ending where the next starts -- additions ``clock + length`` in turn;
* any other link (more than two tasks of which some fit, or ends within ``GAP``) is
  packed by the list scheduler, as before, and the links after it are recipes again.

So a forward packing adds the tail's lengths to the clock in the order the list
scheduler does: the same floats, to the bit, with one C loop (``functools.reduce``)
in place of a scheduler per link.  A reverse packing starts at 0.0 from the chain's
end, so the clocks it reaches are the same at every plan of the same allocation: they
are kept, and a plan reads the one where the tail ends, while what the running tasks
hold at the end (``held``) is nothing over the tail (else the links that reach it are
packed by the list scheduler).  A recipe is kept per job and allocation (``FOLDS`` of
them); the tail is checked against the job's stages at every version of the job (the
identity of each link's state, its waiting tasks, none running: C loops).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import reduce
from itertools import islice, pairwise
from operator import add, attrgetter, is_
from typing import TYPE_CHECKING

from common.dag import finish_times
from common.model import Resources
from global_master.policy.job_state import JobState, StageState
from global_master.policy.vectors import EPS, dominant

if TYPE_CHECKING:
    from global_master.policy.altruism import _Packing

MIN_LINKS = 8
"""A job whose DAG ends in a chain of fewer links is packed as before."""
GAP = 1e-6
"""Ends of a link's tasks at least this far apart are never in one completion batch."""
SAFE = 2.0**29
"""Below this clock (17 years) a float's rounding (< 6e-8) is far below ``GAP``."""
FOLDS = 16
"""Recipes kept per job (one per allocation and direction)."""

_running = attrgetter("running")


def stretch(d: Resources, cap: Sequence[float]) -> float:
    """How much longer a task larger than the allocation takes when it time-shares
    it: an allocation of ``cap`` holds a task of ``d`` for ``cap / d`` of the time."""
    return max((x / c if c > EPS else float("inf")) for x, c in zip(d, cap, strict=True) if x > 0)


def _fits_alone(d: Sequence[float], cap: Sequence[float]) -> bool:
    """``_fits`` with nothing in use and nothing held (``0.0 + x + 0.0`` is ``x``)."""
    return not any(x > c + EPS for x, c in zip(d, cap, strict=True))


class _Link:
    """A link's tasks as a packing orders them (longest first, then largest dominant
    share, then first added: ``_Ready``), what they take together, and its ends."""

    __slots__ = ("order", "top", "total", "whole")

    def __init__(self, st: StageState, capacity: Sequence[float]) -> None:
        specs = [(t.spec.duration, t.spec.demand) for t in st.waiting.values()]
        if len(specs) > 1:
            specs.sort(key=lambda x: (-x[0], -dominant(x[1], capacity)))
        self.order = specs
        m = len(capacity)
        self.total = [float(sum(d[r] for _, d in specs)) for r in range(m)]
        self.top = max(x for x, _ in specs)
        # one addition ends the link when every other end is the top's or GAP before it
        self.whole = all(x == self.top or x < self.top - GAP for x, _ in specs)

    def recipe(self, cap: Sequence[float], forward: bool) -> tuple[bool, list[float]] | None:
        """Whether every task starts at the release (``_alone``), and the lengths the
        clock advances by, in turn, from the link's release to the release of the
        next; None: left to the list scheduler."""
        if _fits_alone(self.total, cap):
            return (True, [self.top]) if self.whole else None
        order = self.order
        fit = [_fits_alone(d, cap) for _, d in order]
        if not any(fit):  # one at a time, in the ready order (forward: stretched)
            if forward:
                return False, [stretch(d, cap) * x for x, d in order]
            return False, [1.0 * x for x, _ in order]
        if len(order) != 2:
            return None
        (x0, d0), (x1, d1) = order
        if fit[0] and fit[1]:  # each alone, the first in the ready order first
            return False, [1.0 * x0, 1.0 * x1]
        # the one that fits, then the other alone (forward: stretched)
        (xa, _), (xb, db) = ((x0, d0), (x1, d1)) if fit[0] else ((x1, d1), (x0, d0))
        return False, [1.0 * xa, (stretch(db, cap) if forward else 1.0) * xb]


class _Forward:
    """A forward recipe of links ``base..``: their lengths end to end (``addends``,
    link ``j``'s from ``off[j - base]``), the first link from ``j`` on that is left to
    the list scheduler (``slow``; the tail's length if none), tasks before each link."""

    __slots__ = ("addends", "base", "off", "slow", "tasks")

    def __init__(self, links: list[_Link], base: int, cap: Sequence[float]) -> None:
        self.base = base
        self.addends: list[float] = []
        self.off: list[int] = []
        self.tasks: list[int] = [0]
        fast: list[bool] = []
        for link in links[base:]:
            self.off.append(len(self.addends))
            r = link.recipe(cap, True)
            ok = r is not None and all(x >= 0.0 for x in r[1])
            fast.append(ok)
            if r is not None and ok:
                self.addends += r[1]
            self.tasks.append(self.tasks[-1] + len(link.order))
        self.off.append(len(self.addends))
        m = base + len(fast)
        self.slow = [m] * (len(fast) + 1)
        for k in range(len(fast) - 1, -1, -1):
            self.slow[k] = self.slow[k + 1] if fast[k] else base + k


class _Reverse:
    """A reverse recipe from the chain's end at 0.0: the clock after each link
    (``clocks[k]``: after the last ``k + 1`` links), the largest time at which what is
    held was asked for up to it (``probes``), tasks packed up to it."""

    __slots__ = ("clocks", "probes", "tasks")

    def __init__(self, links: list[_Link], base: int, cap: Sequence[float]) -> None:
        self.clocks: list[float] = []
        self.probes: list[float] = []
        self.tasks: list[int] = [0]
        clock, probe = 0.0, float("-inf")
        for link in reversed(links[base:]):
            r = link.recipe(cap, False)
            if r is None or not all(x >= 0.0 for x in r[1]):
                break
            together, lengths = r
            for x in lengths:
                clock = clock + x
            # ``_alone`` asks at each task's end minus EPS (the longest's is the last);
            # the list scheduler at or before each task's end
            probe = max(probe, clock - EPS if together else clock + GAP)
            if not 0.0 <= clock < SAFE:
                break
            self.clocks.append(clock)
            self.probes.append(probe)
            self.tasks.append(self.tasks[-1] + len(link.order))


class Tail:
    """A job's chain tail (``links``, in stage order) and its recipes; ``front`` is the
    first link still in it (the links before it were released since)."""

    __slots__ = (
        "capacity", "checked", "folds", "front", "links", "ns", "paths", "pos", "products",
        "rlinks", "specs", "states", "waitings",
    )  # fmt: skip

    def __init__(
        self, links: list[int], stages: Mapping[int, StageState], capacity: tuple[float, ...]
    ) -> None:
        self.capacity = capacity
        self.links = links
        self.rlinks = links[::-1]
        self.pos = {s: j for j, s in enumerate(links)}
        self.states = [stages[s] for s in links]
        self.waitings = [st.waiting for st in self.states]
        self.ns = [len(w) for w in self.waitings]
        self.specs: list[_Link | None] = [None] * len(links)
        self.folds: dict[tuple[bool, tuple[float, ...]], _Forward | _Reverse] = {}
        self.front = 0
        self.checked = (-1, 0)
        self.paths: dict[int, float] | None = None
        self.products: dict[tuple[float, ...], tuple[int, list[int], list[float]]] = {}

    def work(
        self, front: int, capacity: Sequence[float], dom: Callable[[Resources], float]
    ) -> Iterator[float]:
        """The links' waiting work from ``front`` on, task after task in the job's
        order (``JobState.remaining_work``'s terms, ``dom(demand) * duration``): made
        once per capacity, so a sum over the job adds them in the same order."""
        key = tuple(capacity)
        hit = self.products.get(key)
        if hit is None:
            base, off, terms = self.front, [], []  # type: tuple[int, list[int], list[float]]
            for w in self.waitings[base:]:
                off.append(len(terms))
                terms += [dom(t.demand) * t.duration for t in w.values()]
            if len(self.products) >= FOLDS:
                del self.products[next(iter(self.products))]
            hit = self.products[key] = (base, off, terms)
        base, off, terms = hit
        return islice(terms, off[front - base], None)

    def critical(self) -> dict[int, float]:
        """``common.dag.finish_times`` of the links that have a child, on the reversed
        DAG, with each link as long as its longest task (SJF's ``critical_first``: a
        link's longest path to the job's end, the sink's own length not counted, as
        there).  Each is a function of the links after it only: made once."""
        if self.paths is None:
            links = self.links[self.front :]
            rev = {s: [c] for s, c in pairwise(links)}
            length = {s: max(t.duration for t in self.waitings[self.pos[s]].values()) for s in rev}
            self.paths = finish_times(rev, length)
        return self.paths

    def check(self, job: JobState) -> int | None:
        """The front, moved past the links released since; None if a link changed
        otherwise (the tail is made again)."""
        if self.checked[0] == job.version:
            return self.checked[1]
        stages, links, states, f = job.stages, self.links, self.states, self.front
        m = len(links)
        while f < m:
            st = stages.get(links[f])
            if (
                st is states[f]
                and not st.running
                and len(st.waiting) == self.ns[f]
                and (links[f - 1] in stages if f else any(p in stages for p in st.parents))
            ):
                break
            f += 1
        self.front = f
        k = m - f
        if k and (
            list(islice(reversed(stages), k)) != self.rlinks[:k]
            or not all(map(is_, map(stages.get, links[f:]), states[f:]))
            or any(map(_running, states[f:]))
            or list(map(len, self.waitings[f:])) != self.ns[f:]
        ):
            return None
        self.checked = (job.version, f)
        return f

    def _links(self) -> list[_Link]:
        specs = self.specs
        for j in range(self.front, len(specs)):
            if specs[j] is None:
                specs[j] = _Link(self.states[j], self.capacity)
        return specs  # type: ignore[return-value]

    def fold(self, cap: Sequence[float], forward: bool) -> _Forward | _Reverse:
        key = (forward, tuple(cap))
        hit = self.folds.get(key)
        if hit is None:
            hit = (_Forward if forward else _Reverse)(self._links(), self.front, cap)
            if len(self.folds) >= FOLDS:
                del self.folds[next(iter(self.folds))]
            self.folds[key] = hit
        return hit


def chain_tail(job: JobState, capacity: Sequence[float]) -> tuple[Tail, int] | None:
    """The job's tail and its front (the tail kept in ``JobState.chain``, made again
    when the job's stages changed other than by releasing its links); None if the job
    does not end in a chain of ``MIN_LINKS`` links."""
    stages = job.stages
    tail = job.chain
    key = tuple(capacity)
    if tail is not None and tail.capacity == key:
        f = tail.check(job)
        if f is not None:
            return (tail, f) if f < len(tail.links) else None
    if len(stages) < MIN_LINKS:
        job.chain = None
        return None
    links = _chain_end(stages, job.children(), job.live_parents())
    if len(links) < MIN_LINKS:
        job.chain = None
        return None
    tail = job.chain = Tail(links, stages, key)
    tail.checked = (job.version, 0)
    return tail, 0


def _chain_end(
    stages: dict[int, StageState],
    children: Mapping[int, list[int]],
    parents: Mapping[int, list[int]],
) -> list[int]:
    """The last stages (in stage order) that form a chain of untouched links."""
    links: list[int] = []
    after: int | None = None
    for s in reversed(stages):
        st = stages[s]
        if st.running or not st.waiting or not parents.get(s):
            break
        if list(children.get(s, ())) != ([] if after is None else [after]):
            break
        if after is not None and list(parents.get(after, ())) != [s]:
            break
        links.append(s)
        after = s
    links.reverse()
    return links


class TailRun:
    """A job's tail as one packing uses it: the links from ``front``, in the packing's
    direction, the recipe of its allocation, and (reverse) the first time at which the
    running tasks hold something (``limit``)."""

    __slots__ = ("cap", "forward", "front", "limit", "stages", "tail")

    def __init__(
        self,
        job: JobState,
        found: tuple[Tail, int],
        cap: Sequence[float],
        *,
        forward: bool,
        limit: float = float("inf"),
    ) -> None:
        self.tail, self.front = found
        self.stages = job.stages
        self.cap, self.forward, self.limit = cap, forward, limit

    def head(self, stages: Mapping[int, StageState]) -> dict[int, StageState]:
        """The job's stages before the tail."""
        return dict(islice(stages.items(), len(stages) - (len(self.tail.links) - self.front)))

    @property
    def entry(self) -> int:
        """The link a packing releases first."""
        links = self.tail.links
        return links[self.front] if self.forward else links[-1]

    @property
    def last(self) -> int:
        """The link a packing releases last."""
        links = self.tail.links
        return links[-1] if self.forward else links[self.front]

    def index(self, s: int) -> int | None:
        j = self.tail.pos.get(s)
        return j if j is not None and j >= self.front else None

    def expand(self, p: _Packing, j: int) -> None:
        """Link ``j`` is packed by the list scheduler: its tasks left, and the link it
        releases waiting on it alone."""
        tail = self.tail
        s = tail.links[j]
        if s not in p.left:
            p.left[s] = tail.ns[j]
        nxt = j + 1 if self.forward else j - 1
        if self.front <= nxt < len(tail.links):
            p.blocked.setdefault(tail.links[nxt], 1)

    def pack(self, p: _Packing, j: int) -> tuple[list[int], int | None]:
        """Pack from link ``j``, released alone: the stages released after the tail,
        or the link where the list scheduler takes over (already ``expand``-ed)."""
        if self.forward:
            return self._forward(p, j)
        return self._reverse(p, j)

    def _forward(self, p: _Packing, j: int) -> tuple[list[int], int | None]:
        r = self.tail.fold(self.cap, True)
        assert isinstance(r, _Forward)
        k = j - r.base
        e = r.slow[k]
        if e == j or not p.clock >= 0.0:
            self.expand(p, j)
            return [], j
        clock = reduce(add, islice(r.addends, r.off[k], r.off[e - r.base]), p.clock)
        if not clock < SAFE:
            self.expand(p, j)
            return [], j
        p.clock = clock
        if clock > p.finish:
            p.finish = clock
        p.seq += r.tasks[e - r.base] - r.tasks[k]
        if e == len(self.tail.links):
            return [], None
        self.expand(p, e)
        return [], e

    def _reverse(self, p: _Packing, j: int) -> tuple[list[int], int | None]:
        tail = self.tail
        m = len(tail.links)
        if j != m - 1 or p.clock != 0.0 or p.finish != 0.0:
            self.expand(p, j)
            return [], j
        r = tail.fold(self.cap, False)
        assert isinstance(r, _Reverse)
        n = min(len(r.clocks), m - self.front, bisect.bisect_left(r.probes, self.limit))
        if n == 0:
            self.expand(p, j)
            return [], j
        clock = r.clocks[n - 1]
        p.clock = clock
        if clock > p.finish:
            p.finish = clock
        p.seq += r.tasks[n]
        if n < m - self.front:
            self.expand(p, m - 1 - n)
            return [], m - 1 - n
        released: list[int] = []
        blocked = p.blocked
        for c in p.waiting_on.get(tail.links[self.front], ()):
            blocked[c] -= 1
            if blocked[c] == 0:
                released.append(c)
        return released, None
