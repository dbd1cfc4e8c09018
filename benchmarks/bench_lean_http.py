"""What one signed POST to a message route costs the server: the lean path
(``runtime.fastpath``) against aiohttp's path, the same app either way.

Two server processes (uvloop, as under gunicorn) serve a worker pool's app
(``tests.lean_service``: ``service_app``, its routes and middlewares, a scripted core),
one by ``ServiceRunner(lean=True)``, one by ``lean=False``.  A ``Peer`` (the LM's
client: signs each call, checks each answer's signature) posts ``--samples`` calls back
to back to one, then to the other; rounds alternate which goes first, so a noisy spell
of the shared host falls on both.  The server's CPU (user + system, from /proc) over
each batch, divided by its calls, is the figure; the round trip's p50 is a by-product.

    python benchmarks/bench_lean_http.py --out results/bench_lean_http.json

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import uvloop
from aiohttp import web

from common.messages import StopTasks
from runtime import h1, http
from security.access import Access
from security.identity import OPERATOR as OPERATOR_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' service, from a checkout
from tests.lean_service import CFG, LM0, POOL, SECRET, pool_app, stop_tasks

OPERATOR = Access(OPERATOR_ID, CFG, SECRET)

ARMS = ("lean", "aiohttp")


def _serve(port: int, lean: bool) -> None:
    async def main() -> None:
        runner = http.ServiceRunner(pool_app(), lean=lean, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.install()
    asyncio.run(main())


def _wait_listening(port: int) -> None:
    for _ in range(100):  # bounded: 10 s for a server to listen
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"bench_lean_http: no server on port {port}")


def _cpu(pid: int) -> float:
    """The process's CPU seconds so far, user and system (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _batch(peer: http.Peer, msg: StopTasks | None, n: int) -> list[float]:
    """``n`` calls back to back: ``msg`` to ``/v1/stop`` as the LM, or (None) the
    operator's empty ``/v1/ping``, the floor ``megha bench`` measures."""
    rtts = []
    for _ in range(n):
        t0 = time.perf_counter()
        if msg is not None:
            await peer.post("/v1/stop", msg, expect=StopTasks)
        else:
            headers = OPERATOR.sign(POOL, "POST", "/v1/ping", b"", time.time())
            answer = await peer.http.post(peer.urls[0] + "/v1/ping", b"", headers)
            if answer.status != 200:
                raise SystemExit(f"bench_lean_http: a ping answered {answer.status}")
        rtts.append(time.perf_counter() - t0)
    return rtts


async def _run(
    args: argparse.Namespace, ports: dict[str, int], pids: dict[str, int]
) -> dict[str, object]:
    client = h1.Client(limit_per_host=4, keepalive_s=240.0, timeout_s=10.0)
    peers = {arm: http.Peer(POOL, f"http://127.0.0.1:{ports[arm]}", LM0, client) for arm in ARMS}
    msg = None if args.ping else stop_tasks("echo", n=args.tasks)
    for arm in ARMS:  # warm: connections open, incarnations learnt, code loaded
        await _batch(peers[arm], msg, 200)
    cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
    rtt: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm in ARMS if r % 2 == 0 else tuple(reversed(ARMS)):
            c0 = _cpu(pids[arm])
            rtt[arm] += await _batch(peers[arm], msg, args.samples)
            cpu[arm].append((_cpu(pids[arm]) - c0) / args.samples)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    await client.close()
    per_call = {arm: statistics.median(cpu[arm]) * 1e6 for arm in ARMS}
    return {
        "server_cpu_us_per_call_median": {a: round(v, 1) for a, v in per_call.items()},
        "server_cpu_us_per_call_rounds": {a: [round(x * 1e6, 1) for x in cpu[a]] for a in ARMS},
        "lean_over_aiohttp_cpu": round(per_call["lean"] / per_call["aiohttp"], 3),
        "rtt_p50_ms": {a: round(statistics.median(rtt[a]) * 1e3, 4) for a in ARMS},
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="results/bench_lean_http.json", help="where the JSON goes")
    ap.add_argument("--samples", type=int, default=2000, help="calls per arm per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds, alternating the arms' order")
    ap.add_argument("--tasks", type=int, default=4, help="tasks per StopTasks message")
    ap.add_argument("--base-port", type=int, default=42100, help="the two servers' first port")
    ap.add_argument("--ping", action="store_true", help="the operator's /v1/ping instead")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("spawn")
    ports = {arm: args.base_port + i for i, arm in enumerate(ARMS)}
    servers = {
        arm: ctx.Process(target=_serve, args=(ports[arm], arm == "lean"), daemon=True)
        for arm in ARMS
    }
    for proc in servers.values():
        proc.start()
    try:
        for port in ports.values():
            _wait_listening(port)
        uvloop.install()
        pids = {arm: int(proc.pid or 0) for arm, proc in servers.items()}
        figures = asyncio.run(_run(args, ports, pids))
    finally:
        for proc in servers.values():
            proc.terminate()
            proc.join(5)
    result = {
        "what": "server CPU per signed POST to "
        + ("/v1/ping (the floor)" if args.ping else "a message route")
        + ": lean path vs aiohttp's path",
        "args": vars(args),
        "loadavg": os.getloadavg(),
        **figures,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
