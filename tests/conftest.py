"""Shared builders for tests of the pure cores, and a hand-driven in-memory network.

``Network`` only routes effects between the real cores (GM -> LM requests, LM -> GM
answers, events and state updates, LM -> worker pool commands, pool -> LM reports)
and keeps the pools' timers; it makes no decision of its own and plays no worker
logic (the pools are ``worker.core.WorkerPool``).  Tests choose what is delivered,
when, in which order, or whether it is dropped.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from msgspec.structs import replace

from common import codec
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
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    AdmitJob,
    CheckWorkers,
    CommandExited,
    Decide,
    Heartbeat,
    LaunchRequest,
    Placement,
    PreemptRequest,
    ReportKind,
    ReportsTaken,
    RequestSnapshots,
    StartTask,
    StartTasks,
    StopTask,
    StopTasks,
    SubmitJob,
    TaskDue,
    TaskEvent,
    TaskEvents,
    TaskOutcome,
    WorkerHeartbeat,
    WorkerReport,
    WorkerReports,
)
from common.model import N_CONSTRAINTS, NodeSpec, Task, TaskKey, TaskSpec, TaskState, UserConfig
from common.overload import OverloadPolicy
from global_master.core import GlobalMaster
from local_master.core import LocalMaster
from worker.core import WorkerPool

ALL = (1 << N_CONSTRAINTS) - 1
_ids = itertools.count()


def make_task(
    cpu: int = 1,
    mem: int = 1,
    *,
    constraints: int = 0,
    user: str = "u0",
    task_id: str | None = None,
    duration: float = 1.0,
    job: str = "j0",
) -> TaskSpec:
    """A task demanding ``(cpu, mem)``; ids are unique unless given."""
    tid = task_id if task_id is not None else f"t{next(_ids)}"
    return TaskSpec(
        task_id=TaskId(tid),
        job_id=JobId(job),
        user=UserId(user),
        demand=(cpu, mem),
        duration=duration,
        constraints=constraints,
    )


def key(spec: TaskSpec) -> TaskKey:
    return (spec.user, spec.task_id)


def make_lm(
    lm: str = "lm0",
    nodes: Sequence[tuple[int, int] | tuple[int, int, int]] = ((4, 4), (4, 4)),
    home: Sequence[str] | None = None,
    *,
    reroute: bool = False,
    **kwargs: int,
) -> LocalMaster:
    """An LM whose nodes are ``(cpu, mem)`` or ``(cpu, mem, constraint_mask)``; every
    node's home is ``gm0`` unless ``home`` says otherwise (``reroute``: the LM places a
    task whose node has no room elsewhere, as ``OVERLOAD_DEFAULTS`` has it)."""
    specs = [
        NodeSpec(capacity=(n[0], n[1]), constraints=n[2] if len(n) > 2 else ALL) for n in nodes
    ]
    homes = [GmId(h) for h in (home if home is not None else ["gm0"] * len(nodes))]
    gms = [GmId(f"gm{i}") for i in range(3)]
    return LocalMaster(
        LmId(lm), specs, homes, gms=gms, log_limit=kwargs.get("log_limit"), reroute=reroute
    )


def make_gm(
    gm: str = "gm0",
    lms: Sequence[str] = ("lm0",),
    users: Sequence[tuple[str, str, float]] = (("u0", "gm0", 1.0),),
    *,
    max_retries: int = 3,
    patience: int = 8,
    overload: OverloadPolicy | None = None,
    admit_slice: int = 1000,
) -> GlobalMaster:
    """A GM over ``lms``; ``users`` are ``(user, serving GM, share)``."""
    cfg = [UserConfig(user=UserId(u), gm=GmId(g), share=s) for u, g, s in users]
    return GlobalMaster(
        GmId(gm), [LmId(x) for x in lms], cfg, max_retries=max_retries, patience=patience,
        overload=overload, admit_slice=admit_slice,
    )  # fmt: skip


def sync_views(gm: GlobalMaster, *lms: LocalMaster) -> None:
    """Give ``gm`` a full snapshot of each LM, as after start-up."""
    for lm in lms:
        gm.handle(lm.snapshot(gm.gm_id), 0.0)


def jobs_of(specs: Iterable[TaskSpec], now: float) -> list[SubmitJob]:
    """The submissions of ``specs``: one job per (user, job id), in order."""
    by_job: dict[tuple[UserId, JobId], list[TaskSpec]] = {}
    for s in specs:
        by_job.setdefault((s.user, s.job_id), []).append(s)
    return [
        SubmitJob(job_id=j, user=u, token="", submitted_at=now, tasks=tuple(ts))
        for (u, j), ts in by_job.items()
    ]


def submit(
    gm: GlobalMaster, specs: Iterable[TaskSpec], now: float, *, redelivered: bool = False
) -> list[Effect]:
    """Submit ``specs`` to ``gm`` (one job per job id) and return its effects."""
    out: list[Effect] = []
    for job in jobs_of(specs, now):
        out.extend(gm.handle(AdmitJob(job=job, redelivered=redelivered), now))
    return out


def decide(gm: GlobalMaster, now: float, max_tasks: int = 1) -> list[Effect]:
    return gm.handle(Decide(max_tasks=max_tasks), now)


def task_of(gm: GlobalMaster, spec: TaskSpec) -> Task:
    """The GM's own record of a task it holds (queued, in flight or placed)."""
    (task,) = gm.tasks_of([key(spec)])
    return task


