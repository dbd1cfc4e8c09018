"""The idealized single queue: how far job-aware ordering alone can lower mean JCT.

One queue over ``slots`` identical slots, no constraints, no delays, no decisions to
make: a task starts the instant a slot is free.  ``fifo`` serves jobs in arrival order
(each job's tasks in order); ``srpt`` serves next the job with the least remaining work
not yet started (``global_master.policy.srpt``'s measure), non-preemptively, as Megha's
``srpt`` does.  The ratio srpt / fifo is the bound beside the federation's runs
(``benchmarks/bench_order.py``): what ordering gains with placement perfect.

    python benchmarks/srpt_bound.py --trace ../shared/traces/YH1_sub.tr --slots 10000 \\
        --time-scale 0.248 --queues 4 --out results/srpt_bound.json
"""

from __future__ import annotations

import argparse
import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reporting.files import write_json
from workload.traces import read_trace

ORDERS = ("fifo", "srpt")


@dataclass(frozen=True)
class FlatJob:
    """A job as the bound sees it: when it came and its tasks' durations."""

    arrival: float
    durations: tuple[float, ...]


def jobs_of_trace(
    path: str | Path,
    *,
    time_scale: float = 1.0,
    duration_scale: float = 1.0,
    limit_jobs: int | None = None,
) -> list[FlatJob]:
    """A trace's jobs (its first ``limit_jobs``), scaled as ``megha simulate`` scales them."""
    return [
        FlatJob(tj.arrival * time_scale, tuple(d * duration_scale for d in tj.durations))
        for tj in read_trace(path, limit_jobs=limit_jobs)
    ]


def single_queue(jobs: Sequence[FlatJob], slots: int, order: str) -> list[float]:
    """Each job's completion time (last task's end - arrival) in the ideal queue."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    ranked = sorted(range(len(jobs)), key=lambda k: (jobs[k].arrival, k))
    nxt = [0] * len(jobs)  # next task of each job to start
    rem = [sum(j.durations) for j in jobs]
    done = [0.0] * len(jobs)
    fifo: deque[int] = deque()
    heap: list[tuple[float, int]] = []
    ends: list[float] = []  # busy slots' end times
    i, now = 0, 0.0
    while i < len(ranked) or fifo or heap:
        if len(ends) >= slots or (not fifo and not heap):
            # next event: a slot frees (when all are busy) or a job arrives
            t_end = ends[0] if ends else float("inf")
            t_arr = jobs[ranked[i]].arrival if i < len(ranked) else float("inf")
            now = max(now, min(t_end, t_arr))
        while ends and ends[0] <= now:
            heapq.heappop(ends)
        while i < len(ranked) and jobs[ranked[i]].arrival <= now:
            k = ranked[i]
            fifo.append(k) if order == "fifo" else heapq.heappush(heap, (rem[k], k))
            i += 1
        while len(ends) < slots and (fifo or heap):
            k = fifo[0] if order == "fifo" else heap[0][1]
            d = jobs[k].durations[nxt[k]]
            nxt[k] += 1
            rem[k] -= d
            heapq.heappush(ends, now + d)
            done[k] = max(done[k], now + d)
            if nxt[k] == len(jobs[k].durations):
                fifo.popleft() if order == "fifo" else heapq.heappop(heap)
            elif order == "srpt":
                heapq.heapreplace(heap, (rem[k], k))
    return [done[k] - jobs[k].arrival for k in range(len(jobs))]


def partitioned(jobs: Sequence[FlatJob], slots: int, queues: int, order: str) -> list[float]:
    """JCTs when the jobs go round-robin to ``queues`` ideal queues of ``slots / queues``
    slots each: one per GM with its users' jobs and its partition, no repartitioning
    (what ordering gains when each GM orders only its own jobs)."""
    jct: list[float] = []
    for q in range(queues):
        mine = list(jobs[q::queues])
        if mine:
            jct += single_queue(mine, max(1, slots // queues), order)
    return jct


def bound(jobs: Sequence[FlatJob], slots: int, queues: int = 1) -> dict[str, Any]:
    """Mean JCT under each order in the ideal queue, and srpt's as a factor of fifo's;
    with ``queues`` > 1, also over that many partitioned queues (``partitioned``)."""
    out: dict[str, Any] = {"slots": slots, "jobs": len(jobs)}
    for order in ORDERS:
        jct = single_queue(jobs, slots, order)
        out[order] = {"jct_mean_s": sum(jct) / len(jct), "jct_max_s": max(jct)}
    fifo = out["fifo"]["jct_mean_s"]
    out["srpt_over_fifo"] = out["srpt"]["jct_mean_s"] / fifo if fifo > 0 else 1.0
    if queues > 1:
        split = {o: partitioned(jobs, slots, queues, o) for o in ORDERS}
        means = {o: sum(v) / len(v) for o, v in split.items()}
        out[f"{queues}_queues"] = {
            "fifo_jct_mean_s": means["fifo"],
            "srpt_jct_mean_s": means["srpt"],
            "srpt_over_one_queue_fifo": means["srpt"] / fifo if fifo > 0 else 1.0,
        }
    out["offered_load"] = offered_load(jobs, slots)
    return out


def offered_load(jobs: Sequence[FlatJob], slots: int) -> float:
    """The jobs' work over ``slots`` times the span of their arrivals."""
    work = sum(sum(j.durations) for j in jobs)
    span = max(j.arrival for j in jobs) - min(j.arrival for j in jobs)
    return work / (slots * span) if span > 0 else float("inf")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", required=True, help="trace file (../shared/traces format)")
    ap.add_argument("--slots", type=int, default=10_000)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--duration-scale", type=float, default=1.0)
    ap.add_argument("--limit-jobs", type=int, default=None, help="the trace's first N jobs")
    ap.add_argument("--queues", type=int, default=1, help="also over N partitioned queues")
    ap.add_argument("--out", default="results/srpt_bound.json")
    args = ap.parse_args(argv)
    jobs = jobs_of_trace(
        args.trace, time_scale=args.time_scale, duration_scale=args.duration_scale,
        limit_jobs=args.limit_jobs,
    )  # fmt: skip
    result = {
        "trace": str(args.trace),
        "time_scale": args.time_scale,
        "limit_jobs": args.limit_jobs,
        **bound(jobs, args.slots, args.queues),
    }
    write_json(Path(args.out), result)
    print(
        f"ideal single queue, {args.slots} slots, load {result['offered_load']:.2f}: "
        f"mean JCT fifo {result['fifo']['jct_mean_s']:.1f} s, "
        f"srpt {result['srpt']['jct_mean_s']:.1f} s ({result['srpt_over_fifo']:.3f}x)"
        + (
            f"; over {args.queues} queues: {result[f'{args.queues}_queues']}"
            if args.queues > 1
            else ""
        )
        + f"\nwrote {args.out}"
    )


if __name__ == "__main__":
    main()
