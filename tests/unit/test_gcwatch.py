"""The collector's passes are counted and timed per generation, and what existed at
start is frozen out of later collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from runtime.gcwatch import YOUNG, GcWatch


@pytest.fixture
def watch() -> Iterator[GcWatch]:
    w = GcWatch()
    w.start()
    try:
        yield w
    finally:
        w.stop()


def test_start_freezes_what_exists(watch: GcWatch) -> None:
    assert watch.frozen > 0
    assert gc.get_freeze_count() > 0  # (frozen objects may die since: it only shrinks)


def test_each_collection_is_counted_in_its_generation(watch: GcWatch) -> None:
    before = watch.page()["generations"]
    gc.collect(0)
    gc.collect(2)
    after = watch.page()["generations"]
    assert after[0]["collections"] >= before[0]["collections"] + 1
    assert after[2]["collections"] == before[2]["collections"] + 1
    assert after[2]["pause_max_s"] > 0
    assert after[2]["pause_total_s"] >= after[2]["pause_max_s"]


def test_stop_ends_the_count() -> None:
    w = GcWatch()
    w.start()
    w.stop()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert w.page()["generations"][2]["collections"] == 0


def test_a_service_collects_its_young_objects_less_often_and_gives_the_thresholds_back() -> None:
    before = gc.get_threshold()
    w = GcWatch()
    w.start()
    w.start()  # again: what the first start found is what stop gives back
    try:
        assert gc.get_threshold() == (YOUNG, *before[1:])
    finally:
        w.stop()
    assert gc.get_threshold() == before
