"""Memory of a streamed Google 2011 replay against the trace's length (issue 35 item 6).

Writes gzipped ``task_events`` files in the published columns (jobs of 10 tasks arriving
every 0.05 s, each task running an exponential 5 s on average, the events in time
order), of N and 4N jobs; then, each in its own process, reads each file through the
reader alone (``workload.google``) and replays it under ``megha simulate --trace-format
google2011`` (Megha alone, 4,000 workers: about 25% load), and records the peak RSS and wall time of each.  The reader
should stay flat as the trace grows 4x; the simulation holds what its own book keeps.

    python benchmarks/bench_trace_read.py --jobs 20000 --out results/bench_trace_read.json
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

READ = """
import resource, sys, time
from workload.google import read_google
t0 = time.perf_counter()
replay = read_google("google2011", [sys.argv[1]])
jobs = sum(1 for _ in replay)
print(jobs, replay.stats.tasks, time.perf_counter() - t0,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_trace(path: Path, jobs: int, seed: int = 1) -> int:
    """A ``task_events`` file of ``jobs`` jobs; the number of rows."""
    rng = random.Random(seed)
    ends: list[tuple[int, int, int]] = []
    rows = 0
    with gzip.open(path, "wt") as f:

        def flush(until: int) -> None:
            nonlocal rows
            while ends and ends[0][0] <= until:
                t, job, index = heapq.heappop(ends)
                f.write(f"{t},,{job},{index},7,4,u,1,0,0.01,0.01,0,0\n")
                rows += 1

        for j in range(jobs):
            t = j * 50_000
            flush(t)
            for i in range(10):
                f.write(
                    f"{t},,{j},{i},,0,u,1,0,0.01,0.01,0,0\n{t},,{j},{i},7,1,u,1,0,0.01,0.01,0,0\n"
                )
                heapq.heappush(ends, (t + int(rng.expovariate(1 / 5.0) * 1e6), j, i))
                rows += 2
        flush(2**62)
    return rows


def _measure(cmd: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KB) of ``cmd`` and its output."""
    t0 = time.perf_counter()
    p = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *cmd], check=True, capture_output=True, text=True
    )
    rss = int(p.stderr.strip().splitlines()[-1])
    return time.perf_counter() - t0, rss, p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs of the smaller trace")
    ap.add_argument("--out", default="results/bench_trace_read.json")
    args = ap.parse_args(argv)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as tmp:
        for jobs in (args.jobs, 4 * args.jobs):
            path = Path(tmp) / f"task_events-{jobs}.csv.gz"
            rows = write_trace(path, jobs)
            wall, rss, said = _measure([sys.executable, "-c", READ, str(path)])
            n_jobs, tasks = (int(x) for x in said.split()[:2])
            sim_cmd = [sys.executable, "-m", "megha_cli.main", "simulate", "--trace-format",
                       "google2011", str(path), "--workers", "4000", "--gms", "2", "--lms", "4",
                       "--baselines", "", "--quiet", "--out", str(Path(tmp) / f"sim{jobs}")]  # fmt: skip
            sim_wall, sim_rss, _ = _measure(sim_cmd)
            runs.append(
                {"jobs": n_jobs, "tasks": tasks, "rows": rows,
                 "reader": {"wall_s": round(wall, 2), "peak_rss_mb": round(rss / 1024, 1),
                            "rows_per_s": round(rows / wall)},
                 "simulate_megha": {"wall_s": round(sim_wall, 2),
                                    "peak_rss_mb": round(sim_rss / 1024, 1)}}
            )  # fmt: skip
            print(json.dumps(runs[-1]), file=sys.stderr)
    small, big = runs
    result = {
        "runs": runs,
        "reader_rss_ratio_4x_trace": round(
            big["reader"]["peak_rss_mb"] / small["reader"]["peak_rss_mb"], 2
        ),
        "simulate_rss_ratio_4x_trace": round(
            big["simulate_megha"]["peak_rss_mb"] / small["simulate_megha"]["peak_rss_mb"], 2
        ),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