def state(gm: GlobalMaster, spec: TaskSpec) -> TaskState | None:
    return gm.state_of(key(spec))


def queued(gm: GlobalMaster) -> list[TaskSpec]:
    return [t.spec for t in gm.queues]


def launches(effects: Iterable[Effect]) -> list[LaunchRequest]:
    return [e.msg for e in effects if isinstance(e, ToLm) and isinstance(e.msg, LaunchRequest)]


def preempts(effects: Iterable[Effect]) -> list[PreemptRequest]:
    return [e.msg for e in effects if isinstance(e, ToLm) and isinstance(e.msg, PreemptRequest)]


def replies(effects: Iterable[Effect]) -> list[object]:
    return [e.msg for e in effects if isinstance(e, Reply)]


def events(effects: Iterable[Effect]) -> list[TaskEvent]:
    return [e.msg for e in effects if isinstance(e, ToGm)]


def as_events(lm: LmId, evs: Sequence[TaskEvent]) -> TaskEvents:
    return TaskEvents(lm=lm, events=tuple(evs))


def confirm_stops(lm: LocalMaster, effects: Iterable[Effect], now: float) -> list[Effect]:
    """The LM's effects once its pool confirms every stop among ``effects`` (as a pool
    answers a ``StopTasks``): preempted tasks go back to their GMs only then."""
    stops = [e.msg for e in effects if isinstance(e, ToWorker) and isinstance(e.msg, StopTask)]
    reports = tuple(
        WorkerReport(kind=ReportKind.STOPPED, node=s.node, user=s.user, task_id=s.task_id,
                     attempt=s.attempt, gm=s.gm, at=now, worker_at=now)
        for s in stops
    )  # fmt: skip
    return lm.handle(WorkerReports(lm=lm.lm_id, reports=reports), now) if reports else []


def failures(effects: Iterable[Effect]) -> list[TaskOutcome]:
    return [e.msg for e in effects if isinstance(e, ToUser) and not e.msg.finished]


def outcomes(effects: Iterable[Effect]) -> list[TaskOutcome]:
    return [e.msg for e in effects if isinstance(e, ToUser)]


