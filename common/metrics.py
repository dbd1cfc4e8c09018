"""One metrics module: the cores' counters (typed), one percentile definition, and the
summaries every report is made of, with the same keys for ``megha simulate``,
``megha bench`` and the benchmarks.

Allocation time (SPEC §3) is reported three ways, all from submission to the GM queue:

* ``allocation_time_s``: to the **final** start, the one that ran to completion (the
  paper's metric for a task that runs); its components (``components_s``: queueing,
  processing, communication, worker queueing, preempted running) add up to it;
* ``first_start_s``: to the first start;
* ``reallocation_s``: final start - first start, the delay preemptions caused.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from common.ids import UserId
from common.model import COMPONENTS, Task, WaitReason

PERCENTILE_KEYS = ("p50", "p90", "p99", "p999", "max", "mean")


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """Nearest-rank percentiles (no interpolation: every figure is a measured value)."""
    if not values:
        return dict.fromkeys(PERCENTILE_KEYS, 0.0)
    xs = sorted(values)
    n = len(xs)

    def rank(q: float) -> float:
        return xs[min(n - 1, max(0, math.ceil(q * n) - 1))]

    return {
        "p50": rank(0.5),
        "p90": rank(0.9),
        "p99": rank(0.99),
        "p999": rank(0.999),
        "max": xs[-1],
        "mean": math.fsum(xs) / n,
    }


# ----------------------------------------------------------------- counters
@dataclass(slots=True)
class Counters:
    """Base of the typed counters: fields are ints (or floats), zero at start."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


C = TypeVar("C", bound=Counters)


def total(items: Iterable[C], cls: type[C]) -> C:
    """The field-wise sum of several cores' counters."""
    out = cls()
    for c in items:
        for f in fields(cls):
            setattr(out, f.name, getattr(out, f.name) + getattr(c, f.name))
    return out


@dataclass(slots=True)
class GmCounters(Counters):
    decisions: int = 0
    placed_internal: int = 0
    repartition_requests: int = 0
    """Placements a GM asked for on another GM's partition (the LM counts those it grants)."""
    internal_inconsistencies: int = 0
    external_inconsistencies: int = 0
    preemption_attempts: int = 0
    preemptions_granted: int = 0
    preempted_requeued: int = 0
    preemptions_deferred: int = 0
    """Decisions that found no room for a user below its share still in its grace period."""
    preemptions_rate_limited: int = 0
    """Preemptions not asked of an LM because this GM used its budget there this period."""
    repartition_messages: int = 0
    """Launch requests carrying repartitions (several placements may share one)."""
    requeues: int = 0
    waited: int = 0
    """Tasks that found no room and went into the waiting index."""
    woken: int = 0
    """Waiting tasks woken because freed resources could fit them."""
    failed: int = 0
    redelivered_skipped: int = 0
    tasks_adopted: int = 0
    """Running tasks a restarted GM took over from the LMs' snapshots."""
    updates_applied: int = 0
    gaps: int = 0
    stale_updates: int = 0
    """State from an LM incarnation that has been replaced (dropped)."""
    lm_restarts_seen: int = 0
    lost_with_lm: int = 0
    """Tasks an LM accepted but its next incarnation did not hold (placed again)."""
    stale_events: int = 0
    jobs_admitted: int = 0
    jobs_refused: int = 0
    jobs_settled: int = 0
    tasks_finished: int = 0


@dataclass(slots=True)
class LmCounters(Counters):
    launches: int = 0
    repartitions: int = 0
    """Placements granted on another GM's partition: logical nodes created."""
    refused_internal: int = 0
    refused_external: int = 0
    duplicates: int = 0
    preemption_requests: int = 0
    preemptions: int = 0
    preemptions_refused: int = 0
    preempted_work_s: float = 0.0
    """Work thrown away by preemption: CPU-seconds the victims had run (run time x CPU)."""
    relaunched: int = 0
    returned_to_gm: int = 0
    workers_lost: int = 0
    """Nodes declared dead: silent for ``worker_timeout_s`` (no placements on them)."""
    nodes_given_up: int = 0
    """Dead nodes silent for ``node_lost_after_s``: their tasks given up and run again."""
    held_through_silence: int = 0
    """Attempts a dead node still held when its pool spoke again (their reports settle
    them) instead of being run again while they may have ended unheard."""
    stale_reports: int = 0
    refused_requests: int = 0
    recovered: int = 0
    """Running attempts a new LM incarnation learnt from its pool's registration."""
    recovered_ends: int = 0
    """Attempts that ended while no LM took their reports, learnt at registration."""
    pauses: int = 0
    """Liveness checks skipped because the LM itself had not run for a timeout."""


