"""What a loop turn costs after a sleep: the same Python work (a service's message of
N items encoded, decoded and indexed, as a hop does) timed on the CPU clock back to
back and after sleeping GAP between turns, in one process.

On a shared VM a process that sleeps finds its caches, TLB and branch predictors
cold when it wakes (other processes and other guests ran meanwhile), so the first
work of every turn runs slower.  If that penalty is a fixed cost per turn, more work
per wake-up (bigger batches) amortizes it; if it scales with the work, only less work
helps.  The live federation sleeps between most of its messages (``bench_wakes.py``:
~1.2 wake-ups of a Python process per task at 1,000 tasks/s), so this is the floor
under a hop's CPU that no leaner code removes.

    python benchmarks/bench_cold_turns.py --out results/cold_turns.json

Figures: microseconds of process CPU per turn (median of ``--rounds``) for each
(items, gap), the cold penalty (cost after a gap minus back to back) and the ratio.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

ENC = msgspec.msgpack.Encoder()
DEC = msgspec.msgpack.Decoder()


def _message(items: int) -> list[dict[str, Any]]:
    """A launch-like message: one entry per task."""
    return [
        {"task": f"job-{i // 10}/t{i % 10}", "node": i * 7 % 120, "start": 1.5 + i,
         "demand": [1, 512], "user": "alice", "lm": i % 3}
        for i in range(items)
    ]  # fmt: skip


def _turn(msg: list[dict[str, Any]]) -> int:
    """One hop's work on a message: encode, decode, index by task."""
    seen: dict[str, tuple[int, float, list[int]]] = {}
    for x in DEC.decode(ENC.encode(msg)):
        seen[x["task"]] = (x["node"], x["start"] * 2.0, sorted(x["demand"]))
    return len(seen)


def _cpu_per_turn(msg: list[dict[str, Any]], gap_s: float, turns: int) -> float:
    """Median CPU microseconds of one turn, each after sleeping ``gap_s``."""
    costs = []
    for _ in range(turns):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.process_time()
        _turn(msg)
        costs.append(time.process_time() - t0)
    return statistics.median(costs) * 1e6


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/cold_turns.json")
    ap.add_argument("--items", default="1,10,40,160", help="tasks per message, comma-separated")
    ap.add_argument("--gaps-ms", default="0,0.5,2,10,30", help="sleeps between turns (0: none)")
    ap.add_argument("--seconds", type=float, default=1.0, help="sleeping per (items, gap) cell")
    ap.add_argument("--rounds", type=int, default=3)
    return ap


def main() -> int:
    args = _parser().parse_args()
    items = [int(x) for x in args.items.split(",")]
    gaps = [float(x) / 1e3 for x in args.gaps_ms.split(",")]
    cells: dict[tuple[int, float], list[float]] = {}
    for r in range(args.rounds):
        for n in items:
            msg = _message(n)
            for _ in range(200):
                _turn(msg)
            for gap in gaps:
                turns = 2000 if gap == 0 else max(40, int(args.seconds / gap))
                cells.setdefault((n, gap), []).append(_cpu_per_turn(msg, gap, turns))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rows = []
    for n in items:
        warm = statistics.median(cells[(n, 0.0)]) if 0.0 in gaps else None
        for gap in gaps:
            us = statistics.median(cells[(n, gap)])
            row: dict[str, Any] = {"items": n, "gap_ms": gap * 1e3, "cpu_us_per_turn": round(us, 1)}
            if warm is not None:
                row["penalty_us"] = round(us - warm, 1)
                row["over_back_to_back"] = round(us / warm, 2)
            rows.append(row)
            print(f"items {n:4d}  gap {gap * 1e3:5.1f} ms  {us:8.1f} us/turn"
                  + (f"  x{row['over_back_to_back']}" if warm else ""))  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "rounds": args.rounds,
              "rows": rows}  # fmt: skip
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
