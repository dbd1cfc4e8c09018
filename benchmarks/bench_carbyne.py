"""Carbyne against DRF, Tetris and SJF, offline and online: the paper's Figures 4 and 5.

The same seeded DAG jobs (Carbyne-shaped DAGs, or a job file) run through the real GM
and LM cores under each queue policy, twice: offline (every job at time 0) and online
(Poisson arrivals).  Per arrival mode and policy: average / p95 JCT, makespan and
Jain's index, each policy against the best policy in each metric, Carbyne's factors
over DRF, the jobs it slows down, and the issue's goals checked.  Writes the figures
to a JSON file and the table to a markdown file beside it.

    python benchmarks/bench_carbyne.py --out results/bench_carbyne.json
    python benchmarks/bench_carbyne.py --jobs-file jobs.json --arrivals offline
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from common.cluster import ClusterSpec
from common.dag import DagJob, load_jobs
from common.ids import GmId, LmId, UserId
from common.model import NodeSpec, UserConfig
from simulator.config import SimConfig
from simulator.dag_run import (
    ARRIVALS,
    DAG_NODE_CAPACITY,
    format_versus_best,
    run_policies,
    versus_best,
    with_arrivals,
)
from workload.dags import dag_stats, synthetic_dag_jobs

GOALS: dict[str, tuple[str, str, str, float]] = {
    # name: (arrivals, measure, comparison, bound) -- issue 12, the paper's §5.2
    "offline: Carbyne JCT vs DRF": ("offline", "jct_over_drf", ">=", 1.5),
    "offline: Carbyne makespan vs DRF": ("offline", "makespan_over_drf", ">=", 1.2),
    "offline: Carbyne Jain vs DRF": ("offline", "jain_gap_to_drf", "<=", 0.05),
    "offline: Carbyne JCT vs SJF": ("offline", "jct_vs_sjf", "<=", 1.1),
    "offline: Carbyne makespan vs Tetris": ("offline", "makespan_vs_tetris", "<=", 1.05),
    "online: Carbyne JCT vs SJF": ("online", "jct_vs_sjf", "<=", 1.2),
    "online: Carbyne makespan vs Tetris": ("online", "makespan_vs_tetris", "<=", 1.07),
    "online: Carbyne Jain vs DRF": ("online", "jain_gap_to_drf", "<=", 0.06),
}


def carbyne_factors(schedulers: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Carbyne beside its three references (missing references are left out)."""
    c = schedulers["carbyne"]
    out: dict[str, float] = {}
    if "drf" in schedulers:
        d = schedulers["drf"]
        out["jct_over_drf"] = d["jct_s"]["mean"] / c["jct_s"]["mean"]
        out["makespan_over_drf"] = d["makespan_s"] / c["makespan_s"]
        out["jain_gap_to_drf"] = d["jain"]["mean"] - c["jain"]["mean"]
        ref = d["job_jct_s"]
        mine = c["job_jct_s"]
        ratios = [mine[j] / ref[j] for j in ref if j in mine and ref[j] > 0]
        out["jobs_slowed_vs_drf"] = sum(r > 1.0 + 1e-9 for r in ratios) / max(1, len(ratios))
        out["max_slowdown_vs_drf"] = max(ratios, default=1.0)
    if "sjf" in schedulers:
        out["jct_vs_sjf"] = c["jct_s"]["mean"] / schedulers["sjf"]["jct_s"]["mean"]
    if "tetris" in schedulers:
        out["makespan_vs_tetris"] = c["makespan_s"] / schedulers["tetris"]["makespan_s"]
    return out


def check_goals(factors: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """Each goal with the measured value and whether it is met (None: not measured)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (mode, measure, op, bound) in GOALS.items():
        value = factors.get(mode, {}).get(measure)
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        out[name] = {"value": value, "goal": f"{op} {bound}", "met": met}
    return out


def format_goals(goals: Mapping[str, Mapping[str, Any]]) -> str:
    rows = ["| goal | measured | target | met |", "|---|---:|---:|:---:|"]
    for name, g in goals.items():
        value = "-" if g["value"] is None else f"{g['value']:.3f}"
        met = {None: "-", True: "yes", False: "no"}[g["met"]]
        rows.append(f"| {name} | {value} | {g['goal']} | {met} |")
    return "\n".join(rows)


def _jobs(args: argparse.Namespace, users: list[UserConfig]) -> tuple[list[DagJob], int]:
    """The workload and the number of resource types."""
    if args.jobs_file:
        names, jobs = load_jobs(args.jobs_file)
        mine = [u.user for u in users]
        for k, j in enumerate(jobs):  # the file's users are mapped onto ours, in turn
            j.user = mine[k % len(mine)]
            for t in j.tasks:
                t.spec = replace(t.spec, user=j.user)
        return jobs, len(names)
    node = DAG_NODE_CAPACITY[args.resources]
    rng = random.Random(args.seed)
    return synthetic_dag_jobs(
        args.jobs, rate=args.rate, users=users, node_capacity=node, rng=rng
    ), args.resources


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="synthetic DAG jobs")
    ap.add_argument("--jobs-file", help="a DAG job file instead (users mapped onto ours)")
    ap.add_argument("--rate", type=float, default=0.12, help="online: job arrivals per second")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--lms", type=int, default=1)
    ap.add_argument("--users", type=int, default=4, help="users with equal shares, one GM")
    ap.add_argument("--resources", type=int, choices=(1, 2), default=2)
    ap.add_argument("--policies", default="drf,drf-wc,tetris,sjf,carbyne")
    ap.add_argument(
        "--arrivals", default="offline,online", help="offline, online or both (comma list)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="results/bench_carbyne.json")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)

    gm = GmId("gm0")
    users = [UserConfig(UserId(f"u{i}"), gm, 1.0 / args.users) for i in range(args.users)]
    jobs, width = _jobs(args, users)
    node = DAG_NODE_CAPACITY.get(width, tuple([100] * width))
    per = args.nodes // args.lms
    clusters = [
        ClusterSpec(LmId(f"lm{k}"), [NodeSpec(node) for _ in range(per)], [gm] * per)
        for k in range(args.lms)
    ]
    policies = [p for p in args.policies.split(",") if p]
    modes = [m for m in args.arrivals.split(",") if m]
    for m in modes:
        if m not in ARRIVALS:
            ap.error(f"--arrivals: {m!r} is not one of {', '.join(ARRIVALS)}")
    by_mode: dict[str, dict[str, Any]] = {}
    for mode in modes:
        mine = with_arrivals(jobs, mode)
        by_mode[mode] = {}
        for p in policies:
            t0 = time.perf_counter()
            run = run_policies(mine, clusters, [gm], users, [p], SimConfig(), args.seed)
            by_mode[mode].update(run["schedulers"])
            print(f"{mode} {p}: {time.perf_counter() - t0:.1f} s wall", file=sys.stderr)
    factors = {m: carbyne_factors(s) for m, s in by_mode.items() if "carbyne" in s}
    goals = check_goals(factors)
    out: dict[str, Any] = {
        "config": vars(args),
        "dag": dag_stats(jobs),
        "schedulers": {
            m: {p: {k: v for k, v in s.items() if k != "job_jct_s"} for p, s in ss.items()}
            for m, ss in by_mode.items()
        },
        "versus_best": {m: versus_best(s) for m, s in by_mode.items()},
        "carbyne": factors,
        "goals": goals,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True))
    table = format_versus_best(by_mode) + "\n\n" + format_goals(goals)
    path.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"wrote {path} and {path.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
