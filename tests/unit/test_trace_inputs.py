"""Trace lines Python's number parsers take but the trace format has no place for.

``float`` and ``int`` read ``1_000`` as 1000 and ``\u0661`` (ARABIC-INDIC DIGIT ONE)
as 1: a trace line ``0 1_0 ...`` became a job of ten tasks.  The traces' format is
the C simulators' (``strtod``, ``atoi``): ASCII digits only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import ConfigError
from workload.traces import TraceJob, _trace_line, read_trace


def _read(tmp_path: Path, text: str) -> list[TraceJob]:
    p = tmp_path / "t.tr"
    p.write_text(text, encoding="utf-8")
    return read_trace(p)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1_000 1 1 1", "arrival '1_000' is not a number"),
        ("0 1_0 1 1 1 1 1 1 1 1 1 1", "task count '1_0' is not a whole number"),
        ("0 \u0661 1 1", "task count '\u0661' is not a whole number"),
        ("0 1 1 \u0661\u0662", "duration 1 '\u0661\u0662' is not a number"),
        ("0 1 1_0 1", "mean duration '1_0' is not a number"),
        ("0 1 1 0x10", "duration 1 '0x10' is not a number"),
        ("0 1 1 Infinity", "duration 1 'Infinity' is not a finite non-negative number"),
        ("0 1 1 -nan", "duration 1 '-nan' is not a finite non-negative number"),
    ],
)
def test_numbers_are_ascii_decimals(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _read(tmp_path, f"0 1 1 1\n{line}\n")
    assert err.value.reason == "bad_trace"
    assert str(err.value).endswith(f":2: {message}")


@pytest.mark.parametrize("text", ["", "\n\n", "# header only\r\n   \r\n\t\n"])
def test_a_trace_without_a_job_is_an_error(tmp_path: Path, text: str) -> None:
    """It gave a summary of zero tasks with allocation times of 0 s, as if measured."""
    with pytest.raises(ConfigError, match="no jobs") as err:
        _read(tmp_path, text)
    assert err.value.reason == "bad_trace"


@pytest.mark.parametrize(
    ("line", "job"),
    [
        ("+1.5e1 +2 .5 1. 2E-1", TraceJob(15.0, (1.0, 0.2))),
        ("0 1 1 1e-400", TraceJob(0.0, (0.0,))),  # underflows to 0: a finite decimal
        ("1.7e9\t1\t1\t3", TraceJob(1.7e9, (3.0,))),
    ],
)
def test_the_decimals_strtod_reads_are_read(tmp_path: Path, line: str, job: TraceJob) -> None:
    assert _read(tmp_path, line + "\n") == [job]


durations = st.lists(
    st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=5,
)


@given(
    arrival=st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False),
    ds=durations,
)
def test_what_repr_writes_is_read_back_exactly(arrival: float, ds: list[float]) -> None:
    """Any finite float a generator writes with ``repr`` (``1e-05``, ``1.5e+20``) is read
    back as the same float: the stricter syntax refuses none of them."""
    line = [repr(arrival), str(len(ds)), repr(sum(ds) / len(ds)), *map(repr, ds)]
    assert _trace_line(line) == TraceJob(arrival, tuple(ds))
