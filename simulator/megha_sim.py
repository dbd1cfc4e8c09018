"""The Megha simulator: the real GM and LM cores, driven in virtual time (paper §V-B).

This module holds *no* placement logic.  It delivers messages between the cores
with a network delay, and models each GM and LM as a single server that charges
processing time for what it handles (a decision, a validation, a state update),
so queues form where they would form in a real deployment:

* GM: a message or a decision starts when the GM is free; the core is called at
  the start, its effects leave when the processing time has passed.
* LM: a request waits in the LM's inbox; the core is called when its processing
  ends (``received_at`` = arrival), and its effects leave then.
* Worker: a task starts the moment its StartTask arrives (the LM has already
  validated its resources) and reports its end to the LM after its duration.
* Heartbeats: every LM sends its state delta to every GM each ``update_period_s``,
  the LMs' phases spread over the period.

Start reports of workers are not sent in simulation (they change no decision); the
worker stamps the task's ledger itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.cluster import ClusterSpec
from common.effects import Effect, Report, ToAllGms, ToGm, ToLm, ToWorker, stamp_sent
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    LaunchRequest,
    LaunchResponse,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StartTask,
    StateSnapshot,
    StateUpdated,
    StopTask,
    TaskEvent,
    WorkerReport,
)
from common.model import Phase, Task, UserConfig
from global_master.core import GlobalMaster
from global_master.queues import UserQueues
from local_master.core import LocalMaster
from request_generator.workload import Job
from simulator.engine import EventLoop
from simulator.jobs import JobBook


@dataclass
class SimConfig:
    """Delays and processing costs (seconds).

    Processing costs default to the per-operation CPU time of the real cores, as
    measured by ``python benchmarks/bench_core.py`` on our 2-core machines (means,
    rounded up: decision 7.1 us, validation 10.3 us, update 0.48 us/node, task event
    1.2 us at the GM, worker report 2.9 us at the LM); they are constants so that the
    same seed gives the same result on any machine.
    """

    network_delay_s: float = 0.0005
    gm_decision_s: float = 7.5e-6
    gm_message_s: float = 1.5e-6
    update_node_s: float = 0.5e-6
    lm_validation_s: float = 10.5e-6
    lm_message_s: float = 3e-6
    update_period_s: float = 10.0
    batch: int = 1
    """Decisions a GM makes before sending (launches to one LM share a request)."""
    max_retries: int = 3
    patience: int = 8
    sample_usage_every_s: float | None = None
    """Record each user's dominant share of the federation this often (Carbyne reports)."""


class DagLike(Protocol):
    job_id: JobId
    user: UserId
    arrival: float

    @property
    def tasks(self) -> list[Task]: ...


@dataclass
class SimResult:
    tasks: list[Task]
    job_completion: dict[JobId, float]
    job_arrival: dict[JobId, float]
    counters: dict[str, int]
    makespan_s: float
    failed: dict[TaskId, str] = field(default_factory=dict)
    usage_samples: list[tuple[float, dict[UserId, float]]] = field(default_factory=list)
    stuck: int = 0
    events: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0


class _Server:
    """A GM or LM as a single server with a FIFO inbox."""

    __slots__ = ("busy", "inbox")

    def __init__(self) -> None:
        self.inbox: deque[tuple[float, Any]] = deque()
        self.busy = False


QueuesFactory = Callable[[GmId, list[UserId]], UserQueues]