@dataclass(slots=True)
class WorkerCounters(Counters):
    started: int = 0
    finished: int = 0
    failed: int = 0
    stopped: int = 0
    repeated: int = 0
    refused: int = 0
    fenced: int = 0
    """Attempts the pool stopped itself when its lease on the LM expired."""
    stopped_before_start: int = 0
    """Starts refused because their stop had come first (reordered or batched)."""


# ---------------------------------------------------------------- summaries
def task_record(task: Task) -> dict[str, Any]:
    """One CSV row per task: identity, timestamps, allocation time and its split."""
    row: dict[str, Any] = {
        "task_id": task.task_id,
        "job_id": task.job_id,
        "user": task.user,
        "gm": task.gm or "",
        "submitted_at": round(task.submitted_at, 9),
        "first_started_at": round(task.first_started_at, 9),
        "started_at": round(task.started_at, 9),
        "finished_at": round(task.finished_at, 9),
        "allocation_s": round(task.allocation_time, 9),
        "first_start_s": round(task.first_allocation_time, 9),
        "reallocation_s": round(max(0.0, task.started_at - task.first_started_at), 9)
        if task.started_at >= 0
        else -1.0,
    }
    for name, value in zip(COMPONENTS, task.components(), strict=True):
        row[f"{name}_s"] = round(value, 9)
    row["attempt"] = task.attempt
    row["decisions"] = task.decisions
    for reason in WaitReason:
        row[f"waits_{reason.name.lower()}"] = task.waits[reason]
    return row


def summarize_tasks(tasks: Sequence[Task]) -> dict[str, Any]:
    """Tails of the tasks that started, per component and per user."""
    started = [t for t in tasks if t.started_at >= 0]
    alloc = [t.allocation_time for t in started]
    per_user: dict[str, list[float]] = {}
    for t in started:
        per_user.setdefault(t.user, []).append(t.allocation_time)
    comps = [t.components() for t in started]
    waits = {r.name.lower(): sum(t.waits[r] for t in tasks) for r in WaitReason}
    waited = {r.name.lower(): sum(1 for t in tasks if t.waits[r]) for r in WaitReason}
    return {
        "allocation_time_s": percentiles(alloc),
        "first_start_s": percentiles([t.first_allocation_time for t in started]),
        "reallocation_s": percentiles([t.started_at - t.first_started_at for t in started]),
        "components_s": {
            name: percentiles([c[i] for c in comps]) for i, name in enumerate(COMPONENTS)
        },
        "per_user": {u: percentiles(v) for u, v in sorted(per_user.items())},
        "tasks": len(tasks),
        "tasks_started": len(started),
        "tasks_restarted": sum(1 for t in started if t.started_at > t.first_started_at),
        "wait_reasons": {"decisions": waits, "tasks": waited},
    }


def jct_stats(jct: Mapping[Any, float]) -> dict[str, float]:
    """Job completion times: mean, p50, p95, max (nearest rank)."""
    xs = list(jct.values())
    p = percentiles(xs)
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "max": 0.0, "jobs": 0}
    s = sorted(xs)
    p95 = s[min(len(s) - 1, max(0, math.ceil(0.95 * len(s)) - 1))]
    return {"mean": p["mean"], "p50": p["p50"], "p95": p95, "max": p["max"], "jobs": len(xs)}


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index of ``values`` (1 = perfectly even)."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


