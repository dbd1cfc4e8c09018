"""A worker pool's service-side CPU per task on its own event loop, this tree against
another checkout, alternating in one sitting (issue 35 item 1).

``bench_lm_pool`` runs the pool's core by hand; what a live pool spends beyond it --
a timer per task, the journal's writes, the reports' batching, the wake-ups of the
loop -- it does not see.  Here each arm is a fresh process with its tree first on
``sys.path`` that runs that tree's ``worker.app.WorkerService`` on uvloop (as gunicorn
does), with its journal (under ``/dev/shm``) and its batcher, but its LM a stand-in
in the same process (no sockets: each post is encoded, then answered at once):

* starts arrive as an LM sends them: every ``--every-ms`` a ``StartTasks`` of
  ``rate * every`` synthetic tasks (decoded, fed, made durable, the answer encoded,
  as ``runtime.http``'s lean lane does, its ``refusal`` asked first), each of an
  exponential duration of mean ``--mean-ms`` (bench_live's ramp: 20 ms), for
  ``--seconds``;
* the pool's reports, heartbeats and registration go to the stand-in.

Per arm: CPU time (``time.process_time``) per task, voluntary context switches per
task (the loop's wake-ups), journal writes per task and report posts per task (each
a signed request live; that cost is not here), the mean wait from a task's end as it
was due to its report leaving (``report_wait_ms``: what its LM waits to hear of it),
and how late the pool fed its tasks' ends on average (``end_late_ms``: ``worker.timers``; 0 for a tree that had a loop
timer per task).  Median over rounds; ratio new/old.

    python benchmarks/bench_pool_service.py --against /work/wt/base --rounds 5

writes ``docs/figures/bench_pool_service/<date>/pool_service.json`` (``--out``).  Not
part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
N_NODES = 40  # one LM's share of bench_live's 120 nodes


class _LmStandIn:
    """The pool's LM without sockets: every post encoded, answered at once, counted."""

    def __init__(self, lm: Any, clock: Any) -> None:
        self.lm = lm
        self.clock = clock
        self.posts: dict[str, int] = {}
        self.items = 0
        self.due: dict[str, float] = {}
        """Each task's end as it was due (the pool's clock), by task id."""
        self.waited = [0.0, 0]
        """From each end's due instant until its report left, summed; how many."""

    async def post(self, path: str, msg: Any, *, expect: Any = None, policy: Any = None) -> Any:
        from common import codec
        from common.messages import Registered, WorkerReports

        codec.encode(msg)
        self.posts[path] = self.posts.get(path, 0) + 1
        await asyncio.sleep(0)  # (an answer comes back on a later turn)
        if path == "/v1/register":
            return Registered(lm=self.lm, epoch=1)
        if path == "/v1/worker-report":
            self.items += len(msg.reports)
            now = self.clock()
            for r in msg.reports:
                due = self.due.pop(r.task_id, None)
                if due is not None:
                    self.waited[0] += now - due
                    self.waited[1] += 1
            return WorkerReports(lm=self.lm, reports=())
        return None