class MeghaSimulation:
    """A federation of GMs and LMs in virtual time, driving the real cores."""

    def __init__(
        self,
        clusters: Sequence[ClusterSpec],
        gm_ids: Sequence[GmId],
        users: Sequence[UserConfig],
        config: SimConfig | None = None,
        queues_factory: QueuesFactory | None = None,
    ) -> None:
        self.cfg = config or SimConfig()
        self.loop = EventLoop()
        lm_ids = [c.lm for c in clusters]
        self.gms: dict[GmId, GlobalMaster] = {}
        for g in gm_ids:
            mine = [u.user for u in users if u.gm == g]
            queues = queues_factory(g, mine) if queues_factory else None
            self.gms[g] = GlobalMaster(
                g,
                lm_ids,
                users,
                max_retries=self.cfg.max_retries,
                patience=self.cfg.patience,
                queues=queues,
            )
        self.lms: dict[LmId, LocalMaster] = {
            c.lm: LocalMaster(c.lm, c.nodes, c.home) for c in clusters
        }
        self.user_gm: dict[UserId, GmId] = {u.user: u.gm for u in users}
        self._gm_srv = {g: _Server() for g in self.gms}
        self._lm_srv = {lm: _Server() for lm in self.lms}
        self._running: dict[TaskId, int] = {}
        self._token = 0
        self.book = JobBook()
        self.outstanding = 0
        self.usage_samples: list[tuple[float, dict[UserId, float]]] = []
        self._total_capacity = self._capacity_totals()
        self._idle_ticks = 0
        self._arrivals_left = 0
        self.stuck = 0
        for lm in self.lms.values():
            for g in self.gms:
                snap = lm.snapshot(g)
                self.gms[g].on_snapshot(snap, 0.0)

    def _capacity_totals(self) -> list[int]:
        tot: list[int] = []
        for lm in self.lms.values():
            for cap in lm.capacity:
                if not tot:
                    tot = [0] * len(cap)
                for r, x in enumerate(cap):
                    tot[r] += x
        return tot

    # ---------------------------------------------------------------- input
    def add_jobs(self, jobs: Iterable[Job | DagLike]) -> None:
        """Jobs enter their user's GM queue at their arrival time."""
        for job in jobs:
            if job.user not in self.user_gm:
                raise ValueError(f"job {job.job_id}: user {job.user!r} has no GM")
            self.book.add(job)
            self.outstanding += len(job.tasks)
            self._arrivals_left += 1
            self.loop.at(job.arrival, self._arrive, job)

    def _arrive(self, job: Job | DagLike) -> None:
        self._arrivals_left -= 1
        gm_id = self.user_gm[job.user]
        gm = self.gms[gm_id]
        now = self.loop.now
        if hasattr(job, "stages"):
            submit_job: Callable[[Any, float], list[Effect]] = getattr(gm, "submit_job")  # noqa: B009
            self._route(submit_job(job, now), now)
        else:
            gm.submit(job.tasks, now)
        self._kick_gm(gm_id)

    # ------------------------------------------------------------------ GMs
    def _deliver_gm(self, gm_id: GmId, msg: Any) -> None:
        srv = self._gm_srv[gm_id]
        srv.inbox.append((self.loop.now, msg))
        if not srv.busy:
            self._gm_step(gm_id)

    def _deliver_all_gms(self, msg: StateUpdated) -> None:
        for g in self.gms:
            self._deliver_gm(g, msg)

    def _kick_gm(self, gm_id: GmId) -> None:
        if not self._gm_srv[gm_id].busy:
            self._gm_step(gm_id)

    def _gm_step(self, gm_id: GmId) -> None:
        """The GM handles its next message, or makes its next decision, or idles."""
        srv = self._gm_srv[gm_id]
        gm = self.gms[gm_id]
        cfg = self.cfg
        now = self.loop.now
        if srv.inbox:
            _, msg = srv.inbox.popleft()
            if isinstance(msg, StateUpdated):
                effects = gm.on_state_update(msg, now)
                cost = cfg.gm_message_s + cfg.update_node_s * len(msg.delta.nodes)
            elif isinstance(msg, TaskEvent):
                effects = gm.on_task_event(msg, now)
                cost = cfg.gm_message_s
            elif isinstance(msg, LaunchResponse):
                effects = gm.on_launch_response(msg, now)
                retried = sum(1 for r in msg.results if not r.accepted)
                cost = (
                    cfg.gm_message_s
                    + cfg.update_node_s * len(msg.delta.nodes)
                    + cfg.gm_decision_s * retried
                )
            elif isinstance(msg, PreemptResponse):
                effects = gm.on_preempt_response(msg, now)
                cost = cfg.gm_message_s + cfg.gm_decision_s * (not msg.accepted)
            elif isinstance(msg, StateSnapshot):
                effects = gm.on_snapshot(msg, now)
                cost = cfg.gm_message_s + cfg.update_node_s * len(msg.state.nodes)
            else:
                raise TypeError(f"GM cannot handle {type(msg).__name__}")
        elif gm.has_work():
            before = gm.counters["decisions"]
            effects = gm.decide(now, cfg.batch)
            cost = cfg.gm_decision_s * (gm.counters["decisions"] - before)
        else:
            srv.busy = False
            return
        srv.busy = True
        done = now + cost
        stamp_sent(effects, done)
        self._route(effects, done)
        self.loop.at(done, self._gm_step, gm_id)

    # ------------------------------------------------------------------ LMs
    def _deliver_lm(self, lm_id: LmId, msg: Any) -> None:
        srv = self._lm_srv[lm_id]
        srv.inbox.append((self.loop.now, msg))
        if not srv.busy:
            self._lm_step(lm_id)

    def _lm_step(self, lm_id: LmId) -> None:
        """The LM takes its next request; the core runs when its processing ends."""
        srv = self._lm_srv[lm_id]
        if not srv.inbox:
            srv.busy = False
            return
        cfg = self.cfg
        msg = srv.inbox[0][1]
        if isinstance(msg, LaunchRequest):
            cost = cfg.lm_message_s + cfg.lm_validation_s * len(msg.placements)
        elif isinstance(msg, PreemptRequest):
            cost = cfg.lm_message_s + cfg.lm_validation_s * 4
        else:
            cost = cfg.lm_message_s
        srv.busy = True
        self.loop.after(cost, self._lm_done, lm_id)

    def _lm_done(self, lm_id: LmId) -> None:
        srv = self._lm_srv[lm_id]
        arrived, msg = srv.inbox.popleft()
        lm = self.lms[lm_id]
        now = self.loop.now
        if isinstance(msg, LaunchRequest):
            effects = lm.on_launch(msg, now, received_at=arrived)
        elif isinstance(msg, WorkerReport):
            effects = lm.on_worker_report(msg, now)
        elif isinstance(msg, PreemptRequest):
            effects = lm.on_preempt(msg, now, received_at=arrived)
        elif isinstance(msg, SnapshotRequest):
            effects = lm.on_snapshot_request(msg, now)
        elif msg == "heartbeat":
            effects = lm.heartbeat(now)
        else:
            raise TypeError(f"LM cannot handle {type(msg).__name__}")
        self._route(effects, now)
        self._lm_step(lm_id)

    def _heartbeat(self, lm_id: LmId) -> None:
        if self.outstanding <= 0:
            return
        self._deliver_lm(lm_id, "heartbeat")
        self.loop.after(self.cfg.update_period_s, self._heartbeat, lm_id)

    # -------------------------------------------------------------- workers
    def _worker_start(self, lm_id: LmId, node: NodeIndex, task: Task) -> None:
        now = self.loop.now
        task.enter(Phase.WORKER_QUEUEING, now)
        task.start(now)
        self._token += 1
        self._running[task.task_id] = self._token
        self.loop.at(now + task.duration, self._worker_finish, lm_id, node, task, self._token)

    def _worker_stop(self, task_id: TaskId) -> None:
        self._running.pop(task_id, None)

    def _worker_finish(self, lm_id: LmId, node: NodeIndex, task: Task, token: int) -> None:
        if self._running.get(task.task_id) != token:
            return  # stopped (preempted) before it finished
        del self._running[task.task_id]
        rep = WorkerReport(
            lm=lm_id, node=node, task_id=task.task_id, kind="finished", at=self.loop.now
        )
        self.loop.after(self.cfg.network_delay_s, self._deliver_lm, lm_id, rep)

    # ---------------------------------------------------------------- wires
    def _route(self, effects: list[Effect], t: float) -> None:
        at = t + self.cfg.network_delay_s
        loop = self.loop
        for eff in effects:
            if isinstance(eff, ToWorker):
                msg = eff.msg
                lm_id = msg.lm
                if isinstance(msg, StartTask):
                    loop.at(at, self._worker_start, lm_id, eff.node, msg.task)
                elif isinstance(msg, StopTask):
                    loop.at(at, self._worker_stop, msg.task_id)
            elif isinstance(eff, ToGm):
                m = eff.msg
                if isinstance(m, TaskEvent) and m.kind in ("finished", "failed"):
                    self._task_done(m.task, m.kind, t)
                loop.at(at, self._deliver_gm, eff.gm, m)
            elif isinstance(eff, ToLm):
                loop.at(at, self._deliver_lm, eff.lm, eff.msg)
            elif isinstance(eff, ToAllGms):
                loop.at(at, self._deliver_all_gms, eff.msg)
            elif isinstance(eff, Report):
                self._task_done(eff.msg.task, "failed", t, eff.msg.reason)

    def _task_done(self, task: Task, kind: str, t: float, reason: str = "") -> None:
        self.outstanding -= 1
        self.book.done(task, t, (reason or "failed on worker") if kind == "failed" else "")

    # ----------------------------------------------------------------- usage
    def _sample_usage(self) -> None:
        if self.outstanding <= 0 or self.cfg.sample_usage_every_s is None:
            return
        used: dict[UserId, list[int]] = {}
        for lm in self.lms.values():
            for u, res in lm.usage.items():
                acc = used.setdefault(u, [0] * len(res))
                for r, x in enumerate(res):
                    acc[r] += x
        tot = self._total_capacity
        self.usage_samples.append(
            (
                self.loop.now,
                {
                    u: max(x / c for x, c in zip(res, tot, strict=True) if c > 0)
                    for u, res in used.items()
                },
            )
        )
        self.loop.after(self.cfg.sample_usage_every_s, self._sample_usage)

    # ------------------------------------------------------------------- run
    def _watchdog(self) -> None:
        """End a run that cannot progress: nothing running, nothing in flight, work left.

        Such tasks are counted as ``stuck`` (an explicit outcome, never silent).
        """
        if self.outstanding <= 0:
            return
        quiet = not self._running and all(
            not s.busy and not s.inbox for s in (*self._gm_srv.values(), *self._lm_srv.values())
        )
        self._idle_ticks = self._idle_ticks + 1 if quiet and not self._arrivals_left else 0
        if self._idle_ticks >= 3:
            self.stuck = self.outstanding
            self.outstanding = 0
            return
        self.loop.after(self.cfg.update_period_s * 3, self._watchdog)

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        start = self.book.first_arrival or 0.0
        period = self.cfg.update_period_s
        for k, lm_id in enumerate(self.lms):
            self.loop.at(start + period * (k + 1) / len(self.lms), self._heartbeat, lm_id)
        if self.cfg.sample_usage_every_s is not None:
            self.loop.at(start, self._sample_usage)
        self.loop.at(start + period * 3, self._watchdog)
        self.loop.run(progress=progress)
        counters: dict[str, int] = {}
        for c in [g.counters for g in self.gms.values()] + [m.counters for m in self.lms.values()]:
            for name, v in c.items():
                counters[name] = counters.get(name, 0) + v
        book = self.book
        return SimResult(
            tasks=book.tasks,
            job_completion=book.job_completion,
            job_arrival=book.job_arrival,
            counters=counters,
            makespan_s=book.makespan,
            failed=book.failed,
            usage_samples=self.usage_samples,
            stuck=self.stuck,
            events=self.loop.events,
            virtual_s=self.loop.now,
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
        )
