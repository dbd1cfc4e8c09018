"""A worker pool's pure core: the task lifecycle on the nodes of one LM.

Theory of operation:

* One entry: ``handle(message, now) -> effects``.  ``StartTasks`` and ``StopTasks``
  come from the pool's LM; ``TaskDue`` (a synthetic task's duration elapsed) and
  ``CommandExited`` (a real process ended) come from the driver.
* A synthetic task (no command) starts the moment its ``StartTask`` arrives and holds
  its resources for its duration: the core asks for a timer (``After``).  A task with
  a command asks the driver to run it (``RunCommand``); it has started once the
  driver says so.  The started reports of a ``StartTasks`` batch travel back in the
  answer (``Reply``); later reports go to the LM (``ToLm``).
* Attempts: each ``(user, task id)`` runs at most one attempt here.  A start of an
  attempt already running is a repeat (ignored); a newer attempt replaces an older
  one (stopped first).  Timers and exits of an attempt no longer running are stale
  and ignored, so nothing ever has to be cancelled.  A start of an attempt stopped
  here before it arrived (or fenced) is answered ``LOST`` (not run): its LM places it
  again.  A start of an attempt that ended here (``ended``, bounded, kept in the
  journal across the pool's processes) is answered with that end, never run again:
  its LM sent it again (its answer was lost or late, or it came back from its
  journal) and learns the end it missed.
* A ``StartTasks`` from an older LM epoch than the newest one seen is refused: a
  superseded LM (an old incarnation, or a fenced standby) cannot start work.
* The pool registers with its LM (``RegisterPool`` -> ``RegisterWorkers``): at start,
  and whenever an LM incarnation asks, it tells which nodes live, what runs, and what
  ended since its LM last took its reports (``unreported``, until ``ReportsTaken``),
  so a restarted LM (or its standby) rebuilds its state from the workers, which hold
  what runs, and no GM places again a task that ended while no LM listened.
* **Lease**: each answer of the LM renews the pool's lease (``LeaseRenewed``).  A pool
  out of touch for longer than its lease (shorter than the LM's worker timeout) stops
  every attempt itself and reports them ``LOST``: by the time its LM declares its
  nodes dead and places their tasks elsewhere, nothing runs here any more.  A pool that
  was frozen stops them as of its lease's expiry (it did nothing since), and a start
  that reaches it while its lease is expired (sent before it froze or was cut off) is
  answered ``LOST`` instead of run: its LM may have placed that task elsewhere since.

Pure: no clocks, no processes; ``worker.runner`` carries the effects out.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from msgspec.structs import replace

from common.effects import After, Effect, KillCommand, Record, Reply, RunCommand, ToLm
from common.ids import LmId, NodeIndex
from common.messages import (
    CheckLease,
    CommandExited,
    CommandStarted,
    EndedAttempt,
    JournalTaken,
    JournalUnreported,
    LeaseRenewed,
    PlacedRef,
    Refused,
    Registered,
    RegisterPool,
    RegisterWorkers,
    ReportKind,
    ReportsTaken,
    StartTask,
    StartTasks,
    StopTasks,
    TaskDue,
    WorkerReport,
    WorkerReports,
)
from common.metrics import WorkerCounters
from common.model import TaskKey, TaskSpec
from common.reasons import RequestReason

STOP_MEMORY = 10_000
"""Attempts stopped before their start arrived that a pool remembers (tombstones)."""
END_MEMORY = 10_000
"""Attempts that ended here (finished or failed) that a pool remembers, newest last: a
start of one arriving again is answered with its end, never run a second time."""
_ENDS = (ReportKind.FINISHED, ReportKind.FAILED)
LAUNCH_LOG = 20_000
"""Rows a pool's launch log keeps (a reader polling every few seconds misses none)."""


class Running:
    """An attempt running here: its start, when it reached this pool (``worker_at``) and
    when it started (``started_at``, -1: not yet).  The start's parts read on every
    report are kept as attributes of their own (read several times per task)."""

    __slots__ = ("attempt", "gm", "node", "queued_at", "spec", "start", "started_at", "worker_at")

    def __init__(self, start: StartTask, worker_at: float, started_at: float = -1.0) -> None:
        self.start = start
        self.spec: TaskSpec = start.spec
        self.attempt: int = start.attempt
        self.node: NodeIndex = start.node
        self.gm = start.gm
        self.queued_at = start.queued_at
        self.worker_at = worker_at
        self.started_at = started_at