def report(
    lm: LmId,
    kind: int,
    spec: TaskSpec,
    node: int,
    at: float,
    *,
    attempt: int = 1,
    worker_at: float | None = None,
    started_at: float = -1.0,
    gm: str = "gm0",
) -> WorkerReports:
    """A worker pool's report about one attempt of a task (a start at ``at`` unless
    ``started_at`` says otherwise)."""
    if kind == 0 and started_at < 0:  # ReportKind.STARTED
        started_at = at
    return WorkerReports(
        lm=lm,
        reports=(
            WorkerReport(
                kind=kind,  # type: ignore[arg-type]
                node=NodeIndex(node),
                user=spec.user,
                task_id=spec.task_id,
                attempt=attempt,
                gm=GmId(gm),
                at=at,
                worker_at=at if worker_at is None else worker_at,
                started_at=started_at,
            ),
        ),
    )


def alive(lm: LocalMaster, now: float, *nodes: int) -> None:
    """Worker heartbeats for ``nodes`` (all if none given)."""
    which = nodes or tuple(range(lm.n_nodes))
    lm.handle(WorkerHeartbeat(lm=lm.lm_id, nodes=tuple(NodeIndex(n) for n in which), at=now), now)


def check_workers(lm: LocalMaster, now: float, timeout: float) -> list[Effect]:
    return lm.handle(CheckWorkers(timeout=timeout), now)


def heartbeat(lm: LocalMaster, now: float) -> list[Effect]:
    return lm.handle(Heartbeat(), now)


def launch_req(spec: TaskSpec, node: int = 0, gm: str = "gm0", attempt: int = 1) -> LaunchRequest:
    return LaunchRequest(
        gm=GmId(gm),
        lm=LmId("lm0"),
        request_id=0,
        placements=(Placement(spec=spec, attempt=attempt, node=NodeIndex(node)),),
        known_version=-1,
    )


# ------------------------------------------------------------------- network
@dataclass(slots=True)
class Envelope:
    """A message on the wire: to an LM (``to_lm``, answered to ``reply_to``) or a GM."""

    dst: str
    msg: object
    to_lm: bool
    reply_to: str = ""


def _wire(msg: object) -> object:
    """What the other end receives: the message as the codec encodes and decodes it."""
    return codec.decode(codec.encode(msg))


def _same(msg: object) -> object:
    return msg


