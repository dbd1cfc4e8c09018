"""What a queue policy's plans cost as a job grows, simulated on 20 nodes, 1 GM, 2 LMs:
one job of N tasks, either one stage of N identical tasks ([4, 1], 1 s; ``--shape
uniform``) or a stage of N tasks of three sizes and durations of 1-10 s (seeded) with a
stage of N/4 tasks after it (``--shape varied``: every task end re-packs the DAG), or
N/2 stages of 2 tasks, each after the 50 stages before it (``--shape dense``).

Per policy and N: wall time of the run, plans made, time per plan, wall time per task,
and the growth of the wall time from one N to the next as a ratio (1.0 per doubling of
N per task is linear; quadratic doubles it).  Writes the figures to a JSON file.

``--chain-depth D,D,...`` measures deep chains: ``--users`` jobs (one per user, all at
t = 0), each a chain of D stages of 2 tasks (1-10 s, seeded; each stage after the one
before), on ``--nodes`` nodes: per policy and D, wall and CPU time per stage, and CPU per
stage against the first D's as a ratio (1.0: linear in the stages; a 10x deeper chain at
10: quadratic).

``--many-jobs N,N,...`` measures the other axis: N small jobs (two stages of 1-4 and 1-2
tasks, 1-10 s, three sizes; seeded) from several users, all at t = 0 on one GM, so the GM
holds hundreds to thousands of queued jobs and every task end re-plans all of them.  Per
policy and N: CPU time per task (process time: the machine may be shared; wall time
beside it).  With ``--before REF`` the same runs are also made with
the code of git ref REF (checked out in a temporary ``git worktree``, run in a
subprocess), for a side-by-side ratio; both must make the same decisions (makespan and
mean JCT are compared).

    python benchmarks/bench_replan.py --sizes 1000,2000,5000 --out results/bench_replan.json
    python benchmarks/bench_replan.py --shape varied --sizes 2000,4000,8000 --policies carbyne
    python benchmarks/bench_replan.py --chain-depth 100,300,1000 --nodes 1000 \\
        --policies carbyne,sjf --out results/chain.json
    python benchmarks/bench_replan.py --many-jobs 200,600,2000 --policies drf,carbyne \\
        --before main --out results/many_jobs.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.cluster import ClusterSpec
from common.dag import DagJob, make_job
from common.ids import GmId, LmId, UserId
from common.model import NodeSpec, UserConfig
from global_master.policy.jobs import JobQueues
from simulator.config import SimConfig
from simulator.dag_run import DAG_NODE_CAPACITY, run_policies

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


DENSE_PARENTS = 50
"""``--shape dense``: each stage is after the previous 50 (a DAG of ~50 N edges)."""


def _job(n: int, shape: str) -> DagJob:
    if shape == "uniform":
        return make_job("j1", "alice", 0.0, [(0, [((4, 1), 1.0)] * n, [])])
    if shape == "dense":
        stages = [
            (s, [((4, 1), 1.0)] * 2, list(range(max(0, s - DENSE_PARENTS), s)))
            for s in range(n // 2)
        ]
        return make_job("j1", "alice", 0.0, stages)
    rng = random.Random(n)
    sizes = [(4, 1), (8, 2), (16, 4)]
    first = [(rng.choice(sizes), round(rng.uniform(1.0, 10.0), 2)) for _ in range(n)]
    after = [((8, 2), round(rng.uniform(1.0, 4.0), 2)) for _ in range(max(1, n // 4))]
    return make_job("j1", "alice", 0.0, [(0, first, []), (1, after, [0])])


def _timed_run(
    policy: str, jobs: list[DagJob], users: list[UserConfig], nodes: int, lms: int
) -> tuple[dict[str, Any], float, float, int]:
    """``jobs`` under ``policy`` on ``lms`` LMs of ``nodes`` nodes in all, one GM:
    the policy's figures, wall and CPU seconds, and how many plans it made."""
    gm = GmId("gm0")
    per = nodes // lms
    cap = DAG_NODE_CAPACITY[2]
    clusters = [
        ClusterSpec(LmId(f"lm{k}"), [NodeSpec(cap) for _ in range(per)], [gm] * per)
        for k in range(lms)
    ]
    _PLANS.update(count=0, seconds=0.0)
    t0, c0 = time.perf_counter(), time.process_time()
    run = run_policies(jobs, clusters, [gm], users, [policy], SimConfig(), 1)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return run["schedulers"][policy], wall, cpu, int(_PLANS["count"])


def run_one(policy: str, n: int, nodes: int, lms: int, shape: str = "uniform") -> dict[str, Any]:
    """Wall time and plans of one job of ``n`` tasks under ``policy``."""
    users = [UserConfig(UserId("alice"), GmId("gm0"), 1.0)]
    figures, wall, _, plans = _timed_run(policy, [_job(n, shape)], users, nodes, lms)
    return {
        "tasks": n,
        "wall_s": wall,
        "makespan_s": figures["makespan_s"],
        "plans": plans,
        "plan_ms": 1000 * _PLANS["seconds"] / max(1, plans),
        "wall_per_task_ms": 1000 * wall / n,
    }


