"""What TLS on internal HTTP costs per task: ``bench_live.py`` with ``tls = "on"`` and
``tls = "off"``, alternating in one sitting (off, on, on, off, ... so a drift of the
machine's load weighs on both), and the ratios of on to off.

    python benchmarks/bench_tls.py --pairs 2 --rates 500 --seconds 8 --out results/bench_tls

Writes ``OUT/run<i>-<tls>.json`` (each ``bench_live`` run) and ``OUT/bench_tls.json``:
per run the allocation p50/p99 at 50% load and at each rate, the floor round trip
(one signed empty POST to an LM) back to back and spaced, CPU ms per task per role;
then the median of each over the runs of each mode and the ratio on/off.  The broker
stays on the shared 127.0.0.1:5672 in clear (AMQPS needs a TLS listener there, which
this machine's shared broker must not get): the figures are HTTP's cost only.

Needs RabbitMQ on 127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _figures(run: dict[str, Any]) -> dict[str, float]:
    """The figures compared: milliseconds (allocation, floors) and CPU ms per task."""
    out: dict[str, float] = {}
    steps = {"load50": run["load50"], **{r["label"]: r for r in run["ramp"]}}
    for name, row in steps.items():
        out[f"{name}.p50_ms"] = 1e3 * row["allocation_s"]["p50"]
        out[f"{name}.p99_ms"] = 1e3 * row["allocation_s"]["p99"]
        out[f"{name}.floor_ms"] = 1e3 * row["floor_rtt_s"]
        out[f"{name}.tasks_per_s"] = row["throughput_tasks_per_s"]
        for role, ms in row["cpu_ms_per_task"].items():
            out[f"{name}.cpu_ms_per_task.{role}"] = ms
    spaced = run["floor_spaced"]
    out["idle.floor_back_to_back_p50_ms"] = 1e3 * spaced["back_to_back_s"]["p50"]
    out["idle.floor_spaced_p50_ms"] = 1e3 * spaced["spaced_s"]["p50"]
    return out


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per mode and on/off ratios of every figure."""
    by_mode: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for r in runs:
        by_mode[r["tls"]].append(r["figures"])
    med = {
        mode: {k: round(statistics.median(f[k] for f in figs), 4) for k in figs[0]}
        for mode, figs in by_mode.items()
        if figs
    }
    ratio = {
        k: round(med["on"][k] / med["off"][k], 3)
        for k in med.get("on", {})
        if k in med.get("off", {}) and med["off"][k] > 0
    }
    return {"median": med, "ratio_on_over_off": ratio}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench_tls")
    ap.add_argument("--pairs", type=int, default=2, help="on/off pairs (off,on,on,off,...)")
    ap.add_argument("--rates", default="500", help="bench_live's ramp steps (tasks/s)")
    ap.add_argument("--seconds", type=float, default=8.0, help="submission time per step")
    ap.add_argument("--base-port", type=int, default=18800)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    order = [m for i in range(args.pairs) for m in (("off", "on") if i % 2 == 0 else ("on", "off"))]
    runs: list[dict[str, Any]] = []
    for i, mode in enumerate(order):
        path = out / f"run{i}-{mode}.json"
        argv = [
            sys.executable, str(HERE / "bench_live.py"), "--out", str(path),
            "--rates", args.rates, "--seconds", str(args.seconds), "--no-ramp-stop",
            "--base-port", str(args.base_port), "--set", f'tls="{mode}"',
        ]  # fmt: skip
        print(f"run {i}: tls {mode}", flush=True)
        t0 = time.time()
        subprocess.run(argv, check=True, env=os.environ.copy())
        run = json.loads(path.read_text())
        runs.append(
            {
                "run": i,
                "tls": mode,
                "wall_s": round(time.time() - t0, 1),
                "loadavg": run["machine"]["loadavg_before"],
                "figures": _figures(run),
            }
        )
    doc = {
        "command": " ".join(sys.argv),
        "order": order,
        "machine": {"cpus": os.cpu_count(), "loadavg_after": os.getloadavg()},
        "runs": runs,
        **_summary(runs),
    }
    (out / "bench_tls.json").write_text(json.dumps(doc, indent=2) + "\n")
    r = doc["ratio_on_over_off"]
    for k in sorted(r):
        if k.endswith(("p50_ms", "p99_ms", "cpu_ms_per_task.total")) or k.startswith("idle"):
            on, off = doc["median"]["on"][k], doc["median"]["off"][k]
            print(f"{k:>40}: off {off:9.3f}  on {on:9.3f}  on/off {r[k]:.3f}")
    print(f"wrote {out / 'bench_tls.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
