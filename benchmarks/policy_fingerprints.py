"""Fingerprints of ``megha simulate`` runs under every queue policy: a change meant to
make the policies cheaper must leave every one of them identical.

Per workload and policy, one ``megha simulate`` run in its own process, with the task
records written as ``tasks-<policy>.csv`` beside ``summary.json`` (a DAG run writes no
CSV of its own), and three sha256 digests:

* ``summary``: ``summary.json`` without what measures the machine, not the schedule
  (``wall_s``, ``cpu_s``, ``timing``, ``cpu_ms_per_task``, at any depth);
* ``csv``: the task CSV as written (times rounded to 1 ns);
* ``exact``: every task's placement and ledger with its times as exact floats (hex).

    python benchmarks/policy_fingerprints.py --out results/fingerprints.json
    python benchmarks/policy_fingerprints.py --check results/fingerprints.json

``--check FILE`` runs the same workloads and compares with a recorded file (exit 1 on
any difference).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

POLICIES = ("fifo", "drf", "drf-wc", "carbyne", "carbyne-pack", "sjf", "tetris")
CLOCK_KEYS = frozenset({"wall_s", "cpu_s", "timing", "cpu_ms_per_task"})
USERS4 = "u0:0.25@gm0,u1:0.25@gm0,u2:0.25@gm0,u3:0.25@gm0"
MANY_JOBS = 300


def workloads(jobs_file: Path) -> dict[str, list[str]]:
    """Name -> ``megha simulate`` options (every run also gets ``--policies P``)."""
    small = ["--workers", "20", "--gms", "1", "--lms", "2", "--users", USERS4]
    return {
        "dag-online-s1": [
            "--workload", "dag", "--jobs-count", "40", "--rate", "0.12", "--seed", "1", *small,
        ],
        "dag-offline-s2": [
            "--workload", "dag", "--jobs-count", "30", "--arrivals", "offline", "--seed", "2",
            *small,
        ],
        "dag-paper-s3": [
            "--workload", "dag", "--jobs-count", "30", "--profile", "paper", "--rate", "0.5",
            "--seed", "3", *small,
        ],
        f"many-jobs-{MANY_JOBS}": ["--jobs", str(jobs_file), "--seed", "1", *small],
    }  # fmt: skip


def _strip(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in CLOCK_KEYS}
    if isinstance(doc, list):
        return [_strip(v) for v in doc]
    return doc


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_one(out: Path, simulate_args: list[str]) -> int:
    """In this process: ``megha simulate`` with every run's tasks kept as a CSV and as
    an exact record (``exact-<policy>.txt``)."""
    from megha_cli import main as cli
    from megha_cli import simulate
    from reporting.tasks import write_records_csv

    inner = simulate._with_progress

    def keeping(label: str, total: int, outstanding: Any, run: Any, quiet: bool) -> Any:
        result = inner(label, total, outstanding, run, quiet)
        write_records_csv(out / f"tasks-{label}.csv", result.tasks, result.failed)
        lines = []
        for t in sorted(result.tasks, key=lambda t: (t.user, t.task_id)):
            times = [t.submitted_at, t.first_started_at, t.started_at, t.finished_at]
            marks = [(x.hex(), str(p)) for x, p in t.marks]
            lines.append(
                repr((t.user, t.task_id, t.gm, t.lm, t.attempt, t.altruistic,
                      [x.hex() for x in times], marks, t.decisions, list(t.waits)))
            )  # fmt: skip
        (out / f"exact-{label}.txt").write_text("\n".join(lines) + "\n")
        return result

    simulate._with_progress = keeping
    return cli.main(["simulate", *simulate_args, "--out", str(out), "--quiet"])


def fingerprint(root: Path, name: str, args: list[str], policy: str) -> dict[str, str]:
    out = root / name / policy
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(out), "--", *args]
    cmd += ["--policies", policy]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=os.environ.copy())
    summary = json.loads((out / "summary.json").read_text())
    stripped = json.dumps(_strip(summary), indent=2, sort_keys=True).encode()
    return {
        "summary": _sha(stripped),
        "csv": _sha((out / f"tasks-{policy}.csv").read_bytes()),
        "exact": _sha((out / f"exact-{policy}.txt").read_bytes()),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--one"]:
        rest = argv[3:] if argv[2:3] == ["--"] else argv[2:]
        return run_one(Path(argv[1]), rest)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/fingerprints.json")
    ap.add_argument("--check", default="", help="compare with this recorded file")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workloads", default="", help="only these (comma list)")
    ap.add_argument("--keep", default="", help="keep the runs' files in this directory")
    args = ap.parse_args(argv)
    root = Path(args.keep or tempfile.mkdtemp(prefix="fingerprints-"))
    from benchmarks.bench_replan import many_jobs
    from common.dag import write_jobs

    jobs_file = root / f"many-jobs-{MANY_JOBS}.json"
    write_jobs(jobs_file, many_jobs(MANY_JOBS, 4), ["cpu", "mem"])
    chosen = [w for w in args.workloads.split(",") if w]
    prints: dict[str, dict[str, dict[str, str]]] = {}
    for name, wargs in workloads(jobs_file).items():
        if chosen and name not in chosen:
            continue
        prints[name] = {}
        for policy in [p for p in args.policies.split(",") if p]:
            prints[name][policy] = fp = fingerprint(root, name, wargs, policy)
            print(f"{name} {policy}: {fp['summary'][:12]} {fp['csv'][:12]} {fp['exact'][:12]}",
                  file=sys.stderr)  # fmt: skip
    runs = sum(len(v) for v in prints.values())
    if args.check:
        want = json.loads(Path(args.check).read_text())["fingerprints"]
        bad = [
            f"{w} {p}"
            for w, per in prints.items()
            for p, fp in per.items()
            if want.get(w, {}).get(p) != fp
        ]
        print(f"{runs} runs, {runs - len(bad)} identical, differ: {bad or 'none'}", file=sys.stderr)
        return 1 if bad else 0
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"runs": runs, "fingerprints": prints}, indent=2, sort_keys=True))
    print(f"{runs} runs; wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
