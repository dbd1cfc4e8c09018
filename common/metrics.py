"""The cores' counters (typed), the one percentile definition of every figure, and the
check that no task ran twice (the worker pools' launch logs).

The summaries, task CSVs and plots made of them are ``reporting``.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

import msgspec

PERCENTILE_KEYS = ("p50", "p90", "p99", "p999", "max", "mean")


def nearest_rank(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (sorted ascending) by nearest rank: the smallest
    value with at least ``q`` of them at or below it -- the one percentile definition
    of every summary (no interpolation: every figure is a measured value); 0 if empty."""
    n = len(xs)
    return xs[min(n - 1, max(0, math.ceil(q * n) - 1))] if n else 0.0


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99, p999 (``nearest_rank``), max and mean of ``values``."""
    if not values:
        return dict.fromkeys(PERCENTILE_KEYS, 0.0)
    xs = sorted(values)
    return {
        "p50": nearest_rank(xs, 0.5),
        "p90": nearest_rank(xs, 0.9),
        "p99": nearest_rank(xs, 0.99),
        "p999": nearest_rank(xs, 0.999),
        "max": xs[-1],
        "mean": math.fsum(xs) / len(xs),
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
    rerouted: int = 0
    """Inconsistencies the LM made good by placing on another node (nothing retried)."""
    jobs_keeping_ends: int = 0
    """Jobs whose delivery was held so long that their LMs were asked to keep what of
    them ended (``KeepEnds``), so that a restarted GM runs none of it again."""
    ends_seen: int = 0
    """Task ends (finished or failed) this GM heard of from the LMs."""
    end_lag_s: float = 0.0
    """Their summed lag: the event's arrival here minus the end on the worker (across
    hosts, plus the clocks' skew).  ``end_lag_s / ends_seen`` is how long, on average,
    this GM's view still holds a slot after its task ended (Little's law: busy slots
    in the view = rate x (run time + launch path + this))."""
    preemption_attempts: int = 0
    preemptions_granted: int = 0
    preempted_requeued: int = 0
    preemptions_deferred: int = 0
    """Decisions that found no room for a user below its share still in its grace period."""
    preemptions_rate_limited: int = 0
    """Preemptions not asked of an LM because this GM used its budget there this period."""
    repartition_messages: int = 0
    """Launch requests carrying repartitions (several placements may share one)."""
    launch_requests: int = 0
    """Launch requests sent (placements per request = decisions / launch_requests)."""
    requeues: int = 0
    waited: int = 0
    """Tasks that found no room and went into the waiting index."""
    woken: int = 0
    """Waiting tasks woken because freed resources could fit them."""
    failed: int = 0
    redelivered_skipped: int = 0
    tasks_adopted: int = 0
    """Running tasks a restarted GM took over from the LMs' snapshots."""
    orphans_queued: int = 0
    """Tasks an LM gave back (requeued, preempted) that a restarted GM held no record of:
    queued again from the event's spec (and kept on the broker)."""
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
    jobs_cancelled: int = 0
    """Cancels of a job this GM held (``CancelJob``; a repeated one counts again)."""
    revoked_ended: int = 0
    """Tasks of users whose token was revoked, ended ``user_revoked`` (queued or stopped)."""


@dataclass(slots=True)
class LmCounters(Counters):
    launches: int = 0
    repartitions: int = 0
    """Placements granted on another GM's partition: logical nodes created."""
    refused_internal: int = 0
    refused_external: int = 0
    rerouted: int = 0
    """Placements whose node had no room, placed on another node instead (``reroute``)."""
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
    stale_keep_ends: int = 0
    """``KeepEnds`` to keep a job's ends that came after its GM let them go (ignored)."""
    refused_foreign: int = 0
    """Placements and preemptions for a user not of the sending GM (``foreign_user``)."""
    journal_restored: int = 0
    """Attempts (held, stopping, ended) a new incarnation took back from its journal."""
    journal_skipped: int = 0
    """Journal records of nodes or GMs the federation no longer has (ignored)."""
    revoked_stops: int = 0
    """Attempts stopped because their user's token was revoked (``StopUserTasks``)."""


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
    journal_restored: int = 0
    """Unreported ends a new pool process took back from its journal."""


_Attempt = tuple[tuple[str, str], int]
"""(user, task id) and attempt number."""


