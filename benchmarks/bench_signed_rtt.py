"""CPU of one signed request and its answer, both ends, on loopback: a ``Peer`` (the
LM's ``runtime.h1`` client: signs each call, checks each answer's signature) posting
to a worker pool's app served by ``runtime.http.ServiceRunner`` (the lean path), both
in one process on one uvloop, so ``time.process_time`` over a batch counts the client,
the server and the loopback's system calls alike.  This tree against another checkout,
alternating in one sitting, each arm a fresh process with its tree first on
``sys.path`` (``tests.lean_service``'s app and scripted core, from that tree).

    python benchmarks/bench_signed_rtt.py --against /work/wt/base --rounds 6

Figures: microseconds of CPU per round trip (median over rounds) and new/old.  With
``--profile FILE`` one arm of this tree runs under cProfile instead (stats to FILE).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


async def _arm_main(args: argparse.Namespace) -> dict[str, float]:
    from aiohttp import web

    from runtime import http
    from tests.lean_service import LM0, POOL, Pool, pool_app, stop_tasks

    class Quick(Pool):
        async def durable(self, msg: object) -> None:
            """Nothing to wait for (a pool's journal written, a GM's nothing)."""

    runner = http.ServiceRunner(pool_app(Pool() if args.waits else Quick()), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    client = http.session()
    peer = http.Peer(POOL, f"http://127.0.0.1:{port}", LM0, client)
    msg = stop_tasks("echo", n=args.tasks)
    concurrency = max(1, args.concurrency)

    async def calls(n: int) -> None:
        for _ in range(n):
            await peer.post("/v1/stop", msg, expect=type(msg))

    async def batch(n: int) -> Any:
        per = n // concurrency
        gc.collect()
        t0 = time.process_time()
        await asyncio.gather(*(calls(per) for _ in range(concurrency)))
        return (time.process_time() - t0) / (per * concurrency)

    await batch(500)  # warm: the connection open, the incarnation learnt, code loaded
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    spent = [await batch(args.requests) for _ in range(args.batches)]
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    await client.close()
    await runner.cleanup()
    return {"us_per_request": round(1e6 * statistics.median(spent), 2)}


def _arm(args: argparse.Namespace) -> int:
    sys.path.insert(0, args.tree)
    import uvloop

    uvloop.install()
    row = asyncio.run(_arm_main(args))
    if args.arm_out:
        Path(args.arm_out).write_text(json.dumps(row))
    else:
        print(json.dumps(row))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="the old checkout (a git worktree)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=2000, help="round trips per batch")
    ap.add_argument("--batches", type=int, default=3, help="batches per arm (median)")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per StopTasks message")
    ap.add_argument("--concurrency", type=int, default=1, help="calls in flight at once")
    ap.add_argument("--waits", action="store_true",
                    help="the service waits a turn of the loop before it answers (an LM's "
                    "launches and reports wait for what they sent); default: it does not "
                    "(a pool's starts)")  # fmt: skip
    ap.add_argument("--profile", help="run this tree once under cProfile, stats to this file")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=str(HERE), help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm or args.profile:
        return _arm(args)
    if not args.against:
        ap.error("--against is required (or --profile)")
    from benchmarks import arms  # (the parent only: an arm imports its own tree)

    arm_args = [
        "--requests", str(args.requests), "--batches", str(args.batches),
        "--tasks", str(args.tasks), "--concurrency", str(args.concurrency),
        *(["--waits"] if args.waits else []),
    ]  # fmt: skip
    rows = arms.run_arms(__file__, args.against, args.rounds, arm_args)
    doc = {
        "what": "CPU per signed round trip on loopback, client (Peer, runtime.h1) and server "
        "(ServiceRunner, lean path) in one process (bench_signed_rtt)",
        "against": args.against, "rounds": args.rounds, "requests": args.requests,
        "batches": args.batches, "tasks": args.tasks, "concurrency": args.concurrency,
        "waits": args.waits,
    }  # fmt: skip
    arms.write(doc, rows, args.out, "bench_signed_rtt", "signed_rtt.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
