"""Sweeps on a Dask cluster of separate processes: a ``dask scheduler`` and two ``dask
worker`` s started by their own CLIs on 127.0.0.1, as on a cluster of machines."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from megha_cli.main import main
from simulator.sweep import PointsFailed, SweepWatch, run_points

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _dask(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("dask")), *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A scheduler and two single-threaded workers, each its own process."""
    from distributed import Client

    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [_dask("scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")]
    for _ in range(2):
        procs.append(
            _dask(
                "worker", address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1",
                "--no-dashboard",
            )
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with Client(address, timeout="5s", set_as_default=False) as c:
                    c.wait_for_workers(2, timeout=120)
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield address
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_a_sweep_runs_on_a_scheduler_and_two_worker_processes(
    scheduler: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    args = ["simulate", "--jobs-count", "6", "--tasks-per-job", "3", "--workers", "30,60"]
    args += ["--gms", "1,2", "--lms", "2", "--baselines", "sparrow", "--cluster", scheduler]
    assert main([*args, "--out", str(out)]) == 0
    for point in ("w30_g1_l2", "w30_g2_l2", "w60_g1_l2", "w60_g2_l2"):
        summary = json.loads((out / point / "summary.json").read_text())
        assert set(summary["schedulers"]) == {"megha", "sparrow"}
        assert summary["tasks"] == 18
        assert (out / point / "tasks-megha.csv").read_text().count("\n") == 19
        assert (out / point / "allocation_cdf.png").stat().st_size > 0
    sweep = json.loads((out / "sweep.json").read_text())
    assert sorted((r["scheduler"], r["workers"], r["gms"]) for r in sweep) == sorted(
        (s, w, g) for s in ("megha", "sparrow") for w in (30, 60) for g in (1, 2)
    )
    assert (out / "sweep.png").exists()
    assert "sweep: 4/4 points done" in capsys.readouterr().err
    # the same points serially give the same figures (the cluster changes where, not what)
    serial = tmp_path / "serial"
    assert main([*args[:-2], "--cluster", "serial", "--quiet", "--out", str(serial)]) == 0
    for point in ("w30_g1_l2", "w60_g2_l2"):
        a = json.loads((out / point / "summary.json").read_text())["schedulers"]
        b = json.loads((serial / point / "summary.json").read_text())["schedulers"]
        assert a == b


def flaky_point(
    args: argparse.Namespace, workers: int, gms: int, lms: int, out: Path
) -> dict[str, Any]:
    """A point that fails its first attempt (a marker file says it was tried), and
    every attempt when ``workers`` is 13."""
    marker = Path(args.markers) / f"w{workers}_g{gms}_l{lms}"
    attempts = int(marker.read_text()) + 1 if marker.exists() else 1
    marker.write_text(str(attempts))
    if workers == 13 or attempts == 1:
        raise RuntimeError(f"attempt {attempts} of w{workers} fails")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"attempts": attempts}))
    table = {"megha": {"wall_s": 0.0}}
    allocation = {"p50": 0.0, "p90": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0, "mean": 0.0}
    return {
        "workers": workers, "gms": gms, "lms": lms, "timing": table,
        "schedulers": {"megha": {"allocation_time_s": allocation}},
    }  # fmt: skip


def test_a_failed_point_is_reported_and_retried_once(scheduler: str, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    seen: list[tuple[str, bool]] = []
    watch = SweepWatch(failed=lambda point, error, again: seen.append((point, again)))
    args = argparse.Namespace(
        workers=[10, 20], gms=[1], lms=[1], out=str(tmp_path / "ok"), cluster=scheduler,
        quiet=True, markers=str(markers),
    )  # fmt: skip
    summaries = run_points(args, flaky_point, lambda s: None, watch)
    assert [s["workers"] for s in summaries] == [10, 20]
    assert sorted(seen) == [("w10_g1_l1", True), ("w20_g1_l1", True)]
    assert json.loads((tmp_path / "ok" / "w10_g1_l1" / "summary.json").read_text()) == {
        "attempts": 2
    }
    assert len(json.loads((tmp_path / "ok" / "sweep.json").read_text())) == 2

    # a point failing twice is given up on; the other points' files are written
    seen.clear()
    args.workers, args.out = [13, 30], str(tmp_path / "bad")
    with pytest.raises(PointsFailed) as info:
        run_points(args, flaky_point, lambda s: None, watch)
    assert sorted(seen) == [("w13_g1_l1", False), ("w13_g1_l1", True), ("w30_g1_l1", True)]
    failures = json.loads((tmp_path / "bad" / "sweep-failures.json").read_text())
    assert [(f["point"], f["attempts"]) for f in failures] == [("w13_g1_l1", 2)]
    assert "attempt 2 of w13 fails" in failures[0]["error"]
    assert info.value.failures == failures
    assert (tmp_path / "bad" / "w30_g1_l1" / "summary.json").exists()
    assert [r["workers"] for r in json.loads((tmp_path / "bad" / "sweep.json").read_text())] == [30]