class WorkerPool:
    """The tasks on the nodes of one LM's cluster hosted by this pool."""

    def __init__(
        self,
        lm: LmId,
        n_nodes: int,
        *,
        commands: bool = True,
        lease_s: float | None = None,
        durable: bool = False,
    ) -> None:
        self.lm = lm
        self.lease_s = lease_s
        """The pool's lease on its LM (None: no fencing, as in the simulator)."""
        self.n_nodes = n_nodes
        self.commands = commands
        """Whether tasks may carry a command (off: every task is synthetic)."""
        self.epoch = -1
        self.renewed = -1.0
        """When the LM last answered (its lease); -1: not yet."""
        self.regained = -1.0
        """When this pool was last back in touch with its LM after its lease had lapsed
        (the ``sent`` of that renewal); a start the LM sent before it is stale."""
        self.running: dict[TaskKey, Running] = {}
        self.tombstones: OrderedDict[TaskKey, int] = OrderedDict()
        """The newest attempt of a task stopped here before it started (bounded): a
        start of that attempt arriving later (its LM had batched or the network had
        reordered them) is not run, so a preempted attempt never comes back to life."""
        self.unreported: dict[tuple[TaskKey, int], EndedAttempt] = {}
        """Finished or failed attempts whose report no LM has taken yet."""
        self.ended: OrderedDict[TaskKey, EndedAttempt] = OrderedDict()
        """The latest attempt of a task that finished or failed here (bounded, oldest
        first): a start of it that comes again is answered with its end, not run."""
        self.launches: deque[tuple[str, str, str, int, int, float]] = deque(maxlen=LAUNCH_LOG)
        """The latest starts, ends and stops: (what, user, task, attempt, node, at), for
        operators and the fault suite (two overlapping attempts would be a duplicate);
        bounded: readers follow it with ``launches_after`` as it goes."""
        self.launch_seq = 0
        """How many rows were ever logged: the number of the newest row."""
        self.counters = WorkerCounters()
        self._journal: list[object] | None = [] if durable else None
        """``durable``: unreported ends as they come and go, for the driver to write to
        the journal before the report leaves (a ``Record``): a pool killed with the rest
        of the federation still tells its LM what ended, so nothing ended runs again."""
        self._handlers: dict[type, Callable[[Any, float], list[Effect]]] = {
            StartTasks: self._on_start,
            StopTasks: self._on_stop,
            TaskDue: self._on_due,
            RegisterPool: self._on_register,
            Registered: self._on_registered,
            LeaseRenewed: self._on_renewed,
            CheckLease: self._on_check_lease,
            CommandStarted: self._on_command_started,
            CommandExited: self._on_exited,
            ReportsTaken: self._on_reports_taken,
        }

    def idle_nodes(self) -> int:
        """Nodes free of any task, counting one task per node (a node that runs
        several counts them all: a low bound)."""
        return max(self.n_nodes - len(self.running), 0)

    def handle(self, msg: object, now: float) -> list[Effect]:
        """Take one message at time ``now``; return what the driver must do.  A pool whose
        lease expired fences itself before anything else."""
        try:
            handler = self._handlers[type(msg)]
        except KeyError:
            raise TypeError(f"a worker pool does not handle {type(msg).__name__}") from None
        lease = self.lease_s
        if lease is not None and now - self.renewed > lease and type(msg) is not LeaseRenewed:
            fenced = self._fence(now, lease)  # (its own checks: within the lease, none)
            if fenced:
                return self._recorded(fenced + handler(msg, now))
        return self._recorded(handler(msg, now))

    def _recorded(self, effects: list[Effect]) -> list[Effect]:
        journal = self._journal
        if journal:
            effects.append(Record(tuple(journal)))
            journal.clear()
        return effects

    def _unreported(self, key: TaskKey, ended: EndedAttempt) -> None:
        self.unreported[(key, ended.report.attempt)] = ended
        self._remember(key, ended)
        if self._journal is not None:
            self._journal.append(JournalUnreported(ended=ended))

    def _remember(self, key: TaskKey, ended: EndedAttempt) -> None:
        """An attempt ended here (``ended``) or was fenced (a tombstone): a start of it
        that comes again does not run it."""
        if ended.report.kind not in _ENDS:
            self._tombstone(key, ended.report.attempt)
            return
        self.ended[key] = ended
        self.ended.move_to_end(key)
        while len(self.ended) > END_MEMORY:
            self.ended.popitem(last=False)

    def _accept_epoch(self, lm: LmId, epoch: int) -> Refused | None:
        """A command from this pool's LM, of its newest incarnation (or a refusal)."""
        if lm != self.lm:
            return Refused(
                reason=RequestReason.WRONG_LM, detail=f"this pool hosts {self.lm}'s nodes"
            )
        if epoch < self.epoch:
            return Refused(
                reason=RequestReason.STALE_EPOCH, detail=f"epoch {epoch} is older than {self.epoch}"
            )
        self.epoch = epoch
        return None

    def _on_start(self, msg: StartTasks, now: float) -> list[Effect]:
        refused = self._accept_epoch(msg.lm, msg.epoch)
        if refused is not None:
            self.counters.refused += 1
            return [Reply(refused)]
        bad = next((s for s in msg.tasks if not 0 <= s.node < self.n_nodes), None)
        if bad is not None:
            self.counters.refused += 1
            return [
                Reply(
                    Refused(reason=RequestReason.UNKNOWN_NODE, detail=f"node {bad.node} not hosted")
                )
            ]
        effects: list[Effect] = []
        started: list[WorkerReport] = []
        if self._lease_expired(now) or 0 <= msg.sent < self.regained:
            # sent before this pool lost touch (it was frozen, or cut off): its LM may
            # have placed these elsewhere since; they go back to it as LOST, not run.
            # Read after the lease was renewed again (a heartbeat's answer came first, a
            # start sent before the lapse waited in a socket), it is as stale: its
            # ``sent`` is before the renewal that ended the lapse
            self.counters.fenced += len(msg.tasks)
            lost = tuple(
                WorkerReport(kind=ReportKind.LOST, node=s.node, user=s.spec.user,
                             task_id=s.spec.task_id, attempt=s.attempt, gm=s.gm, at=now,
                             worker_at=now, detail="lease lost")
                for s in msg.tasks
            )  # fmt: skip
            return [Reply(WorkerReports(lm=self.lm, reports=lost))]
        for s in msg.tasks:
            self._start_one(s, now, started, effects)
        effects.insert(0, Reply(WorkerReports(lm=self.lm, reports=tuple(started))))
        return effects

    def _start_one(
        self, s: StartTask, now: float, started: list[WorkerReport], effects: list[Effect]
    ) -> None:
        spec = s.spec
        key = (spec.user, spec.task_id)
        if self.tombstones.get(key, 0) >= s.attempt:
            # stopped before it started: never run, and its LM is told (it may hold it
            # as running: a GM that lost track placed that attempt again)
            self.counters.stopped_before_start += 1
            started.append(WorkerReport(
                kind=ReportKind.LOST, node=s.node, user=spec.user, task_id=spec.task_id,
                attempt=s.attempt, gm=s.gm, at=now, worker_at=now,
                detail="stopped before it started",
            ))  # fmt: skip
            return
        r = self.running.get(key)
        if r is not None:
            if r.attempt >= s.attempt:
                self.counters.repeated += 1
                return
            self._drop(key, effects, now)
        done = self.ended.get(key)
        if (
            done is not None
            and done.report.attempt >= s.attempt
            and done.start.spec.job_id == spec.job_id  # (a later job may use the id again)
        ):
            # ended here already: its LM sent the start again (a lost or late answer, a
            # restart); it learns the end, and nothing runs twice
            self.counters.repeated += 1
            if done.report.attempt == s.attempt:
                started.append(done.report)
            return
        r = self.running[key] = Running(s, now)
        self._log(("start", spec.user, spec.task_id, s.attempt, s.node, now))
        if spec.command and self.commands:
            effects.append(RunCommand(spec, s.attempt))
            return
        r.started_at = now
        self.counters.started += 1
        started.append(self._report(ReportKind.STARTED, r, now))
        effects.append(After(spec.duration, TaskDue(user=spec.user, task_id=spec.task_id,
                                                     attempt=s.attempt)))  # fmt: skip

    def _drop(self, key: TaskKey, effects: list[Effect], now: float) -> None:
        r = self.running.pop(key)
        self.counters.stopped += 1
        self._log(("stop", key[0], key[1], r.attempt, r.node, now))
        if r.spec.command and self.commands:
            effects.append(KillCommand(r.spec.user, r.spec.task_id, r.attempt))

    def _on_register(self, msg: RegisterPool, now: float) -> list[Effect]:
        """Tell the LM which nodes live here and what they run."""
        running = tuple(r.start for r in self.running.values())
        started = tuple(
            self._report(ReportKind.STARTED, r, r.started_at)
            for r in self.running.values()
            if r.started_at >= 0
        )
        nodes = tuple(NodeIndex(n) for n in range(self.n_nodes))
        msg_ = RegisterWorkers(
            lm=self.lm,
            nodes=nodes,
            at=now,
            running=running,
            started=started,
            ended=tuple(self.unreported.values()),
        )
        return [ToLm(self.lm, msg_)]

    def _on_reports_taken(self, msg: ReportsTaken, now: float) -> list[Effect]:
        taken = [
            PlacedRef(user=rep.user, task_id=rep.task_id, attempt=rep.attempt)
            for rep in msg.reports
            if self.unreported.pop(((rep.user, rep.task_id), rep.attempt), None) is not None
        ]
        if taken and self._journal is not None:
            self._journal.append(JournalTaken(attempts=tuple(taken)))
        return []

    # ---------------------------------------------------------------- journal
    def records(self) -> list[object]:
        """This pool's durable state as journal records (a compacted journal): the ends
        no LM took, then the ends remembered (``ended``) whose reports were taken."""
        out: list[object] = [JournalUnreported(ended=e) for e in self.unreported.values()]
        taken = [e for k, e in self.ended.items() if (k, e.report.attempt) not in self.unreported]
        if taken:
            out.extend(JournalUnreported(ended=e) for e in taken)
            refs = (PlacedRef(user=e.report.user, task_id=e.report.task_id,
                              attempt=e.report.attempt) for e in taken)  # fmt: skip
            out.append(JournalTaken(attempts=tuple(refs)))
        return out

    def restore(self, records: Iterable[object]) -> None:
        """Take back the ends a former process of this pool had not had taken: they go
        to the LM with this process's registration; and the ends it remembered, so a
        start of one is not run again.  (What it ran died with it: its LM runs those
        attempts again.)"""
        for r in records:
            if isinstance(r, JournalUnreported):
                rep = r.ended.report
                key = (rep.user, rep.task_id)
                self.unreported[(key, rep.attempt)] = r.ended
                self._remember(key, r.ended)
            elif isinstance(r, JournalTaken):
                for t in r.attempts:
                    self.unreported.pop(((t.user, t.task_id), t.attempt), None)
        self.counters.journal_restored += len(self.unreported)

    def _on_registered(self, msg: Registered, now: float) -> list[Effect]:
        if msg.lm == self.lm:
            self.epoch = max(self.epoch, msg.epoch)
            self._renew(now, now)
        return []

    def _on_renewed(self, msg: LeaseRenewed, now: float) -> list[Effect]:
        self._renew(msg.sent if msg.sent >= 0 else now, now)
        return []

    def _renew(self, sent: float, now: float) -> None:
        """The LM answered a request that left at ``sent``; if the lease had lapsed by
        ``now``, this pool is back in touch as of ``sent`` (``regained``)."""
        if sent <= self.renewed:
            return
        if self._lease_expired(now):
            self.regained = max(self.regained, sent)
        self.renewed = sent

    def _on_check_lease(self, msg: CheckLease, now: float) -> list[Effect]:
        return self._fence(now, msg.lease)

    def _tombstone(self, key: TaskKey, attempt: int) -> None:
        self.tombstones[key] = max(attempt, self.tombstones.pop(key, 0))
        while len(self.tombstones) > STOP_MEMORY:
            self.tombstones.popitem(last=False)

    def _log(self, row: tuple[str, str, str, int, int, float]) -> None:
        self.launches.append(row)
        self.launch_seq += 1

    def launches_after(self, after: int) -> tuple[list[tuple[str, str, str, int, int, float]], int]:
        """The logged rows numbered above ``after``, and how many of those the bounded
        log no longer holds."""
        first = self.launch_seq - len(self.launches) + 1
        skip = max(0, after + 1 - first)
        rows = list(itertools.islice(self.launches, skip, None))
        return rows, max(0, first - after - 1)

    def _lease_expired(self, now: float) -> bool:
        """Out of touch with its LM for longer than the lease (until the LM answers)."""
        return self.lease_s is not None and self.renewed >= 0 and now - self.renewed > self.lease_s

    def _fence(self, now: float, lease: float) -> list[Effect]:
        """Out of touch for longer than the lease: stop everything (reported ``LOST``)."""
        if self.renewed < 0 or now - self.renewed <= lease or not self.running:
            return []
        at = min(now, self.renewed + lease)  # a frozen pool did nothing since
        effects: list[Effect] = []
        for key, r in list(self.running.items()):
            self._drop(key, effects, at)
            self.counters.fenced += 1
            lost = self._report(ReportKind.LOST, r, at, "lease lost")
            # kept until an LM takes it: a new incarnation that never held the task
            # learns from the registration that it must run again
            self._unreported(key, EndedAttempt(start=r.start, report=lost))
            effects.append(ToLm(self.lm, lost))
        return effects

    def _on_stop(self, msg: StopTasks, now: float) -> list[Effect]:
        """Preempted or superseded attempts: dropped, and each confirmed ``STOPPED`` in
        the answer once it runs here no more (the LM already released its resources)."""
        refused = self._accept_epoch(msg.lm, msg.epoch)
        if refused is not None:
            self.counters.refused += 1
            return [Reply(refused)]
        effects: list[Effect] = []
        stopped: list[WorkerReport] = []
        for s in msg.tasks:
            key = (s.user, s.task_id)
            r = self.running.get(key)
            if r is not None and r.attempt <= s.attempt:
                self._drop(key, effects, now)
                r = None
            if r is None:  # stopped, or not started yet: it never starts now
                self._tombstone(key, s.attempt)
                stopped.append(WorkerReport(
                    kind=ReportKind.STOPPED, node=s.node, user=s.user, task_id=s.task_id,
                    attempt=s.attempt, gm=s.gm, at=now, worker_at=now,
                ))  # fmt: skip
        effects.insert(0, Reply(WorkerReports(lm=self.lm, reports=tuple(stopped))))
        return effects

    def _current(self, user: Any, task_id: Any, attempt: int) -> Running | None:
        r = self.running.get((user, task_id))
        return r if r is not None and r.attempt == attempt else None

    def _on_due(self, msg: TaskDue, now: float) -> list[Effect]:
        r = self._current(msg.user, msg.task_id, msg.attempt)
        if r is None:
            return []  # stopped or superseded meanwhile
        return self._end(r, now, True, "")

    def _on_exited(self, msg: CommandExited, now: float) -> list[Effect]:
        r = self._current(msg.user, msg.task_id, msg.attempt)
        if r is None:
            return []
        if r.started_at < 0:  # it never got going: started and ended at once
            r.started_at = now
        out = (msg.exit_code, msg.stdout, msg.stderr)
        return self._end(r, now, msg.ok, msg.detail, out)

    def _on_command_started(self, msg: CommandStarted, now: float) -> list[Effect]:
        """The driver has the command running: the attempt has started."""
        r = self._current(msg.user, msg.task_id, msg.attempt)
        if r is None or r.started_at >= 0:
            return []
        r.started_at = now
        self.counters.started += 1
        return [ToLm(self.lm, self._report(ReportKind.STARTED, r, now))]

    def _end(
        self, r: Running, now: float, ok: bool, detail: str,
        out: tuple[int | None, bytes, bytes] | None = None,
    ) -> list[Effect]:  # fmt: skip
        """The attempt ended (``out``: its command's exit code, stdout and stderr)."""
        spec = r.spec
        key = (spec.user, spec.task_id)
        del self.running[key]
        self._log(("end", spec.user, spec.task_id, r.attempt, r.node, now))
        if ok:
            self.counters.finished += 1
        else:
            self.counters.failed += 1
        report = self._report(ReportKind.FINISHED if ok else ReportKind.FAILED, r, now, detail)
        if out is not None:
            report = replace(report, exit_code=out[0], stdout=out[1], stderr=out[2])
        self._unreported(key, EndedAttempt(start=r.start, report=report))
        return [ToLm(self.lm, report)]

    def _report(self, kind: ReportKind, r: Running, now: float, detail: str = "") -> WorkerReport:
        spec = r.spec
        return WorkerReport(
            kind=kind,
            node=r.node,
            user=spec.user,
            task_id=spec.task_id,
            attempt=r.attempt,
            gm=r.gm,
            at=now,
            worker_at=r.worker_at,
            started_at=r.started_at,
            detail=detail,
            job_id=spec.job_id,
            queued_at=r.queued_at,
        )