class LaunchRow(msgspec.Struct, frozen=True, gc=False):
    """A row of a worker pool's launch log, as ``DuplicateLaunches`` reads it: an
    attempt's ``start``, ``end`` or ``stop`` at ``at`` (the pool's clock)."""

    what: str
    user: str
    task_id: str
    attempt: int
    at: float

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> LaunchRow:
        """A row given as a mapping (a log read whole), its values taken as their types."""
        return cls(
            row["what"], str(row["user"]), str(row["task_id"]), int(row["attempt"]),
            float(row["at"]),
        )  # fmt: skip


class DuplicateLaunches:
    """Tasks that ran twice, from the worker pools' logs read as they come (``add`` one
    row: ``what`` start, end or stop; an attempt's rows come from one pool, in order):
    two attempts of one task running at the same time (in one pool or several), the
    same attempt started twice, or a task that ended twice.  Keeps per task only its
    attempts' spans and its count of ends, not the rows.

    A pool process's attempts end with it.  A row naming its ``pool`` and that pool
    process's ``incarnation`` (``LaunchLog`` adds both), or ``heard`` (the pool
    answered), says when the incarnation was last known alive; once a newer incarnation
    of the pool is heard of, the older one's attempts that logged no end are taken as
    ended then (killed with their process), not as running beside their relaunch, and
    such an attempt may start again.  An incarnation no newer one followed keeps its
    attempts running to the end of the log (a pool that never came back cannot say).

    With ``horizon_s`` (a long run), a task that ended and whose every attempt ended is
    judged once no row of it came for ``horizon_s`` (log time: the latest ``at`` seen)
    and then forgotten but for a verdict of "ran twice"; a row of it after that is
    checked only against its later rows."""

    def __init__(self, horizon_s: float | None = None) -> None:
        self.spans: dict[tuple[str, str], dict[int, list[float]]] = {}
        self.ends: dict[tuple[str, str], int] = {}
        self.twice: dict[tuple[str, str], str] = {}
        """Tasks found to have run twice, and how."""
        self._first_end: dict[tuple[str, str], tuple[str, str]] = {}
        """Task -> the pool process that logged its (first) end."""
        self.horizon_s = horizon_s
        self._ended: deque[tuple[float, tuple[str, str]]] = deque()
        self._latest = -math.inf
        self._pools: dict[str, tuple[str, float]] = {}
        """Pool -> its latest incarnation and when that was last heard of."""
        self._running: dict[tuple[str, str], set[_Attempt]] = {}
        """(pool, incarnation) -> its attempts started and not ended."""
        self._died: set[_Attempt] = set()
        """Attempts ended with their pool's incarnation."""
        self.rows = 0
        """Rows checked (a check that read nothing found nothing)."""
        self.restarts = 0
        """Pools heard of under a new incarnation."""

    def heard(self, pool: str, incarnation: str, at: float) -> None:
        """Pool ``pool``'s process ``incarnation`` was alive at ``at``: an older
        incarnation's attempts ended when it was last heard of."""
        known = self._pools.get(pool)
        if known is not None and known[0] != incarnation:
            self.restarts += 1
            self._end_incarnation(pool, *known)
            known = None
        self._pools[pool] = (incarnation, at if known is None else max(known[1], at))

    def _end_incarnation(self, pool: str, incarnation: str, last: float) -> None:
        for task, attempt in self._running.pop((pool, incarnation), ()):
            span = self.spans.get(task, {}).get(attempt)
            if span is not None and span[1] == math.inf:
                span[1] = max(span[0], last)
                self._died.add((task, attempt))

    def add(self, row: Mapping[str, Any]) -> None:
        """One row (``what``, ``user``, ``task_id``, ``attempt``, ``at``; and ``pool``
        with the pool process's ``incarnation``, if it names one)."""
        incarnation = row.get("incarnation")
        pool = row["pool"] if incarnation is not None else ""
        self.add_rows((LaunchRow.of(row),), pool, incarnation)

    def add_rows(self, rows: Iterable[LaunchRow], pool: str, incarnation: object | None) -> None:
        """A page of one pool's log: ``add`` of each row, in order, as if it named
        ``pool`` and ``incarnation`` (None: a pool that does not name it), with the
        same findings and state after each row, in one pass: the pool process is
        heard of with the page's first row and then once with its latest time (one
        process: no restart between), and the horizon is looked at only when it
        would forget something."""
        spans_of, running_of = self.spans, self._running
        ends, twice, first_end = self.ends, self.twice, self._first_end
        horizon, ended, latest = self.horizon_s, self._ended, self._latest
        where: tuple[str, str] | None = None
        running: set[_Attempt] | None = None
        inf = math.inf
        heard_at, n = -inf, 0
        try:
            for row in rows:
                n += 1
                task = (row.user, row.task_id)
                attempt, at = row.attempt, row.at
                if incarnation is not None:
                    if where is None:  # the first row: a new process of the pool, maybe
                        where, running = self._page_from(pool, incarnation, at)
                    elif at > heard_at:
                        heard_at = at
                spans = spans_of.get(task)
                if spans is None:
                    spans = spans_of[task] = {}
                what = row.what
                if what == "start":
                    if attempt in spans:
                        self._started_again(task, attempt, spans)
                    spans[attempt] = [at, inf]
                    if where is not None:
                        if running is None:
                            running = running_of.setdefault(where, set())
                        running.add((task, attempt))
                else:
                    span = spans.get(attempt)
                    if span is not None and span[1] == inf:
                        span[1] = at
                    if running is not None:
                        running.discard((task, attempt))
                    if what == "end":
                        k = ends[task] = ends.get(task, 0) + 1
                        if k > 1:
                            twice.setdefault(task, self._ended_twice(task))
                        elif where is not None:
                            first_end[task] = where
                        if horizon is not None:
                            ended.append((at, task))
                if horizon is not None:
                    if at > latest:
                        latest = self._latest = at
                    if ended and ended[0][0] < latest - horizon:
                        self._forget(latest - horizon)
        finally:
            self.rows += n
            if where is not None and heard_at > -inf:
                self.heard(*where, heard_at)

    def _page_from(
        self, pool: str, incarnation: object, at: float
    ) -> tuple[tuple[str, str], set[_Attempt] | None]:
        """``add_rows``' first row of a page: the pool process it names heard of at
        ``at`` (a new one, maybe), and the attempts it runs, if any."""
        where = (str(pool), str(incarnation))
        self.heard(*where, at)
        return where, self._running.get(where)

    def _started_again(
        self, task: tuple[str, str], attempt: int, spans: Mapping[int, list[float]]
    ) -> None:
        """``add_rows``' start of an attempt it has heard of already: twice, unless its
        pool process died since (then a finding only if it overlaps another)."""
        if (task, attempt) not in self._died:
            self.twice.setdefault(task, f"attempt {attempt} started twice")
        elif _overlap(spans):
            self.twice.setdefault(task, "two attempts at once")
        self._died.discard((task, attempt))

    def _forget(self, before: float) -> None:
        """Judge and forget the tasks that ended and were quiet since ``before``."""
        ended = self._ended
        while ended and ended[0][0] < before:
            _, task = ended.popleft()
            spans = self.spans.get(task)
            if spans is None:
                continue
            last = max(max(s) for s in spans.values()) if spans else -math.inf
            if last == math.inf:  # an attempt still runs: judged at the end
                continue
            if last >= before:  # heard of since: later
                ended.append((last, task))
                continue
            if _overlap(spans):  # the graver finding
                self.twice[task] = "two attempts at once"
            for attempt in spans:
                self._died.discard((task, attempt))
            del self.spans[task]
            self.ends.pop(task, None)
            self._first_end.pop(task, None)

    def _ended_twice(self, task: tuple[str, str]) -> str:
        first = self._first_end.get(task)
        if first is None or self._pools[first[0]][0] == first[1]:
            return "ended twice"
        # e.g. a pool killed after a task's end, before its LM took the report
        return f"ended twice, first in a process of {first[0]} that has been replaced since"

    def result(self, only: Container[tuple[str, str]] | None = None) -> dict[str, Any]:
        """``count`` and (the first 50) ``tasks``, among ``only`` if given; when there
        are any, ``why`` says how each of those ran twice."""
        dup = dict(self.twice)
        for task, by_attempt in self.spans.items():
            if _overlap(by_attempt):  # the graver finding
                dup[task] = "two attempts at once"
        found = sorted(t for t in dup if only is None or t in only)
        out: dict[str, Any] = {"count": len(found), "tasks": [f"{u}/{t}" for u, t in found[:50]]}
        if found:
            out["why"] = {f"{u}/{t}": dup[(u, t)] for u, t in found[:50]}
        return out


def _overlap(by_attempt: Mapping[int, list[float]]) -> bool:
    """Whether two attempts' spans overlap."""
    runs = sorted(by_attempt.values())
    return any(b[0] < a[1] for a, b in itertools.pairwise(runs))


def duplicate_launches(launches: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``DuplicateLaunches`` over a whole log at once."""
    check = DuplicateLaunches()
    for row in sorted(launches, key=lambda r: float(r["at"])):
        check.add(row)
    return check.result()
