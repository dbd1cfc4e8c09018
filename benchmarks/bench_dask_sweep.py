"""A 16-point ``megha simulate`` sweep, serial against a Dask ``LocalCluster`` (issue 35
item 5), alternating in one sitting so both see the same machine.

Each round runs the same sweep (2 worker counts x 4 GM counts x 2 LM counts of a
synthetic workload, Megha alone) once with ``--cluster serial`` and once with
``--cluster local`` (one worker process per core), each as its own ``megha simulate``
process, and records the wall seconds of each (the LocalCluster's start and stop
included) and CPU seconds (the process and every process it started); checks that
both wrote the same figures per point; writes JSON to --out.  On a machine shared with
other work, the wall ratio says what the cores left to the sweep gave it; the CPU
ratio what distributing cost.

    python benchmarks/bench_dask_sweep.py --rounds 2 --out results/bench_dask_sweep.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _sweep(cluster: str, jobs: int, out: Path) -> tuple[float, float]:
    """Wall seconds of one ``megha simulate`` sweep process, and the CPU seconds of it
    and its processes (the LocalCluster's scheduler and workers are reaped in it)."""
    cmd = [sys.executable, "-m", "megha_cli.main", "simulate", *SWEEP]
    cmd += ["--jobs-count", str(jobs), "--cluster", cluster, "--out", str(out)]
    t0, cpu0 = time.perf_counter(), _children_cpu()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _children_cpu() - cpu0


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
    cpus: dict[str, list[float]] = {"serial": [], "local": []}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-dask-sweep-") as tmp:
        for r in range(args.rounds):
            for cluster in ("serial", "local"):
                out = Path(tmp) / f"{cluster}{r}"
                wall, cpu = _sweep(cluster, args.jobs, out)
                walls[cluster].append(round(wall, 2))
                cpus[cluster].append(round(cpu, 2))
                loads.append(os.getloadavg()[0])
                print(f"round {r + 1} {cluster}: {wall:.1f} s wall, {cpu:.1f} s CPU",
                      file=sys.stderr)  # fmt: skip
            same = _figures(Path(tmp) / f"serial{r}") == _figures(Path(tmp) / f"local{r}")
            if not same:
                raise SystemExit("serial and LocalCluster sweeps gave different figures")
    serial, local = statistics.median(walls["serial"]), statistics.median(walls["local"])
    result = {
        "points": 16,
        "jobs_per_point": args.jobs,
        "tasks_per_point": args.jobs * 10,
        "cores": os.cpu_count(),
        "load_average_1m_after_each": loads,
        "wall_s": walls,
        "cpu_s": cpus,
        "median_wall_s": {"serial": round(serial, 2), "local": round(local, 2)},
        "speedup": round(serial / local, 2),
        "cpu_ratio_local_over_serial": round(
            statistics.median(cpus["local"]) / statistics.median(cpus["serial"]), 2
        ),
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
