"""A GM's eventually consistent view of one LM's cluster (paper §IV-B1).

Per LM the view holds one bit-vector per machine constraint (bit i = node i meets
it), one bit-vector per partition (bit i = node i's home is that GM), the free
resources of every node as last reported, the per-node versions, and the GM's own
*pending reservations* (resources it has asked for and not yet heard back about).

Invariant: ``free[i] == reported[i] - pending[i]`` componentwise, always.  Applying a
reported node value therefore never forgets an in-flight request of this GM, and
releasing a reservation when the response arrives is exact whichever of the
response or a heartbeat comes first.

The matching itself (AND of constraint vectors, then a first-fit scan of the nodes
whose bit survives) lives here because it is the hot path: eligibility vectors are
cached per constraint mask (machine constraints and homes never change), and an
``avail`` vector (every resource > 0) skips full nodes without touching them.

``Views`` holds a GM's view of every LM: a view is made from an LM's snapshot (which
keeps the GM's pending reservations) and follows that LM incarnation's updates
(``epoch``); an update of an older incarnation is stale, one of a newer incarnation
or one after a gap asks for a snapshot (once until it comes).  The GM decides only
once it has a view of every LM.  ``Views`` counts what it sees in the GM's counters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from bitarray import bitarray, frozenbitarray

from common.ids import GmId, LmId, UserId
from common.messages import ClusterLayout, SnapshotRequest, StateDelta, StateSnapshot, TaskEvent
from common.metrics import GmCounters
from common.model import N_CONSTRAINTS, Resources


class LmView:
    """What one GM believes about one LM's cluster."""

    __slots__ = (
        "_eligible",
        "avail",
        "capacity",
        "capacity_kinds",
        "capacity_total",
        "constraint_vectors",
        "epoch",
        "free",
        "freed",
        "home",
        "lm",
        "n",
        "node_classes",
        "node_masks",
        "node_version",
        "partitions",
        "pending",
        "shape",
        "usage",
        "version",
    )

    def __init__(self, layout: ClusterLayout) -> None:
        self.lm: LmId = layout.lm
        n = self.n = len(layout.capacity)
        self.capacity: list[Resources] = list(layout.capacity)
        shape = self.shape = _shape(layout)
        self.capacity_total: tuple[int, ...] = shape.capacity_total
        """The cluster's capacity in each resource (fixed with the layout)."""
        self.capacity_kinds: frozenset[Resources] = shape.capacity_kinds
        """The distinct node capacities of the cluster."""
        self.node_classes: frozenset[tuple[int, Resources]] = shape.classes
        """The distinct (constraint mask, capacity) of its nodes."""
        self.node_masks: list[int] = list(layout.constraints)
        self.home: list[GmId] = list(layout.home)
        self.constraint_vectors: Sequence[bitarray] = shape.constraint_vectors
        self.partitions: Mapping[GmId, bitarray] = shape.partitions
        widths = {len(c) for c in self.capacity_kinds}
        self.free: list[Sequence[int]] = (
            [(0,) * widths.pop()] * n
            if len(widths) == 1
            else [(0,) * len(c) for c in self.capacity]
        )
        """Each node's free resources in this view: a reported value as it came (shared
        with the message, so never changed in place: ``_own`` copies before a write)."""
        self.pending: list[list[int] | None] = [None] * n
        self.node_version: list[int] = [-1] * n
        self.avail = bitarray(n, endian="little")
        self.avail.setall(0)
        self.version = -1
        self.epoch = -1
        """The LM incarnation this view follows (a restarted LM counts versions anew)."""
        self.usage: dict[UserId, Resources] = {}
        self.freed: set[int] = set(shape.nodes)
        """Nodes whose free resources grew since the GM last looked (its waiting tasks
        that could fit there are woken); a new view counts every node as freed."""
        self._eligible: dict[tuple[int, GmId, bool], bitarray] = {}

    # ------------------------------------------------------------ matching
    def eligible(self, mask: int, gm: GmId, internal: bool) -> bitarray:
        """Nodes meeting every constraint in ``mask``, in ``gm``'s partition or outside it."""
        key = (mask, gm, internal)
        v = self._eligible.get(key)
        if v is None:
            v = bitarray(self.n, endian="little")
            v.setall(1)
            for c in range(N_CONSTRAINTS):
                if mask >> c & 1:
                    v &= self.constraint_vectors[c]
            part = self.partitions.get(gm)
            if part is None:
                if internal:
                    v.setall(0)
            elif internal:
                v &= part
            else:
                v &= ~part
            self._eligible[key] = v
        return v

    def first_fit(self, eligible: bitarray, demand: Resources) -> int:
        """The first eligible node whose free resources cover ``demand``, or -1."""
        cand = eligible & self.avail
        free = self.free
        for i in cand.search(1):
            f = free[i]
            for r, d in enumerate(demand):
                if f[r] < d:
                    break
            else:
                return i
        return -1

    def feasible(self, mask: int, demand: Resources) -> bool:
        """Some node of this LM could ever run the task (constraints and capacity)."""
        v = bitarray(self.n, endian="little")
        v.setall(1)
        for c in range(N_CONSTRAINTS):
            if mask >> c & 1:
                v &= self.constraint_vectors[c]
        cap = self.capacity
        return any(all(c >= d for c, d in zip(cap[i], demand, strict=True)) for i in v.search(1))

    # ------------------------------------------------------------- updates
    # ``avail[i]``: node i has some of every resource free, all(x > 0 for x in free[i])
    # (written ``not f or min(f) > 0``: the same, and cheaper on the hot paths; of a
    # reported value, never negative, ``0 not in f``: the same again)
    def set_node(self, i: int, reported: Resources, node_version: int) -> bool:
        """Take a reported value if it is newer than what the view holds (``_take`` of
        one node, written out: every task event carries its node's state)."""
        if node_version <= self.node_version[i]:
            return False
        self.node_version[i] = node_version
        free = self.free
        old = free[i]
        pend = self.pending[i]
        new: Sequence[int]
        if pend is None:
            if reported == old:  # the value held: nothing freed, ``avail`` as it was
                free[i] = reported
                return True
            new = free[i] = reported  # kept as reported (never changed in place: ``_own``)
            self.avail[i] = 0 not in reported
        else:
            new = free[i] = [x - p for x, p in zip(reported, pend, strict=True)]
            self.avail[i] = not new or min(new) > 0
        if len(new) != len(old):
            raise ValueError(f"node {i}: {len(new)} resources, the view has {len(old)}")
        for x, y in zip(new, old):  # noqa: B905  (lengths checked: a keyword is slow here)
            if x > y:
                self.freed.add(i)
                break
        return True

    def _take(
        self, nodes: Sequence[int], reported: Sequence[Resources], versions: Sequence[int]
    ) -> bool:
        """Take each reported value newer than the view's; whether any was.  (The hot
        path of a GM: every GM applies every change of every LM, and most nodes of a
        heartbeat are known already; hence one loop, with nothing looked up twice.)"""
        have, pending, free, avail = self.node_version, self.pending, self.free, self.avail
        freed = self.freed
        changed = False
        for i, f, v in zip(nodes, reported, versions, strict=True):
            if v <= have[i]:
                continue
            changed = True
            have[i] = v
            old = free[i]
            pend = pending[i]
            new: Sequence[int]
            if pend is None:
                if f == old:  # the value held: nothing freed, ``avail`` as it was
                    free[i] = f
                    continue
                new = free[i] = f  # kept as reported (never changed in place: ``_own``)
                avail[i] = 0 not in f  # (reported values are never negative: ``Resources``)
            else:
                new = free[i] = [x - p for x, p in zip(f, pend, strict=True)]
                avail[i] = not new or min(new) > 0
            if len(new) != len(old):
                raise ValueError(f"node {i}: {len(new)} resources, the view has {len(old)}")
            for x, y in zip(new, old):  # noqa: B905  (lengths checked: a keyword is slow here)
                if x > y:
                    freed.add(i)
                    break
        return changed

    def apply(self, delta: StateDelta) -> tuple[bool, bool]:
        """Apply a delta; returns (something changed, a gap was detected).

        A gap means the delta starts after the version the view is complete up to:
        its nodes are still applied (per-node versions keep that safe), but the view
        stays incomplete until a full snapshot arrives.
        """
        newer = delta.version >= self.version
        changed = self._take(delta.nodes, delta.free, delta.node_versions)
        gap = delta.base_version > self.version
        if newer:
            if not gap:
                self.version = delta.version
            if self.usage != delta.usage:
                changed = True
                self.usage = dict(delta.usage)
        return changed, gap

    def reserve(self, i: int, demand: Resources) -> None:
        """This GM asked for ``demand`` on node ``i``: pending until the answer."""
        pend = self.pending[i]
        if pend is None:
            pend = self.pending[i] = [0] * len(demand)
        free = self.free  # (``_own``, inline)
        f = free[i] = list(free[i])
        for r, d in enumerate(demand):
            pend[r] += d
            f[r] -= d
        self.avail[i] = not f or min(f) > 0

    def _own(self, i: int) -> list[int]:
        """Node ``i``'s free resources copied into a list of this view's own, to change
        (what it held may be a reported value, shared with the message and other views)."""
        f = self.free[i] = list(self.free[i])
        return f

    def release(self, i: int, demand: Resources) -> None:
        """The answer came (or never will): ``demand`` on node ``i`` is no longer pending."""
        pend = self.pending[i]
        if pend is None:
            return
        free = self.free  # (``_own``, inline)
        f = free[i] = list(free[i])
        for r, d in enumerate(demand):
            pend[r] -= d
            f[r] += d
        if not any(pend):
            self.pending[i] = None
        self.freed.add(i)
        self.avail[i] = not f or min(f) > 0


