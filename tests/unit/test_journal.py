"""runtime.journal: records survive the process, torn tails are dropped, rewrites are atomic."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.journal import Journal, JournalBusy, frame


def reopen(d: Path) -> tuple[Journal, list[bytes]]:
    j = Journal(d, "lm0")
    return j, j.open()


def test_records_come_back_in_order_after_the_process_goes(tmp_path: Path) -> None:
    j, got = reopen(tmp_path)
    assert got == []
    j.append([b"a", b"bb"])
    j.append([b"ccc"])
    j.close()
    j, got = reopen(tmp_path)
    assert got == [b"a", b"bb", b"ccc"]
    j.close()


def test_a_torn_tail_is_dropped_and_the_log_goes_on_after_it(tmp_path: Path) -> None:
    j, _ = reopen(tmp_path)
    j.append([b"one", b"two"])
    j.close()
    log = tmp_path / "lm0.0.log"
    whole = log.read_bytes()
    log.write_bytes(whole + frame(b"three")[:-2])  # the write of "three" cut short
    j, got = reopen(tmp_path)
    assert got == [b"one", b"two"]
    assert j.torn_bytes == len(frame(b"three")) - 2
    j.append([b"four"])
    j.close()
    _, got = reopen(tmp_path)
    assert got == [b"one", b"two", b"four"]


def test_a_corrupt_frame_ends_the_log(tmp_path: Path) -> None:
    j, _ = reopen(tmp_path)
    j.append([b"keep", b"flip", b"after"])
    j.close()
    log = tmp_path / "lm0.0.log"
    data = bytearray(log.read_bytes())
    at = len(frame(b"keep")) + 8  # first payload byte of "flip"
    data[at] ^= 0xFF
    log.write_bytes(bytes(data))
    _, got = reopen(tmp_path)
    assert got == [b"keep"]


def test_rewrite_replaces_everything_with_a_new_generation(tmp_path: Path) -> None:
    j, _ = reopen(tmp_path)
    j.append([b"x", b"y", b"z"])
    j.rewrite([b"state"])
    j.append([b"later"])
    j.close()
    assert not (tmp_path / "lm0.0.log").exists()
    j, got = reopen(tmp_path)
    assert got == [b"state", b"later"]
    assert j.generation == 1
    j.close()


def test_a_crash_between_the_snapshot_and_the_new_log_keeps_the_new_generation(
    tmp_path: Path,
) -> None:
    j, _ = reopen(tmp_path)
    j.append([b"old"])
    j.rewrite([b"new"])
    j.close()
    # as if the process died after the rename, before the old log was removed and the
    # new one made: the old generation's log must not be replayed over the snapshot
    (tmp_path / "lm0.1.log").unlink()
    (tmp_path / "lm0.0.log").write_bytes(frame(b"old"))
    _, got = reopen(tmp_path)
    assert got == [b"new"]
    assert not (tmp_path / "lm0.0.log").exists()


def test_a_half_written_snapshot_is_ignored(tmp_path: Path) -> None:
    j, _ = reopen(tmp_path)
    j.append([b"a"])
    j.close()
    (tmp_path / "lm0.snap.tmp").write_bytes(b"garbage")
    _, got = reopen(tmp_path)
    assert got == [b"a"]


def test_a_second_process_cannot_hold_the_same_journal(tmp_path: Path) -> None:
    j, _ = reopen(tmp_path)
    with pytest.raises(JournalBusy):
        Journal(tmp_path, "lm0").open()
    j.close()
    other, _ = reopen(tmp_path)
    other.close()


def test_sync_clears_dirty_and_files_are_private(tmp_path: Path) -> None:
    j, _ = reopen(tmp_path)
    assert not j.dirty
    j.append([b"a"])
    assert j.dirty
    j.sync()
    assert not j.dirty
    j.rewrite([b"b"])
    for p in tmp_path.iterdir():
        assert p.stat().st_mode & 0o077 == 0, p
    j.close()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.binary(max_size=40), max_size=4)),
        st.tuples(st.just("rewrite"), st.lists(st.binary(max_size=40), max_size=4)),
        st.tuples(st.just("reopen"), st.just([])),
        st.tuples(st.just("tear"), st.integers(min_value=1, max_value=7)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_the_journal_holds_what_a_list_would(
    tmp_path_factory: pytest.TempPathFactory, seq: list[tuple[str, object]]
) -> None:
    d = tmp_path_factory.mktemp("j")
    j, model = reopen(d)
    for op, arg in seq:
        if op == "append":
            j.append(arg)
            model.extend(arg)
        elif op == "rewrite":
            j.rewrite(arg)
            model = list(arg)
        elif op == "reopen":
            j.close()
            j, got = reopen(d)
            assert got == model
        else:  # a record cut short by a crash: written partly, then the process died
            j.close()
            log = d / f"lm0.{j.generation}.log"
            with open(log, "ab") as f:
                f.write(frame(b"lost")[:arg])
            j, got = reopen(d)
            assert got == model
    j.close()
    _, got = reopen(d)
    assert got == model
    assert all(os.path.basename(p).startswith("lm0") for p in os.listdir(d))