MANY_SIZES = [(8000, 2048), (16000, 4096), (4000, 1024)]
"""Task demands of the many-jobs workload (of a node's (64000, 16384))."""


def many_jobs(n: int, users: int, seed: int = 0) -> list[DagJob]:
    """``n`` small two-stage jobs of ``users`` users (round-robin), all arriving at 0."""
    rng = random.Random(f"many:{seed}:{n}")
    jobs = []
    for k in range(n):
        first = [
            (rng.choice(MANY_SIZES), round(rng.uniform(1.0, 10.0), 2))
            for _ in range(rng.randint(1, 4))
        ]
        after = [
            (rng.choice(MANY_SIZES), round(rng.uniform(1.0, 10.0), 2))
            for _ in range(rng.randint(1, 2))
        ]
        jobs.append(make_job(f"j{k}", f"u{k % users}", 0.0, [(0, first, []), (1, after, [0])]))
    return jobs


def run_many(policy: str, n: int, users: int, nodes: int, lms: int) -> dict[str, Any]:
    """Wall time per task of ``n`` small jobs of ``users`` users on one GM."""
    cfgs = [UserConfig(UserId(f"u{k}"), GmId("gm0"), 1.0 / users) for k in range(users)]
    jobs = many_jobs(n, users)
    tasks = sum(len(j.tasks) for j in jobs)
    figures, wall, cpu, plans = _timed_run(policy, jobs, cfgs, nodes, lms)
    return {
        "jobs": n,
        "tasks": tasks,
        "wall_s": wall,
        "wall_per_task_ms": 1000 * wall / tasks,
        "cpu_s": cpu,
        "cpu_per_task_ms": 1000 * cpu / tasks,
        "plans": plans,
        "plan_ms": 1000 * _PLANS["seconds"] / max(1, plans),
        "makespan_s": figures["makespan_s"],
        "jct_mean_s": figures["jct_s"]["mean"],
    }


def chain_jobs(depth: int, users: int) -> list[DagJob]:
    """``users`` jobs, each a chain of ``depth`` stages of 2 tasks (each stage after the
    one before), all arriving at 0 (seeded by the depth)."""
    rng = random.Random(f"chain:{depth}")
    jobs = []
    for k in range(users):
        stages = [
            (s, [(rng.choice(MANY_SIZES), round(rng.uniform(1.0, 10.0), 2)) for _ in range(2)],
             [s - 1] if s else [])
            for s in range(depth)
        ]  # fmt: skip
        jobs.append(make_job(f"c{k}", f"u{k}", 0.0, stages))
    return jobs


def run_chain(policy: str, depth: int, users: int, nodes: int, lms: int) -> dict[str, Any]:
    """Wall and CPU time per stage of ``users`` chains of ``depth`` stages on one GM."""
    cfgs = [UserConfig(UserId(f"u{k}"), GmId("gm0"), 1.0 / users) for k in range(users)]
    jobs = chain_jobs(depth, users)
    stages = depth * users
    figures, wall, cpu, plans = _timed_run(policy, jobs, cfgs, nodes, lms)
    return {
        "depth": depth,
        "stages": stages,
        "wall_s": wall,
        "cpu_s": cpu,
        "wall_per_stage_ms": 1000 * wall / stages,
        "cpu_per_stage_ms": 1000 * cpu / stages,
        "plans": plans,
        "plan_ms": 1000 * _PLANS["seconds"] / max(1, plans),
        "makespan_s": figures["makespan_s"],
        "jct_mean_s": figures["jct_s"]["mean"],
    }


