"""A live GM's core input, replayed through this tree's core and an old checkout's,
alternating in one sitting: CPU per task of the decision core alone (issue 35 items 1
and 3: the simulator runs the same core).

Record first (``benchmarks/gm_record_hook``): every message a live GM's core was
given, with its time.  Each arm is a fresh process with its tree first on
``PYTHONPATH``: it makes the core as the service does (``global_master.app._make_core``
with the recorded config), feeds it the recorded stream ``--repeat`` times (a fresh
core each time, the messages unpickled before the clock starts) and takes the CPU
(``time.process_time``) of the ``handle`` calls.  Arms go old, new, new, old, ...;
the figure is the median CPU per task admitted, and the ratio new/old (also of the
least of each arm's replays: on a shared host, the least disturbed).

Both arms must decide alike: each arm also digests every effect of one replay (their
``repr``, message by message) and the script fails if the digests differ.

    GM_RECORD_DIR=/tmp/rec PYTHONPATH=benchmarks/gm_record_hook:. \\
        python benchmarks/bench_live.py --rates 1000 --seconds 8 --base-port P
    python benchmarks/bench_gm_replay.py --against /work/wt/old /tmp/rec/*.rec

writes JSON to ``--out``.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def _load(path: str) -> tuple[Any, Any, list[tuple[object, float]]]:
    """The recorded config, GM id and stream (a record cut short ends early)."""
    stream: list[tuple[object, float]] = []
    with open(path, "rb") as f:
        cfg, gm = pickle.load(f)
        while True:
            try:
                stream.append(pickle.load(f))
            except (EOFError, pickle.UnpicklingError):
                break
    return cfg, gm, stream


def _tasks(stream: list[tuple[object, float]]) -> int:
    from common.messages import AdmitJob

    return sum(len(m.job.tasks) for m, _ in stream if isinstance(m, AdmitJob))


def _replay_once(path: str, digest: bool) -> tuple[float, str]:
    from global_master.app import _make_core

    cfg, gm, stream = _load(path)
    core = _make_core(cfg, gm)
    handle = core.handle
    gc.collect()
    if digest:
        h = hashlib.sha256()
        for msg, now in stream:
            h.update(repr(handle(msg, now)).encode())
        return 0.0, h.hexdigest()
    t0 = time.process_time()
    for msg, now in stream:
        handle(msg, now)
    return time.process_time() - t0, ""


def _arm(paths: list[str], repeat: int) -> int:
    """One arm, in this process: CPU seconds of each replay of each record."""
    out: dict[str, Any] = {"records": {}}
    for path in paths:
        _, _, stream = _load(path)
        cpu = [_replay_once(path, False)[0] for _ in range(repeat)]
        out["records"][path] = {
            "messages": len(stream),
            "tasks": _tasks(stream),
            "cpu_s": cpu,
            "digest": _replay_once(path, True)[1],
        }
    print(json.dumps(out))
    return 0


def _run_arm(tree: Path, paths: list[str], repeat: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(HERE / "benchmarks/bench_gm_replay.py"), "--arm", "--repeat"]
    done = subprocess.run(
        [*cmd, str(repeat), *paths], cwd=tree, env=env, capture_output=True, text=True, check=True
    )
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("records", nargs="+", help="recorded streams (gm_record_hook)")
    ap.add_argument("--against", type=Path, help="the old checkout")
    ap.add_argument("--rounds", type=int, default=3, help="pairs of arms (old, new / new, old)")
    ap.add_argument("--repeat", type=int, default=3, help="replays per record per arm")
    ap.add_argument("--out", default="results/bench_gm_replay.json")
    ap.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    paths = [str(Path(p).resolve()) for p in args.records]
    if args.arm:
        return _arm(paths, args.repeat)
    if args.against is None:
        ap.error("--against OLD_TREE is needed")
    trees = {"old": args.against.resolve(), "new": HERE}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    digests: dict[str, set[str]] = {"old": set(), "new": set()}
    tasks = 0
    for r in range(args.rounds):
        for arm in ("old", "new") if r % 2 == 0 else ("new", "old"):
            res = _run_arm(trees[arm], paths, args.repeat)["records"]
            tasks = sum(rec["tasks"] for rec in res.values())
            for i in range(args.repeat):  # one figure per replay of every record
                cpu[arm].append(sum(rec["cpu_s"][i] for rec in res.values()))
            digests[arm].add(json.dumps({p: rec["digest"] for p, rec in res.items()}))
            print(f"round {r} {arm}: {[round(c, 3) for c in cpu[arm][-args.repeat :]]} s",
                  file=sys.stderr)  # fmt: skip
    per_task = {a: 1e6 * statistics.median(v) / max(tasks, 1) for a, v in cpu.items()}
    least = {a: 1e6 * min(v) / max(tasks, 1) for a, v in cpu.items()}  # the least disturbed
    same = digests["old"] == digests["new"] and len(digests["new"]) == 1
    figures = {
        "records": paths,
        "tasks": tasks,
        "rounds": args.rounds,
        "repeat": args.repeat,
        "cpu_us_per_task": {a: round(v, 2) for a, v in per_task.items()},
        "ratio_new_over_old": round(per_task["new"] / per_task["old"], 4),
        "cpu_us_per_task_min": {a: round(v, 2) for a, v in least.items()},
        "ratio_of_mins": round(least["new"] / least["old"], 4),
        "cpu_s": cpu,
        "same_decisions": same,
        "loadavg": os.getloadavg(),
        "trees": {a: str(t) for a, t in trees.items()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    keys = ("cpu_us_per_task", "ratio_new_over_old", "ratio_of_mins", "same_decisions", "loadavg")
    print(json.dumps({k: figures[k] for k in keys}))
    if not same:
        print("the arms' effects differ: decisions are not identical", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
