"""The Megha simulator: the real GM, LM and worker cores, driven in virtual time (paper §V-B).

This module holds *no* scheduling logic.  It calls each core's one entry,
``handle(message, now)``, exactly as the live services do, delivers the effects
with a network delay, and models each GM and LM as a single server that charges
processing time for what it handles (a decision, a validation, a state update), so
queues form where they would form in a real deployment:

* GM: a message or a decision starts when the GM is free; the core is called at
  the start, its effects leave when the processing time has passed (a request's
  ``sent_at`` is stamped then, as the live driver stamps it when it posts).
* LM: a message waits in the LM's inbox; the core is called when its processing
  ends, and the answer carries the arrival as ``received_at``.
* Worker pools (one per LM, as live): the same ``WorkerPool`` core as the live
  worker; its timers (``After``) become events of the loop.
* Heartbeats: every LM sends its state delta to every GM each ``update_period_s``,
  the LMs' phases spread over the period.
* Quiet spans are skipped, not simulated tick by tick.  The federation is *quiet*
  when nothing can change before the next arrival or pool timer (a task's end): no
  message on the wire (a GM's own timer, a large job's next slice, counts as one),
  every GM and LM idle, every LM's changes already sent, no GM with a request out.
  That is an idle gap between arrivals, and equally a span where every task runs and
  none ends for days, with or without tasks waiting at a GM for room: an empty delta
  wakes none of them (nothing was freed), and the only waiting tasks woken by time,
  those of a user whose preemption grace is over, are not woken before the time the
  GM says (``GlobalMaster.unchanged_until``), which then bounds the span as the next
  arrival does.  A heartbeat there carries an empty delta that no GM acts on, a
  watchdog tick finds work running or to come, and every usage sample reads the same
  usage, so each LM parks its heartbeats and the watchdog and the usage sampler park
  too (``_sleep``).  A margin (a period and twice an empty heartbeat's echo) before
  the next event (or that GM time) they resume on their own time grids
  (``_wake``), so at that event every server, view and LM is exactly as if every tick
  had been simulated: the skipped heartbeats are accounted (``updates_applied``, each
  server's busy time and messages, and with live hop samples the draws they would
  have taken, so later hops are the same) and the skipped samples added as one run of
  the usage step function (``simulator.usage``).  The internal ``SKIP_QUIET = False``
  simulates every tick; the tests compare.  Timers and arrivals are never moved.  A
  message landing while anything is parked wakes it first (it cannot happen in a
  quiet span; a safety net).
* What each message costs a server, and what a hop takes, is ``simulator.costs``'s
  (``gm_cost``, ``decision_cost``, ``lm_cost``, ``lm_send_cost``, ``hop``): the cores'
  costs by default; calibrated to a live run, also each service's fixed cost per
  message and hop times measured live (``docs/calibration.md``).
"""

from __future__ import annotations

import gc
import heapq
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from msgspec.structs import replace

from common.cluster import ClusterSpec
from common.dag import DagJob
from common.effects import (
    After,
    Effect,
    JobRefused,
    JobSettled,
    Persist,
    Reply,
    ToAllGms,
    ToGm,
    ToLm,
    ToUser,
    ToWorker,
)
from common.errors import ConfigError
from common.ids import GmId, JobId, LmId, UserId
from common.messages import (
    AdmitJob,
    CommitGang,
    Decide,
    Heartbeat,
    LaunchRequest,
    LaunchResponse,
    PreemptRequest,
    PreemptResponse,
    ReportsTaken,
    ReserveRequest,
    ReserveResponse,
    StartTask,
    StartTasks,
    StateSnapshot,
    StateUpdated,
    StopTask,
    StopTasks,
    TaskEvent,
    TaskEvents,
    WorkerReport,
    WorkerReports,
)
from common.metrics import GmCounters, LmCounters, total
from common.model import Task, TaskKey, UserConfig
from global_master.core import AdmissionLimits, GlobalMaster
from global_master.queues import UserQueues
from local_master.core import LocalMaster
from simulator import costs
from simulator.config import SimConfig
from simulator.engine import EventLoop
from simulator.jobs import JobBook, KeptTasks
from simulator.records import RunRecords
from simulator.usage import UsageSeries
from worker.core import WorkerPool
from workload.jobs import Job, to_submission