def main_chain(args: argparse.Namespace) -> int:
    """``--chain-depth``: per policy and depth, the time per stage and its growth."""
    depths = [int(x) for x in args.chain_depth.split(",") if x]
    out: dict[str, Any] = {"config": vars(args), "chain": {}}
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in [x for x in args.policies.split(",") if x]:
        rows: list[dict[str, Any]] = []
        out["chain"][p] = rows
        for d in depths:  # each row printed and written as it comes
            row = run_chain(p, d, args.users, args.nodes, args.lms)
            rows.append(row)
            row["cpu_per_stage_over_first"] = row["cpu_per_stage_ms"] / rows[0]["cpu_per_stage_ms"]
            print(
                f"{p} depth={row['depth']}: {row['wall_s']:.2f} s wall, {row['cpu_s']:.2f} s CPU, "
                f"{row['cpu_per_stage_ms']:.2f} CPU ms/stage "
                f"(x{row['cpu_per_stage_over_first']:.2f} of depth {depths[0]}), "
                f"{row['plans']} plans, {row['plan_ms']:.3f} ms/plan, "
                f"makespan {row['makespan_s']:.2f} s",
                file=sys.stderr,
            )
            path.write_text(json.dumps(out, indent=2, sort_keys=True))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def _many_rows(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    sizes = [int(x) for x in args.many_jobs.split(",") if x]
    out: dict[str, list[dict[str, Any]]] = {}
    for p in [x for x in args.policies.split(",") if x]:
        out[p] = []
        for n in sizes:
            best: dict[str, Any] | None = None
            for _ in range(max(1, args.repeat)):  # the fastest of the repeats
                row = run_many(p, n, args.users, args.nodes, args.lms)
                if best is None or row["cpu_s"] < best["cpu_s"]:
                    best = row
            assert best is not None
            out[p].append(best)
            print(
                f"{args.label or 'this tree'} {p} jobs={n}: {best['tasks']} tasks, "
                f"{best['wall_s']:.2f} s wall, {best['cpu_per_task_ms']:.3f} CPU ms/task, "
                f"{best['plans']} plans, {best['plan_ms']:.3f} ms/plan",
                file=sys.stderr,
            )
    return out


def _before(ref: str, argv: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The many-jobs rows of git ref ``ref``: this script run on that tree's code."""
    root = Path(__file__).resolve().parent.parent
    tmp = Path(tempfile.mkdtemp(prefix="bench-before-"))
    tree = tmp / "tree"
    subprocess.run(
        ["git", "-C", str(root), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    try:
        rows = tmp / "rows.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
        cmd += ["--rows-only", str(rows), "--label", ref]
        subprocess.run(cmd, check=True, env=env, cwd=str(tree))
        data: dict[str, list[dict[str, Any]]] = json.loads(rows.read_text())
        return data
    finally:
        subprocess.run(
            ["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
            check=False,
            capture_output=True,
        )


def _strip_before(argv: list[str]) -> list[str]:
    """``argv`` without ``--before REF`` and ``--out PATH``."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--before", "--out"):
            skip = True
            continue
        if a.startswith(("--before=", "--out=")):
            continue
        out.append(a)
    return out


def main_many(args: argparse.Namespace, argv: list[str]) -> int:
    """``--many-jobs``: this tree's rows, and with ``--before`` REF's beside them."""
    import common  # where the policy code comes from (PYTHONPATH)

    code = str(Path(common.__file__).resolve().parent.parent)
    if args.rows_only:
        Path(args.rows_only).write_text(json.dumps(_many_rows(args)))
        return 0
    before = _before(args.before, _strip_before(argv)) if args.before else None
    after = _many_rows(args)
    config = {k: v for k, v in vars(args).items() if k not in ("rows_only", "label")}
    out: dict[str, Any] = {"config": config, "code": code, "many_jobs": {}}
    same = True
    for p, rows in after.items():
        entry: dict[str, Any] = {"after": rows}
        if before is not None:
            entry["before"] = before[p]
            entry["after_over_before"] = []
            for b, a in zip(before[p], rows, strict=True):
                decided_alike = (b["makespan_s"], b["jct_mean_s"]) == (
                    a["makespan_s"],
                    a["jct_mean_s"],
                )
                same = same and decided_alike
                entry["after_over_before"].append(
                    {
                        "jobs": a["jobs"],
                        "cpu_ms_per_task": [b["cpu_per_task_ms"], a["cpu_per_task_ms"]],
                        "ratio": a["cpu_per_task_ms"] / b["cpu_per_task_ms"],
                        "same_makespan_and_jct": decided_alike,
                    }
                )
                print(
                    f"{p} jobs={a['jobs']}: {b['cpu_per_task_ms']:.2f} -> "
                    f"{a['cpu_per_task_ms']:.2f} CPU ms/task ({args.before} -> this tree), "
                    f"x{b['cpu_per_task_ms'] / a['cpu_per_task_ms']:.2f}, "
                    f"same makespan and JCT: {decided_alike}",
                    file=sys.stderr,
                )
        out["many_jobs"][p] = entry
    if before is not None:
        out["same_decisions"] = same
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True))
    print(f"wrote {path}", file=sys.stderr)
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="500,1000,2000,5000")
    ap.add_argument("--policies", default="carbyne,drf")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--lms", type=int, default=2)
    ap.add_argument(
        "--shape",
        choices=("uniform", "varied", "dense"),
        default="uniform",
        help="the job: one stage of identical tasks, two of varied tasks, or N/2 stages "
        "of 2 tasks, each stage after the 50 before it (~25 N edges: every plan walks them)",
    )
    ap.add_argument("--out", default="results/bench_replan.json")
    ap.add_argument(
        "--many-jobs",
        default="",
        metavar="N,N,...",
        help="instead: N small jobs of --users users on one GM, per N (ms per task)",
    )
    ap.add_argument(
        "--chain-depth",
        default="",
        metavar="D,D,...",
        help="instead: --users chains of D stages of 2 tasks on one GM, per D (ms per stage)",
    )
    ap.add_argument("--users", type=int, default=4, help="--many-jobs, --chain-depth: users")
    ap.add_argument("--repeat", type=int, default=1, help="--many-jobs: fastest of R runs")
    ap.add_argument(
        "--before", default="", metavar="REF", help="--many-jobs: also measure git ref REF"
    )
    ap.add_argument("--rows-only", default="", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    _timed_replan()
    if args.many_jobs:
        return main_many(args, argv)
    if args.chain_depth:
        return main_chain(args)
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
