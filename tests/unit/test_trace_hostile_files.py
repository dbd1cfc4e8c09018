"""The published traces' files as users hand them over: corrupt gzip, pipes, tar
archives.  Each is read or refused with a ``ConfigError`` naming the file, never a
traceback nor a silently shortened trace."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zlib
from pathlib import Path

import pytest

from common.errors import ConfigError
from megha_cli.main import main
from workload.alibaba import AlibabaReplay
from workload.google import read_google
from workload.tracefiles import csv_rows
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


def test_a_pipe_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    """``<(zcat part-*.csv.gz)`` lost its first buffer to the gzip test (a row cut in
    two: an error or a wrong first row), and each scheduler after the first read the
    pipe empty.  A FIFO is refused without being opened (no wait for a writer)."""
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"events: not a regular file") as e:
        list(read_google("google2011", [fifo]))
    assert e.value.reason == "trace_unreadable"
    with pytest.raises(ConfigError, match=r"not a regular file"):
        list(AlibabaReplay([tmp_path]))


def test_every_file_is_checked_before_the_first_row(tmp_path: Path) -> None:
    """A mistyped last part file stopped the replay only once every part before it had
    been simulated."""
    first = tmp_path / "part-00000-of-00500.csv"
    first.write_bytes(task_events(3))
    rows = csv_rows([first, tmp_path / "part-00001-of-0500.csv"])
    with pytest.raises(ConfigError, match=r"part-00001-of-0500.csv: .*No such file"):
        next(rows)


def tar_of(path: Path, members: dict[str, bytes], *, gz: bool) -> Path:
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_tar_archive_is_read_file_by_file(tmp_path: Path) -> None:
    """Alibaba ships ``batch_task.tar.gz``: given as it was downloaded, the tar header
    was read as the first row ("1 field(s)")."""
    rows = b"M1,2,j_1,1,Terminated,100,110,100,0.39\nR2_1,1,j_1,1,Terminated,110,115,100,0.39\n"
    rows += b"task_x,3,j_2,1,Terminated,50,60,100,0.39\n"
    plain = tmp_path / "batch_task.csv"
    plain.write_bytes(rows)
    want = list(AlibabaReplay([plain]))
    for gz in (True, False):
        tar = tar_of(
            tmp_path / f"batch_task.tar{'.gz' if gz else ''}", {"batch_task.csv": rows}, gz=gz
        )
        replay = AlibabaReplay([tar])
        assert list(replay) == want
        assert replay.stats.rows == 3
    bad = tar_of(tmp_path / "bad.tar.gz", {"a.csv": rows, "b.csv": b"M1,2,j_3\n"}, gz=True)
    with pytest.raises(ConfigError, match=r"bad.tar.gz\[b.csv\]:1: 3 field\(s\)"):
        list(AlibabaReplay([bad]))


def test_each_file_of_a_2019_tar_has_its_header(tmp_path: Path) -> None:
    head = b"time,type,collection_id,instance_index\n"
    shards = {
        "instance_events-000.csv": head + f"0,0,7,0\n{S},3,7,0\n".encode(),
        "instance_events-001.csv": head + f"{3 * S},6,7,0\n".encode(),
    }
    tar = tar_of(tmp_path / "export.tar.gz", shards, gz=True)
    assert list(read_google("google2019", [tar])) == [TraceJob(0.0, (2.0,))]


@pytest.mark.parametrize("source", [["--trace"], ["--trace-format", "google2011"]])
def test_simulate_refuses_a_pipe_before_the_first_scheduler_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: list[str]
) -> None:
    """``--trace <(cat YH1_sub.tr)`` ran Megha, then each baseline read the pipe empty:
    "no jobs (0 line(s))" after the whole first run."""
    fifo = tmp_path / "trace"
    os.mkfifo(fifo)
    small = ["--workers", "4", "--lms", "2", "--gms", "1", "--users", "u0:1@gm0"]
    out = tmp_path / "out"
    assert main(["simulate", "--quiet", *small, "--out", str(out), *source, str(fifo)]) == 2
    assert "trace: not a regular file" in capsys.readouterr().err
    assert not (out / "summary.json").exists()
