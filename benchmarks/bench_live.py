"""Live federation benchmark: 3 GMs, 3 LMs, 120 nodes on this machine.

Measures allocation time (p50/p99/max) and the floor round trip in the same run,
at 50% of the federation's capacity and at increasing fixed rates until the
federation no longer keeps up; reports the highest sustained tasks/s.

    python benchmarks/bench_live.py --out results/bench_live.json

Needs RabbitMQ on 127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig
from megha_cli.federation import start_federation, stop_federation
from megha_cli.secure import purge
from request_generator.bench import BenchOptions, run_bench

NODES = 120


def _step(cfg: FederationConfig, home: Path, out: Path, label: str, **kw: Any) -> dict[str, Any]:
    opts = BenchOptions(out=str(out / label), progress=False, floor_samples=300, **kw)
    t = time.time()
    s = asyncio.run(run_bench(cfg, opts, home))
    offered = s["offered_tasks_per_s"]
    row = {
        "label": label,
        "offered_tasks_per_s": round(offered, 1),
        "throughput_tasks_per_s": round(s["throughput_tasks_per_s"], 1),
        "tasks": s["tasks"],
        "lost_tasks": s["lost_tasks"],
        "failed_tasks": s["tasks_failed"],
        "allocation_s": s["allocation_time_s"],
        "components_s": s["components_s"],
        "floor_rtt_s": s["floor_rtt_s"],
        "floor": s["floor"],
        "counters": s["counters"],
        "wall_s": round(time.time() - t, 1),
    }
    print(
        f"{label:>14}: offered {offered:7.1f}/s  got {row['throughput_tasks_per_s']:7.1f}/s  "
        f"p50 {s['allocation_time_s']['p50'] * 1e3:8.2f} ms  p99 "
        f"{s['allocation_time_s']['p99'] * 1e3:8.2f} ms  max "
        f"{s['allocation_time_s']['max'] * 1e3:8.2f} ms  floor {s['floor_rtt_s'] * 1e3:.3f} ms",
        flush=True,
    )
    return row


def sustained(row: dict[str, Any]) -> bool:
    """Kept up: every task placed, throughput within 10% of the offered rate, p99 < 1 s."""
    return bool(
        row["lost_tasks"] == 0
        and row["throughput_tasks_per_s"] >= 0.9 * row["offered_tasks_per_s"]
        and row["allocation_s"]["p99"] < 1.0
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench_live.json")
    ap.add_argument("--base-port", type=int, default=18800)
    ap.add_argument(
        "--queue-type", default=FederationConfig.queue_type, choices=["quorum", "classic"]
    )
    ap.add_argument("--seconds", type=float, default=8.0, help="submission time per step")
    ap.add_argument(
        "--rates", default="250,500,750,1000,1500,2000", help="tasks/s steps for the ramp"
    )
    args = ap.parse_args()
    out = Path(args.out)
    cfg = replace(
        FederationConfig(),
        name=f"bench-live-{os.getpid()}",
        gms=3,
        lms=3,
        nodes_per_lm=NODES // 3,
        base_port=args.base_port,
        queue_type=args.queue_type,
    ).validate()
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))  # pids, config, service logs
    load1 = os.getloadavg()
    start_federation(cfg, home)
    rows: list[dict[str, Any]] = []
    try:
        # 50% load: 120 one-slot nodes, 0.5 s tasks -> capacity 240 tasks/s; offer 120/s.
        per_job = 4
        mean = 0.5
        rate = 0.5 * NODES / mean
        rows.append(
            _step(
                cfg, home, out.parent / "bench_live", "load50",
                jobs=int(rate * args.seconds / per_job), tasks_per_job=per_job,
                mean_duration=mean, job_rate=rate / per_job,
            )
        )  # fmt: skip
        # Ramp: short tasks (20 ms, capacity 6,000/s) so the scheduler is the limit.
        per_job = 10
        for r in (float(x) for x in args.rates.split(",")):
            row = _step(
                cfg, home, out.parent / "bench_live", f"rate{int(r)}",
                jobs=int(r * args.seconds / per_job), tasks_per_job=per_job,
                mean_duration=0.02, rate=r / per_job, timeout_s=120.0,
            )  # fmt: skip
            rows.append(row)
            if not sustained(row):
                break
    finally:
        stop_federation(home)
        purge(cfg, home)
    ok = [r for r in rows[1:] if sustained(r)]
    result = {
        "federation": {
            "gms": 3,
            "lms": 3,
            "nodes": NODES,
            "profile": cfg.profile,
            "queue_type": cfg.queue_type,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": load1,
            "loadavg_after": os.getloadavg(),
        },
        "load50": rows[0],
        "ramp": rows[1:],
        "sustained_tasks_per_s": max((r["throughput_tasks_per_s"] for r in ok), default=0.0),
        "at_highest_sustained": ok[-1] if ok else None,
        "targets": {"p50_s_at_50pct": 0.005, "p99_s_at_50pct": 0.05, "tasks_per_s": 1000},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}; sustained {result['sustained_tasks_per_s']} tasks/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
