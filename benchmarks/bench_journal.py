"""What the LMs' and pools' journals cost: `bench_live.py` with journals on and off,
alternating in one sitting (the machine is shared: compare the ratio, not the figures).

    python benchmarks/bench_journal.py --out results/bench_journal --rounds 2

Each round runs every arm once, in turn: ``off`` (``--set journal=false``), ``on`` (the
default: a record per message into the page cache, ``fdatasync`` every second) and, with
``--arms off,on,sync0``, ``sync0`` (an ``fdatasync`` before every answer).  Each run is
``bench_live.py --rates RATE --seconds S --no-ramp-stop`` (its 50%-load step, then one
fixed rate), written to ``OUT/<arm>-<round>.json``; ``OUT/bench_journal.json`` holds each
arm's CPU ms per task by role at that rate (the median over rounds), allocation p50/p99
at 50% load and at the rate, and each arm's ratio to ``off``.  Needs RabbitMQ on
127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ARMS = {"off": ["--set", "journal=false"], "on": [], "sync0": ["--set", "journal_sync_s=0"]}


def _run(arm: str, k: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    path = out / f"{arm}-{k}.json"
    cmd = [
        sys.executable, str(HERE / "bench_live.py"), "--rates", str(args.rate),
        "--seconds", str(args.seconds), "--no-ramp-stop", "--out", str(path),
        "--base-port", str(args.base_port), *ARMS[arm],
    ]  # fmt: skip
    print(
        f"bench_journal: round {k + 1}/{args.rounds}, journals {arm}", file=sys.stderr, flush=True
    )
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _figures(run: dict[str, Any]) -> dict[str, Any]:
    at_rate = run["ramp"][0]
    return {
        "cpu_ms_per_task": at_rate["cpu_ms_per_task"],
        "throughput_tasks_per_s": at_rate["throughput_tasks_per_s"],
        "p50_ms": 1e3 * at_rate["allocation_s"]["p50"],
        "p99_ms": 1e3 * at_rate["allocation_s"]["p99"],
        "load50_p50_ms": 1e3 * run["load50"]["allocation_s"]["p50"],
        "load50_p99_ms": 1e3 * run["load50"]["allocation_s"]["p99"],
    }


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    roles = sorted({r for row in rows for r in row["cpu_ms_per_task"]})
    out: dict[str, Any] = {
        "cpu_ms_per_task": {
            r: round(statistics.median(row["cpu_ms_per_task"].get(r, 0.0) for row in rows), 3)
            for r in roles
        }
    }
    for k in ("throughput_tasks_per_s", "p50_ms", "p99_ms", "load50_p50_ms", "load50_p99_ms"):
        out[k] = round(statistics.median(row[k] for row in rows), 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench_journal", help="directory for the results")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each arm, alternating")
    ap.add_argument("--rate", type=int, default=1000, help="tasks/s of the fixed-rate step")
    ap.add_argument("--seconds", type=float, default=8.0, help="submission time per step")
    ap.add_argument("--arms", default="off,on", help="of off, on, sync0 (comma-separated)")
    ap.add_argument("--base-port", type=int, default=18800)
    args = ap.parse_args()
    arms = args.arms.split(",")
    if not arms or any(a not in ARMS for a in arms) or args.rounds < 1:
        ap.error(f"--arms: a comma-separated list of {', '.join(ARMS)}; --rounds >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for k in range(args.rounds):
        for arm in arms if k % 2 == 0 else reversed(arms):
            runs[arm].append(_figures(_run(arm, k, args, out)))
    medians = {a: _median(rows) for a, rows in runs.items()}
    arm_figures = {a: {"median": medians[a], "runs": rows} for a, rows in runs.items()}
    result: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds, "rounds": args.rounds,
                              "wall_s": round(time.time() - t0, 1), "arms": arm_figures}  # fmt: skip
    if "off" in runs:
        base = medians["off"]["cpu_ms_per_task"]["total"]
        result["cpu_total_ratio_to_off"] = {
            a: round(m["cpu_ms_per_task"]["total"] / max(base, 1e-9), 3) for a, m in medians.items()
        }
    (out / "bench_journal.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "arms"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
