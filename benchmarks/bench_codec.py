"""Cost of the wire codec: encode and decode of the messages that carry the work.

Cases: a 10-task ``LaunchRequest`` (GM -> LM, the hot path of every decision), a
10,000-task ``SubmitJob`` (a large job, user -> GM), a ``StateUpdated`` of a
1,000-node delta (an LM heartbeat), and the other hops of 10 tasks: ``LaunchResponse``
(LM -> GM), ``StartTasks`` (LM -> pool), ``WorkerReports`` of their ends (pool -> LM)
and ``TaskEvents`` (LM -> GM).  Each figure is the best of ``--repeats`` timings of
``codec.encode`` / ``codec.decode`` in CPU time of the process (microseconds per message):
on a shared machine, other processes' load changes it less than wall-clock time.

With ``--against TREE`` the same cases run alternately, round after round, under this
tree's codec and under TREE's (another checkout: ``PYTHONPATH`` picks the code), each in
its own process, and the ratios (TREE / this) are written too; wall-clock figures on a
shared machine are only comparable that way.

    python benchmarks/bench_codec.py --out results/bench_codec.json
    python benchmarks/bench_codec.py --against /tmp/old-checkout --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def _cases() -> dict[str, object]:
    from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
    from common.messages import LaunchRequest, Placement, StateDelta, StateUpdated, SubmitJob
    from common.model import TaskSpec

    def spec(i: int) -> TaskSpec:
        return TaskSpec(task_id=TaskId(f"job7.t{i}"), job_id=JobId("job7"), user=UserId("u3"),
                        demand=(1000, 2048), duration=12.5, constraints=5)  # fmt: skip

    launch = LaunchRequest(
        gm=GmId("gm0"),
        lm=LmId("lm1"),
        request_id=4242,
        placements=tuple(
            Placement(spec=spec(i), attempt=1, node=NodeIndex(i * 7), queued_at=100.0 + i)
            for i in range(10)
        ),
        known_version=9000,
        sent_at=101.5,
    )
    job = SubmitJob(job_id=JobId("job7"), user=UserId("u3"), token="t" * 64,
                    submitted_at=99.0, tasks=tuple(spec(i) for i in range(10_000)))  # fmt: skip
    delta = StateDelta(
        lm=LmId("lm1"),
        epoch=1,
        version=50_000,
        base_version=49_000,
        nodes=tuple(NodeIndex(i) for i in range(1000)),
        free=tuple((i % 64 * 1000, 16_384) for i in range(1000)),
        node_versions=tuple(range(49_000, 50_000)),
        usage={UserId(f"u{i}"): (i, i) for i in range(10)},
    )
    return {
        "launch_10": launch,
        "submit_job_10000": job,
        "state_updated_1000": StateUpdated(delta=delta),
        **_hops_cases(spec),
    }


def _hops_cases(spec: Callable[[int], Any]) -> dict[str, object]:
    """What else a task crosses, 10 tasks each: the LM's answer to a launch, its starts
    to a pool, the pool's end reports, the LM's end events to the GM."""
    from common import messages as m
    from common.ids import GmId, LmId, NodeIndex, UserId

    gm, lm = GmId("gm0"), LmId("lm1")
    delta = m.StateDelta(
        lm=lm,
        epoch=1,
        version=9010,
        base_version=9000,
        nodes=tuple(NodeIndex(i * 7) for i in range(10)),
        free=tuple((i * 1000, 2048) for i in range(10)),
        node_versions=tuple(range(9001, 9011)),
        usage={UserId("u3"): (10_000, 20_480)},
    )
    response = m.LaunchResponse(
        gm=gm,
        lm=lm,
        request_id=4242,
        results=tuple(m.PlacementResult(accepted=True) for _ in range(10)),
        delta=delta,
        request_sent_at=101.5,
        received_at=101.6,
        sent_at=101.7,
    )
    starts = m.StartTasks(
        lm=lm,
        epoch=1,
        sent=101.7,
        tasks=tuple(
            m.StartTask(node=NodeIndex(i * 7), spec=spec(i), attempt=1, gm=gm, queued_at=100.0 + i)
            for i in range(10)
        ),
    )
    return {
        "launch_response_10": response,
        "start_tasks_10": starts,
        **_ends_cases(spec),
    }


def _ends_cases(spec: Callable[[int], Any]) -> dict[str, object]:
    """The ends of 10 tasks: a pool's reports to its LM, the LM's events to the GM."""
    from common import messages as m
    from common.ids import GmId, LmId, NodeIndex, UserId

    gm, lm, user = GmId("gm0"), LmId("lm1"), UserId("u3")
    reports = m.WorkerReports(
        lm=lm,
        reports=tuple(
            m.WorkerReport(
                kind=m.ReportKind.FINISHED,
                node=NodeIndex(i * 7),
                user=user,
                task_id=spec(i).task_id,
                attempt=1,
                gm=gm,
                job_id=spec(i).job_id,
                queued_at=100.0 + i,
                at=114.2,
                worker_at=101.8,
                started_at=101.9,
                exit_code=0,
            )
            for i in range(10)
        ),
    )
    events = m.TaskEvents(
        lm=lm,
        epoch=1,
        events=tuple(
            m.TaskEvent(
                kind=m.EventKind.FINISHED,
                lm=lm,
                gm=gm,
                user=user,
                task_id=spec(i).task_id,
                attempt=1,
                node=NodeIndex(i * 7),
                node_free=(64_000, 16_384),
                node_version=9011 + i,
                job_id=spec(i).job_id,
                queued_at=100.0 + i,
                at=114.2,
                worker_at=101.8,
                started_at=101.9,
                exit_code=0,
            )
            for i in range(10)
        ),
    )
    return {"worker_reports_10": reports, "task_events_10": events}


def _best(fn: Callable[[], object], repeats: int, budget_s: float) -> float:
    """Seconds per call: the best of ``repeats`` timings of a loop of about ``budget_s``."""
    t0 = time.process_time()
    fn()
    one = max(time.process_time() - t0, 1e-7)
    n = max(1, int(budget_s / one))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t0) / n)
    return best


def measure(repeats: int, budget_s: float) -> dict[str, Any]:
    """Encode and decode of every case under the codec on ``sys.path`` (microseconds)."""
    from common import codec

    out: dict[str, Any] = {}
    for name, msg in _cases().items():
        body = codec.encode(msg)
        assert codec.decode(body, max_size=len(body)) == msg
        out[name] = {
            "bytes": len(body),
            "encode_us": _best(partial(codec.encode, msg), repeats, budget_s) * 1e6,
            "decode_us": _best(partial(codec.decode, body, max_size=len(body)), repeats, budget_s)
            * 1e6,
        }
    return out


def _run_in(tree: Path, repeats: int, budget_s: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", "--repeats", str(repeats),
           "--budget", str(budget_s)]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def compare(against: Path, rounds: int, repeats: int, budget_s: float) -> dict[str, Any]:
    """Alternate rounds under this tree and ``against``; medians over rounds and ratios."""
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "against": []}
    for r in range(rounds):
        order = [("this", HERE), ("against", against)]
        for label, tree in order if r % 2 == 0 else order[::-1]:
            print(f"round {r + 1}/{rounds}: {label} ({tree}) ...", file=sys.stderr)
            runs[label].append(_run_in(tree, repeats, budget_s))
    med: dict[str, dict[str, dict[str, float]]] = {}
    for label, rows in runs.items():
        med[label] = {
            case: {k: statistics.median(row[case][k] for row in rows) for k in rows[0][case]}
            for case in rows[0]
        }
    ratios = {
        case: {
            k: med["against"][case][k] / med["this"][case][k] for k in ("encode_us", "decode_us")
        }
        for case in med["this"]
    }
    return {
        "this": str(HERE),
        "against": str(against),
        "rounds": rounds,
        "median": med,
        "ratio_against_over_this": ratios,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="results/bench_codec.json", help="JSON figures written here")
    ap.add_argument("--repeats", type=int, default=5, help="timings per figure (the best counts)")
    ap.add_argument("--budget", type=float, default=0.2, help="seconds per timing loop")
    ap.add_argument("--against", type=Path, help="another checkout to alternate with")
    ap.add_argument("--rounds", type=int, default=5, help="with --against: rounds per tree")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child of --against
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.repeats, args.budget)))
        return 0
    if args.against is not None:
        result = compare(args.against.resolve(), args.rounds, args.repeats, args.budget)
        table = result["median"]
    else:
        result = {"this": str(HERE), "median": {"this": measure(args.repeats, args.budget)}}
        table = result["median"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'tree':<8} {'case':<20} {'bytes':>8} {'encode us':>11} {'decode us':>11}")
    for label, cases in table.items():
        for case, row in cases.items():
            print(f"{label:<8} {case:<20} {row['bytes']:>8.0f} {row['encode_us']:>11.2f} "
                  f"{row['decode_us']:>11.2f}")  # fmt: skip
    for case, r in result.get("ratio_against_over_this", {}).items():
        print(f"{case}: against/this encode {r['encode_us']:.2f}x, decode {r['decode_us']:.2f}x")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
