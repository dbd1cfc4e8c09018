"""A GM's view of one LM: constraint bit-vectors, partitions, first fit, versions,
and the pending-reservation invariant ``free == reported - pending``."""

from __future__ import annotations

import pytest

from common.ids import GmId, LmId, NodeIndex, UserId
from common.messages import ClusterLayout, StateDelta
from global_master.view import LmView

GM0, GM1 = GmId("gm0"), GmId("gm1")


def make_view(
    capacity: list[tuple[int, int]], masks: list[int], home: list[str] | None = None
) -> LmView:
    homes = tuple(GmId(h) for h in (home or ["gm0"] * len(capacity)))
    view = LmView(
        ClusterLayout(
            lm=LmId("lm0"), capacity=tuple(capacity), constraints=tuple(masks), home=homes
        )
    )
    view.apply(full(capacity, version=len(capacity)))
    return view


def full(free: list[tuple[int, int]], version: int) -> StateDelta:
    return StateDelta(
        lm=LmId("lm0"),
        version=version,
        base_version=-1,
        nodes=tuple(NodeIndex(i) for i in range(len(free))),
        free=tuple(free),
        node_versions=tuple(range(1, len(free) + 1)),
    )


def delta(base: int, version: int, changes: dict[int, tuple[tuple[int, int], int]]) -> StateDelta:
    return StateDelta(
        lm=LmId("lm0"),
        version=version,
        base_version=base,
        nodes=tuple(NodeIndex(i) for i in changes),
        free=tuple(f for f, _ in changes.values()),
        node_versions=tuple(v for _, v in changes.values()),
        usage={UserId("u"): (1, 1)},
    )


def test_eligible_is_the_and_of_constraint_vectors_within_the_partition() -> None:
    view = make_view([(4, 4)] * 4, [0b011, 0b001, 0b111, 0b010], ["gm0", "gm0", "gm1", "gm0"])
    assert view.eligible(0b011, GM0, True).to01() == "1000"
    assert view.eligible(0b011, GM0, False).to01() == "0010"
    assert view.eligible(0, GM0, True).to01() == "1101"
    assert view.eligible(0b001, GM1, True).to01() == "0010"
    # a GM with no partition on this LM: nothing internal, everything external
    assert not view.eligible(0, GmId("gm9"), True).any()
    assert view.eligible(0, GmId("gm9"), False).all()


def test_first_fit_checks_every_resource_type() -> None:
    view = make_view([(8, 1), (1, 8), (8, 8), (8, 8)], [0, 0, 0, 0])
    every = view.eligible(0, GM0, True)
    assert view.first_fit(every, (2, 2)) == 2
    assert view.first_fit(every, (8, 1)) == 0
    assert view.first_fit(every, (9, 1)) == -1


def test_full_nodes_are_skipped_by_the_avail_vector() -> None:
    view = make_view([(4, 4), (4, 4)], [0, 0])
    view.apply(delta(2, 3, {0: ((0, 4), 3)}))
    assert view.avail.to01() == "01"
    assert view.first_fit(view.eligible(0, GM0, True), (0, 1)) == 1


def test_feasible_looks_at_capacity_not_free_resources() -> None:
    view = make_view([(4, 4), (2, 8)], [0b01, 0b11])
    view.apply(delta(2, 4, {0: ((0, 0), 3), 1: ((0, 0), 4)}))
    assert view.feasible(0b01, (4, 4))
    assert view.feasible(0b10, (2, 8))
    assert not view.feasible(0b10, (4, 4))
    assert not view.feasible(0b100, (1, 1))


def test_reservations_survive_updates_in_either_order() -> None:
    view = make_view([(4, 4)], [0])
    view.reserve(0, (3, 1))
    assert view.free == [[1, 3]]
    # the LM accepted: a heartbeat reports it before the response arrives
    view.apply(delta(1, 2, {0: ((1, 3), 2)}))
    assert view.free == [[-2, 2]]  # conservative until the response releases it
    assert not view.avail[0]
    view.release(0, (3, 1))
    assert view.free == [[1, 3]]
    assert view.pending == [None]
    # the response's own delta, arriving after the heartbeat, changes nothing
    changed, gap = view.apply(delta(1, 2, {0: ((1, 3), 2)}))
    assert (changed, gap) == (False, False)
    assert view.free == [[1, 3]]


