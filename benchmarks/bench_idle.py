"""What an idle federation's processes burn, this tree against another checkout,
alternating in one sitting (issue 35 item 1: what GMs, LMs and pools spend between
tasks).

Each arm is a fresh process with its tree first on ``PYTHONPATH``: it starts that
tree's federation (3 GMs x 3 LMs x 120 nodes, secure defaults), lets it settle, then
reads each role's CPU (user + system, ``/proc``), its system calls and context
switches over ``--seconds`` of no load at all, and stops it.  Figures per role are per
process and per wall second (CPU: milliseconds of CPU per second, 10 = 1% of a core);
each the median over rounds, with the ratio new/old.

    python benchmarks/bench_idle.py --against /work/wt/base --rounds 3 --seconds 30 \\
        --base-port 47400

writes ``docs/figures/bench_idle/<date>/idle.json`` (``--out``).  Needs RabbitMQ
on 127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def _arm(args: argparse.Namespace) -> int:
    sys.path.insert(0, args.tree)
    from benchmarks import bench_live as bl  # the tree's own
    from common.config import parse_config

    cfg = replace(
        parse_config({}), name=f"bench-idle-{os.getpid()}", gms=3, lms=3,
        nodes_per_lm=bl.NODES // 3, base_port=args.base_port,
    ).validate()  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    names = vars(bl)
    names["start_federation"](cfg, home, quiet=True)
    try:
        time.sleep(args.settle)
        pids = bl._pids_by_role(home)
        pids.pop("bench_client", None)
        count = {r: len(ps) for r, ps in pids.items()}
        cpu0, io0, t0 = bl._cpu_by_role(home), bl._io_by_role(home), time.time()
        time.sleep(args.seconds)
        cpu1, io1, t1 = bl._cpu_by_role(home), bl._io_by_role(home), time.time()
    finally:
        names["stop_federation"](home, quiet=True)
        names["purge"](cfg, home)
    wall = t1 - t0
    row: dict[str, Any] = {}
    for role, n in count.items():
        (u0, k0), (u1, k1) = cpu0[role], cpu1[role]
        per = max(n, 1) * wall
        row[role] = {
            "cpu_ms_per_s": round(1e3 * ((u1 - u0) + (k1 - k0)) / per, 3),
            "reads_per_s": round((io1[role][0] - io0[role][0]) / per, 2),
            "writes_per_s": round((io1[role][1] - io0[role][1]) / per, 2),
            "switches_per_s": round((io1[role][2] - io0[role][2]) / per, 2),
        }
    Path(args.arm_out).write_text(json.dumps(row))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the old checkout (a git worktree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30.0, help="idle time measured per arm")
    ap.add_argument("--settle", type=float, default=5.0, help="idle time before measuring")
    ap.add_argument("--base-port", type=int, default=47400)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        return _arm(args)
    from benchmarks import arms  # (the parent only: an arm imports its own tree)

    arm_args = [
        "--seconds", str(args.seconds), "--settle", str(args.settle),
        "--base-port", str(args.base_port),
    ]  # fmt: skip
    rows = arms.run_arms(__file__, args.against, args.rounds, arm_args, cwd_tree=True)
    doc = {
        "what": "idle federation: CPU ms, system calls, switches per process per second",
        "against": args.against, "rounds": args.rounds, "seconds": args.seconds,
    }  # fmt: skip
    arms.write(doc, rows, args.out, "bench_idle", "idle.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
