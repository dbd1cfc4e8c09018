"""Trace formats: the jobs of a trace file, as written.

* ``read_trace``: the format of ``../shared/traces`` (Sparrow's and Megha's simulators):
  one job a line, ``arrival n mean d_1 .. d_n``.

A reader returns ``TraceJob`` s (an arrival and the tasks' durations);
``workload.synthetic.jobs_from_trace`` turns them into jobs of tasks (demands from a
profile, placement constraints), the same for every driver: the simulator and
``megha bench``.  Another format is another reader here returning ``TraceJob`` s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TraceJob:
    arrival: float
    durations: tuple[float, ...]


def read_trace(path: str | Path, *, limit_jobs: int | None = None) -> list[TraceJob]:
    """Parse a trace file: one job a line, ``arrival n mean d_1 .. d_n`` separated by
    blanks (exactly ``n`` durations; ``#`` starts a comment, blank lines are
    skipped).  Numbers are finite decimals as C's ``strtod`` reads them (ASCII digits,
    an optional exponent: not Python's ``1_000`` nor other scripts' digits),
    durations and the arrival non-negative, ``n`` a positive integer; ``mean`` is
    checked but not used (the durations are).  A file without a job is an error.  The first
    ``limit_jobs`` jobs of the file are kept, and the file is read no further (it is
    read a line at a time: a long trace is never held whole).  A malformed line is a
    ``ConfigError`` naming it and what is wrong (reason ``bad_trace``)."""
    if limit_jobs is not None and limit_jobs < 1:
        raise ConfigError(f"limit_jobs must be at least 1, got {limit_jobs}", reason="bad_trace")
    jobs: list[TraceJob] = []
    p = Path(path)
    lineno = 0
    try:
        with p.open("rb") as f:
            for k, raw in enumerate(f):
                try:
                    text = raw.decode("utf-8-sig" if k == 0 else "utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigError(
                        f"{p}:{lineno + 1}: not UTF-8 text ({exc.reason})",
                        reason="trace_unreadable",
                    ) from None
                # the lines of str.splitlines: CRLF, CR, and \f, \x1c.. break lines too
                for line in text.splitlines():
                    lineno += 1
                    fields = line.split("#", 1)[0].split()
                    if not fields:
                        continue
                    try:
                        jobs.append(_trace_line(fields))
                    except ValueError as exc:
                        raise ConfigError(f"{p}:{lineno}: {exc}", reason="bad_trace") from None
                    if limit_jobs is not None and len(jobs) >= limit_jobs:
                        return sorted(jobs, key=lambda j: j.arrival)
    except OSError as exc:
        raise ConfigError(f"cannot read trace {p}: {exc}", reason="trace_unreadable") from exc
    if not jobs:
        raise ConfigError(
            f"{p}: no jobs ({lineno} line(s), each blank or a comment)", reason="bad_trace"
        )
    jobs.sort(key=lambda j: j.arrival)
    return jobs


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?").fullmatch
_WHOLE = re.compile(r"[+-]?[0-9]+").fullmatch
_NOT_FINITE = {"inf", "infinity", "nan"}


def _number(text: str, what: str) -> float:
    """A finite, non-negative number, or a ``ValueError`` saying which field is wrong.
    ``float`` alone also took ``1_000`` (1000) and digits of any script (``\u0661``)."""
    if _DECIMAL(text) is None:
        if text.lstrip("+-").lower() in _NOT_FINITE:
            raise ValueError(f"{what} {text!r} is not a finite non-negative number")
        raise ValueError(f"{what} {text!r} is not a number")
    x = float(text)
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{what} {text!r} is not a finite non-negative number")
    return x


def _trace_line(fields: Sequence[str]) -> TraceJob:
    """One trace line's job (``fields``: the line split on blanks)."""
    if len(fields) < 3:
        raise ValueError(
            f"{len(fields)} field(s), expected 'arrival n mean d_1 .. d_n' separated by blanks"
        )
    arrival = _number(fields[0], "arrival")
    try:
        if _WHOLE(fields[1]) is None:
            raise ValueError
        n = int(fields[1])
    except ValueError:
        raise ValueError(f"task count {fields[1]!r} is not a whole number") from None
    if n < 1:
        raise ValueError(f"task count is {n}, a job needs at least one task")
    _number(fields[2], "mean duration")
    given = len(fields) - 3
    if given != n:
        raise ValueError(f"declares {n} task(s) but lists {given} duration(s)")
    durations = tuple(_number(x, f"duration {i}") for i, x in enumerate(fields[3:], 1))
    return TraceJob(arrival, durations)
