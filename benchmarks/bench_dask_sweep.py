"""A 16-point ``megha simulate`` sweep, serial against a Dask ``LocalCluster`` (issue 35
item 5), alternating in one sitting so both see the same machine.

Each round runs the same sweep (2 worker counts x 4 GM counts x 2 LM counts of a
synthetic workload, Megha alone) once with ``--cluster serial`` and once with
``--cluster local`` (one worker process per core), each as its own ``megha simulate``
process, and records the wall seconds of each (the LocalCluster's start and stop
included); checks that both wrote the same figures per point; writes JSON to --out.

    python benchmarks/bench_dask_sweep.py --rounds 2 --out results/bench_dask_sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SWEEP = [
    "--workers", "400,800", "--gms", "1,2,3,4", "--lms", "2,4", "--baselines", "",
    "--workload", "synthetic", "--rate", "6", "--tasks-per-job", "10",
    "--mean-duration", "5", "--quiet",
]  # fmt: skip


def _sweep(cluster: str, jobs: int, out: Path) -> float:
    """Wall seconds of one ``megha simulate`` sweep process."""
    cmd = [sys.executable, "-m", "megha_cli.main", "simulate", *SWEEP]
    cmd += ["--jobs-count", str(jobs), "--cluster", cluster, "--out", str(out)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _figures(out: Path) -> dict[str, Any]:
    """Each point's schedulers' figures (what must not depend on where it ran)."""
    return {
        p.name: json.loads((p / "summary.json").read_text())["schedulers"]
        for p in sorted(out.iterdir())
        if p.is_dir()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="serial/local pairs, alternating")
    ap.add_argument("--jobs", type=int, default=1500, help="synthetic jobs per point")
    ap.add_argument("--out", default="results/bench_dask_sweep.json")
    args = ap.parse_args(argv)
    walls: dict[str, list[float]] = {"serial": [], "local": []}
    with tempfile.TemporaryDirectory(prefix="bench-dask-sweep-") as tmp:
        for r in range(args.rounds):
            for cluster in ("serial", "local"):
                out = Path(tmp) / f"{cluster}{r}"
                walls[cluster].append(_sweep(cluster, args.jobs, out))
                print(f"round {r + 1} {cluster}: {walls[cluster][-1]:.1f} s", file=sys.stderr)
            same = _figures(Path(tmp) / f"serial{r}") == _figures(Path(tmp) / f"local{r}")
            if not same:
                raise SystemExit("serial and LocalCluster sweeps gave different figures")
    serial, local = statistics.median(walls["serial"]), statistics.median(walls["local"])
    result = {
        "points": 16,
        "jobs_per_point": args.jobs,
        "tasks_per_point": args.jobs * 10,
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "wall_s": walls,
        "median_wall_s": {"serial": round(serial, 2), "local": round(local, 2)},
        "speedup": round(serial / local, 2),
        "same_figures": True,
        "command": "megha simulate " + " ".join(SWEEP) + f" --jobs-count {args.jobs}",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(
        f"16 points: serial {serial:.1f} s, LocalCluster ({os.cpu_count()} workers) "
        f"{local:.1f} s: {serial / local:.2f}x"
    )
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
