"""A connection flood against a live LM: what clients without credentials hold of it.

Starts its own federation (1 GM, 1 LM, 10 nodes; gunicorn processes, the real broker),
then ``--clients`` processes each open up to ``--connections`` TCP connections to the
LM's port as fast as they can and keep them open, sending nothing, for ``--seconds``.
Once a second the operator pings the LM (a signed call on a new connection, as a peer
that connects afresh would), and the LM's open file descriptors are counted.

    python benchmarks/bench_flood.py --out results/bench_flood.json

The JSON has one row per second: connections opened so far, the LM's descriptors, and
the ping's round trip in seconds or the error.  A service holds at most
``runtime.http.MAX_UNPROVEN`` connections without a proven caller; every loop is bounded
by ``--connections`` and ``--seconds``.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig, parse_config
from federation.processes import running_federation, service_pids
from request_generator.bench import measure_floor
from runtime import h1
from security.access import Access
from security.identity import lm as lm_identity


def _flood(port: int, connections: int, seconds: float, opened: Any) -> None:
    """Open up to ``connections`` connections to ``port`` and hold them ``seconds``."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    socks: list[socket.socket] = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            for _ in range(min(200, connections - len(socks))):
                s = socket.socket()
                s.setblocking(False)
                try:
                    s.connect_ex(("127.0.0.1", port))
                except OSError:  # out of descriptors or local ports: hold what is open
                    s.close()
                    break
                socks.append(s)
            opened.value = len(socks)
            time.sleep(0.01)
    finally:
        for s in socks:
            s.close()


def _descriptor_limit(pid: int) -> int:
    """The process's soft limit of open files (``/proc/PID/limits``); 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


async def _ping(cfg: FederationConfig, access: Access) -> float | str:
    """The operator's signed ping to the LM on a new connection: its round trip in
    seconds, or ``"no answer"``."""
    client = h1.Client(limit_per_host=1, timeout_s=2.0)
    try:
        rtts = await measure_floor(client, cfg.lm_url("lm0"), access, lm_identity("lm0"), 1)
    finally:
        await client.close()
    return rtts[0] if rtts else "no answer"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench_flood.json")
    ap.add_argument("--base-port", type=int, default=21000)
    ap.add_argument("--clients", type=int, default=2, help="flooding processes")
    ap.add_argument(
        "--connections", type=int, default=12000, help="connections each client holds at most"
    )
    ap.add_argument("--seconds", type=float, default=12.0, help="how long the flood lasts")
    return ap


def _watch(
    cfg: FederationConfig, access: Access, lm_pid: int, counts: list[Any], seconds: float
) -> list[dict[str, Any]]:
    """Once a second for ``seconds``: connections opened, the LM's descriptors, a ping."""
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        ping = asyncio.run(_ping(cfg, access))
        row = {
            "t_s": round(time.monotonic() - t0, 2),
            "opened": sum(c.value for c in counts),
            "lm_descriptors": _descriptors(lm_pid),
            "ping": ping,
        }
        rows.append(row)
        shown = f"{ping * 1e3:.2f} ms" if isinstance(ping, float) else ping
        print(f"t={row['t_s']:5.1f}s opened {row['opened']:6d}  LM descriptors "
              f"{row['lm_descriptors']:6d}  ping {shown}", flush=True)  # fmt: skip
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0) % 1.0))
    return rows


def main() -> int:
    args = _parser().parse_args()
    if args.clients < 1 or args.connections < 1 or not 0 < args.seconds <= 600:
        raise SystemExit("need --clients >= 1, --connections >= 1, 0 < --seconds <= 600")
    cfg = replace(
        parse_config({}), name=f"bench-flood-{os.getpid()}", gms=1, lms=1, nodes_per_lm=10,
        base_port=args.base_port,
    ).validate()  # fmt: skip
    with running_federation(cfg) as home:
        access = Access.in_home(home, cfg)
        lm_pid = service_pids(home)["lm0"]
        limit = _descriptor_limit(lm_pid)
        port = int(cfg.lm_url("lm0").rsplit(":", 1)[1])
        counts = [multiprocessing.Value("i", 0) for _ in range(args.clients)]
        floods = [
            multiprocessing.Process(target=_flood, args=(port, args.connections, args.seconds, c))
            for c in counts
        ]
        for p in floods:
            p.start()
        rows = _watch(cfg, access, lm_pid, counts, args.seconds)
        for p in floods:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    failed = sum(1 for r in rows if not isinstance(r["ping"], float))
    result = {
        "clients": args.clients,
        "connections_per_client": args.connections,
        "lm_descriptor_limit": limit,
        "max_lm_descriptors": max((r["lm_descriptors"] for r in rows), default=0),
        "pings": len(rows),
        "pings_failed": failed,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}: LM descriptors at most {result['max_lm_descriptors']}, "
          f"{failed} of {len(rows)} pings failed")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
