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
import gc
import json
import os
import random
import resource
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


async def _open_pool(state: str) -> tuple[Any, _LmStandIn]:
    """The tree's pool service, open and registered with its stand-in LM."""
    from dataclasses import replace

    from common.config import STATE_ENV, FederationConfig
    from common.ids import LmId
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
    return svc, stand_in


class _Load:
    """Starts as an LM sends them, paced: ``per_batch`` tasks every ``every`` s."""

    def __init__(self, svc: Any, stand_in: _LmStandIn, args: argparse.Namespace) -> None:
        self.svc, self.stand_in = svc, stand_in
        self.every: float = args.every_ms / 1e3
        rate: float = args.rate
        self.per_batch = max(1, round(rate * self.every))
        self.mean_s: float = args.mean_ms / 1e3
        self.rng = random.Random(7)
        self.seq = 0

    def _starts(self) -> Any:
        from common.ids import GmId, JobId, NodeIndex, TaskId, UserId
        from common.messages import StartTask, StartTasks
        from common.model import TaskSpec

        tasks = []
        for _ in range(self.per_batch):
            self.seq += 1
            seq = self.seq
            spec = TaskSpec(task_id=TaskId(f"t{seq}"), job_id=JobId(f"j{seq // 10}"),
                            user=UserId("u0"), demand=(1, 1),
                            duration=self.rng.expovariate(1 / self.mean_s))  # fmt: skip
            tasks.append(StartTask(spec=spec, attempt=1, node=NodeIndex(seq % N_NODES),
                                   gm=GmId("gm0"), queued_at=0.0))  # fmt: skip
        return StartTasks(lm=self.svc.core.lm, epoch=1, tasks=tuple(tasks), sent=-1.0)

    async def run(self, seconds: float) -> int:
        """Send starts for ``seconds``; how many tasks."""
        from common import codec
        from common.messages import StartTasks

        svc, loop = self.svc, asyncio.get_running_loop()
        t0, batches = loop.time(), int(seconds / self.every)
        for b in range(batches):
            msg = codec.decode(codec.encode(self._starts()), expect=StartTasks)
            svc.refusal()  # as the routes ask before they feed
            now = svc.driver.clock()
            for t in msg.tasks:
                self.stand_in.due[t.spec.task_id] = now + t.spec.duration
            answer = svc.driver.feed(msg)
            await svc.durable(msg)
            codec.encode(answer)
            wait = t0 + (b + 1) * self.every - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        return int(batches * self.per_batch)


def _counts(svc: Any, stand_in: _LmStandIn) -> dict[str, float]:
    """What the figures are differences of."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    late, fed = _late(svc)
    return {
        "cpu": time.process_time(), "user": ru.ru_utime, "sys": ru.ru_stime,
        "switches": ru.ru_nvcsw, "finished": svc.core.counters.finished,
        "writes": svc.state.writes if svc.state is not None else 0,
        "posts": stand_in.posts.get("/v1/worker-report", 0), "items": stand_in.items,
        "waited": stand_in.waited[0], "heard": stand_in.waited[1], "late": late, "fed": fed,
    }  # fmt: skip


async def _run(args: argparse.Namespace, state: str) -> dict[str, Any]:
    svc, stand_in = await _open_pool(state)
    load = _Load(svc, stand_in, args)
    await load.run(0.5)  # warm
    await asyncio.sleep(0.5)
    gc.collect()
    c0 = _counts(svc, stand_in)
    n = await load.run(args.seconds)
    while svc.core.counters.finished - c0["finished"] < n:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # the last reports leave
    c1 = _counts(svc, stand_in)
    await svc.close()
    d = {k: c1[k] - c0[k] for k in c0}
    return {
        "us_per_task": round(1e6 * d["cpu"] / n, 2),
        "user_us_per_task": round(1e6 * d["user"] / n, 2),
        "sys_us_per_task": round(1e6 * d["sys"] / n, 2),
        "wakeups_per_task": round(d["switches"] / n, 3),
        "journal_writes_per_task": round(d["writes"] / n, 3),
        "report_posts_per_task": round(d["posts"] / n, 4),
        "reports_per_post": round(d["items"] / max(d["posts"], 1), 2),
        "report_wait_ms": round(1e3 * d["waited"] / max(d["heard"], 1), 3),
        "end_late_ms": round(1e3 * d["late"] / max(d["fed"], 1), 3),
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
    from benchmarks import arms  # (the parent only: an arm imports its own tree)

    arm_args = [
        "--rate", str(args.rate), "--every-ms", str(args.every_ms),
        "--mean-ms", str(args.mean_ms), "--seconds", str(args.seconds),
    ]  # fmt: skip
    rows = arms.run_arms(__file__, args.against, args.rounds, arm_args)
    doc = {
        "what": "a worker pool's service-side CPU per task on uvloop, its LM a stand-in",
        "against": args.against, "rounds": args.rounds, "rate": args.rate,
        "every_ms": args.every_ms, "mean_ms": args.mean_ms, "seconds": args.seconds,
    }  # fmt: skip
    arms.write(doc, rows, args.out, "bench_pool_service", "pool_service.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
