"""One very large job, live: what it costs everyone else on its GM.

A federation of 1 GM x 2 LMs x 120 one-slot nodes serves two users.  u1 submits a
small job (4 tasks of 50 ms) every 50 ms throughout; after one second u0 submits one job
of ``--tasks`` tasks (default 100,000, the schema's maximum).  Meanwhile the GM's
``/health`` is asked every 20 ms.  Reported (JSON, ``--out``): the GM's longest
``/health`` answer and u1's allocation times (p50, p99, max), both for the window from
the big job's submission until its last task started, and over the whole run, and
from each small job's publication to its tasks' starts (the broker queue included); the big
job's own figures (tasks finished, lost, how long until its last start); and for every
task whether it ended once (the pools' launch logs).  Run it on two commits to compare:
the figures are what a stall of the GM's event loop looks like from outside.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import parse_config
from common.ids import JobId, TaskId, UserId
from common.metrics import duplicate_launches, percentiles
from common.model import TaskSpec
from federation.operator import signed_get
from federation.processes import running_federation
from request_generator.submitter import Outcomes, Submitter
from workload.jobs import Job

SMALL_EVERY_S = 0.05
HEALTH_EVERY_S = 0.02


def _probe(url: str, stop: Any, results: Any) -> None:
    """Ask ``url``/health every ``HEALTH_EVERY_S`` until ``stop``; put the (asked at,
    took) pairs on ``results``."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    out: list[tuple[float, float]] = []
    while not stop.is_set():
        t = time.time()
        conn.request("GET", "/health")
        conn.getresponse().read()
        out.append((t, time.time() - t))
        time.sleep(HEALTH_EVERY_S)
    conn.close()
    results.put(out)


def _job(name: str, user: str, n: int, duration: float) -> Job:
    tasks = [
        TaskSpec(task_id=TaskId(f"{name}.t{i}"), job_id=JobId(name), user=UserId(user),
                 demand=(1,), duration=duration)
        for i in range(n)
    ]  # fmt: skip
    return Job(job_id=JobId(name), user=UserId(user), arrival=0.0, tasks=tasks)


async def _until_done(sub: Submitter, ids: list[tuple[UserId, TaskId]], timeout_s: float) -> None:
    """Until every task of ``ids`` is done, at most ``timeout_s``; a line every tenth."""
    deadline = time.time() + timeout_s
    last = 0
    while time.time() < deadline:
        done = sum(1 for k in ids if sub.outcomes.done(k))
        if done == len(ids):
            break
        if done - last >= len(ids) // 10:
            print(f"  {done:,} of {len(ids):,} tasks done", flush=True)
            last = done
        await asyncio.sleep(0.5)


def _figures(
    out: Outcomes,
    ids: list[tuple[UserId, TaskId]],
    t_big: float,
    small: list[Job],
    published: dict[JobId, float],
    health: list[tuple[float, float]],
) -> dict[str, Any]:
    """The big job's fate; the GM's /health answer times and the other user's times,
    while the big job was placed and over the whole run."""
    big_done = [out.finished[k] for k in ids if k in out.finished]
    last_start = max((t.started_at for t in big_done), default=t_big)
    window = (t_big, last_start)
    small_tasks = [out.finished[(t.user, t.task_id)] for j in small for t in j.tasks
                   if (t.user, t.task_id) in out.finished]  # fmt: skip

    def alloc(ts: list[Any]) -> dict[str, float]:
        return percentiles([t.started_at - t.submitted_at for t in ts])

    def from_publish(ts: list[Any]) -> dict[str, float]:
        """Published -> started: what the user waits, the broker queue included (a GM
        that does not take deliveries leaves them there, outside allocation time)."""
        return percentiles([t.started_at - published[t.job_id] for t in ts])

    in_window = [t for t in small_tasks if window[0] <= t.submitted_at <= window[1]]
    return {
        "big_job": {
            "tasks": len(ids),
            "finished": len(big_done),
            "lost": len(ids) - sum(1 for k in ids if out.done(k)),
            "failed": sum(1 for k in ids if k in out.failed),
            "last_start_after_submit_s": round(last_start - t_big, 3),
        },
        "gm_health_s": {
            "while_big_job_placed": percentiles(
                [d for t, d in health if window[0] <= t <= window[1]]
            ),
            "whole_run": percentiles([d for _, d in health]),
        },
        "other_user_allocation_s": {
            "while_big_job_placed": alloc(in_window),
            "whole_run": alloc(small_tasks),
            "tasks_while_big_job_placed": len(in_window),
        },
        "other_user_publish_to_start_s": {
            "while_big_job_placed": from_publish(in_window),
            "whole_run": from_publish(small_tasks),
        },
        "small_jobs_lost": sum(
            1 for j in small for t in j.tasks if not out.done((t.user, t.task_id))
        ),
        "duplicate_outcomes": out.duplicates,
    }


