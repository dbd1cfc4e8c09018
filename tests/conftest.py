"""Shared builders for tests of the pure cores, and a hand-driven in-memory network.

``Network`` only routes effects between cores (GM -> LM requests, LM -> GM answers,
events and state updates, LM -> worker commands) and plays the workers; it makes
no placement decision of its own.  Tests choose what is delivered, when, in which
order, or whether it is dropped.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from common.effects import Effect, Report, ToAllGms, ToGm, ToLm, ToWorker, stamp_sent
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    LaunchRequest,
    PreemptRequest,
    StartTask,
    StopTask,
    TaskFailed,
    WorkerReport,
)
from common.model import N_CONSTRAINTS, NodeSpec, Phase, Task, UserConfig
from global_master.core import GlobalMaster
from local_master.core import LocalMaster

ALL = (1 << N_CONSTRAINTS) - 1
T = TypeVar("T")
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
) -> Task:
    """A task demanding ``(cpu, mem)``; ids are unique unless given."""
    tid = task_id if task_id is not None else f"t{next(_ids)}"
    return Task(
        task_id=TaskId(tid),
        job_id=JobId(job),
        user=UserId(user),
        demand=(cpu, mem),
        duration=duration,
        constraints=constraints,
    )


def make_lm(
    lm: str = "lm0",
    nodes: Sequence[tuple[int, int] | tuple[int, int, int]] = ((4, 4), (4, 4)),
    home: Sequence[str] | None = None,
    **kwargs: int,
) -> LocalMaster:
    """An LM whose nodes are ``(cpu, mem)`` or ``(cpu, mem, constraint_mask)``; every
    node's home is ``gm0`` unless ``home`` says otherwise."""
    specs = [
        NodeSpec(capacity=(n[0], n[1]), constraints=n[2] if len(n) > 2 else ALL) for n in nodes
    ]
    homes = [GmId(h) for h in (home if home is not None else ["gm0"] * len(nodes))]
    return LocalMaster(LmId(lm), specs, homes, log_limit=kwargs.get("log_limit"))


def make_gm(
    gm: str = "gm0",
    lms: Sequence[str] = ("lm0",),
    users: Sequence[tuple[str, str, float]] = (("u0", "gm0", 1.0),),
    *,
    max_retries: int = 3,
    patience: int = 8,
) -> GlobalMaster:
    """A GM over ``lms``; ``users`` are ``(user, serving GM, share)``."""
    cfg = [UserConfig(user=UserId(u), gm=GmId(g), share=s) for u, g, s in users]
    return GlobalMaster(
        GmId(gm), [LmId(x) for x in lms], cfg, max_retries=max_retries, patience=patience
    )


def sync_views(gm: GlobalMaster, *lms: LocalMaster) -> None:
    """Give ``gm`` a full snapshot of each LM, as after start-up."""
    for lm in lms:
        gm.on_snapshot(lm.snapshot(gm.gm_id), 0.0)


def launches(effects: Iterable[Effect]) -> list[LaunchRequest]:
    return [e.msg for e in effects if isinstance(e, ToLm) and isinstance(e.msg, LaunchRequest)]


def preempts(effects: Iterable[Effect]) -> list[PreemptRequest]:
    return [e.msg for e in effects if isinstance(e, ToLm) and isinstance(e.msg, PreemptRequest)]


def to_gm(effects: Iterable[Effect], kind: type) -> list[object]:
    return [e.msg for e in effects if isinstance(e, ToGm) and isinstance(e.msg, kind)]


def failures(effects: Iterable[Effect]) -> list[TaskFailed]:
    return [e.msg for e in effects if isinstance(e, Report)]


def _same(msg: T) -> T:
    return msg


@dataclass(slots=True)
class Envelope:
    """A message on the wire: to an LM (``ToLm``) or to a GM (``ToGm``/fan-out)."""

    dst: str
    msg: object
    to_lm: bool