def usage_from_tasks(
    tasks: Sequence[Task], capacity: Sequence[int], first: float, last: float, step: float = 1.0
) -> list[tuple[float, dict[UserId, float]]]:
    """Each user's dominant share of the federation, sampled every ``step`` seconds,
    from the tasks' measured start and finish times."""
    edges: list[tuple[float, int, Task]] = []
    for t in tasks:
        if t.started_at >= 0 and t.finished_at >= t.started_at:
            edges.append((t.started_at, 1, t))
            edges.append((t.finished_at, -1, t))
    edges.sort(key=lambda e: (e[0], e[1]))
    used: dict[UserId, list[int]] = {}
    out: list[tuple[float, dict[UserId, float]]] = []
    k = 0
    now = first
    while now <= last:
        while k < len(edges) and edges[k][0] <= now:
            _, sign, t = edges[k]
            acc = used.setdefault(t.user, [0] * len(capacity))
            for r, x in enumerate(t.demand):
                acc[r] += sign * x
            k += 1
        out.append(
            (
                now,
                {
                    u: max((x / c for x, c in zip(v, capacity, strict=True) if c > 0), default=0)
                    for u, v in used.items()
                },
            )
        )
        now += step
    return out


JAIN_WINDOW_S = 60.0


def jain_windows(
    samples: Sequence[tuple[float, Mapping[UserId, float]]],
    spans: Mapping[UserId, Sequence[tuple[float, float]]],
    shares: Mapping[UserId, float],
    window_s: float = JAIN_WINDOW_S,
) -> dict[str, float]:
    """Jain's index of (dominant share / configured share) per window, over the users
    with a job in the system during that window (``spans``: per user, each job's
    arrival and completion)."""
    if not samples:
        return {"mean": 1.0, "min": 1.0, "max": 1.0}
    t0 = samples[0][0]
    windows: dict[int, list[Mapping[UserId, float]]] = {}
    for t, use in samples:
        windows.setdefault(int((t - t0) // window_s), []).append(use)
    idx: list[float] = []
    for w, pts in sorted(windows.items()):
        lo, hi = t0 + w * window_s, t0 + (w + 1) * window_s
        active = [
            u for u, sp in spans.items() if u in shares and any(a < hi and e > lo for a, e in sp)
        ]
        if len(active) < 2:
            continue
        xs = [sum(use.get(u, 0.0) for use in pts) / len(pts) / shares[u] for u in active]
        idx.append(jain(xs))
    if not idx:
        return {"mean": 1.0, "min": 1.0, "max": 1.0}
    return {"mean": sum(idx) / len(idx), "min": min(idx), "max": max(idx)}


class DuplicateLaunches:
    """Tasks that ran twice, from the worker pools' logs read as they come (``add`` one
    row: ``what`` start, end or stop; an attempt's rows come from one pool, in order):
    two attempts of one task running at the same time (in one pool or several), the
    same attempt started twice, or a task that ended twice.  Keeps per task only its
    attempts' spans and its count of ends, not the rows."""

    def __init__(self) -> None:
        self.spans: dict[tuple[str, str], dict[int, list[float]]] = {}
        self.ends: dict[tuple[str, str], int] = {}
        self.twice: set[tuple[str, str]] = set()

    def add(self, row: Mapping[str, Any]) -> None:
        task = (str(row["user"]), str(row["task_id"]))
        attempt, at = int(row["attempt"]), float(row["at"])
        spans = self.spans.setdefault(task, {})
        if row["what"] == "start":
            if attempt in spans:
                self.twice.add(task)
            spans[attempt] = [at, math.inf]
            return
        span = spans.get(attempt)
        if span is not None and span[1] == math.inf:
            span[1] = at
        if row["what"] == "end":
            n = self.ends[task] = self.ends.get(task, 0) + 1
            if n > 1:
                self.twice.add(task)

    def result(self, only: Container[tuple[str, str]] | None = None) -> dict[str, Any]:
        """``count`` and (the first 50) ``tasks``, among ``only`` if given."""
        dup = set(self.twice)
        for task, by_attempt in self.spans.items():
            runs = sorted(by_attempt.values())
            if any(b[0] < a[1] for a, b in itertools.pairwise(runs)):
                dup.add(task)
        found = sorted(t for t in dup if only is None or t in only)
        return {"count": len(found), "tasks": [f"{u}/{t}" for u, t in found[:50]]}


def duplicate_launches(launches: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``DuplicateLaunches`` over a whole log at once."""
    check = DuplicateLaunches()
    for row in sorted(launches, key=lambda r: float(r["at"])):
        check.add(row)
    return check.result()