@dataclass(slots=True)
class Network:
    """Routes effects between cores by hand; runs the real worker-pool cores.

    Worker pools receive their LM's commands in order (one FIFO per pool).  A pool
    may be cut off from its LM (it goes on running and reporting what it had) or lose
    a node (its tasks die).  With ``copies`` every message crosses the codec, as in
    the live federation; without, cores share objects as in the simulator.
    """

    gms: dict[GmId, GlobalMaster]
    lms: dict[LmId, LocalMaster]
    wire: list[Envelope] = field(default_factory=list)
    pools: dict[LmId, WorkerPool] = field(default_factory=dict)
    inbox: dict[LmId, deque[StartTasks | StopTasks]] = field(default_factory=dict)
    timers: list[tuple[float, LmId, TaskDue]] = field(default_factory=list)
    outcomes: dict[TaskKey, TaskOutcome] = field(default_factory=dict)
    settled: list[JobSettled] = field(default_factory=list)
    refused: list[JobRefused] = field(default_factory=list)
    persisted: list[Persist] = field(default_factory=list)
    copies: bool = False

    def pool(self, lm: LmId) -> WorkerPool:
        p = self.pools.get(lm)
        if p is None:
            p = self.pools[lm] = WorkerPool(lm, self.lms[lm].n_nodes)
        return p

    def send(
        self,
        effects: Iterable[Effect],
        now: float,
        *,
        src_lm: LmId | None = None,
        src_gm: GmId | None = None,
        request: object = None,
    ) -> None:
        """Put a core's effects on the wire (a GM's requests are stamped as sent at ``now``)."""
        wire = _wire if self.copies else _same
        starts: list[StartTask] = []
        stops: list[StopTask] = []
        evs: dict[GmId, list[TaskEvent]] = {}
        for e in effects:
            if isinstance(e, ToLm):
                msg = e.msg
                if isinstance(msg, LaunchRequest | PreemptRequest):
                    msg = replace(msg, sent_at=now)
                self.wire.append(Envelope(e.lm, wire(msg), True, src_gm or ""))
            elif isinstance(e, Reply):
                to = getattr(request, "gm", None)
                assert to is not None, f"{src_lm} answered {request!r:.80} with {e.msg!r:.80}"
                self.wire.append(Envelope(to, wire(e.msg), False))
            elif isinstance(e, ToGm):
                evs.setdefault(e.gm, []).append(e.msg)
            elif isinstance(e, ToAllGms):
                for g in self.gms:
                    self.wire.append(Envelope(g, wire(e.msg), False))
            elif isinstance(e, ToWorker):
                (starts if isinstance(e.msg, StartTask) else stops).append(e.msg)  # type: ignore[arg-type]
            elif isinstance(e, ToUser):
                self.outcomes[e.msg.task.key] = e.msg
            elif isinstance(e, JobSettled):
                self.settled.append(e)
            elif isinstance(e, JobRefused):
                self.refused.append(e)
            elif isinstance(e, Persist):
                self.persisted.append(e)
            elif isinstance(e, After) and src_gm is not None:  # a large job's next slice
                self.wire.append(Envelope(src_gm, e.msg, False))
            else:
                raise TypeError(f"unexpected effect {e!r:.80}")
        for g, items in evs.items():
            assert src_lm is not None
            self.wire.append(Envelope(g, wire(TaskEvents(lm=src_lm, events=tuple(items))), False))
        if starts or stops:
            assert src_lm is not None
            q = self.inbox.setdefault(src_lm, deque())
            if stops:
                q.append(StopTasks(lm=src_lm, tasks=tuple(stops)))
            if starts:
                q.append(StartTasks(lm=src_lm, tasks=tuple(starts)))

    def deliver(self, index: int, now: float) -> None:
        """Hand the ``index``-th message on the wire to its core; send its effects."""
        env = self.wire.pop(index)
        if env.to_lm:
            lm = self.lms[LmId(env.dst)]
            self.send(lm.handle(env.msg, now), now, src_lm=lm.lm_id, request=env.msg)
        else:
            gm = self.gms[GmId(env.dst)]
            self.send(gm.handle(env.msg, now), now, src_gm=gm.gm_id)

    def run(self, now: float, limit: int = 10_000) -> None:
        """Deliver everything on the wire, oldest first, until it is quiet."""
        for _ in range(limit):
            if not self.wire:
                return
            self.deliver(0, now)
        raise AssertionError("the network did not go quiet")

    def start(self, now: float) -> None:
        """Every GM asks every LM for a snapshot; deliver until quiet."""
        for gm in self.gms.values():
            self.send(gm.handle(RequestSnapshots(), now), now, src_gm=gm.gm_id)
        self.run(now)

    def submit(self, gm: GmId, specs: Iterable[TaskSpec], now: float) -> None:
        self.send(submit(self.gms[gm], specs, now), now, src_gm=gm)

    def decide(self, gm: GmId, now: float, max_tasks: int = 1) -> None:
        self.send(decide(self.gms[gm], now, max_tasks), now, src_gm=gm)

    def place_and_start(self, gm: GmId, now: float, started: float, max_tasks: int = 1) -> None:
        """``gm`` decides on up to ``max_tasks`` at ``now``, its LMs validate, and the
        pools start what was placed at ``started``; every answer delivered."""
        self.decide(gm, now, max_tasks)
        self.run(now)
        self.work_all(started)
        self.run(started)

    def heartbeat(self, lm: LmId, now: float) -> None:
        self.send(heartbeat(self.lms[lm], now), now, src_lm=lm)

    def lm_input(self, lm: LmId, msg: object, now: float) -> None:
        """A message straight into an LM (worker heartbeats, liveness checks)."""
        self.send(self.lms[lm].handle(msg, now), now, src_lm=lm)

    # ------------------------------------------------------------ workers
    def _pool_effects(self, lm: LmId, effects: list[Effect], now: float) -> None:
        reports: list[WorkerReport] = []
        for e in effects:
            if isinstance(e, Reply):
                msg = e.msg
                if isinstance(msg, WorkerReports):
                    reports.extend(msg.reports)
            elif isinstance(e, After):
                assert isinstance(e.msg, TaskDue)
                self.timers.append((now + e.delay, lm, e.msg))
            elif isinstance(e, ToLm):
                assert isinstance(e.msg, WorkerReport)
                reports.append(e.msg)
        if reports:
            self.lm_input(lm, WorkerReports(lm=lm, reports=tuple(reports)), now)
            self.pool(lm).handle(ReportsTaken(reports=tuple(reports)), now)

    def work(self, lm: LmId, now: float) -> None:
        """The pool of ``lm`` takes its next command batch (start or stop)."""
        cmd = self.inbox[lm].popleft()
        self._pool_effects(lm, self.pool(lm).handle(cmd, now), now)

    def work_all(self, now: float) -> None:
        for lm, q in list(self.inbox.items()):
            while q:
                self.work(lm, now)

    @property
    def running(self) -> list[tuple[LmId, NodeIndex, UserId, TaskId]]:
        """What every pool runs: (LM, node, user, task)."""
        return sorted(
            (lm, r.node, k[0], k[1]) for lm, p in self.pools.items() for k, r in p.running.items()
        )

    def finish(
        self,
        task_id: TaskId,
        now: float,
        kind: str = "finished",
        *,
        lm: LmId | None = None,
        user: UserId | None = None,
    ) -> None:
        """The pool running ``task_id`` (on ``lm`` if given) reports it ended."""
        (where,) = [
            (l_, u)
            for l_, _, u, t in self.running
            if t == task_id and lm in (None, l_) and user in (None, u)
        ]
        l_, u = where
        r = self.pools[l_].running[(u, task_id)]
        msg: TaskDue | CommandExited
        if kind == "finished":
            msg = TaskDue(user=u, task_id=task_id, attempt=r.attempt)
        else:
            msg = CommandExited(user=u, task_id=task_id, attempt=r.attempt, ok=False, detail="x")
        self._pool_effects(l_, self.pools[l_].handle(msg, now), now)

    def lose_node(self, lm: LmId, node: NodeIndex) -> None:
        """The node dies: its tasks and the commands queued for it vanish with it."""
        pool = self.pool(lm)
        for k in [k for k, r in pool.running.items() if r.node == node]:
            del pool.running[k]
        q = self.inbox.get(lm)
        if q:
            kept: deque[StartTasks | StopTasks] = deque()
            for batch in q:
                tasks = tuple(t for t in batch.tasks if t.node != node)
                if tasks:
                    kept.append(replace(batch, tasks=tasks))  # type: ignore[arg-type]
            self.inbox[lm] = kept


def free_base(host: str = "127.0.0.1") -> int:
    """A base port for a federation whose service ports (GMs +0, LMs +100, pools +200,
    standbys +300) are free; below the kernel's ephemeral range (32768-60999), so no
    client socket of this machine can hold one of them when the services bind.  Tests
    running at once (pytest -n) each get their own."""
    lo, hi = _port_slice()
    for _ in range(200):
        base = random.randrange(lo, hi - 310, 10)
        ports = [
            base + k for k in (*range(10), *range(100, 110), *range(200, 210), *range(300, 310))
        ]
        if all(_bindable(host, p) for p in ports):
            return base
    raise RuntimeError("no free ports")


def _port_slice() -> tuple[int, int]:
    """This test process's own ports of [20000, 29000): each pytest-xdist worker a slice
    of its own, so that federations of tests running at once never pick overlapping
    ranges between their check and their bind (private brokers take theirs from
    ``testbed``'s range above)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    k = int(worker[2:]) if worker[2:].isdigit() else 0
    span = 9000 // count
    return 20000 + (k % count) * span, 20000 + (k % count + 1) * span


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
