"""What a GM pays for a job delivery before and instead of decoding it
(``global_master.intake``): the peek at its token and the container count, against the
decode itself, for a legitimate job of each size and for the hostile body of issue 32
(8 MiB of empty msgpack maps).  Each case runs in a fresh process (its peak memory is
its own), ``--rounds`` times, old and new alternating; the median is written.

    python benchmarks/bench_intake.py --out results/bench_intake.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

CASE = r"""
import json, resource, sys, time
import msgpack
from common import codec
from common.ids import JobId, TaskId, UserId
from common.messages import SubmitJob
from common.model import TaskSpec
from global_master import intake

kind, size, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "job":
    tasks = tuple(TaskSpec(task_id=TaskId(f"j.t{i}"), job_id=JobId("j"), user=UserId("u0"),
                           demand=(1,), duration=1.5) for i in range(size))
    body = codec.encode(SubmitJob(job_id=JobId("j"), user=UserId("u0"), token="t" * 47,
                                  submitted_at=0.0, tasks=tasks))
else:  # size arrays of a million empty maps, a valid token in front
    fields = {"job_id": "bomb", "user": "u0", "token": "t" * 47, "submitted_at": 0.0,
              "tasks": [[{}] * ((1 << 20) - 1) for _ in range(size)]}
    body = msgpack.packb(["submit_job", 2, fields])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.process_time()
try:
    if what == "decode":  # what the GM did first before: the whole body, then the token
        codec.decode(body, max_size=len(body))
    else:  # what it does now before decoding: the token's fields, the containers
        intake.peek(body)
        intake.check_containers(body)
    outcome = "accepted"
except Exception as exc:
    outcome = getattr(exc, "reason", type(exc).__name__)
cpu = time.process_time() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"bytes": len(body), "cpu_s": cpu, "peak_growth_mib": (peak - base) / 1024,
                  "outcome": outcome}))
"""

CASES = [("job", 100), ("job", 10_000), ("job", 90_000), ("bomb", 7)]


def run_case(kind: str, size: int, what: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CASE, kind, str(size), what],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/bench_intake.json")
    args = ap.parse_args(argv)
    rows = []
    for kind, size in CASES:
        runs: dict[str, list[dict[str, Any]]] = {"decode": [], "intake": []}
        for r in range(args.rounds):
            for what in ("decode", "intake") if r % 2 == 0 else ("intake", "decode"):
                runs[what].append(run_case(kind, size, what))
        row: dict[str, Any] = {"case": f"{kind} {size}", "bytes": runs["decode"][0]["bytes"]}
        for what, rs in runs.items():
            row[what] = {
                "cpu_s": round(statistics.median(x["cpu_s"] for x in rs), 4),
                "peak_growth_mib": round(statistics.median(x["peak_growth_mib"] for x in rs), 1),
                "outcome": rs[0]["outcome"],
            }
        row["intake_over_decode_cpu"] = round(row["intake"]["cpu_s"] / row["decode"]["cpu_s"], 3)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": args.rounds, "cases": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
