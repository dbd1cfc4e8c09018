"""The published traces' files, read a row at a time: gzip or plain CSV (told apart by
the gzip magic bytes, not the name), or a tar archive of them (Alibaba's
``batch_task.tar.gz``: each file in it read in turn), several files one after another,
each row with where it came from so an error names the file and line.  Nothing is held
but the row.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
import stat
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import IO, cast

from common.errors import ConfigError

GZIP_MAGIC = b"\x1f\x8b"

# zlib.error: a corrupt deflate block (a flipped bit) is neither OSError nor EOFError
READ_ERRORS = (OSError, EOFError, UnicodeDecodeError, csv.Error, zlib.error, tarfile.TarError)


def _text(f: IO[bytes]) -> IO[str]:
    """``f`` as text; a byte order mark (an export from Windows tools) is dropped, not
    read as part of the first field (``\ufeffM1`` is no DAG name: its job's
    dependencies were silently lost)."""
    return io.TextIOWrapper(f, encoding="utf-8-sig", newline="")


def _binary(path: Path, gz: bool) -> IO[bytes]:
    """``path``'s bytes, gunzipped if ``gz``."""
    return cast(IO[bytes], gzip.open(path, "rb")) if gz else path.open("rb")


def _is_tar(block: bytes) -> bool:
    """Whether ``block`` (a file's first 512 bytes) is a tar header (its checksum holds)."""
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def _texts(path: Path) -> Iterator[tuple[str, IO[str]]]:
    """``path``'s CSV texts and their names: the file itself, or each file of a tar
    archive (``name.tar.gz[member]``) in the archive's order."""
    with path.open("rb") as f:
        gz = f.read(2) == GZIP_MAGIC
    with _binary(path, gz) as f:
        head = f.read(512)
    if not _is_tar(head):
        with _text(_binary(path, gz)) as t:
            yield str(path), t
        return
    with tarfile.open(path, "r:gz" if gz else "r:") as tar:
        for member in tar:
            data = tar.extractfile(member) if member.isfile() else None
            if data is not None:
                with _text(data) as t:
                    yield f"{path}[{member.name}]", t


def rereadable(path: Path) -> None:
    """``ConfigError`` unless ``path`` is a file that can be read again from its start:
    a pipe (``<(zcat ...)``) lost its first buffer to the gzip test, and the next
    scheduler's pass of the trace found it empty."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc}", reason="trace_unreadable") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"cannot read trace {path}: not a regular file (a pipe or a directory?); each "
            "scheduler reads the trace from its start: give the file itself",
            reason="trace_unreadable",
        )


def csv_rows(paths: Sequence[str | Path]) -> Iterator[tuple[str, list[str]]]:
    """``(where, fields)`` for every row of every file in order; ``where`` is
    ``file:line``.  Blank rows are skipped.  A file that cannot be opened or read
    (not UTF-8, a gzip stream cut short or corrupt) is a ``ConfigError`` naming it."""
    for _, rows in csv_files(paths):
        yield from rows


def csv_files(paths: Sequence[str | Path]) -> Iterator[tuple[str, Iterator[tuple[str, list[str]]]]]:
    """Each file (each file of a tar archive) by name and its rows as ``csv_rows`` gives
    them (a file's header is its first row, whatever blank lines come before it); a file
    without a row is not given.  Every path is checked before the first row is read."""
    if not paths:
        raise ConfigError("no trace file given", reason="missing_trace")
    files = [Path(name) for name in paths]
    for path in files:
        rereadable(path)
    for path in files:
        for name, rows in itertools.groupby(_file_rows(path), key=itemgetter(0)):
            yield name, ((where, row) for _, where, row in rows)


def _file_rows(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    """``(file, where, fields)`` of each row of ``path`` (of each file, for a tar)."""
    name, line = str(path), 0
    try:
        for name, text in _texts(path):
            line = 0
            for line, row in enumerate(csv.reader(text), 1):
                if row:
                    yield name, f"{name}:{line}", row
    except READ_ERRORS as exc:
        raise ConfigError(
            f"cannot read trace {name} (after line {line}): {exc}", reason="trace_unreadable"
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