async def _run(cfg: Any, home: Path, n_big: int, timeout_s: float) -> dict[str, Any]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    stop = asyncio.Event()
    # the probe is a process of its own: this one is busy with 100,000 outcomes
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    stop_probe = ctx.Event()
    prober = ctx.Process(target=_probe, args=(cfg.gm_url(cfg.gm_ids[0]), stop_probe, results))
    prober.start()

    small: list[Job] = []
    published: dict[JobId, float] = {}

    async def trickle() -> None:
        i = 0
        while not stop.is_set():
            job = _job(f"s{i}", "u1", 4, 0.05)
            small.append(job)
            published[job.job_id] = await sub.submit(job)
            i += 1
            await asyncio.sleep(SMALL_EVERY_S)

    tasks = [asyncio.create_task(trickle())]
    try:
        await asyncio.sleep(1.0)
        big = _job("big", "u0", n_big, 0.01)
        print(f"submitting one job of {n_big:,} tasks", flush=True)
        t_big = await sub.submit(big)
        ids = [(t.user, t.task_id) for t in big.tasks]
        await _until_done(sub, ids, timeout_s)
        await asyncio.sleep(1.0)  # a last second of small jobs after it
    finally:
        stop.set()
        stop_probe.set()
        health: list[tuple[float, float]] = results.get(timeout=30)
        prober.join(timeout=10)
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(1.0)  # the last small jobs' outcomes
        await sub.close()
    return _figures(sub.outcomes, ids, t_big, small, published, health)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000, help="tasks of the big job")
    ap.add_argument("--out", default="results/bench_big_job.json")
    ap.add_argument("--base-port", type=int, default=18700)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the big job")
    args = ap.parse_args()
    cfg = replace(
        parse_config({}),
        name=f"bench-big-{os.getpid()}",
        gms=1,
        lms=2,
        nodes_per_lm=60,
        users="u0:0.5@gm0,u1:0.5@gm0",
        base_port=args.base_port,
    ).validate()
    load1 = os.getloadavg()
    with running_federation(cfg, quiet=False) as home:
        result = asyncio.run(_run(cfg, home, args.tasks, args.timeout))
        rows: list[dict[str, Any]] = []
        for lm in cfg.lm_ids:
            rows.extend(signed_get(cfg, home, f"{lm}-workers", "/v1/launches")["launches"])
        result["duplicate_launches"] = duplicate_launches(rows)["count"]
        result["gm_gc"] = signed_get(cfg, home, cfg.gm_ids[0], "/v1/state").get("gc", {})
    result["machine"] = {
        "cpus": os.cpu_count(),
        "loadavg_before": load1,
        "loadavg_after": os.getloadavg(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    h = result["gm_health_s"]["while_big_job_placed"]
    a = result["other_user_allocation_s"]["while_big_job_placed"]
    w = result["other_user_publish_to_start_s"]["while_big_job_placed"]
    b = result["big_job"]
    print(
        f"big job: {b['finished']:,} of {b['tasks']:,} finished, {b['lost']} lost, last start "
        f"{b['last_start_after_submit_s']} s after submission; meanwhile GM /health max "
        f"{h['max'] * 1e3:.1f} ms, other user's allocation p50 {a['p50'] * 1e3:.1f} ms p99 "
        f"{a['p99'] * 1e3:.1f} ms max {a['max'] * 1e3:.1f} ms; published -> started max "
        f"{w['max'] * 1e3:.1f} ms"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
