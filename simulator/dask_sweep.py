"""A sweep's points as tasks on a Dask distributed cluster (``megha simulate --cluster``).

``local`` starts a ``LocalCluster`` of one single-threaded worker process per core of
this machine (a simulation is pure Python: threads would share one interpreter lock);
``tcp://HOST:PORT`` joins a running ``dask scheduler`` whose ``dask worker`` s can
import this package (the same code) and read the workload's files at the same paths.
A point runs into a scratch directory on its worker; its files come back with its
summary and are written here under ``--out``, so workers need no shared filesystem.
A point that fails (an exception, or its worker lost) is reported and submitted once
more; a ``ConfigError`` (bad input) ends the sweep at once, as a serial sweep does.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
from distributed import Client, Future, LocalCluster, as_completed

from common.errors import ConfigError
from simulator.sweep import ATTEMPTS, Point, PointRun, SweepWatch, error_text, point_name

Shipped = tuple[dict[str, Any], dict[str, bytes]]
"""A point's summary and its files (path under the point's directory -> bytes)."""


def run_shipped(point: PointRun, args: argparse.Namespace, p: Point) -> Shipped:
    """On a worker: one point into a scratch directory; its summary and files."""
    with tempfile.TemporaryDirectory(prefix="megha-point-") as tmp:
        root = Path(tmp)
        summary = point(args, *p, root)
        files = {
            f.relative_to(root).as_posix(): f.read_bytes()
            for f in sorted(root.rglob("*"))
            if f.is_file()
        }
    return summary, files


def _unpack(shipped: Shipped, target: Path) -> dict[str, Any]:
    """Writes a point's files under ``target``; its summary."""
    summary, files = shipped
    for name, data in files.items():
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return summary


def open_client(where: str) -> Client:
    """A client of ``where``: ``local`` (a new ``LocalCluster`` of this machine's cores,
    closed with the client) or a scheduler's address."""
    if where == "local":
        # the workers' statistical profiler samples a running point's stack every 10 ms
        with dask.config.set({"distributed.worker.profile.enabled": False}):
            cluster = LocalCluster(
                n_workers=os.cpu_count() or 1,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
        client = Client(cluster, set_as_default=False)
        client._megha_cluster = cluster  # type: ignore[attr-defined]
        return client
    try:
        return Client(where, timeout="20s", set_as_default=False)
    except OSError as exc:
        raise ConfigError(
            f"--cluster {where}: no Dask scheduler answers there ({exc})",
            reason="no_cluster",
        ) from None


def close_client(client: Client) -> None:
    cluster = getattr(client, "_megha_cluster", None)
    client.close()
    if cluster is not None:
        cluster.close()


def _key(p: Point, attempt: int) -> str:
    """A task's name on the cluster: the point and attempt, unique to this sweep (a
    scheduler shared by several sweeps must never take one's point for another's)."""
    return f"megha-{point_name(p)}-{attempt}-{uuid.uuid4().hex[:12]}"


def distributed_points(
    args: argparse.Namespace,
    point: PointRun,
    points: list[Point],
    out: Path,
    where: str,
    watch: SweepWatch,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each point a task on the cluster at ``where``; ``(index, summary)`` as each is
    done, its files written under ``out``; a failure reported and submitted once more."""
    quiet = copy.copy(args)
    quiet.quiet = True  # a worker has no terminal: the sweep's own progress is shown here
    client = open_client(where)
    try:
        index: dict[Future[Shipped], tuple[int, int]] = {}
        for k, p in enumerate(points):
            f = client.submit(run_shipped, point, quiet, p, key=_key(p, 1), pure=False)
            index[f] = (k, 1)
        pending = as_completed(list(index), loop=client.loop)
        for f in pending:
            k, attempt = index.pop(f)
            p = points[k]
            try:
                shipped = f.result()
            except ConfigError:
                raise
            except Exception as exc:
                again = attempt < ATTEMPTS
                watch.failed(point_name(p), error_text(exc), again)
                if again:
                    g = client.submit(
                        run_shipped, point, quiet, p, key=_key(p, attempt + 1), pure=False
                    )
                    index[g] = (k, attempt + 1)
                    pending.add(g)
                else:
                    watch.failures.append(
                        {"point": point_name(p), "error": error_text(exc), "attempts": attempt}
                    )
                continue
            yield k, _unpack(shipped, out / point_name(p))
    finally:
        close_client(client)
