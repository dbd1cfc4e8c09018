"""Live CPU per task, this tree against another checkout, alternating in one sitting
(issue 35 item 1).

Each arm is a fresh process run with its own tree first on ``PYTHONPATH``: it imports
that tree's ``benchmarks/bench_live.py`` (services, client and measurement are that
tree's own), starts its federation (3 GMs x 3 LMs x 120 nodes, secure defaults), runs
a warm-up step, then ``bench_live``'s step at the rate asked, and stops.  Arms go
old, new, new, old, old, new... so a noisy spell of the shared host falls on both.

Two CPU figures per role (from ``/proc``, user + system):

* ``step``: ``bench_live``'s own, over the whole ``bench()`` call: the floor pings
  before the run, the run, the state pages and the client's summary and plots after;
* ``run``: from the first job's publication to the last task's outcome only (the
  client's ``_submit_all`` and ``_wait_done`` wrapped in both trees), what the
  federation spends on the tasks themselves.

    python benchmarks/bench_cpu_halving.py --against /work/wt/live-old --rounds 2 \\
        --rate 1000 --seconds 10 --then 3000

writes ``docs/figures/bench_live/<date>/cpu_halving.json`` (``--out``).  ``--then R``
runs one more step at R tasks/s on this tree after the rounds (sustained: nothing
lost, >= 90% of R placed, allocation p99 <= 50 ms).  Needs RabbitMQ on 127.0.0.1:5672.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def _arm(args: argparse.Namespace) -> int:
    """One arm, in this process (its tree first on ``sys.path``): a federation, a
    warm-up, the measured steps, the rows as JSON on ``--arm-out``."""
    from dataclasses import replace

    sys.path.insert(0, args.tree)
    from benchmarks import bench_live as bl  # the tree's own
    from common.config import parse_config
    from request_generator import bench as rg

    window: dict[str, Any] = {}
    home_box: list[Path] = []
    submit_all, wait_done = rg._submit_all, rg._wait_done

    async def timed_submit(*a: Any, **kw: Any) -> Any:
        window["cpu0"] = bl._cpu_by_role(home_box[0])
        window["t0"] = time.time()
        return await submit_all(*a, **kw)

    async def timed_wait(*a: Any, **kw: Any) -> Any:
        try:
            return await wait_done(*a, **kw)
        finally:
            window["cpu1"] = bl._cpu_by_role(home_box[0])
            window["t1"] = time.time()

    rg._submit_all = timed_submit
    rg._wait_done = timed_wait
    cfg = replace(
        parse_config({}), name=f"bench-halving-{os.getpid()}", gms=3, lms=3,
        nodes_per_lm=bl.NODES // 3, base_port=args.base_port,
    ).validate()  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    home_box.append(home)
    where = Path(tempfile.mkdtemp(prefix="halving-steps-"))
    rows: list[dict[str, Any]] = []
    traffic: dict[str, dict[str, int]] = {}
    # the tree's own (megha_cli.federation in older trees, federation.processes now)
    names = vars(bl)
    names["start_federation"](cfg, home)
    try:
        steps = [("warmup", args.rate, 3.0, False)]
        steps += [(f"rate{int(r)}", r, args.seconds, True) for r in args.rates]
        for label, rate, seconds, keep in steps:
            per_job = 10
            row = bl._step(
                cfg, home, where, label, traffic, jobs=int(rate * seconds / per_job),
                tasks_per_job=per_job, mean_duration=0.02, rate=rate / per_job,
                timeout_s=120.0, profile=keep and args.profile,
            )  # fmt: skip
            if not keep:
                continue
            used = {
                r: (u - window["cpu0"][r][0]) + (k - window["cpu0"][r][1])
                for r, (u, k) in window["cpu1"].items()
            }
            n = max(row["tasks"], 1)
            row["run_cpu_ms_per_task"] = {r: round(1e3 * v / n, 3) for r, v in used.items()}
            row["run_cpu_ms_per_task"]["total"] = round(1e3 * sum(used.values()) / n, 3)
            row["run_s"] = round(window["t1"] - window["t0"], 2)
            row["sustained"] = bl.sustained(row)
            rows.append(row)
    finally:
        names["stop_federation"](home)
        names["purge"](cfg, home)
    Path(args.arm_out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _run_arm(tree: str, rates: list[float], seconds: float, port: int, profile: bool,
             log: Path) -> list[dict[str, Any]]:  # fmt: skip
    out = Path(tempfile.mkstemp(prefix="halving-arm-", suffix=".json")[1])
    env = {**os.environ, "PYTHONPATH": tree}
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--arm", "--tree", tree,
        "--arm-out", str(out), "--rates", ",".join(str(r) for r in rates),
        "--seconds", str(seconds), "--base-port", str(port),
        *(["--profile"] if profile else []),
    ]  # fmt: skip
    with log.open("a") as f:
        f.write(f"\n=== {tree} {rates} {time.strftime('%H:%M:%S')}\n")
        f.flush()
        subprocess.run(argv, env=env, cwd=tree, stdout=f, stderr=subprocess.STDOUT, check=True)
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    out.unlink()
    return rows


def _summary(row: dict[str, Any], tree: str, load: tuple[float, ...]) -> dict[str, Any]:
    keep = (
        "label", "offered_tasks_per_s", "throughput_tasks_per_s", "tasks",
        "unfinished_tasks", "failed_tasks", "allocation_s", "cpu_ms_per_task",
        "run_cpu_ms_per_task", "run_s", "cpu_system_share", "traffic", "sustained",
        "counters", "profile", "gc_since_start", "end_to_gm_s", "wall_s",
    )  # fmt: skip
    return {"tree": tree, "loadavg_before": load, **{k: row[k] for k in keep if k in row}}


def _median(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    roles = sorted({r for row in rows for r in row[key]})
    return {r: round(statistics.median(row[key].get(r, 0.0) for row in rows), 3) for r in roles}


def _compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("cpu_ms_per_task", "run_cpu_ms_per_task"):
        mo, mn = _median(old, key), _median(new, key)
        out[key] = {
            "old_median": mo,
            "new_median": mn,
            "new_over_old": {r: round(mn[r] / mo[r], 3) for r in mn if mo.get(r)},
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="/work/wt/live-old", help="the old checkout")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--then", type=float, default=0.0, help="a last step at this rate (new)")
    ap.add_argument("--then-seconds", type=float, default=10.0)
    ap.add_argument("--profile", action="store_true", help="py-spy every process (first round)")
    ap.add_argument("--base-port", type=int, default=18800)
    ap.add_argument("--out", default="")
    # one arm (internal)
    ap.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    ap.add_argument("--rates", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        args.rates = [float(x) for x in args.rates.split(",")]
        return _arm(args)
    day = datetime.date.today().isoformat()
    out = Path(args.out or HERE / "docs/figures/bench_live" / day / "cpu_halving.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    new_tree, old_tree = str(HERE), str(Path(args.against).resolve())
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    order = []
    for i in range(args.rounds):
        order += [("old", old_tree), ("new", new_tree)] if i % 2 == 0 else [
            ("new", new_tree), ("old", old_tree)]  # fmt: skip
    result: dict[str, Any] = {
        "rate": args.rate,
        "seconds": args.seconds,
        "order": [],
        "cpus": os.cpu_count(),
    }
    for k, (arm, tree) in enumerate(order):
        load = os.getloadavg()
        rows = _run_arm(
            tree, [args.rate], args.seconds, args.base_port, args.profile and k < 2, log
        )
        row = _summary(rows[0], tree, load)
        runs[arm].append(row)
        result["order"].append(arm)
        tot, run = row["cpu_ms_per_task"]["total"], row["run_cpu_ms_per_task"]["total"]
        print(f"{arm}: {row['throughput_tasks_per_s']}/s p99 "
              f"{row['allocation_s']['p99'] * 1e3:.1f} ms, CPU/task step {tot} ms, run {run} ms, "
              f"load {load[0]:.1f}", flush=True)  # fmt: skip
        result["runs"] = runs
        result["compare"] = (
            _compare(runs["old"], runs["new"]) if runs["old"] and runs["new"] else {}
        )
        out.write_text(json.dumps(result, indent=1) + "\n")
    if args.then:
        load = os.getloadavg()
        rows = _run_arm(new_tree, [args.then], args.then_seconds, args.base_port, False, log)
        result["then"] = _summary(rows[0], new_tree, load)
        t = result["then"]
        print(f"new at {args.then}/s: {t['throughput_tasks_per_s']}/s p99 "
              f"{t['allocation_s']['p99'] * 1e3:.1f} ms unfinished {t['unfinished_tasks']} "
              f"sustained {t['sustained']}", flush=True)  # fmt: skip
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result.get("compare", {}), indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