@dataclass(slots=True)
class Network:
    """Routes effects between cores by hand, and plays the workers.

    Workers receive their LM's commands in order (one FIFO per node) and, being other
    processes, work on their own copy of a task; a started task is reported back at
    once with that copy's ledger.  With ``copies`` every message is copied on the
    wire, as in the live federation; without, cores share objects as in the simulator.
    """

    gms: dict[GmId, GlobalMaster]
    lms: dict[LmId, LocalMaster]
    wire: list[Envelope] = field(default_factory=list)
    inbox: dict[tuple[LmId, NodeIndex], deque[StartTask | StopTask]] = field(default_factory=dict)
    running: dict[tuple[LmId, NodeIndex, TaskId], Task] = field(default_factory=dict)
    """What each worker runs, by (LM, node, task): a worker may start a task its LM
    has already moved elsewhere (a StartTask queued before the StopTask)."""
    failed: list[TaskFailed] = field(default_factory=list)
    copies: bool = False

    def send(self, effects: Iterable[Effect], now: float, *, src_lm: LmId | None = None) -> None:
        """Put a core's effects on the wire (a GM's are stamped as sent at ``now``)."""
        effects = list(effects)
        if src_lm is None:
            stamp_sent(effects, now)
        wire = copy.deepcopy if self.copies else _same
        for e in effects:
            if isinstance(e, ToLm):
                self.wire.append(Envelope(e.lm, wire(e.msg), True))
            elif isinstance(e, ToGm):
                self.wire.append(Envelope(e.gm, wire(e.msg), False))
            elif isinstance(e, ToAllGms):
                for g in self.gms:
                    self.wire.append(Envelope(g, wire(e.msg), False))
            elif isinstance(e, ToWorker):
                assert src_lm is not None
                self.inbox.setdefault((src_lm, e.node), deque()).append(e.msg)
            else:
                self.failed.append(e.msg)

    def deliver(self, index: int, now: float) -> None:
        """Hand the ``index``-th message on the wire to its core; send its effects."""
        env = self.wire.pop(index)
        if env.to_lm:
            lm = self.lms[LmId(env.dst)]
            self.send(lm.handle(env.msg, now), now, src_lm=lm.lm_id)
        else:
            gm = self.gms[GmId(env.dst)]
            self.send(gm.handle(env.msg, now), now)

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
            self.send(gm.start(now), now)
        self.run(now)

    def decide(self, gm: GmId, now: float, max_tasks: int = 1) -> None:
        self.send(self.gms[gm].decide(now, max_tasks), now)

    def heartbeat(self, lm: LmId, now: float) -> None:
        self.send(self.lms[lm].heartbeat(now), now, src_lm=lm)

    # ------------------------------------------------------------ workers
    def work(self, lm: LmId, node: NodeIndex, now: float) -> None:
        """The worker of ``node`` takes its next command: start or stop a task."""
        cmd = self.inbox[(lm, node)].popleft()
        if isinstance(cmd, StopTask):
            self.running.pop((lm, node, cmd.task_id), None)
            return
        task = copy.deepcopy(cmd.task)
        task.enter(Phase.WORKER_QUEUEING, now)
        task.start(now)
        self.running[(lm, node, task.task_id)] = task
        rep = WorkerReport(lm=lm, node=node, task_id=task.task_id, kind="started", at=now)
        self.send(self.lms[lm].on_worker_report(rep, now, task=task), now, src_lm=lm)

    def work_all(self, now: float) -> None:
        for (lm, node), q in list(self.inbox.items()):
            while q:
                self.work(lm, node, now)

    def finish(
        self,
        task_id: TaskId,
        now: float,
        kind: str = "finished",
        *,
        lm: LmId | None = None,
        node: NodeIndex | None = None,
    ) -> None:
        """The worker running ``task_id`` (on ``lm``/``node`` if given) reports it ended."""
        (key,) = [
            k for k in self.running if k[2] == task_id and (lm, node) in ((None, None), k[:2])
        ]
        del self.running[key]
        lm, node, _ = key
        rep = WorkerReport(lm=lm, node=node, task_id=task_id, kind=kind, at=now)
        self.send(self.lms[lm].on_worker_report(rep, now), now, src_lm=lm)

    def lose_node(self, lm: LmId, node: NodeIndex) -> None:
        """The worker dies: its commands and running tasks vanish with it."""
        self.inbox.pop((lm, node), None)
        for key in [k for k in self.running if k[:2] == (lm, node)]:
            del self.running[key]