@dataclass
class SimResult:
    records: RunRecords
    """Every task's and job's figures, taken as they ended (``simulator.records``)."""
    counters: dict[str, float]
    makespan_s: float
    kept: KeptTasks | None = None
    """Every task and job whole, when the run kept them (``keep_tasks``)."""
    usage_samples: UsageSeries = field(default_factory=lambda: UsageSeries(0.0))
    """Each user's dominant share on the sampling grid (``sample_usage_every_s``)."""
    stuck: int = 0
    events: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def _whole(self) -> KeptTasks:
        if self.kept is None:
            raise ValueError("this run kept no task (keep_tasks=False): its figures are in records")
        return self.kept

    @property
    def tasks(self) -> list[Task]:
        """Every task, in submission order: its outcome, or as submitted (kept runs)."""
        return self._whole().tasks

    @property
    def job_completion(self) -> dict[JobId, float]:
        return self._whole().job_completion

    @property
    def job_arrival(self) -> dict[JobId, float]:
        return self._whole().job_arrival

    @property
    def failed(self) -> dict[TaskKey, str]:
        return self._whole().failed

    @property
    def failed_jobs(self) -> set[JobId]:
        """Jobs with a task that failed or was refused (not in ``job_completion``)."""
        return self._whole().failed_jobs


def timing_of(result: SimResult) -> dict[str, float]:
    """What a run cost: wall and CPU seconds, CPU ms per simulated task, events."""
    n = max(1, result.records.tasks)
    return {
        "wall_s": round(result.wall_s, 3),
        "cpu_s": round(result.cpu_s, 3),
        "cpu_ms_per_task": round(1000 * result.cpu_s / n, 4),
        "events": result.events,
    }


class _Server:
    """A GM or LM as a single server with a FIFO inbox."""

    __slots__ = ("busy", "busy_s", "handled", "inbox")

    def __init__(self) -> None:
        self.inbox: deque[tuple[float, Any]] = deque()
        self.busy = False
        self.busy_s = 0.0
        """Busy time charged so far."""
        self.handled = 0
        """Messages and decision turns handled so far."""


QueuesFactory = Callable[[GmId, list[UserId]], UserQueues]

_STAMPED = frozenset({LaunchRequest, PreemptRequest, ReserveRequest, CommitGang})
"""Requests the driver stamps with ``sent_at`` as they leave (final message classes)."""

SIM_LIMITS = AdmissionLimits(max_task_duration_s=math.inf, max_user_tasks=0)
"""What the simulated GMs admit: a workload is replayed as written.  The live GM's
cap on a task's duration (``max_task_duration_s``, an operator's setting) is not a
property of a trace; applied here it refused jobs Sparrow ran, so the schedulers
compared would not see the same workload.  Nor is the cap on a user's tasks held
(``max_user_tasks``, there to bound a GM's memory)."""


@contextmanager
def _few_collections() -> Iterator[None]:
    """The cyclic garbage collector, for a run, spared what the run is made of and woken
    less often: everything made before (the federation's views, tables, the trace's
    jobs) is frozen out of its passes, and a young collection waits for
    ``GC_YOUNG`` objects, not 700.  A run makes and drops millions of small messages
    and tuples, few of them in cycles; at the defaults the collector took about a tenth
    of a large run's CPU, mostly walking the frozen objects again (and at 50,000 young
    objects still 6.0 of 54 s of a 200,000-task run, 3.3 s at 2,000,000, with the same
    peak RSS).  (Time only: no
    decision depends on when garbage goes.)"""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


GC_YOUNG = 2_000_000
"""Allocations (net) between young collections during a run (``_few_collections``)."""


def _advance(t: float, step: float, until: float) -> tuple[float, int, float]:
    """Step a tick grid from tick ``t`` to its first tick at or after ``until``, as the
    loop does (``t += step``: the same floats as ticking); how many ticks were passed,
    and the last of them (``t`` if none).

    A long span (a task of days at a 10-s heartbeat, a gap of years between arrivals)
    is not stepped tick by tick: inside one binade of floats, [2**(e-1), 2**e), every
    ``t + step`` rounds to ``t`` plus the same whole number of ulps (``_stride``), so
    ``n`` ticks are one multiplication, exact; a binade's last ticks, and the first
    one on a tie, are stepped.  A ``step`` too small to move ``t`` is a ``ValueError``
    (ticking there never ends)."""
    k = 0
    last = t
    while t < until:
        jump = _stride(t, step, until)
        if jump is not None:
            n, r, ulp = jump
            grid = round(t / ulp)
            last = (grid + (n - 1) * r) * ulp
            t = (grid + n * r) * ulp
            k += n
            continue
        nxt = t + step
        if nxt == t:
            raise ValueError(f"a tick of {step!r} s cannot move time past {t!r} s")
        last, t = t, nxt
        k += 1
    return t, k, last


