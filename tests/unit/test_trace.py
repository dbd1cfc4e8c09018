"""The trace reader: the format of ``../shared/traces``, strictly, each error naming its line."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from common.errors import ConfigError
from workload.traces import TraceJob, read_trace


def _trace(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.tr"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0.0 2 1 1.0 1.0 7.0 extra", "declares 2 task(s) but lists 4 duration(s)"),
        ("0.0 2 1.0 1.0", "declares 2 task(s) but lists 1 duration(s)"),
        ("0.0 0 0.0", "task count is 0, a job needs at least one task"),
        ("0.0 -1 0.0", "task count is -1, a job needs at least one task"),
        ("0.0 2.0 1 1.0 1.0", "task count '2.0' is not a whole number"),
        ("0.0 2 1 -1.0 1.0", "duration 1 '-1.0' is not a finite non-negative number"),
        ("0.0 2 1 1.0 nan", "duration 2 'nan' is not a finite non-negative number"),
        ("0.0 2 1 inf 1.0", "duration 1 'inf' is not a finite non-negative number"),
        ("nan 1 1 1.0", "arrival 'nan' is not a finite non-negative number"),
        ("inf 1 1 1.0", "arrival 'inf' is not a finite non-negative number"),
        ("-1 1 1 1.0", "arrival '-1' is not a finite non-negative number"),
        ("0.0 1 x 1.0", "mean duration 'x' is not a number"),
        ("0.0 1 nan 1.0", "mean duration 'nan' is not a finite non-negative number"),
        ("0,2,1,1.0,1.0", "1 field(s), expected 'arrival n mean d_1 .. d_n' separated by blanks"),
    ],
)
def test_a_malformed_line_is_refused_saying_what_is_wrong(
    tmp_path: Path, line: str, message: str
) -> None:
    p = _trace(tmp_path, f"0.0 1 1 1.0\n{line}\n")
    with pytest.raises(ConfigError) as err:
        read_trace(p)
    assert err.value.reason == "bad_trace"
    assert str(err.value) == f"{p}:2: {message}"


def test_limit_jobs_keeps_the_first_jobs_and_must_be_positive(tmp_path: Path) -> None:
    p = _trace(tmp_path, "0 1 1 1\n1 1 1 1\n2 1 1 1\n")
    assert len(read_trace(p, limit_jobs=2)) == 2
    for bad in (0, -1):
        with pytest.raises(ConfigError):
            read_trace(p, limit_jobs=bad)


def test_a_well_formed_trace_is_read_sorted_by_arrival(tmp_path: Path) -> None:
    """Blanks, tabs, CRLF, comments and a byte-order mark are not part of the data."""
    p = tmp_path / "t.tr"
    text = "# a comment\n10.0 2 1.5 1.0 2.0\n\n0.0\t1\t3\t3.0  # trailing comment\r\n"
    p.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_trace(p) == [TraceJob(0.0, (3.0,)), TraceJob(10.0, (1.0, 2.0))]


def test_a_file_that_is_not_text_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "bin.tr"
    p.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ConfigError) as err:
        read_trace(p)
    assert err.value.reason == "trace_unreadable"


def _long_trace(tmp_path: Path, jobs: int, tail: bytes = b"") -> Path:
    p = tmp_path / "long.tr"
    line = "0.5 4 1.0 1.0 1.0 1.0 1.0\n"
    p.write_bytes(line.encode() * jobs + tail)
    return p


def test_limit_jobs_reads_no_further_than_the_jobs_it_keeps(tmp_path: Path) -> None:
    """A long trace cut to its first jobs is not held whole in memory, and what lies
    past them (a truncated or corrupt copy's tail) is not read."""
    p = _long_trace(tmp_path, 200_000, tail=b"\xff\xfe garbage\n")  # 5.4 MB, then junk
    tracemalloc.start()
    try:
        jobs = read_trace(p, limit_jobs=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert jobs == [TraceJob(0.5, (1.0,) * 4)] * 3
    assert peak < 1_000_000  # the file is 5.4 MB: a few read buffers, not the text


def test_a_trace_that_stops_being_text_names_where(tmp_path: Path) -> None:
    p = _long_trace(tmp_path, 20_000, tail=b"# a comment\n\xff\xfe garbage\n")
    with pytest.raises(ConfigError) as err:
        read_trace(p)
    assert err.value.reason == "trace_unreadable"
    assert str(err.value) == f"{p}:20002: not UTF-8 text (invalid start byte)"