class _Shape:
    """What a cluster layout determines for every view of it: immutable, shared."""

    __slots__ = ("capacity_kinds", "capacity_total", "classes", "constraint_vectors", "nodes",
                 "partitions")  # fmt: skip

    def __init__(self, layout: ClusterLayout) -> None:
        n = len(layout.capacity)
        self.capacity_total = tuple(map(sum, zip(*layout.capacity, strict=True)))
        self.capacity_kinds = frozenset(layout.capacity)
        every = (1 << N_CONSTRAINTS) - 1
        self.classes = frozenset(
            (m & every, c) for m, c in zip(layout.constraints, layout.capacity, strict=True)
        )
        self.constraint_vectors = tuple(
            map(frozenbitarray, _constraint_vectors(layout.constraints, n))
        )
        self.partitions: Mapping[GmId, bitarray] = MappingProxyType(
            {g: frozenbitarray(v) for g, v in _partitions(layout.home).items()}
        )
        self.nodes = frozenset(range(n))


_SHAPES: dict[tuple[tuple[Resources, ...], tuple[int, ...], tuple[GmId, ...]], _Shape] = {}
"""Each cluster layout's shape (``_Shape``), made once however many views of it there
are (every GM holds a view of every LM: in a simulation they share it; a view made
again from a snapshot of the same LM finds it here)."""
SHAPES_KEPT = 1024
"""How many layouts ``_SHAPES`` keeps (the oldest made goes first)."""


