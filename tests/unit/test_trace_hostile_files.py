"""The published traces' files as users hand them over: corrupt gzip, pipes, tar
archives.  Each is read or refused with a ``ConfigError`` naming the file, never a
traceback nor a silently shortened trace."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from common.errors import ConfigError
from workload.google import read_google
from workload.traces import TraceJob

S = 1_000_000


def task_events(jobs: int) -> bytes:
    """``jobs`` one-task jobs of the 2011 ``task_events`` table, each running 5 s."""
    rows = []
    for j in range(jobs):
        for dt, kind in ((0, 0), (0, 1), (5, 4)):
            rows.append(
                f"{(j + dt) * S},,{j},0,{'' if kind == 0 else 7},{kind},u=,2,0,0.03,0.01,0,0"
            )
    rows.sort(key=lambda r: int(r.split(",")[0]))
    return "".join(r + "\n" for r in rows).encode()


def test_a_corrupt_gzip_body_is_an_error_naming_the_file(tmp_path: Path) -> None:
    """A flipped bit in the deflate stream raised ``zlib.error``, neither OSError nor
    EOFError: the run crashed, was retried as a lost point, and exited 1."""
    data = bytearray(gzip.compress(task_events(200), mtime=0))
    data[20] ^= 0xFF
    path = tmp_path / "part-00000-of-00500.csv.gz"
    path.write_bytes(data)
    with pytest.raises(zlib.error):
        gzip.decompress(bytes(data))  # what the reader met
    with pytest.raises(ConfigError, match=r"cannot read trace .*part-00000-of-00500") as e:
        list(read_google("google2011", [path]))
    assert e.value.reason == "trace_unreadable"


def test_a_gzip_file_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(task_events(3)))
    assert list(read_google("google2011", [path])) == [TraceJob(float(j), (5.0,)) for j in range(3)]
