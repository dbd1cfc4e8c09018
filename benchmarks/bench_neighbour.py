"""A noisy neighbour: what one user's burst of jobs costs another user of the same GM.

Starts its own federation (1 GM, 1 LM, 40 nodes; gunicorn processes, the real broker),
two users of equal share on that GM.  User ``u0`` publishes ``--burst`` one-task jobs
at once, from a process and broker connection of its own, as another client would;
meanwhile user ``u1`` publishes one one-task job every 50 ms (``--jobs`` of them).
For ``u1``'s tasks: publication -> its GM's queue (the ingress, while the broker takes
in the burst and the GM reads it), and publication -> start.

    python benchmarks/bench_neighbour.py --out results/bench_neighbour.json

Every loop is bounded by its count and ``--timeout``.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig, load_config, parse_config
from common.ids import JobId, TaskId, UserId
from common.metrics import percentiles
from common.model import Task, TaskSpec
from federation.processes import running_federation
from request_generator.submitter import Submitter
from workload.jobs import Job

TASK_S = 0.05


def _job(name: str, user: str) -> Job:
    spec = TaskSpec(task_id=TaskId(f"{name}.t0"), job_id=JobId(name), user=UserId(user),
                    demand=(1,), duration=TASK_S)  # fmt: skip
    return Job(job_id=JobId(name), user=UserId(user), arrival=0.0, tasks=[spec])


async def _burst(cfg: FederationConfig, home: Path, tag: str, n: int) -> None:
    """``u0``'s burst: ``n`` jobs published at once (a child process runs this)."""
    sub = Submitter.operator(cfg, home, keep=False)
    await sub.open(listen=False)
    try:
        await asyncio.gather(*(sub.submit(_job(f"a{tag}-{i}", "u0")) for i in range(n)))
    finally:
        await sub.close()


async def _measure(
    cfg: FederationConfig, home: Path, burst: int, jobs: int, timeout_s: float
) -> dict[str, Any]:
    sub = Submitter.operator(cfg, home, keep=False)
    ended: dict[str, Task] = {}
    published: dict[str, float] = {}
    all_ended = asyncio.Event()

    def sink(task: Task, _at: float) -> None:
        if str(task.task_id) in published:
            ended[str(task.task_id)] = task
            if len(ended) == jobs:
                all_ended.set()

    sub.outcomes.sink = sink
    await sub.open()
    tag = f"{os.getpid()}-{int(time.time())}"
    try:
        flood = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--burst-of", str(burst), "--home", str(home), "--tag", tag
        )
        await asyncio.sleep(0.05)  # the burst under way
        for i in range(jobs):
            job = _job(f"b{tag}-{i}", "u1")
            published[f"{job.job_id}.t0"] = await sub.submit(job)
            await asyncio.sleep(0.05)
        await asyncio.wait_for(flood.wait(), timeout_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_ended.wait(), timeout_s)
    finally:
        await sub.close()
    done = [t for t in ended.values() if t.started_at >= 0]
    return {
        "burst_jobs": burst,
        "neighbour_jobs": jobs,
        "neighbour_started": len(done),
        "neighbour_to_gm_queue_s": percentiles(
            [t.submitted_at - published[str(t.task_id)] for t in done]
        ),
        "neighbour_to_start_s": percentiles(
            [t.started_at - published[str(t.task_id)] for t in done]
        ),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench_neighbour.json")
    ap.add_argument("--base-port", type=int, default=22000)
    ap.add_argument("--burst", type=int, default=5000, help="u0's jobs, published at once")
    ap.add_argument("--jobs", type=int, default=40, help="u1's jobs, one every 50 ms")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for u1's")
    ap.add_argument("--burst-of", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--home", help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.burst_of is not None:  # the child: u0's burst
        home = Path(args.home)
        asyncio.run(_burst(load_config(home / "federation.toml"), home, args.tag, args.burst_of))
        return 0
    if not (1 <= args.burst <= 100_000 and 1 <= args.jobs <= 10_000 and 0 < args.timeout <= 3600):
        raise SystemExit("need 1 <= --burst <= 100000, 1 <= --jobs <= 10000, 0 < --timeout <= 3600")
    cfg = replace(
        parse_config({}), name=f"bench-neighbour-{os.getpid()}", gms=1, lms=1,
        nodes_per_lm=40, base_port=args.base_port, users="u0:0.5@gm0,u1:0.5@gm0",
    ).validate()  # fmt: skip
    with running_federation(cfg) as home:
        result = asyncio.run(_measure(cfg, home, args.burst, args.jobs, args.timeout))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    q, s = result["neighbour_to_gm_queue_s"], result["neighbour_to_start_s"]
    print(
        f"u1 beside a burst of {args.burst} jobs: {result['neighbour_started']}/{args.jobs} "
        f"started; to the GM's queue p50 {q['p50'] * 1e3:.1f} ms, p90 {q['p90'] * 1e3:.1f}, "
        f"max {q['max'] * 1e3:.1f}; to start p50 {s['p50'] * 1e3:.1f} ms, "
        f"p90 {s['p90'] * 1e3:.1f}, max {s['max'] * 1e3:.1f}; wrote {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