def test_per_node_versions_make_deltas_order_independent() -> None:
    d1 = delta(2, 3, {0: ((3, 3), 3)})
    d2 = delta(3, 4, {1: ((2, 2), 4)})
    d3 = delta(4, 5, {0: ((4, 4), 5)})
    a = make_view([(4, 4), (4, 4)], [0, 0])
    b = make_view([(4, 4), (4, 4)], [0, 0])
    for d in (d1, d2, d3):
        a.apply(d)
    for d in (d3, d1, d2):
        b.apply(d)
    assert a.free == b.free == [(4, 4), (2, 2)]  # the reported values, as they came
    assert a.node_version == b.node_version == [5, 4]
    assert a.version == 5


def test_a_gap_is_detected_and_the_version_waits_for_a_snapshot() -> None:
    view = make_view([(4, 4)], [0])
    changed, gap = view.apply(delta(5, 6, {0: ((1, 1), 6)}))
    assert changed
    assert gap
    assert view.free == [(1, 1)]  # the node is still taken: its version is newer
    assert view.version == 1
    changed, gap = view.apply(full([(1, 1)], version=6))
    assert not gap
    assert view.version == 6


def test_an_old_delta_never_takes_a_node_back() -> None:
    view = make_view([(4, 4)], [0])
    view.apply(delta(1, 3, {0: ((0, 0), 3)}))
    changed, _ = view.apply(delta(1, 2, {0: ((4, 4), 2)}))
    assert view.free == [(0, 0)]
    assert view.version == 3
    assert view.node_version == [3]
    assert not changed


def test_capacity_total_sums_every_node_and_kinds_are_distinct() -> None:
    view = make_view([(4, 2), (1, 8), (4, 2)], [0, 0, 0])
    assert view.capacity_total == (9, 12)
    assert view.capacity_kinds == {(4, 2), (1, 8)}


def test_partitions_and_constraint_vectors_follow_the_layout() -> None:
    layout = ClusterLayout(
        lm="lm0",
        capacity=((1,),) * 4,
        constraints=(0b01, 0b10, 0b11, 0),
        home=("g1", "g0", "g1", "g2"),
    )
    view = LmView(layout)
    assert list(view.partitions) == ["g1", "g0", "g2"]  # in the order they first appear
    assert [view.partitions[g].to01() for g in ("g0", "g1", "g2")] == ["0100", "1010", "0001"]
    assert view.constraint_vectors[0].to01() == "1010"
    assert view.constraint_vectors[1].to01() == "0110"
    assert all(v.to01() == "0000" for v in view.constraint_vectors[2:])


def test_views_of_one_layout_share_its_vectors_and_none_can_change_them() -> None:
    def layout(masks: tuple[int, ...]) -> ClusterLayout:
        return ClusterLayout(lm="lm0", capacity=((1,),) * 3, constraints=masks, home=("g0",) * 3)

    a, b = LmView(layout((1, 2, 3))), LmView(layout((1, 2, 3)))  # as two GMs' views
    other = LmView(layout((1, 2, 2)))
    assert a.constraint_vectors is b.constraint_vectors
    assert a.partitions is b.partitions
    assert other.constraint_vectors[0].to01() == "100"
    assert a.constraint_vectors[0].to01() == "101"
    with pytest.raises(TypeError):
        a.constraint_vectors[0][1] = 1
    with pytest.raises(TypeError):
        a.partitions["g0"][0] = 0  # type: ignore[index]
    assert a.eligible(0b1, GmId("g0"), True).to01() == "101"
    assert a.eligible(0b1, GmId("g0"), False).to01() == "000"


def test_a_reservation_never_changes_the_reported_value_other_views_hold() -> None:
    a, b = make_view([(4, 4)], [0]), make_view([(4, 4)], [0])
    reported = (2, 2)
    for v in (a, b):
        v.apply(delta(1, 2, {0: (reported, 2)}))
    a.reserve(0, (1, 1))
    assert reported == (2, 2)
    assert list(a.free[0]) == [1, 1]
    assert list(b.free[0]) == [2, 2]
    a.release(0, (1, 1))
    assert list(a.free[0]) == [2, 2]
    assert a.avail[0]
    assert b.avail[0]
