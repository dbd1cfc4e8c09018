"""How close the dashboard's allocation-time figures come to the measured ones.

Starts a small federation (2 GMs, 2 LMs of 8 one-slot nodes) and its dashboard, runs
``megha bench`` at a few loads, and after each reads the dashboard's snapshot: its
allocation figures (from the times the GMs list, docs/dashboard.md) beside the
bench's measured allocation times of the same tasks.  Loads are a minute apart, so
each reading covers one load only.

    python benchmarks/bench_dashboard.py --out results/bench_dashboard.json

Needs RabbitMQ on 127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig
from federation.processes import start_dashboard, start_federation, stop_federation
from federation.provision import purge
from megha_cli.dashboard.aggregate import WINDOW_S
from megha_cli.dashboard.server import dashboard_token
from request_generator.bench import BenchOptions, bench

LOADS = (("light", 2.0), ("busy", 8.0), ("overloaded", 12.0))
"""(label, jobs/s) of 3 tasks of 0.5 s each on 16 slots: 19%, 75%, 112% of capacity."""
SECONDS = 20.0


def _config(base: int) -> FederationConfig:
    """Every process's port in [base, base + 30)."""
    addresses = {
        **{f"gm{i}": f"127.0.0.1:{base + i}" for i in range(2)},
        **{f"lm{j}": f"127.0.0.1:{base + 10 + j}" for j in range(2)},
        **{f"lm{j}-workers": f"127.0.0.1:{base + 20 + j}" for j in range(2)},
    }
    return replace(
        FederationConfig(), name="bench-dash", gms=2, lms=2, nodes_per_lm=8, base_port=base,
        addresses=addresses,
    ).validate()  # fmt: skip


def _snapshot(port: int, home: Path) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {dashboard_token(home)}"}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/snapshot", headers=auth)
    with urllib.request.urlopen(req, timeout=5) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="results/bench_dashboard.json")
    ap.add_argument("--base-port", type=int, default=19300)
    ap.add_argument("--dashboard-port", type=int, default=19399)
    args = ap.parse_args()
    cfg = _config(args.base_port)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-dash-") as tmp:
        home = Path(tmp) / "home"
        start_federation(cfg, home, quiet=True)
        try:
            start_dashboard(cfg, home, args.dashboard_port)
            for k, (label, rate) in enumerate(LOADS):
                if k:
                    time.sleep(WINDOW_S + 2)  # the last load leaves the window
                opts = BenchOptions(
                    jobs=int(rate * SECONDS), tasks_per_job=3, mean_duration=0.5, job_rate=rate,
                    out=str(Path(tmp) / label), progress=False, timeout_s=120,
                )  # fmt: skip
                s = bench(cfg, opts, home)
                time.sleep(2.5)  # two more polls
                a = _snapshot(args.dashboard_port, home)["allocation"]
                measured = s["allocation_time_s"]
                rows.append(
                    {
                        "load": label,
                        "jobs_per_s": rate,
                        "tasks": s["tasks"],
                        "measured_s": {k: measured[k] for k in ("p50", "p99", "mean")},
                        "measured_queueing_s": {
                            k: s["components_s"]["queueing"][k] for k in ("p50", "p99", "mean")
                        },
                        "dashboard_s": {"p50": a["p50_s"], "p99": a["p99_s"], "mean": a["mean_s"]},
                        "dashboard_tasks": a["tasks"],
                    }
                )
                print(json.dumps(rows[-1]))
        finally:
            stop_federation(home, quiet=True)
            purge(cfg, home)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"loads": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
