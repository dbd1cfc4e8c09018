"""A GM's records of the deliveries in hand are slots of one file per process
(``runtime.poison``): written in place while a delivery is handled, emptied after,
reused, and read back by the next process only while they hold a record."""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime.poison import SLOT, PoisonGuard, Verdict, _slot_records, delivery_key

A = delivery_key("fed.user.u0", b"job a")
B = delivery_key("fed.user.u0", b"job b")


def _slots(directory: Path) -> list[dict[str, object]]:
    return [r for p in directory.glob("slots-*") for r in _slot_records(p.read_bytes())]


def test_a_record_is_held_while_handled_and_its_slot_reused(tmp_path: Path) -> None:
    g = PoisonGuard(tmp_path, master="m")

    async def run() -> None:
        async with g.handling(A):
            async with g.handling(B):
                assert {r["key"] for r in _slots(tmp_path)} == {A, B}
            assert [r["key"] for r in _slots(tmp_path)] == [A]
        assert _slots(tmp_path) == []
        async with g.handling(B):  # a freed slot is written again: the file does not grow
            assert [r["key"] for r in _slots(tmp_path)] == [B]

    asyncio.run(run())
    (f,) = tmp_path.glob("slots-*")
    assert f.stat().st_size == 2 * SLOT
    assert _slots(tmp_path) == []
    # nothing was in hand at the end: the next process judges nothing
    assert PoisonGuard(tmp_path, master="m").verdict(A, redelivered=True) is Verdict.FRESH
    assert not list(tmp_path.glob("slots-*"))  # read, then removed


def test_an_unreadable_or_empty_slot_is_skipped() -> None:
    good = b'{"key": "k", "master": "m", "suspect": false}'.ljust(SLOT)
    assert _slot_records(b"\0" * SLOT + b"{not json".ljust(SLOT) + good) == [
        {"key": "k", "master": "m", "suspect": False}
    ]
