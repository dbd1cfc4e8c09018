"""Gang stages at a given load: a gang's allocation time beside a single task's.

A seeded Poisson workload on the simulated federation (the real GM and LM cores):
half of the offered work in single-task jobs, half in gangs of 2-200 tasks (uniform),
task durations uniform in [5, 15] s.  Measured in one run:

* a single task's allocation time (final start - entry into its GM's queue);
* a gang's allocation time: its first task's entry into the queue to its last task's
  start (the issue's measure), and the ratio of the two p99s (goal: at most 3x at 50%
  load);
* partial starts (a gang with some but not all of its ``need`` tasks started, or an
  LM that refused a commit): must be 0; gangs that failed ``gang_unschedulable``;
  reservations, back-offs and backfilled tasks.

The same jobs are also run with ``gang`` off (``--no-baseline`` skips it), so the
cost of starting all-or-nothing shows beside the same tasks placed one by one.

    python benchmarks/bench_gang.py --out results/bench_gang.json
    python benchmarks/bench_gang.py --load 0.8 --workers 3000 --out results/bench_gang_80.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from common.cluster import PROFILES, default_users, make_federation
from common.ids import GmId, JobId, TaskId, UserId
from common.metrics import percentiles
from common.model import TaskSpec
from simulator.megha_sim import MeghaSimulation, SimResult
from workload.jobs import Job

MEAN_DURATION_S = 10.0
MEAN_GANG = 101.0  # uniform 2..200


def workload(
    workers: int, load: float, span_s: float, users: list[UserId], seed: int, gang: bool = True
) -> list[Job]:
    """Poisson arrivals of single-task jobs and gangs, each half of the offered work."""
    rng = random.Random(seed)
    share = load * workers / MEAN_DURATION_S / 2  # task-seconds per second, per kind
    rates = {"s": share, "g": share / MEAN_GANG}
    jobs: list[Job] = []
    for kind, rate in rates.items():
        t, k = 0.0, 0
        while True:
            t += rng.expovariate(rate)
            if t >= span_s:
                break
            n = 1 if kind == "s" else rng.randint(2, 200)
            user = users[k % len(users)]
            jid = JobId(f"{kind}{k}")
            specs = [
                TaskSpec(task_id=TaskId(f"{jid}.{i}"), job_id=jid, user=user, demand=(1,),
                         duration=round(rng.uniform(5.0, 15.0), 3))
                for i in range(n)
            ]  # fmt: skip
            jobs.append(Job(jid, user, t, specs, gang=gang and kind == "g"))
            k += 1
    jobs.sort(key=lambda j: j.arrival)
    return jobs


def _tails(xs: list[float]) -> dict[str, float]:
    """Seconds: p50 p90 p99 p999 max mean (``common.metrics.percentiles``), and n."""
    if not xs:
        return {}
    return {"n": len(xs), **{f"{k}_s": round(v, 4) for k, v in percentiles(xs).items()}}


def measure(r: SimResult, sim: MeghaSimulation) -> dict[str, Any]:
    """Allocation tails of single tasks and of gangs (whole), partial starts, stats."""
    single: list[float] = []
    by_job: dict[JobId, list[tuple[float, float]]] = defaultdict(list)
    for t in r.tasks:
        if t.job_id.startswith("s") and t.started_at >= 0:
            single.append(t.allocation_time)
        elif t.job_id.startswith("g"):
            by_job[t.job_id].append((t.submitted_at, t.started_at))
    whole: list[float] = []
    partial = 0
    for members in by_job.values():
        started = [s for _, s in members if s >= 0]
        if started and len(started) < len(members):
            partial += 1
        if len(started) == len(members):
            whole.append(max(started) - min(q for q, _ in members))
    stats: dict[str, int] = defaultdict(int)
    for gm in sim.gms.values():
        for k, v in gm.gang.stats.items():
            stats[k] += v
    lm_stats = {
        "holds_expired": sum(lm.reservations.expired for lm in sim.lms.values()),
        "backfilled_at_lm": sum(lm.reservations.backfilled for lm in sim.lms.values()),
        "backfill_stopped": sum(lm.reservations.backfill_stopped for lm in sim.lms.values()),
    }
    out: dict[str, Any] = {
        "single_task_allocation": _tails(single),
        "gang_allocation": _tails(whole),
        "gangs_partially_started": partial,
        "gangs_failed": len({k[1].rsplit(".", 1)[0] for k in r.failed}),
        "gang_stats": dict(stats),
        **lm_stats,
        "stuck": r.stuck,
        "tasks": len(r.tasks),
    }
    s99 = out["single_task_allocation"].get("p99_s")
    g99 = out["gang_allocation"].get("p99_s")
    if s99 and g99 is not None:
        out["gang_p99_over_single_p99"] = round(g99 / s99, 3)
    return out


def run(args: argparse.Namespace, gang: bool) -> dict[str, Any]:
    gms = [GmId(f"gm{i}") for i in range(args.gms)]
    users = default_users(gms)
    clusters = make_federation(
        args.workers, gms, args.lms, PROFILES["slots"], False, random.Random(args.seed)
    )
    sim = MeghaSimulation(clusters, gms, users)
    jobs = workload(args.workers, args.load, args.span, [u.user for u in users], args.seed, gang)
    sim.add_jobs(jobs)
    t0 = time.process_time()
    r = sim.run()
    out = measure(r, sim)
    out["cpu_s"] = round(time.process_time() - t0, 2)
    out["jobs"] = len(jobs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=1500, help="slots in the federation")
    ap.add_argument("--gms", type=int, default=3)
    ap.add_argument("--lms", type=int, default=3)
    ap.add_argument("--load", type=float, default=0.5, help="offered load (1.0: capacity)")
    ap.add_argument("--span", type=float, default=300.0, help="seconds of arrivals")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-baseline", action="store_true", help="skip the run without gangs")
    ap.add_argument("--out", type=Path, default=Path("results/bench_gang.json"))
    args = ap.parse_args(argv)
    figures: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/bench_gang.py", *(argv or sys.argv[1:])]),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "gangs": run(args, gang=True),
    }
    if not args.no_baseline:
        figures["same_jobs_without_gang"] = run(args, gang=False)
    g = figures["gangs"]
    figures["goals"] = {
        "partial_starts": g["gangs_partially_started"] + g["gang_stats"].get("partial_starts", 0),
        "gang_p99_within_3x_single_p99": g.get("gang_p99_over_single_p99", float("inf")) <= 3.0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
