"""What a queue policy's plans cost as a job grows, simulated on 20 nodes, 1 GM, 2 LMs:
one job of N tasks, either one stage of N identical tasks ([4, 1], 1 s; ``--shape
uniform``) or a stage of N tasks of three sizes and durations of 1-10 s (seeded) with a
stage of N/4 tasks after it (``--shape varied``: every task end re-packs the DAG).

Per policy and N: wall time of the run, plans made, time per plan, wall time per task,
and the growth of the wall time from one N to the next as a ratio (1.0 per doubling of
N per task is linear; quadratic doubles it).  Writes the figures to a JSON file.

    python benchmarks/bench_replan.py --sizes 1000,2000,5000 --out results/bench_replan.json
    python benchmarks/bench_replan.py --shape varied --sizes 2000,4000,8000 --policies carbyne
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from common.cluster import ClusterSpec
from common.dag import DagJob, make_job
from common.ids import GmId, LmId, UserId
from common.model import NodeSpec, UserConfig
from global_master.policy.jobs import JobQueues
from simulator.dag_run import DAG_NODE_CAPACITY, run_policies
from simulator.megha_sim import SimConfig

_PLANS = {"count": 0, "seconds": 0.0}


def _timed_replan() -> None:
    """Count the plans and the time they take (``JobQueues._replan``, wrapped)."""
    inner = JobQueues._replan

    def replan(self: JobQueues) -> None:
        t0 = time.perf_counter()
        inner(self)
        _PLANS["count"] += 1
        _PLANS["seconds"] += time.perf_counter() - t0

    JobQueues._replan = replan  # type: ignore[method-assign]


def _job(n: int, shape: str) -> DagJob:
    if shape == "uniform":
        return make_job("j1", "alice", 0.0, [(0, [((4, 1), 1.0)] * n, [])])
    rng = random.Random(n)
    sizes = [(4, 1), (8, 2), (16, 4)]
    first = [(rng.choice(sizes), round(rng.uniform(1.0, 10.0), 2)) for _ in range(n)]
    after = [((8, 2), round(rng.uniform(1.0, 4.0), 2)) for _ in range(max(1, n // 4))]
    return make_job("j1", "alice", 0.0, [(0, first, []), (1, after, [0])])


def run_one(policy: str, n: int, nodes: int, lms: int, shape: str = "uniform") -> dict[str, Any]:
    """Wall time and plans of one job of ``n`` tasks under ``policy``."""
    gm = GmId("gm0")
    users = [UserConfig(UserId("alice"), gm, 1.0)]
    job = _job(n, shape)
    per = nodes // lms
    cap = DAG_NODE_CAPACITY[2]
    clusters = [
        ClusterSpec(LmId(f"lm{k}"), [NodeSpec(cap) for _ in range(per)], [gm] * per)
        for k in range(lms)
    ]
    _PLANS.update(count=0, seconds=0.0)
    t0 = time.perf_counter()
    run = run_policies([job], clusters, [gm], users, [policy], SimConfig(), 1)
    wall = time.perf_counter() - t0
    plans = int(_PLANS["count"])
    return {
        "tasks": n,
        "wall_s": wall,
        "makespan_s": run["schedulers"][policy]["makespan_s"],
        "plans": plans,
        "plan_ms": 1000 * _PLANS["seconds"] / max(1, plans),
        "wall_per_task_ms": 1000 * wall / n,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="500,1000,2000,5000")
    ap.add_argument("--policies", default="carbyne,drf")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--lms", type=int, default=2)
    ap.add_argument(
        "--shape",
        choices=("uniform", "varied"),
        default="uniform",
        help="the job: one stage of identical tasks, or two of varied tasks",
    )
    ap.add_argument("--out", default="results/bench_replan.json")
    args = ap.parse_args(argv)
    _timed_replan()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    out: dict[str, Any] = {"config": vars(args), "policies": {}}
    for p in [x for x in args.policies.split(",") if x]:
        rows = [run_one(p, n, args.nodes, args.lms, args.shape) for n in sizes]
        for prev, row in itertools.pairwise(rows):
            # wall-time growth over task growth: 1.0 is linear, N2/N1 is quadratic
            row["growth_over_linear"] = (row["wall_s"] / prev["wall_s"]) / (
                row["tasks"] / prev["tasks"]
            )
        out["policies"][p] = rows
        for row in rows:
            print(
                f"{p} N={row['tasks']}: {row['wall_s']:.2f} s wall, "
                f"{row['plans']} plans, {row['plan_ms']:.3f} ms/plan, "
                f"{row['wall_per_task_ms']:.3f} ms/task, "
                f"growth/linear {row.get('growth_over_linear', float('nan')):.2f}",
                file=sys.stderr,
            )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