def _stride(t: float, step: float, until: float) -> tuple[int, int, float] | None:
    """``(n, r, ulp)``: the next ``n >= 2`` ticks from ``t`` each add ``r`` ulps, stay
    in ``t``'s binade and below ``until``; None when fewer (the caller steps one).

    In the binade of ``t`` (normal, > 0) every float is ``T * ulp`` with ``T`` a whole
    number below ``2**53``, and ``t + step`` is ``T + step/ulp`` rounded to the nearest
    whole number, ties to even -- while that sum stays below ``2**53``.  Off a tie
    that adds ``round(step/ulp)`` every time; on a tie (``step/ulp`` = a + 1/2) it
    adds whichever of a, a+1 is even once ``T`` is even, which it is after one tick."""
    if t < sys.float_info.min:  # zero or subnormal: no fixed ulp
        return None
    ulp = math.ulp(t)
    s = step / ulp  # exact: ulp is a power of two
    if not s < 2.0**52:  # one tick leaves the binade
        return None
    a = math.floor(s)
    frac = s - a
    grid = round(t / ulp)
    if frac < 0.5:
        r = a
    elif frac > 0.5:
        r = a + 1
    elif grid % 2:
        return None
    else:
        r = a if a % 2 == 0 else a + 1
    if r == 0:
        return None
    x = until / ulp
    below = (math.ceil(x) - 1 - grid) // r if x < 2.0**60 else 1 << 60
    inside = (2**53 - a - 2 - grid) // r + 1 if grid <= 2**53 - a - 2 else 0
    n = min(below, inside)
    return (n, r, ulp) if n >= 2 else None


