"""The idealized single queue: how far job-aware ordering alone can lower mean JCT.

One queue over ``slots`` identical slots, no constraints, no delays, no decisions to
make: a task starts the instant a slot is free.  ``fifo`` serves jobs in arrival order
(each job's tasks in order); ``srpt`` serves next the job with the least remaining work
not yet started (``global_master.policy.srpt``'s measure), non-preemptively, as Megha's
``srpt`` does, aged as it is (its remaining work halved per ``half_life_s`` since the
job arrived; ``inf``: plain SRPT).  The ratio srpt / fifo is the bound beside the federation's runs
(``benchmarks/bench_order.py``): what ordering gains with placement perfect.

    python benchmarks/srpt_bound.py --trace ../shared/traces/YH1_sub.tr --slots 10000 \\
        --time-scale 0.248 --queues 4 --out results/srpt_bound.json

``--half-lives 30,60,inf`` adds, per half-life, the aged SRPT's mean JCT and p99 of the
tasks' allocation time (arrival to start) beside FIFO's: the trade the aging makes.
"""

from __future__ import annotations

import argparse
import heapq
import math
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
    return serve(jobs, slots, order)[0]


def serve(
    jobs: Sequence[FlatJob], slots: int, order: str, half_life_s: float = math.inf
) -> tuple[list[float], list[float]]:
    """The ideal queue: each job's completion time (last task's end - arrival), and each
    task's allocation time (its start - its job's arrival)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    ranked = sorted(range(len(jobs)), key=lambda k: (jobs[k].arrival, k))
    nxt = [0] * len(jobs)  # next task of each job to start
    rem = [sum(j.durations) for j in jobs]
    done = [0.0] * len(jobs)
    alloc: list[float] = []
    queue = _Queue(jobs, rem, order, half_life_s)
    ends: list[float] = []  # busy slots' end times
    i, now = 0, 0.0
    while i < len(ranked) or queue:
        if len(ends) >= slots or not queue:
            # next event: a slot frees (when all are busy) or a job arrives
            t_end = ends[0] if ends else float("inf")
            t_arr = jobs[ranked[i]].arrival if i < len(ranked) else float("inf")
            now = max(now, min(t_end, t_arr))
        while ends and ends[0] <= now:
            heapq.heappop(ends)
        while i < len(ranked) and jobs[ranked[i]].arrival <= now:
            queue.push(ranked[i])
            i += 1
        while len(ends) < slots and queue:
            k = queue.head()
            d = jobs[k].durations[nxt[k]]
            nxt[k] += 1
            rem[k] -= d
            alloc.append(now - jobs[k].arrival)
            heapq.heappush(ends, now + d)
            done[k] = max(done[k], now + d)
            queue.served(k, last=nxt[k] == len(jobs[k].durations))
    return [done[k] - jobs[k].arrival for k in range(len(jobs))], alloc


class _Queue:
    """The ideal queue's jobs: in arrival order (``fifo``) or by aged remaining work."""

    def __init__(
        self, jobs: Sequence[FlatJob], rem: list[float], order: str, half_life_s: float
    ) -> None:
        self.jobs, self.rem, self.order, self.half_life_s = jobs, rem, order, half_life_s
        self.fifo: deque[int] = deque()
        self.heap: list[tuple[float, int]] = []

    def __bool__(self) -> bool:
        return bool(self.fifo or self.heap)

    def key(self, k: int) -> float:
        if math.isinf(self.half_life_s):
            return self.rem[k]
        return math.log2(max(self.rem[k], 1e-9)) + self.jobs[k].arrival / self.half_life_s

    def push(self, k: int) -> None:
        if self.order == "fifo":
            self.fifo.append(k)
        else:
            heapq.heappush(self.heap, (self.key(k), k))

    def head(self) -> int:
        return self.fifo[0] if self.order == "fifo" else self.heap[0][1]

    def served(self, k: int, *, last: bool) -> None:
        if self.order == "fifo":
            if last:
                self.fifo.popleft()
        elif last:
            heapq.heappop(self.heap)
        else:
            heapq.heapreplace(self.heap, (self.key(k), k))


def p99(values: Sequence[float]) -> float:
    """The 99th percentile (nearest rank below), 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))]


def half_lives(jobs: Sequence[FlatJob], slots: int, lives: Sequence[float]) -> dict[str, Any]:
    """FIFO and SRPT aged by each half-life in the ideal queue: mean JCT, its factor of
    FIFO's, the p99 of the tasks' allocation time and its factor of FIFO's."""
    jct, alloc = serve(jobs, slots, "fifo")
    fifo_mean, fifo_p99 = sum(jct) / len(jct), p99(alloc)
    out: dict[str, Any] = {"fifo": {"jct_mean_s": fifo_mean, "alloc_p99_s": fifo_p99}}
    for h in lives:
        jct, alloc = serve(jobs, slots, "srpt", h)
        mean, tail = sum(jct) / len(jct), p99(alloc)
        out[f"srpt_half_life_{h:g}"] = {
            "jct_mean_s": mean,
            "jct_vs_fifo": mean / fifo_mean if fifo_mean > 0 else 1.0,
            "alloc_p99_s": tail,
            "alloc_p99_vs_fifo": tail / fifo_p99 if fifo_p99 > 0 else 1.0,
        }
    return out


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
    ap.add_argument(
        "--half-lives", default="", help="comma list of SRPT half-lives (s; inf: plain SRPT)"
    )
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
    lives = [float(x) for x in args.half_lives.split(",") if x.strip()]
    if lives:
        result["half_lives"] = half_lives(jobs, args.slots, lives)
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
        + "".join(
            f"\n  {name}: mean JCT {row['jct_mean_s']:.1f} s, alloc p99 {row['alloc_p99_s']:.1f} s"
            for name, row in result.get("half_lives", {}).items()
        )
        + f"\nwrote {args.out}"
    )


if __name__ == "__main__":
    main()
