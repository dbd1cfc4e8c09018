"""Cost of the pure cores' operations on one CPU: the figures behind SimConfig's defaults.

For each partition size, ``simulator.costs.measure`` times a GM decision, an LM
validation, the fixed cost of a message at the GM and at the LM, and a state update
per node -- once for the core alone (what the simulator charges by default) and once
with the codec around it (what a live service pays).  Writes JSON to --out.

    python benchmarks/bench_core.py --out results/bench_core.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simulator.costs import measure


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--partitions", default="100,1000,5000", help="nodes per partition, comma-separated"
    )
    ap.add_argument("--repeats", type=int, default=3, help="rounds per partition size")
    ap.add_argument("--batch", type=int, default=500, help="tasks per round")
    ap.add_argument("--out", default="results/bench_core.json")
    args = ap.parse_args(argv)
    rows = []
    for n in (int(x) for x in args.partitions.split(",")):
        for wire in (False, True):
            print(
                f"partition {n:,} nodes, {'with codec' if wire else 'core alone'} ...",
                file=sys.stderr,
            )
            rows.append(measure(n, args.repeats, args.batch, wire=wire).as_dict())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"costs": rows}, indent=2))
    head = f"{'nodes':>6} {'wire':>5} {'decision':>9} {'validate':>9} {'gm msg':>8} {'lm msg':>8} {'upd/node':>9}"
    print(head + "   (microseconds)")
    for r in rows:
        print(
            f"{r['partition_nodes']:>6} {'yes' if r['wire'] else 'no':>5} "
            f"{r['gm_decision_s'] * 1e6:>9.2f} {r['lm_validation_s'] * 1e6:>9.2f} "
            f"{r['gm_message_s'] * 1e6:>8.2f} {r['lm_message_s'] * 1e6:>8.2f} "
            f"{r['update_node_s'] * 1e6:>9.3f}"
        )
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