class MeghaSimulation:
    """A federation of GMs, LMs and worker pools in virtual time, driving the real cores."""

    SKIP_QUIET: ClassVar[bool] = True
    """Internal: skip quiet spans (module docstring).  False simulates every heartbeat
    and watchdog tick; the equivalence tests compare the two."""

    def __init__(
        self,
        clusters: Sequence[ClusterSpec],
        gm_ids: Sequence[GmId],
        users: Sequence[UserConfig],
        config: SimConfig | None = None,
        queues_factory: QueuesFactory | None = None,
        *,
        records: RunRecords | None = None,
        keep_tasks: bool = True,
    ) -> None:
        """``records``: where each task's and job's figures go as they end (a new
        ``RunRecords`` if None); ``keep_tasks``: also keep every task whole for the
        result (``SimResult.tasks``; a long trace wants False: memory bounded by what
        is in flight)."""
        self.cfg = config or SimConfig()
        self._hops = random.Random(0)
        self.loop = EventLoop()
        self.gms: dict[GmId, GlobalMaster] = self._make_gms(
            [c.lm for c in clusters], gm_ids, users, queues_factory
        )
        self.lms: dict[LmId, LocalMaster] = self._make_lms(clusters, gm_ids)
        self.pools: dict[LmId, WorkerPool] = {
            c.lm: WorkerPool(c.lm, len(c.nodes), commands=False) for c in clusters
        }
        self.user_gm: dict[UserId, GmId] = {u.user: u.gm for u in users}
        self._gm_srv = {g: _Server() for g in self.gms}
        self._lm_srv = {lm: _Server() for lm in self.lms}
        self.book = JobBook(records, keep=keep_tasks)
        self.usage_samples = UsageSeries(self.cfg.sample_usage_every_s or 0.0)
        self._total_capacity = self._capacity_totals()
        self._idle_ticks = 0
        self._arrivals_left = 0
        self._arrivals: list[float] = []
        """Arrival times still to come (a heap)."""
        self._timers: list[float] = []
        """When each pending pool timer fires (a heap)."""
        self._in_flight = 0
        """Messages on the wire (scheduled, not yet landed)."""
        self._hb_sent: dict[LmId, int] = {}
        """Each LM's state version when its last heartbeat was delivered."""
        self._parked: dict[LmId, float] = {}
        """LMs skipping their heartbeats in a quiet span: the first beat skipped."""
        self._watchdog_parked: float | None = None
        """The watchdog's first tick skipped in a quiet span (None: ticking)."""
        self._sampler_parked: float | None = None
        """The usage sampler's first tick skipped in a quiet span (None: ticking)."""
        self._asleep = False
        """Something is parked (``_wake`` resumes it)."""
        self._wake_due = math.inf
        self._margin = math.inf
        """How long before the next event parked ticks resume (``run`` sets it)."""
        self._skipped_beats = 0
        self.stuck = 0
        self._stream: Iterator[Job | DagJob] = iter(())
        """Jobs still to come of a stream (``stream_jobs``)."""
        self._stream_at = -math.inf
        self._streamed = 0
        self._first_views()

    def _first_views(self) -> None:
        """Every GM starts from every LM's snapshot, as a live GM does on start."""
        for lm in self.lms.values():
            for g in self.gms:
                self.gms[g].handle(lm.snapshot(g), 0.0)

    def _make_gms(
        self,
        lm_ids: list[LmId],
        gm_ids: Sequence[GmId],
        users: Sequence[UserConfig],
        queues_factory: QueuesFactory | None,
    ) -> dict[GmId, GlobalMaster]:
        """A GM core per id, each with its users' queues (``queues_factory``'s, if given)."""
        gms: dict[GmId, GlobalMaster] = {}
        for g in gm_ids:
            mine = [u.user for u in users if u.gm == g]
            queues = queues_factory(g, mine) if queues_factory else None
            gms[g] = GlobalMaster(
                g,
                lm_ids,
                users,
                max_retries=self.cfg.max_retries,
                patience=self.cfg.patience,
                queues=queues,
                limits=SIM_LIMITS,
                overload=self.cfg.overload,
            )
        return gms

    def _make_lms(
        self, clusters: Sequence[ClusterSpec], gm_ids: Sequence[GmId]
    ) -> dict[LmId, LocalMaster]:
        """An LM core per cluster."""
        return {
            c.lm: LocalMaster(
                c.lm,
                c.nodes,
                c.home,
                gms=gm_ids,
                report_starts=False,
                victims_younger_than_wait=self.cfg.overload.victims_younger_than_wait,
                reroute=self.cfg.overload.reroute_at_lm,
            )
            for c in clusters
        }

    @property
    def outstanding(self) -> int:
        """Tasks without an outcome yet (the stuck ones count as done once declared)."""
        return 0 if self.stuck else self.book.outstanding

    def _capacity_totals(self) -> list[int]:
        tot: list[int] = []
        for lm in self.lms.values():
            for cap in lm.nodes.capacity:
                if not tot:
                    tot = [0] * len(cap)
                for r, x in enumerate(cap):
                    tot[r] += x
        return tot

    # ---------------------------------------------------------------- input
    def add_jobs(self, jobs: Iterable[Job | DagJob]) -> None:
        """Jobs enter their user's GM queue at their arrival time."""
        for job in jobs:
            if job.user not in self.user_gm:
                raise ValueError(f"job {job.job_id}: user {job.user!r} has no GM")
            self.book.add(job)
            self._arrivals_left += 1
            heapq.heappush(self._arrivals, job.arrival)
            self.loop.at(job.arrival, self._arrive, job)

    def stream_jobs(self, jobs: Iterable[Job | DagJob]) -> None:
        """Jobs taken from ``jobs`` one at a time, each when the one before it arrives,
        so a streamed trace is never held whole (``add_jobs`` schedules them all at
        once); ``jobs`` must come in arrival order.  Each arrival is ordered before any
        other event of its instant, as ``add_jobs`` (called before ``run``) orders
        them: the same run either way."""
        self._stream = iter(jobs)
        self._stream_at = -math.inf
        self._streamed = 0
        self._take_streamed()

    def _take_streamed(self) -> None:
        """Schedules the stream's next job, if any (the arrivals heap then holds it)."""
        job = next(self._stream, None)
        if job is None:
            return
        if job.arrival < self._stream_at:
            raise ConfigError(
                f"job {job.job_id} arrives at {job.arrival:g} s, before the job streamed "
                f"before it ({self._stream_at:g} s): a stream must come in arrival order",
                reason="bad_trace",
            )
        if job.user not in self.user_gm:
            raise ValueError(f"job {job.job_id}: user {job.user!r} has no GM")
        self._stream_at = job.arrival
        self.book.add(job)
        self._arrivals_left += 1
        heapq.heappush(self._arrivals, job.arrival)
        self.loop.arrival(job.arrival, self._streamed, self._arrive_streamed, job)
        self._streamed += 1

    def _arrive_streamed(self, job: Job | DagJob) -> None:
        self._take_streamed()  # first: the next arrival is known while this one lands
        self._arrive(job)

    def _arrive(self, job: Job | DagJob) -> None:
        if self._asleep:
            self._wake()
        self._arrivals_left -= 1
        heapq.heappop(self._arrivals)  # this one (arrivals come in time order)
        sub = to_submission(job, "", self.loop.now)
        self._deliver_gm(self.user_gm[job.user], AdmitJob(job=sub))

    # ----------------------------------------------------------------- wire
    def _send(self, at: float, land: Callable[..., None], *args: Any) -> None:
        """Put a message on the wire; ``land(*args)`` delivers it at ``at``."""
        self._in_flight += 1
        self.loop.at(at, land, *args)

    def _land_gm(self, gm_id: GmId, msg: Any) -> None:
        self._landed()
        self._deliver_gm(gm_id, msg)

    def _land_all_gms(self, msg: StateUpdated) -> None:
        self._landed()
        for g in self.gms:
            self._deliver_gm(g, msg)

    def _land_lm(self, lm_id: LmId, msg: Any) -> None:
        self._landed()
        self._deliver_lm(lm_id, msg)

    def _land_pool(self, lm_id: LmId, msg: Any) -> None:
        self._landed()
        self._deliver_pool(lm_id, msg)

    def _landed(self) -> None:
        self._in_flight -= 1
        if self._asleep:  # never in a quiet span; a safety net
            self._wake()

    # ------------------------------------------------------------------ GMs
    def _deliver_gm(self, gm_id: GmId, msg: Any) -> None:
        srv = self._gm_srv[gm_id]
        srv.inbox.append((self.loop.now, msg))
        if not srv.busy:
            self._gm_step(gm_id)

    def _gm_step(self, gm_id: GmId) -> None:
        """The GM handles its next message, or makes its next decisions, or idles."""
        srv = self._gm_srv[gm_id]
        gm = self.gms[gm_id]
        now = self.loop.now
        if srv.inbox:
            _, msg = srv.inbox.popleft()
            effects = gm.handle(msg, now)
            cost = costs.gm_cost(self.cfg, msg)
        elif gm.has_work():
            before = gm.counters.decisions
            effects = gm.handle(Decide(max_tasks=self.cfg.batch), now)
            cost = costs.decision_cost(self.cfg, gm.counters.decisions - before)
        else:
            srv.busy = False
            return
        srv.busy = True
        srv.busy_s += cost
        srv.handled += 1
        done = now + cost
        self._route(effects, done, gm_id=gm_id)
        self.loop.at(done, self._gm_step, gm_id)

    # ------------------------------------------------------------------ LMs
    def _deliver_lm(self, lm_id: LmId, msg: Any) -> None:
        srv = self._lm_srv[lm_id]
        srv.inbox.append((self.loop.now, msg))
        if not srv.busy:
            self._lm_step(lm_id)

    def _lm_step(self, lm_id: LmId) -> None:
        """The LM takes its next message; the core runs when its processing ends."""
        srv = self._lm_srv[lm_id]
        if not srv.inbox:
            srv.busy = False
            return
        cost = costs.lm_cost(self.cfg, srv.inbox[0][1])
        srv.busy = True
        srv.busy_s += cost
        srv.handled += 1
        self.loop.after(cost, self._lm_done, lm_id)

    def _lm_done(self, lm_id: LmId) -> None:
        srv = self._lm_srv[lm_id]
        arrived, msg = srv.inbox.popleft()
        now = self.loop.now
        effects = self.lms[lm_id].handle(msg, now)
        send = costs.lm_send_cost(self.cfg, effects)  # encoding what it publishes
        self._lm_srv[lm_id].busy_s += send
        self._route(effects, now + send, lm_id=lm_id, request=msg, arrived=arrived)
        if send > 0:
            self.loop.after(send, self._lm_step, lm_id)
        else:
            self._lm_step(lm_id)

    def _heartbeat(self, lm_id: LmId) -> None:
        if self.outstanding <= 0:
            return
        version = self.lms[lm_id].version
        if self._hb_sent.get(lm_id) == version and self._sleep():
            self._parked[lm_id] = self.loop.now  # an empty delta no GM would act on
            return
        self._hb_sent[lm_id] = version
        self._deliver_lm(lm_id, Heartbeat())
        self.loop.after(self.cfg.update_period_s, self._heartbeat, lm_id)

    # ---------------------------------------------------------- quiet spans
    def _quiet_until(self) -> float:
        """When ticks parked now must resume: a margin before the next arrival or pool
        timer, or before a GM's time-driven work (``unchanged_until``: a waiting task's
        user whose preemption grace ends), if nothing can change the federation before
        it (module docstring); else -inf (nothing may park).  Every heartbeat the GMs
        would handle before that GM time (it left its LM more than an echo earlier) is
        an empty update that changes nothing there but the counts accounted."""
        if not self.SKIP_QUIET or self._in_flight:
            return -math.inf
        nxt = min(
            self._timers[0] if self._timers else math.inf,
            self._arrivals[0] if self._arrivals else math.inf,
        )
        if nxt == math.inf:  # nothing will ever happen: the watchdog must see it
            return -math.inf
        wake = nxt - self._margin
        if wake <= self.loop.now:
            return -math.inf
        for srv in (*self._gm_srv.values(), *self._lm_srv.values()):
            if srv.busy or srv.inbox:
                return -math.inf
        for gm in self.gms.values():
            if gm.inflight:  # a request out
                return -math.inf
            # tasks waiting for room: woken by time only when a user's grace is over
            wake = min(wake, gm.unchanged_until() - self._margin)
        if wake <= self.loop.now:
            return -math.inf
        sent = self._hb_sent
        for lm_id, lm in self.lms.items():
            if sent.get(lm_id) != lm.version:  # a change the GMs have not heard of yet
                return -math.inf
        return wake

    def _sleep(self) -> bool:
        """If the federation is quiet, arrange the wake-up and say the caller may park."""
        wake = self._quiet_until()
        if wake <= self.loop.now:
            return False
        self._asleep = True
        if wake < self._wake_due:
            self._wake_due = wake
            self.loop.at(wake, self._wake)
        return True

    def _wake(self) -> None:
        """A quiet span ends: parked heartbeats, the watchdog and the usage sampler
        resume at their first tick from now on their own grids; the skipped heartbeats
        are accounted, the skipped samples added."""
        self._asleep = False
        self._wake_due = math.inf
        now = self.loop.now
        period = self.cfg.update_period_s
        for lm_id, first in self._parked.items():
            beat, skipped, _ = _advance(first, period, now)
            self._account_beats(lm_id, skipped)
            self.loop.at(beat, self._heartbeat, lm_id)
        self._parked.clear()
        if self._watchdog_parked is not None:
            tick, _, _ = _advance(self._watchdog_parked, period * 3, now)
            self._watchdog_parked = None
            self.loop.at(tick, self._watchdog)
        every = self.cfg.sample_usage_every_s
        if self._sampler_parked is not None and every is not None:
            # the usage has not changed since the first skipped sample: one run of them
            first = self._sampler_parked
            tick, n, last = _advance(first, every, now)
            self.usage_samples.add(first, self._shares(), n, last)
            self._sampler_parked = None
            self.loop.at(tick, self._sample_usage)

    def _account_beats(self, lm_id: LmId, n: int) -> None:
        """What ``n`` skipped empty heartbeats of ``lm_id`` would have cost and counted:
        the LM's and each GM's busy time and messages, one update applied per GM, and
        the hop each would have drawn (so later draws are the same)."""
        if n <= 0:
            return
        self._skipped_beats += n
        lm_srv = self._lm_srv[lm_id]
        lm_srv.handled += n
        lm_srv.busy_s += n * costs.lm_cost(self.cfg, Heartbeat())
        gm_cost = self.cfg.gm_service_s + self.cfg.gm_message_s  # an empty update
        for srv in self._gm_srv.values():
            srv.handled += n
            srv.busy_s += n * gm_cost
        if self.cfg.hop_samples_s:
            for _ in range(n):
                costs.hop(self.cfg, self._hops)

    def _echo_s(self) -> float:
        """How long an empty heartbeat keeps servers busy at most: the LM, the hop, and
        every LM's update queued at one GM."""
        cfg = self.cfg
        hop = max(cfg.hop_samples_s) if cfg.hop_samples_s else cfg.network_delay_s
        lm = cfg.lm_service_s + cfg.lm_message_s
        return lm + hop + len(self.lms) * (cfg.gm_service_s + cfg.gm_message_s)

    # -------------------------------------------------------------- workers
    def _deliver_pool(self, lm_id: LmId, msg: Any) -> None:
        now = self.loop.now
        effects = self.pools[lm_id].handle(msg, now)
        self._route(effects, now, pool=lm_id)

    def _timer(self, lm_id: LmId, msg: Any) -> None:
        if self._asleep:
            self._wake()
        heapq.heappop(self._timers)  # this one (timers fire in time order)
        self._deliver_pool(lm_id, msg)

    # ---------------------------------------------------------------- wires
    def _route(
        self,
        effects: list[Effect],
        t: float,
        *,
        gm_id: GmId | None = None,
        lm_id: LmId | None = None,
        pool: LmId | None = None,
        request: Any = None,
        arrived: float = 0.0,
    ) -> None:
        """Carry out a core's effects at time ``t`` (the end of its processing)."""
        if not effects:
            return
        at = t + costs.hop(self.cfg, self._hops)
        send = self._send
        starts: list[StartTask] = []
        stops: list[StopTask] = []
        events: dict[GmId, list[TaskEvent]] = {}
        reports: list[WorkerReport] = []
        for eff in effects:  # (the commonest effects first)
            if isinstance(eff, ToWorker):
                if isinstance(eff.msg, StartTask):
                    starts.append(eff.msg)
                else:
                    stops.append(eff.msg)
            elif isinstance(eff, ToUser):
                out = eff.msg
                self.book.done(out.task, t, "" if out.finished else out.reason or "failed")
            elif isinstance(eff, ToGm):
                events.setdefault(eff.gm, []).append(eff.msg)
            elif isinstance(eff, ToLm):
                msg = eff.msg
                if isinstance(msg, WorkerReport):
                    reports.append(msg)
                    continue
                if type(msg) in _STAMPED:
                    msg = replace(msg, sent_at=t)  # the driver stamps when a request leaves
                send(at, self._land_lm, eff.lm, msg)
            elif isinstance(eff, After):
                if gm_id is not None:
                    # a large job's next slice: a message to itself (nothing is quiet meanwhile)
                    send(t + eff.delay, self._land_gm, gm_id, eff.msg)
                else:
                    assert pool is not None
                    heapq.heappush(self._timers, t + eff.delay)
                    self.loop.at(t + eff.delay, self._timer, pool, eff.msg)
            elif isinstance(eff, Reply):
                self._reply(eff.msg, at, lm_id=lm_id, pool=pool, request=request, arrived=arrived)
            elif isinstance(eff, ToAllGms):
                send(at, self._land_all_gms, eff.msg)
            elif isinstance(eff, JobRefused):
                self._refused(eff, t)
            elif not isinstance(eff, JobSettled | Persist):
                # (nothing to acknowledge or keep durable in virtual time: no GM dies)
                raise TypeError(f"the simulator cannot carry out {type(eff).__name__}")
        self._send_batches(at, lm_id, pool, starts, stops, events, reports)

    def _send_batches(
        self,
        at: float,
        lm_id: LmId | None,
        pool: LmId | None,
        starts: list[StartTask],
        stops: list[StopTask],
        events: dict[GmId, list[TaskEvent]],
        reports: list[WorkerReport],
    ) -> None:
        """What ``_route`` gathered, as the live drivers batch it: an LM's starts and
        stops to its pool, its events to each GM, a pool's reports to its LM."""
        send = self._send
        if lm_id is not None and (starts or stops):
            if stops:
                send(at, self._land_pool, lm_id, StopTasks(lm=lm_id, tasks=tuple(stops)))
            if starts:
                send(at, self._land_pool, lm_id, StartTasks(lm=lm_id, tasks=tuple(starts)))
        for g, evs in events.items():
            assert lm_id is not None
            send(at, self._land_gm, g, TaskEvents(lm=lm_id, events=tuple(evs)))
        if reports:
            assert pool is not None
            batch = tuple(reports)
            send(at, self._land_lm, pool, WorkerReports(lm=pool, reports=batch))
            # the network here loses nothing: the pool need not keep them for a new LM
            self.pools[pool].handle(ReportsTaken(reports=batch), at)

    def _reply(
        self, msg: Any, at: float, *, lm_id: LmId | None, pool: LmId | None, request: Any,
        arrived: float,
    ) -> None:  # fmt: skip
        if pool is not None:  # a worker pool answers its LM's start/stop request
            if isinstance(msg, WorkerReports) and msg.reports:
                self._send(at, self._land_lm, pool, msg)
            return
        if isinstance(msg, LaunchResponse | PreemptResponse | ReserveResponse):
            msg = replace(msg, received_at=arrived)
        gm = getattr(request, "gm", None)
        answers = LaunchResponse | PreemptResponse | StateSnapshot | ReserveResponse
        if gm is None or not isinstance(msg, answers):
            raise TypeError(f"{lm_id} answered {type(request).__name__} with {msg!r:.200}")
        self._send(at, self._land_gm, gm, msg)

    def _refused(self, eff: JobRefused, t: float) -> None:
        for spec in self.book.specs(eff.job_id):
            self.book.done_spec(spec, t, f"refused: {eff.reason}")

    # ----------------------------------------------------------------- usage
    def _sample_usage(self) -> None:
        if self.outstanding <= 0 or self.cfg.sample_usage_every_s is None:
            return
        if self._sleep():  # the usage cannot change: the samples are added at the wake
            self._sampler_parked = self.loop.now
            return
        self.usage_samples.add(self.loop.now, self._shares())
        self.loop.after(self.cfg.sample_usage_every_s, self._sample_usage)

    def _shares(self) -> dict[UserId, float]:
        """Each user's dominant share of the federation now."""
        used: dict[UserId, list[int]] = {}
        for lm in self.lms.values():
            for u, res in lm.nodes.usage.items():
                acc = used.setdefault(u, [0] * len(res))
                for r, x in enumerate(res):
                    acc[r] += x
        tot = self._total_capacity
        return {
            u: max(x / c for x, c in zip(res, tot, strict=True) if c > 0) for u, res in used.items()
        }

    # ------------------------------------------------------------------- run
    def _watchdog(self) -> None:
        """End a run that cannot progress: nothing running, nothing in flight, work left.

        Such tasks are counted as ``stuck`` (an explicit outcome, never silent).
        """
        if self.outstanding <= 0:
            return
        if self._sleep():  # work runs or is to come: the tick would find nothing stuck
            self._watchdog_parked = self.loop.now
            self._idle_ticks = 0
            return
        quiet = not self._timers and all(
            not s.busy and not s.inbox for s in (*self._gm_srv.values(), *self._lm_srv.values())
        )
        self._idle_ticks = self._idle_ticks + 1 if quiet and not self._arrivals_left else 0
        if self._idle_ticks >= 3:
            self.stuck = self.book.outstanding
            return
        self.loop.after(self.cfg.update_period_s * 3, self._watchdog)

    def server_load(self) -> dict[str, dict[str, float]]:
        """Per GM and LM: busy time charged and messages (or decision turns) handled."""
        return {
            str(name): {"busy_s": srv.busy_s, "handled": srv.handled}
            for name, srv in (*self._gm_srv.items(), *self._lm_srv.items())
        }

    def counters(self) -> dict[str, float]:
        gm = total((g.counters for g in self.gms.values()), GmCounters).as_dict()
        lm = total((m.counters for m in self.lms.values()), LmCounters).as_dict()
        # each skipped heartbeat is an (empty) update every GM would have applied
        gm["updates_applied"] += self._skipped_beats * len(self.gms)
        return {**gm, **lm}

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        start = self.book.first_arrival or 0.0
        period = self.cfg.update_period_s
        echo = self._echo_s()
        self._margin = period + 2 * echo if echo < period else math.inf
        for k, lm_id in enumerate(self.lms):
            self.loop.at(start + period * (k + 1) / len(self.lms), self._heartbeat, lm_id)
        if self.cfg.sample_usage_every_s is not None:
            self.loop.at(start, self._sample_usage)
        self.loop.at(start + period * 3, self._watchdog)
        with _few_collections():
            self.loop.run(progress=progress, stop=lambda: self.stuck > 0)
        book = self.book
        book.finish()
        return SimResult(
            records=book.records,
            counters=self.counters(),
            makespan_s=book.makespan,
            kept=book.kept(),
            usage_samples=self.usage_samples,
            stuck=self.stuck,
            events=self.loop.events,
            virtual_s=self.loop.now,
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
        )