def _shape(layout: ClusterLayout) -> _Shape:
    """``layout``'s shape, shared by its views."""
    key = (tuple(layout.capacity), tuple(layout.constraints), tuple(layout.home))
    shape = _SHAPES.get(key)
    if shape is None:
        if len(_SHAPES) >= SHAPES_KEPT:
            del _SHAPES[next(iter(_SHAPES))]
        shape = _SHAPES[key] = _Shape(layout)
    return shape


def _constraint_vectors(masks: Sequence[int], n: int) -> list[bitarray]:
    """Per machine constraint, the nodes that meet it (bit i: node i), from the nodes'
    constraint masks (one pass over the nodes with any constraint)."""
    vectors = [bitarray(n, endian="little") for _ in range(N_CONSTRAINTS)]
    for v in vectors:
        v.setall(0)
    every = (1 << N_CONSTRAINTS) - 1
    for i, m in enumerate(masks):
        m &= every
        while m:
            low = m & -m
            vectors[low.bit_length() - 1][i] = 1
            m ^= low
    return vectors


def _partitions(home: Sequence[GmId]) -> dict[GmId, bitarray]:
    """Per GM with a node here (in the order they first appear), its partition's nodes."""
    n = len(home)
    parts: dict[GmId, bitarray] = {}
    for i, g in enumerate(home):
        v = parts.get(g)
        if v is None:
            v = parts[g] = bitarray(n, endian="little")
            v.setall(0)
        v[i] = 1
    return parts


