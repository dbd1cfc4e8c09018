"""The published traces' files, read a row at a time: gzip or plain CSV (told apart by
the gzip magic bytes, not the name), several files one after another, each row with
where it came from so an error names the file and line.  Nothing is held but the row.
"""

from __future__ import annotations

import csv
import gzip
import math
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from common.errors import ConfigError

GZIP_MAGIC = b"\x1f\x8b"


def _open_text(path: Path) -> IO[str]:
    """``path`` as text; a byte order mark (an export from Windows tools) is dropped,
    not read as part of the first field (``\ufeffM1`` is no DAG name: its job's
    dependencies were silently lost)."""
    with path.open("rb") as f:
        gz = f.read(2) == GZIP_MAGIC
    if gz:
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def csv_rows(paths: Sequence[str | Path]) -> Iterator[tuple[str, list[str]]]:
    """``(where, fields)`` for every row of every file in order; ``where`` is
    ``file:line``.  Blank rows are skipped.  A file that cannot be opened or read
    (not UTF-8, a gzip stream cut short or corrupt) is a ``ConfigError`` naming it."""
    for _, rows in csv_files(paths):
        yield from rows


def csv_files(
    paths: Sequence[str | Path],
) -> Iterator[tuple[Path, Iterator[tuple[str, list[str]]]]]:
    """Each file and its rows as ``csv_rows`` gives them (a file's header is its first
    row, whatever blank lines come before it)."""
    if not paths:
        raise ConfigError("no trace file given", reason="missing_trace")
    for name in paths:
        path = Path(name)
        yield path, _file_rows(path)


def _file_rows(path: Path) -> Iterator[tuple[str, list[str]]]:
    line = 0
    try:
        with _open_text(path) as f:
            for line, row in enumerate(csv.reader(f), 1):
                if row:
                    yield f"{path}:{line}", row
    # zlib.error: a corrupt deflate block (a flipped bit) is neither OSError nor EOFError
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error) as exc:
        raise ConfigError(
            f"cannot read trace {path} (after line {line}): {exc}",
            reason="trace_unreadable",
        ) from None


def integer(text: str, what: str, where: str) -> int:
    """A whole number field, or a ``ConfigError`` naming it and where."""
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{where}: {what} {text!r} is not a whole number", reason="bad_trace"
        ) from None


def number(text: str, what: str, where: str, *, empty: float | None = None) -> float:
    """A finite number field (``empty`` when blank, if given), or a ``ConfigError``."""
    if not text and empty is not None:
        return empty
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        raise ConfigError(f"{where}: {what} {text!r} is not a finite number", reason="bad_trace")
    return x


def columns(row: Sequence[str], least: int, table: str, where: str) -> None:
    """``ConfigError`` unless ``row`` has at least ``least`` fields (the table's)."""
    if len(row) < least:
        raise ConfigError(
            f"{where}: {len(row)} field(s), a {table} row has {least}", reason="bad_trace"
        )