async def _run(args: argparse.Namespace, state: str) -> dict[str, Any]:
    from dataclasses import replace

    from common import codec
    from common.config import STATE_ENV, FederationConfig
    from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
    from common.messages import StartTask, StartTasks
    from common.model import TaskSpec
    from security.access import Access
    from security.identity import workers
    from security.secret import Secret
    from worker.app import WorkerService

    os.environ[STATE_ENV] = state
    cfg = replace(FederationConfig(), lms=1, nodes_per_lm=N_NODES).validate()
    secret = Secret.from_text("bench-secret-" + "x" * 40, "bench", insecure_dev=True)
    lm = LmId(cfg.lm_ids[0])
    svc = WorkerService(cfg, lm, Access(workers(lm), cfg, secret))
    await svc.open()
    stand_in = _LmStandIn(lm, svc.driver.clock)
    svc.lm = stand_in  # type: ignore[assignment]  # before the registration runs
    await asyncio.wait_for(svc.registered.wait(), 5.0)
    rng = random.Random(7)
    every: float = args.every_ms / 1e3
    rate: float = args.rate
    per_batch = max(1, round(rate * every))
    batches = int(args.seconds / every)
    seq = 0

    async def load(n_batches: int) -> int:
        nonlocal seq
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for b in range(n_batches):
            tasks = []
            for _ in range(per_batch):
                seq += 1
                spec = TaskSpec(task_id=TaskId(f"t{seq}"), job_id=JobId(f"j{seq // 10}"),
                                user=UserId("u0"), demand=(1, 1),
                                duration=rng.expovariate(1e3 / args.mean_ms))  # fmt: skip
                tasks.append(StartTask(spec=spec, attempt=1, node=NodeIndex(seq % N_NODES),
                                       gm=GmId("gm0"), queued_at=0.0))  # fmt: skip
            body = codec.encode(StartTasks(lm=lm, epoch=1, tasks=tuple(tasks), sent=-1.0))
            msg = codec.decode(body, expect=StartTasks)
            svc.refusal()  # as the routes ask before they feed
            now = svc.driver.clock()
            for t in tasks:
                stand_in.due[t.spec.task_id] = now + t.spec.duration
            answer = svc.driver.feed(msg)
            await svc.durable(msg)
            codec.encode(answer)
            wait = t0 + (b + 1) * every - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        return n_batches * per_batch

    def finished() -> int:
        return int(svc.core.counters.finished)

    async def all_done(n: int) -> None:
        while finished() - done0 < n:  # noqa: ASYNC110  (the pool's own counter)
            await asyncio.sleep(0.01)

    await load(int(0.5 / every))  # warm
    await asyncio.sleep(0.5)
    gc.collect()
    posts0, items0 = dict(stand_in.posts), stand_in.items
    late0 = _late(svc)
    waited0 = list(stand_in.waited)
    done0 = finished()
    writes0 = svc.state.writes if svc.state is not None else 0
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = time.process_time()
    n = await load(batches)
    await all_done(n)
    await asyncio.sleep(0.2)  # the last reports leave
    cpu = time.process_time() - cpu0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    late = _late(svc)
    writes = (svc.state.writes if svc.state is not None else 0) - writes0
    reports = stand_in.posts.get("/v1/worker-report", 0) - posts0.get("/v1/worker-report", 0)
    await svc.close()
    return {
        "us_per_task": round(1e6 * cpu / n, 2),
        "user_us_per_task": round(1e6 * (ru1.ru_utime - ru0.ru_utime) / n, 2),
        "sys_us_per_task": round(1e6 * (ru1.ru_stime - ru0.ru_stime) / n, 2),
        "wakeups_per_task": round((ru1.ru_nvcsw - ru0.ru_nvcsw) / n, 3),
        "journal_writes_per_task": round(writes / n, 3),
        "report_posts_per_task": round(reports / n, 4),
        "reports_per_post": round((stand_in.items - items0) / max(reports, 1), 2),
        "report_wait_ms": round(
            1e3 * (stand_in.waited[0] - waited0[0]) / max(stand_in.waited[1] - waited0[1], 1), 3
        ),
        "end_late_ms": round(1e3 * (late[0] - late0[0]) / max(late[1] - late0[1], 1), 3),
    }


def _late(svc: Any) -> tuple[float, int]:
    """How late the pool's timers fed what they fed, in all, and how many (a tree
    without ``worker.timers``: the loop's timers, on time)."""
    timers = getattr(svc, "timers", None)
    if timers is None:
        return 0.0, 0
    return float(timers.late_s), int(timers.fed)


def _arm(args: argparse.Namespace) -> int:
    sys.path.insert(0, args.tree)
    import uvloop

    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        row = uvloop.run(_run(args, tmp))
    Path(args.arm_out).write_text(json.dumps(row))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the old checkout (a git worktree)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rate", type=float, default=333.0, help="tasks/s to this pool")
    ap.add_argument("--every-ms", type=float, default=10.0, help="between two starts")
    ap.add_argument("--mean-ms", type=float, default=20.0, help="mean task duration")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        return _arm(args)
    trees = {"old": str(Path(args.against).resolve()), "new": str(HERE)}
    rows: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    order = [("old", "new") if k % 2 == 0 else ("new", "old") for k in range(args.rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        for k, pair in enumerate(order):
            for arm in pair:
                arm_out = f"{tmp}/{arm}-{k}.json"
                cmd = [sys.executable, __file__, "--arm", arm, "--tree", trees[arm],
                       "--arm-out", arm_out, "--against", args.against,
                       "--rate", str(args.rate), "--every-ms", str(args.every_ms),
                       "--mean-ms", str(args.mean_ms), "--seconds", str(args.seconds)]  # fmt: skip
                env = {"PYTHONPATH": trees[arm], "PATH": "/usr/bin:/bin"}
                subprocess.run(cmd, check=True, env=env)
                rows[arm].append(json.loads(Path(arm_out).read_text()))
                print(arm, k, rows[arm][-1], file=sys.stderr, flush=True)
    medians = {a: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for a, rs in rows.items()}
    ratios = {
        f: round(medians["new"][f] / medians["old"][f], 3) if medians["old"][f] else None
        for f in medians["old"]
    }
    doc = {
        "what": "a worker pool's service-side CPU per task on uvloop, its LM a stand-in",
        "against": args.against, "rounds": args.rounds, "rate": args.rate,
        "every_ms": args.every_ms, "mean_ms": args.mean_ms, "seconds": args.seconds,
        "median": medians, "ratio_new_over_old": ratios, "rows": rows,
        "load_average": Path("/proc/loadavg").read_text().split()[:3],
    }  # fmt: skip
    day = datetime.date.today().isoformat()
    out: Path = args.out or HERE / "docs/figures/bench_pool_service" / day / "pool_service.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"median": medians, "ratio_new_over_old": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
