"""What one hop costs with each HTTP client: aiohttp's ClientSession against the
services' own ``runtime.h1.Client``, both posting to the same aiohttp server in another
process (uvloop on both sides, as under gunicorn).

Each round sends ``--samples`` POSTs of a 300-byte body, spaced ``--gap-ms`` apart (a
lone task's hop: both processes idle in between), then as many back to back (the
usual floor), first with one client, then the other; rounds alternate which goes
first, so a noisy spell of the shared host falls on both.

    python benchmarks/bench_hop.py --out results/bench_hop.json

Figures are round-trip times in ms (p50/p90/p99 over all rounds) and the ratio
h1/aiohttp of each p50.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop
from aiohttp import web

from common.metrics import percentiles
from runtime import h1

BODY = b"x" * 300
Post = Callable[[str], Awaitable[bytes]]


def _serve(port: int) -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_post("/echo", echo)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _series(post: Post, url: str, n: int, gap_s: float) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await post(url)
        out.append(time.perf_counter() - t0)
        if gap_s:
            await asyncio.sleep(gap_s)
    return out


async def _run(args: argparse.Namespace, url: str) -> dict[str, object]:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit_per_host=16, keepalive_timeout=240),
        timeout=aiohttp.ClientTimeout(total=10),
    )
    client = h1.Client(limit_per_host=16, keepalive_s=240.0, timeout_s=10.0)

    async def via_aiohttp(u: str) -> bytes:
        async with session.post(u, data=BODY) as resp:
            return await resp.read()

    async def via_h1(u: str) -> bytes:
        return (await client.post(u, BODY, {})).body

    clients: dict[str, Post] = {"aiohttp": via_aiohttp, "h1": via_h1}
    times: dict[str, dict[str, list[float]]] = {
        name: {"spaced": [], "back_to_back": []} for name in clients
    }
    for post in clients.values():  # warm both: connections open, code paths loaded
        await _series(post, url, 50, 0.0)
    for r in range(args.rounds):
        order = list(clients) if r % 2 == 0 else list(reversed(clients))
        for name in order:
            times[name]["spaced"] += await _series(
                clients[name], url, args.samples, args.gap_ms / 1e3
            )
            times[name]["back_to_back"] += await _series(clients[name], url, args.samples, 0.0)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    await session.close()
    await client.close()
    figures: dict[str, object] = {
        name: {
            kind: {k: round(v * 1e3, 4) for k, v in percentiles(xs).items()}
            for kind, xs in by_kind.items()
        }
        for name, by_kind in times.items()
    }
    figures["h1_over_aiohttp_p50"] = {
        kind: round(
            percentiles(times["h1"][kind])["p50"] / percentiles(times["aiohttp"][kind])["p50"], 3
        )
        for kind in ("spaced", "back_to_back")
    }
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="results/bench_hop.json", help="where the JSON goes")
    ap.add_argument("--samples", type=int, default=200, help="POSTs per client per kind per round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, alternating the clients' order")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="pause between spaced POSTs")
    args = ap.parse_args()
    port = _free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        for _ in range(100):  # bounded: 10 s for the server to listen
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("bench_hop: the echo server did not start")
        uvloop.install()
        figures = asyncio.run(_run(args, f"http://127.0.0.1:{port}/echo"))
    finally:
        server.terminate()
        server.join(5)
    result = {
        "what": "HTTP round trip, ms, aiohttp server in another process; 300-byte POSTs",
        "samples_per_kind": args.samples * args.rounds,
        "gap_ms": args.gap_ms,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **figures,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(figures["h1_over_aiohttp_p50"]), f"-> {out}")


if __name__ == "__main__":
    main()
