"""Two trees measured alternating in one sitting: the harness the per-lever benchmarks
share (``bench_lm_pool``, ``bench_idle``, ``bench_pool_service``, ``bench_signed_rtt``).

Each arm is a fresh process running the calling script with ``--arm NAME --tree TREE
--arm-out FILE`` and that tree first on ``PYTHONPATH``; it writes one JSON row.  Arms go
old, new, new, old, old, new... so a noisy spell of the shared host falls on both.  A
row's values are numbers, or one level of dicts of numbers (per role); medians and
ratios (new / old, ``None`` where old is 0) keep that shape.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent

Rows = dict[str, list[dict[str, Any]]]


def run_arms(
    script: str, against: str, rounds: int, arm_args: Sequence[str], *, cwd_tree: bool = False
) -> Rows:
    """Each tree's rows, ``rounds`` of each, alternating (``cwd_tree``: each arm runs in
    its tree, as a federation started there writes its state beside it)."""
    trees = {"old": str(Path(against).resolve()), "new": str(HERE)}
    rows: Rows = {"old": [], "new": []}
    order = [("old", "new") if k % 2 == 0 else ("new", "old") for k in range(rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        for k, pair in enumerate(order):
            for arm in pair:
                arm_out = f"{tmp}/{arm}-{k}.json"
                cmd = [sys.executable, script, "--arm", arm, "--tree", trees[arm],
                       "--arm-out", arm_out, "--against", against, *arm_args]  # fmt: skip
                env = {**os.environ, "PYTHONPATH": trees[arm]}
                subprocess.run(cmd, check=True, env=env, cwd=trees[arm] if cwd_tree else None)
                rows[arm].append(json.loads(Path(arm_out).read_text()))
                print(arm, k, json.dumps(rows[arm][-1]), file=sys.stderr, flush=True)
    return rows


def medians(rows: Rows) -> dict[str, dict[str, Any]]:
    """Each arm's median of every value (per key of a nested dict too)."""

    def med(rs: list[dict[str, Any]]) -> dict[str, Any]:
        first = rs[0]
        return {
            f: med([r[f] for r in rs]) if isinstance(first[f], dict)
            else statistics.median(r[f] for r in rs)
            for f in first
        }  # fmt: skip

    return {arm: med(rs) for arm, rs in rows.items()}


def ratios(med: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """new / old of every median, rounded (``None`` where old is 0)."""

    def ratio(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
        return {
            f: ratio(new[f], v) if isinstance(v, dict)
            else (round(new[f] / v, 3) if v else None)
            for f, v in old.items()
        }  # fmt: skip

    return ratio(med["new"], med["old"])


def write(doc: dict[str, Any], rows: Rows, out: Path | None, bench: str, name: str) -> Path:
    """``doc`` with the rows, their medians and ratios and the load average, as JSON to
    ``out`` (default ``docs/figures/<bench>/<date>/<name>``); the summary to stdout."""
    med = medians(rows)
    summary = {"median": med, "ratio_new_over_old": ratios(med)}
    doc = {**doc, **summary, "rows": rows,
           "load_average": Path("/proc/loadavg").read_text().split()[:3]}  # fmt: skip
    day = datetime.date.today().isoformat()
    path = out or HERE / "docs/figures" / bench / day / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return path
