"""Carbyne against DRF, Tetris and SJF on a contended DAG workload, in simulation.

The same seeded DAG jobs (Poisson arrivals, Carbyne-shaped DAGs) run through the
real GM and LM cores under each queue policy.  Writes a JSON file with, per policy,
average / p95 JCT, makespan and Jain's index, and Carbyne's factors over each
baseline plus the fraction of jobs it slows down against DRF.

    python benchmarks/bench_carbyne.py --jobs 200 --out results/bench_carbyne.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from common.cluster import ClusterSpec
from common.ids import GmId, LmId, UserId
from common.model import NodeSpec, UserConfig
from request_generator.dag_workload import dag_stats, synthetic_dag_jobs
from simulator.dag_run import format_dag_table, run_policies
from simulator.megha_sim import SimConfig

NODE = {1: (100,), 2: (64_000, 16_384)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rate", type=float, default=0.12, help="job arrivals per second")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--lms", type=int, default=1)
    ap.add_argument("--users", type=int, default=4, help="users with equal shares, one GM")
    ap.add_argument("--resources", type=int, choices=(1, 2), default=2)
    ap.add_argument("--policies", default="drf,drf-wc,tetris,sjf,carbyne")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/bench_carbyne.json")
    args = ap.parse_args(argv)

    gm = GmId("gm0")
    users = [UserConfig(UserId(f"u{i}"), gm, 1.0 / args.users) for i in range(args.users)]
    node = NODE[args.resources]
    jobs = synthetic_dag_jobs(
        args.jobs, rate=args.rate, users=users, node_capacity=node, rng=random.Random(args.seed)
    )
    per = args.nodes // args.lms
    clusters = [
        ClusterSpec(LmId(f"lm{k}"), [NodeSpec(node) for _ in range(per)], [gm] * per)
        for k in range(args.lms)
    ]
    policies = [p for p in args.policies.split(",") if p]
    results: dict[str, Any] = {}
    for p in policies:
        t0 = time.perf_counter()
        results.update(
            run_policies(jobs, clusters, [gm], users, [p], SimConfig(), args.seed)["schedulers"]
        )
        print(f"{p}: {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)
    out: dict[str, Any] = {
        "config": vars(args),
        "dag": dag_stats(jobs),
        "schedulers": {
            p: {k: v for k, v in s.items() if k != "job_jct_s"} for p, s in results.items()
        },
    }
    if "carbyne" in results:
        c = results["carbyne"]
        factors = {}
        for p, s in results.items():
            if p == "carbyne":
                continue
            factors[p] = {
                "avg_jct": s["jct_s"]["mean"] / c["jct_s"]["mean"],
                "makespan": s["makespan_s"] / c["makespan_s"],
                "jain_delta": c["jain"]["mean"] - s["jain"]["mean"],
            }
        out["carbyne_factor_over"] = factors
        for base in ("drf", "drf-wc"):
            if base not in results:
                continue
            ref = results[base]["job_jct_s"]
            ratios = [c["job_jct_s"][j] / ref[j] for j in ref if j in c["job_jct_s"] and ref[j] > 0]
            slowed = [r for r in ratios if r > 1.0 + 1e-9]
            out[f"slowdown_vs_{base}"] = {
                "fraction_of_jobs_slowed": len(slowed) / len(ratios) if ratios else 0.0,
                "fraction_slowed_over_1_25x": sum(r > 1.25 for r in ratios) / max(1, len(ratios)),
                "max_slowdown_factor": max(ratios, default=1.0),
            }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True))
    print(format_dag_table(results))
    print(json.dumps({k: v for k, v in out.items() if k not in ("schedulers",)}, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