class Views:
    """A GM's views of every LM of the federation, and what they add up to."""

    def __init__(self, gm: GmId, lms: list[LmId], counters: GmCounters) -> None:
        self.gm = gm
        self.lms = lms
        self.counters = counters
        self.by_lm: dict[LmId, LmView] = {}
        self.capacity: list[int] = []
        """The federation's capacity in each resource (from the views' layouts)."""
        self.node_caps: frozenset[Resources] = frozenset()
        """The distinct node capacities of the federation."""
        self.node_classes: frozenset[tuple[int, Resources]] = frozenset()
        """The distinct (constraint mask, capacity) of the federation's nodes."""
        self._wanted: set[LmId] = set()
        """LMs asked for a snapshot that has not come yet."""
        self._freed_sets: list[set[int]] | None = None
        """Every view's ``freed`` (made again when a snapshot replaces a view)."""
        self._restart_counted: dict[LmId, int] = {}
        """The newest epoch of each LM counted in ``lm_restarts_seen``: an incarnation is
        counted once, however many of its updates come before its snapshot."""

    def clear_freed(self) -> None:
        """Forget the nodes freed in every view (no waiting task is woken by them)."""
        sets = self._freed_sets
        if sets is None:
            sets = self._freed_sets = [v.freed for v in self.by_lm.values()]
        for freed in filter(None, sets):  # (the empty ones skipped without a call)
            freed.clear()

    def version_of(self, lm: LmId) -> int:
        """The version of ``lm``'s state this GM's view holds (-1: none)."""
        v = self.by_lm.get(lm)
        return -1 if v is None else v.version

    def want_snapshot(self, lm: LmId) -> list[SnapshotRequest]:
        """A request for ``lm``'s snapshot, unless one is awaited (or it is no LM here)."""
        if lm in self._wanted or lm not in self.lms:
            return []
        self._wanted.add(lm)
        return [SnapshotRequest(gm=self.gm, lm=lm)]

    def apply(self, delta: StateDelta) -> tuple[bool, list[SnapshotRequest]]:
        """An LM's update: whether it changed the view, and a snapshot to ask for (an
        LM without a view yet, a new incarnation, a gap in the versions)."""
        view = self.by_lm.get(delta.lm)
        if view is None:
            return False, self.want_snapshot(delta.lm)
        if delta.epoch != view.epoch:
            if delta.epoch < view.epoch:  # from an incarnation that has been replaced
                self.counters.stale_updates += 1
                return False, []
            if self._restart_counted.get(delta.lm, view.epoch) < delta.epoch:
                self._restart_counted[delta.lm] = delta.epoch  # the LM restarted
                self.counters.lm_restarts_seen += 1
            return False, self.want_snapshot(delta.lm)  # its versions began anew
        changed, gap = view.apply(delta)
        self.counters.updates_applied += 1
        if gap:
            self.counters.gaps += 1
            return changed, self.want_snapshot(delta.lm)
        return changed, []

    def take_snapshot(self, snap: StateSnapshot) -> bool | None:
        """An LM's snapshot becomes its view (this GM's reservations kept), and the
        federation's capacity is added up again.  None: not taken (no LM of this
        federation, or an older incarnation); True: a newer incarnation than the view
        it replaces (the LM restarted, or its standby took over)."""
        lm = snap.layout.lm
        if lm not in self.lms:
            return None
        old = self.by_lm.get(lm)
        if old is not None and snap.state.epoch < old.epoch:
            self.counters.stale_updates += 1
            return None
        if old is not None and snap.state.epoch == old.epoch and _shape(snap.layout) is old.shape:
            # the same incarnation: per-node versions order the snapshot and the view (a
            # snapshot is a delta from nothing: ``apply`` takes only what is newer)
            old.apply(snap.state)
            self._wanted.discard(lm)
            return False
        view = LmView(snap.layout)
        view.epoch = snap.state.epoch
        if old is not None:  # keep this GM's in-flight reservations
            for i, pend in enumerate(old.pending):
                if pend is not None and i < view.n:
                    view.pending[i] = list(pend)
        view.apply(snap.state)
        self.by_lm[lm] = view
        self._freed_sets = None
        totals = [v.capacity_total for v in self.by_lm.values() if v.n]
        self.capacity = [sum(col) for col in zip(*totals, strict=True)]
        self.node_caps = frozenset().union(*(v.capacity_kinds for v in self.by_lm.values()))
        self.node_classes = frozenset().union(*(v.node_classes for v in self.by_lm.values()))
        self._wanted.discard(lm)
        return old is not None and snap.state.epoch > old.epoch

    def node_event(self, ev: TaskEvent, fresh: bool) -> bool | None:
        """A task event carries its node's state: taken if the event is from the LM's
        current incarnation (``fresh``) and newer.  True: the node changed; None: the
        event is not from an LM of this federation as it is (stale)."""
        view = self.by_lm.get(ev.lm)
        if view is None:
            # before this (restarted) GM's first snapshot of that LM: the node's state
            # comes with the snapshot, the task's end must not be lost meanwhile
            return False if ev.lm in self.lms else None
        if not 0 <= ev.node < view.n or len(ev.node_free) != len(self.capacity):
            return None
        return fresh and view.set_node(ev.node, ev.node_free, ev.node_version)
