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
runs one more step at R tasks/s after the rounds (sustained: nothing lost, >= 90% of R
placed, allocation p99 <= 50 ms), ``--then-rounds N`` (1) times on both trees,
alternating as the rounds do (the overloaded case side by side: ``then_runs``,
``then_compare``; ``then``: this tree's last); ``--then-rounds 0``: once, on this tree
only.  ``--rounds 0`` runs only that step.

Each row also has what the services counted over the run (their public ``/metrics``,
read at the first publication and after the last outcome): ``lm_requests_per_task``,
the requests the LMs took per task by endpoint (``total``: all of them; ``from_gms``:
the GMs' launches, preemptions, snapshots, keeps and cancels, not the pools' reports),
and ``jobs_keeping_ends`` (jobs held so long their LMs were asked to keep their ends).
A job held ``ENDS_RETAINED_S / 4`` (30 s) has its ends kept: only an overload that long
shows those requests (``--then 3000 --then-seconds 60`` here).

Needs RabbitMQ on 127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
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


def _add_run_cpu(row: dict[str, Any], window: dict[str, Any]) -> None:
    """The CPU per task of each role from the first publication to the last outcome."""
    used = {
        r: (u - window["cpu0"][r][0]) + (k - window["cpu0"][r][1])
        for r, (u, k) in window["cpu1"].items()
    }
    n = max(row["tasks"], 1)
    row["run_cpu_ms_per_task"] = {r: round(1e3 * v / n, 3) for r, v in used.items()}
    row["run_cpu_ms_per_task"]["total"] = round(1e3 * sum(used.values()) / n, 3)
    row["run_s"] = round(window["t1"] - window["t0"], 2)


GM_ENDPOINTS = ("/v1/launch", "/v1/preempt", "/v1/snapshot", "/v1/keep-ends", "/v1/cancel",
                "/v1/stop-user", "/v1/reserve", "/v1/commit-gang", "/v1/release-gang")  # fmt: skip
"""What the GMs ask of an LM (the rest of its requests are its pool's)."""


def _scrape(cfg: Any) -> dict[str, float]:
    """The GMs' and LMs' counters that say how many requests the LMs took (by endpoint)
    and how many jobs had their ends kept, summed over the processes (``/metrics`` is
    public: no signature).  A process that does not answer adds nothing."""
    import re
    import urllib.request

    line = re.compile(r'^megha_(lm_requests_total\{endpoint="([^"]+)"\}|gm_jobs_keeping_ends)'
                      r"(?:_total)? ([0-9.e+]+)$")  # fmt: skip
    out: dict[str, float] = {}
    for name in [*cfg.gm_ids, *cfg.lm_ids]:
        try:
            with urllib.request.urlopen(cfg.url(name) + "/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for row in text.splitlines():
            m = line.match(row)
            if m:
                key = m.group(2) or "jobs_keeping_ends"
                out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def _add_requests(row: dict[str, Any], window: dict[str, Any]) -> None:
    """The LMs' requests per task over the run, by endpoint, and the jobs kept."""
    before, after = window.get("metrics0", {}), window.get("metrics1", {})
    n = max(row["tasks"], 1)
    diff = {k: v - before.get(k, 0.0) for k, v in after.items()}
    kept = diff.pop("jobs_keeping_ends", 0.0)
    per = {k: round(v / n, 4) for k, v in sorted(diff.items()) if v > 0}
    per["total"] = round(sum(diff.values()) / n, 4)
    per["from_gms"] = round(sum(v for k, v in diff.items() if k in GM_ENDPOINTS) / n, 4)
    row["lm_requests_per_task"] = per
    row["jobs_keeping_ends"] = int(kept)


def _watch_the_run(rg: Any, bl: Any, home: Path, cfg: Any) -> dict[str, Any]:
    """The client's ``_submit_all`` and ``_wait_done`` wrapped: the CPU by role and the
    services' counters at the first publication and after the last outcome (filled
    into the dict returned, at each step)."""
    window: dict[str, Any] = {}
    submit_all, wait_done = rg._submit_all, rg._wait_done

    async def timed_submit(*a: Any, **kw: Any) -> Any:
        window["metrics0"] = await asyncio.to_thread(_scrape, cfg)
        window["cpu0"] = bl._cpu_by_role(home)
        window["t0"] = time.time()
        return await submit_all(*a, **kw)

    async def timed_wait(*a: Any, **kw: Any) -> Any:
        try:
            return await wait_done(*a, **kw)
        finally:
            window["cpu1"] = bl._cpu_by_role(home)
            window["t1"] = time.time()
            window["metrics1"] = await asyncio.to_thread(_scrape, cfg)

    rg._submit_all = timed_submit
    rg._wait_done = timed_wait
    return window


def _arm(args: argparse.Namespace) -> int:
    """One arm, in this process (its tree first on ``sys.path``): a federation, a
    warm-up, the measured steps, the rows as JSON on ``--arm-out``."""
    from dataclasses import replace

    sys.path.insert(0, args.tree)
    from benchmarks import bench_live as bl  # the tree's own
    from common.config import parse_config
    from request_generator import bench as rg

    cfg = replace(
        parse_config({}), name=f"bench-halving-{os.getpid()}", gms=3, lms=3,
        nodes_per_lm=bl.NODES // 3, base_port=args.base_port,
    ).validate()  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    window = _watch_the_run(rg, bl, home, cfg)
    where = Path(tempfile.mkdtemp(prefix="halving-steps-"))
    rows: list[dict[str, Any]] = []
    traffic: dict[str, Any] = {}
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
            _add_run_cpu(row, window)
            _add_requests(row, window)
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
        "counters", "profile", "gc_since_start", "end_to_gm_s", "end_path_ms", "wall_s",
        "lm_requests_per_task", "jobs_keeping_ends",
    )  # fmt: skip
    return {"tree": tree, "loadavg_before": load, **{k: row[k] for k in keep if k in row}}


def _median(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    roles = sorted({r for row in rows for r in row[key]})
    return {r: round(statistics.median(row[key].get(r, 0.0) for row in rows), 3) for r in roles}


def _compare(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("cpu_ms_per_task", "run_cpu_ms_per_task", "lm_requests_per_task"):
        if not all(key in row for row in (*old, *new)):
            continue
        mo, mn = _median(old, key), _median(new, key)
        out[key] = {
            "old_median": mo,
            "new_median": mn,
            "new_over_old": {r: round(mn[r] / mo[r], 3) for r in mn if mo.get(r)},
        }
    return out


def _say(arm: str, row: dict[str, Any], load: tuple[float, ...]) -> None:
    tot, run = row["cpu_ms_per_task"]["total"], row["run_cpu_ms_per_task"]["total"]
    reqs = row.get("lm_requests_per_task", {})
    print(f"{arm} at {row['offered_tasks_per_s']}/s offered: {row['throughput_tasks_per_s']}/s "
          f"p99 {row['allocation_s']['p99'] * 1e3:.1f} ms, unfinished {row['unfinished_tasks']}, "
          f"CPU/task step {tot} ms, run {run} ms, LM requests/task {reqs.get('total')} "
          f"(keep-ends {reqs.get('/v1/keep-ends', 0.0)}), jobs kept "
          f"{row.get('jobs_keeping_ends')}, load {load[0]:.1f}", flush=True)  # fmt: skip


def _then(args: argparse.Namespace, result: dict[str, Any], out: Path, log: Path,
          old_tree: str, new_tree: str) -> None:  # fmt: skip
    """The last step at ``--then`` tasks/s: on this tree, or ``--then-rounds`` times on
    both trees, alternating (old first, then new first, ...)."""
    order = [("new", new_tree)]
    if args.then_rounds > 0:
        order = []
        for i in range(args.then_rounds):
            pair = [("old", old_tree), ("new", new_tree)]
            order += pair if i % 2 == 0 else pair[::-1]
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for k, (arm, tree) in enumerate(order):
        load = os.getloadavg()
        profile = args.profile and k < 2
        rows = _run_arm(tree, [args.then], args.then_seconds, args.base_port, profile, log)
        row = _summary(rows[0], tree, load)
        runs[arm].append(row)
        _say(arm, row, load)
        result["then"] = runs["new"][-1] if runs["new"] else row
        result["then_seconds"] = args.then_seconds
        if args.then_rounds > 0:
            result["then_runs"] = runs
            both = runs["old"] and runs["new"]
            result["then_compare"] = _compare(runs["old"], runs["new"]) if both else {}
        out.write_text(json.dumps(result, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="/work/wt/live-old", help="the old checkout")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--then", type=float, default=0.0, help="a last step at this rate (new)")
    ap.add_argument("--then-seconds", type=float, default=10.0)
    ap.add_argument("--then-rounds", type=int, default=1,
                    help="the --then step this many times on both trees, alternating "
                    "(0: once, on this tree only)")  # fmt: skip
    ap.add_argument("--profile", action="store_true",
                    help="py-spy every process (first round, and first --then pair)")  # fmt: skip
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
        _say(arm, row, load)
        result["runs"] = runs
        result["compare"] = (
            _compare(runs["old"], runs["new"]) if runs["old"] and runs["new"] else {}
        )
        out.write_text(json.dumps(result, indent=1) + "\n")
    if args.then:
        _then(args, result, out, log, old_tree, new_tree)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result.get("compare", {}), indent=1))
    if result.get("then_compare"):
        print(json.dumps(result["then_compare"], indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
