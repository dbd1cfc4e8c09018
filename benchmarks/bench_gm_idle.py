"""An idle federation's GM CPU: the cost of a GM with no load (issue 35 item 1: what
a GM spends between tasks).  Starts the federation ``bench_live`` measures (3 GMs x
3 LMs x 120 nodes), waits for it to settle, then reads the GMs' CPU (``/proc``, user +
system) and their voluntary context switches over ``--seconds``; with ``--against
TREE``, the same in a fresh process of that tree, alternating (old, new, new, old...).

    python benchmarks/bench_gm_idle.py --against /work/wt/base --rounds 2 \\
        --seconds 30 --base-port 47250 --out FILE

Not part of the test suite.  Needs RabbitMQ on 127.0.0.1:5672.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def _switches(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    return 0


def _arm(tree: str, seconds: float, base_port: int, settle_s: float) -> dict[str, Any]:
    """One idle measurement of ``tree`` (its services: ``PYTHONPATH``)."""
    sys.path.insert(0, tree)
    from benchmarks.bench_live import NODES, _cpu_s, _pids_by_role
    from common.config import parse_config
    from federation.processes import start_federation, stop_federation
    from federation.provision import purge

    cfg = replace(
        parse_config({}), name=f"bench-idle-{os.getpid()}", gms=3, lms=3,
        nodes_per_lm=NODES // 3, base_port=base_port,
    ).validate()  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    start_federation(cfg, home)
    try:
        time.sleep(settle_s)
        pids = _pids_by_role(home)["gm"]
        c0 = [sum(_cpu_s(p)) for p in pids]
        s0 = [_switches(p) for p in pids]
        t0 = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        c1 = [sum(_cpu_s(p)) for p in pids]
        s1 = [_switches(p) for p in pids]
    finally:
        stop_federation(home)
        purge(cfg, home)
    per_gm = [(b - a) / wall for a, b in zip(c0, c1, strict=True)]
    return {
        "gm_core_share_pct": round(100 * statistics.mean(per_gm), 3),
        "gm_core_share_pct_each": [round(100 * x, 3) for x in per_gm],
        "gm_switches_per_s": round(
            statistics.mean((b - a) / wall for a, b in zip(s0, s1, strict=True)), 2
        ),
        "wall_s": round(wall, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--against", help="another checkout, measured alternating")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--base-port", type=int, default=47250)
    p.add_argument("--out")
    p.add_argument("--arm", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        print(json.dumps(_arm(args.arm, args.seconds, args.base_port, args.settle)))
        return 0
    trees = {"new": str(HERE)}
    if args.against:
        trees["old"] = str(Path(args.against).resolve())
    order = ["new"] if not args.against else []
    for r in range(args.rounds if args.against else 1):
        order += ["old", "new"] if r % 2 == 0 else ["new", "old"]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for arm in order:
        tree = trees[arm]
        hook = os.environ.get("GM_IDLE_HOOK")  # e.g. benchmarks/cpu_profile_hook
        env = {**os.environ, "PYTHONPATH": f"{hook}:{tree}" if hook else tree}
        out = subprocess.run(
            [sys.executable, __file__, "--arm", tree,
             "--seconds", str(args.seconds), "--settle", str(args.settle),
             "--base-port", str(args.base_port)],
            env=env, cwd=tree, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        row = json.loads(out.strip().splitlines()[-1])
        row["tree"] = tree
        runs[arm].append(row)
        print(arm, row, flush=True)
    med = {
        k: {
            "gm_core_share_pct": statistics.median(r["gm_core_share_pct"] for r in v),
            "gm_switches_per_s": statistics.median(r["gm_switches_per_s"] for r in v),
        }
        for k, v in runs.items()
    }
    result: dict[str, Any] = {"order": order, "runs": runs, "median": med}
    if "old" in med:
        result["new_over_old"] = {
            k: round(med["new"][k] / med["old"][k], 3) if med["old"][k] else None
            for k in med["new"]
        }
    print(json.dumps(result.get("new_over_old", med)))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
