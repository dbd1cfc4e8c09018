"""The GM's task ledger: where each task of its users is (paper §IV-A, §IV-B).

Invariants:

* This is the only state a GM holds consistently: nothing here is stale, since only
  the GM's own decisions and its LMs' answers and events change it (the views of the
  LMs, ``global_master.view``, may be).
* Every task the GM holds is in ``live`` (queued or waiting for its DAG's parents, in
  flight or placed) until it ends; it is in at most one of ``inflight`` (a request to
  an LM is unanswered: DISPATCHED) and ``placed`` (an LM accepted it: PLACED); in
  neither, it is QUEUED.  An ended task is in ``finished`` or ``failed`` (with why) as
  long as its job's record is kept.
* A job's record (``jobs``) names its tasks.  It is *settled* (its delivery may be
  acknowledged) once each task was accepted by an LM or failed; it goes when every task
  has ended, its key remembered (``recent_jobs``, bounded) so that a reused id is
  refused.  A job held ``keep_ends_after_s`` and not settled has its LMs keep its ended
  attempts (``keep_ends_due``), for a GM that restarts before it settles.
* Counted as the tables change, never summed: each user's in-flight demands (fairness
  reads them at every decision that does not place its task) and each user's live tasks
  (admission reads them).

* A task moves between the tables only as ``common.transitions.NEXT`` allows: the
  moves are checked here (``dispatch``, ``accepted``, ``adopt``, ``end``) and a move
  the table forbids raises ``TransitionError`` (a bug), never applied.

Who changes what: the ledger moves tasks between its tables, stamps the times an LM's
answers and events carry into each task's allocation-time ledger (``took``,
``round_trip``) and answers questions; it sends nothing and calls no other piece.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.errors import ConfigError
from common.ids import JobId, LmId, UserId
from common.messages import ENDS_RETAINED_S, EventKind, TaskEvent
from common.model import Phase, Resources, Task, TaskKey, TaskState
from common.transitions import NEXT, check

JobKey = tuple[UserId, JobId]
_Q, _D, _P = TaskState.QUEUED, TaskState.DISPATCHED, TaskState.PLACED
_F, _X = TaskState.FINISHED, TaskState.FAILED
_STARTED, _FINISHED, _FAILED = EventKind.STARTED, EventKind.FINISHED, EventKind.FAILED
_QUEUEING, _PROCESSING = Phase.QUEUEING, Phase.PROCESSING
_COMMUNICATION, _WORKER_QUEUEING = Phase.COMMUNICATION, Phase.WORKER_QUEUEING
_RUNNING = Phase.RUNNING
"""(bound once: an enum member read off its class costs ~30 times a global on 3.11)"""
_SEND_QUEUED = _D in NEXT[_Q]
"""The table lets a queued task be sent (``dispatch``'s hot path needs no lookup)."""
_PLACE_SENT = _P in NEXT[_D]
"""... a task in flight be placed (``accepted``'s hot path)."""
_END_QUEUED = _F in NEXT[_Q] and _X in NEXT[_Q]
"""... a queued task end (``end``'s hot path: an ended task is out of ``placed``)."""


@dataclass(slots=True)
class InFlight:
    """A task whose request to an LM has not been answered yet."""

    task: Task
    lm: LmId
    node: int  # -1 for a preemption request (the LM picks the node)
    repartition: bool
    request_id: int = 0


class InFlightTable(dict[TaskKey, InFlight]):
    """The GM's unanswered requests, by task, with each user's in-flight demands
    counted as they come and go (fairness asks for them at every decision that does
    not place its task; summing them over the table made overload quadratic)."""

    def __init__(self) -> None:
        super().__init__()
        self.demands: dict[UserId, dict[Resources, int]] = {}
        self._shares: dict[UserId, float] = {}
        """``share`` per user, until its requests change (or the cluster: ``rescale``)."""

    def __setitem__(self, key: TaskKey, fl: InFlight) -> None:
        if key in self:
            self._forget(self[key])
        dict.__setitem__(self, key, fl)
        spec = fl.task.spec
        user = spec.user
        self._shares.pop(user, None)
        per = self.demands.get(user)
        if per is None:
            per = self.demands[user] = {}
        d = tuple(spec.demand)
        per[d] = per.get(d, 0) + 1

    def __delitem__(self, key: TaskKey) -> None:
        self._forget(self[key])
        dict.__delitem__(self, key)

    def pop(self, key: TaskKey, *default: Any) -> Any:
        if key in self:
            self._forget(self[key])
        return super().pop(key, *default)

    def _forget(self, fl: InFlight) -> None:
        spec = fl.task.spec
        user = spec.user
        self._shares.pop(user, None)
        per = self.demands[user]
        d = tuple(spec.demand)
        if per[d] == 1:
            del per[d]
            if not per:
                del self.demands[user]
        else:
            per[d] -= 1

    def share(self, user: UserId, share_of: Callable[[Sequence[int]], float]) -> float:
        """The sum of ``user``'s in-flight requests' shares."""
        got = self._shares.get(user)
        if got is None:
            per = self.demands.get(user, {})
            got = self._shares[user] = sum(n * share_of(d) for d, n in per.items())
        return got

    def rescale(self) -> None:
        """The cluster's capacity changed: every share is computed afresh."""
        self._shares.clear()


class LiveTable(dict[TaskKey, Task]):
    """The tasks a GM holds, with how many each user holds (admission reads it)."""

    def __init__(self) -> None:
        super().__init__()
        self.per_user: dict[UserId, int] = {}

    def __setitem__(self, key: TaskKey, task: Task) -> None:
        if key not in self:
            self.per_user[key[0]] = self.per_user.get(key[0], 0) + 1
        dict.__setitem__(self, key, task)

    def __delitem__(self, key: TaskKey) -> None:
        self._forget(key)
        super().__delitem__(key)

    def pop(self, key: TaskKey, *default: Any) -> Any:
        if key in self:  # (as _forget, inline: every task that ends passes here)
            user = key[0]
            n = self.per_user[user] - 1
            if n:
                self.per_user[user] = n
            else:
                del self.per_user[user]
        return dict.pop(self, key, *default)  # (not ``super()``: an object per call)

    def _forget(self, key: TaskKey) -> None:
        n = self.per_user[key[0]] - 1
        if n:
            self.per_user[key[0]] = n
        else:
            del self.per_user[key[0]]


@dataclass(slots=True)
class JobRecord:
    """A job of this GM's users: which tasks still keep its delivery unacknowledged."""

    unsettled: set[TaskKey]
    left: int
    """Tasks not yet finished or failed."""
    settled: bool = False
    tasks: list[TaskKey] = field(default_factory=list)
    keeps_ends: bool = False
    """The LMs were asked to keep its ended attempts (``KeepEnds``) until it settles."""


class Ledger:
    """Every task of this GM's users that it holds, and every job it has a record of."""

    def __init__(self, recent_jobs: int, keep_ends_after_s: float) -> None:
        if not 0.0 <= keep_ends_after_s < ENDS_RETAINED_S:
            raise ConfigError(
                f"keep_ends_after_s must be in [0, {ENDS_RETAINED_S:g}), got {keep_ends_after_s}"
            )
        self.inflight = InFlightTable()
        self.placed: dict[TaskKey, Task] = {}
        self.live = LiveTable()
        """Every task this GM holds: queued (or waiting for its DAG parents), in flight or
        placed; a task leaves when it has ended."""
        self.finished: set[TaskKey] = set()
        self.failed: dict[TaskKey, str] = {}
        self.jobs: dict[JobKey, JobRecord] = {}
        self.recent_jobs: OrderedDict[JobKey, None] = OrderedDict()
        self.recent_limit = recent_jobs
        """Ended jobs remembered (so a reused id is refused): at most this many."""
        self.keep_ends_after_s = keep_ends_after_s
        """A job whose delivery is held this long has its LMs keep its ended attempts
        (``KeepEnds``) until it settles: well within what they keep anyway
        (``ENDS_RETAINED_S``), so nothing of it is forgotten before a restarted GM asks."""
        self._keep_due: deque[tuple[float, JobKey]] = deque()
        self.ended_outside: set[TaskKey] = set()
        """Tasks that ended while their job had no record here (``end`` without a job)."""
        """Jobs by when their ends are to be kept (in admission order)."""

    def state_of(self, key: TaskKey) -> TaskState | None:
        """Where a task is (None: not held, and not of a job with a record here)."""
        if key in self.inflight:
            return _D
        if key in self.placed:
            return _P
        if key in self.finished:
            return _F
        if key in self.failed:
            return _X
        if key in self.live:
            return _Q
        return None

    def holds(self, key: TaskKey) -> bool:
        """The task is in flight, placed, or ended within a job recorded here."""
        return (
            key in self.inflight or key in self.placed or key in self.finished or key in self.failed
        )

    def tasks_of(self, keys: Iterable[TaskKey]) -> list[Task]:
        """The tasks held for ``keys`` (queued, in flight or placed)."""
        live = self.live
        return [t for k in keys if (t := live.get(k)) is not None]

    def is_recent(self, jk: JobKey) -> bool:
        """A job of that key ended here lately."""
        return jk in self.recent_jobs

    def ended_in_recent_job(self, key: TaskKey, job: JobId) -> bool:
        """The task is not held and its job ended here lately (every task of it ended
        and was told): whatever an LM says of it is older than its end."""
        return key not in self.live and (key[0], job) in self.recent_jobs

    # ------------------------------------------------------------ moves
    def dispatch(self, fl: InFlight) -> None:
        """``fl``'s task leaves its queue in a request to an LM (QUEUED -> DISPATCHED)."""
        spec = fl.task.spec
        key = (spec.user, spec.task_id)
        queued = key in self.live and key not in self.inflight and key not in self.placed
        if not (queued and _SEND_QUEUED):
            check(key, self.state_of(key), _D)
        self.inflight[key] = fl

    def accepted(self, task: Task) -> None:
        """An LM accepted the request ``task`` was in flight with, whose answer took it
        out of ``inflight`` just now (DISPATCHED -> PLACED)."""
        key = task.key
        placed = self.placed
        if (  # ``state_of`` is QUEUED (out of ``inflight`` just now): a move the table has
            not _PLACE_SENT
            or key in self.inflight
            or key in placed
            or key in self.finished
            or key in self.failed
            or key not in self.live
        ):
            was = self.state_of(key)
            check(key, _D if was is _Q else was, _P)
        placed[key] = task

    def adopt(self, task: Task) -> None:
        """A task running on an LM that this GM did not hold (it restarted): placed."""
        key = task.key
        check(key, self.state_of(key), _P)
        self.placed[key] = task

    # ------------------------------------------------------------ job records
    def open_job(self, jk: JobKey, keys: list[TaskKey], now: float, redelivered: bool) -> None:
        """A job's record, with every task, made as its first tasks are queued."""
        record = JobRecord(unsettled=set(keys), left=len(keys))
        record.tasks = keys
        self.jobs[jk] = record
        if redelivered:  # it came back: its ends are kept from the next update on
            self._keep_due.appendleft((now, jk))  # (no later than any due left there)
        else:
            self._keep_due.append((now + self.keep_ends_after_s, jk))

    def settle(self, task: Task) -> tuple[JobKey, bool] | None:
        """``task`` was accepted by an LM or failed.  If that settles its job: the job,
        and whether its LMs were keeping its ends (they may let go now)."""
        spec = task.spec
        jk = (spec.user, spec.job_id)
        rec = self.jobs.get(jk)
        if rec is None or rec.settled:
            return None
        rec.unsettled.discard((spec.user, spec.task_id))
        if rec.unsettled:
            return None
        rec.settled = True
        kept, rec.keeps_ends = rec.keeps_ends, False
        return jk, kept

    def end(
        self,
        key: TaskKey,
        *,
        finished: bool,
        reason: str,
        job: tuple[JobKey, JobRecord] | None = None,
    ) -> None:
        """Task ``key`` finished or failed for good: it leaves the live tables.  With its
        ``job`` (key and record): counted there (the last of its tasks retires it).  A
        task that ended before its job had a record here (adopted after a restart) is
        counted in its job when the job comes back: that is no second end."""
        if (job is None or key not in self.ended_outside) and (
            not _END_QUEUED  # ``state_of`` QUEUED: a move the table has, nothing to check
            or key in self.inflight
            or key in self.placed
            or key in self.finished
            or key in self.failed
            or key not in self.live
        ):
            check(key, self.state_of(key), _F if finished else _X)
        if job is None:
            self.ended_outside.add(key)
        else:
            self.ended_outside.discard(key)
        self.live.pop(key, None)
        if finished:
            self.finished.add(key)
        else:
            self.failed[key] = reason
        if job is None:
            return
        jk, rec = job
        rec.left -= 1
        if rec.left > 0:
            return
        for k in rec.tasks:
            self.finished.discard(k)
            self.failed.pop(k, None)
        del self.jobs[jk]
        recent = self.recent_jobs
        recent[jk] = None
        while len(recent) > self.recent_limit:
            recent.popitem(last=False)

    def next_keep_due(self) -> float:
        """When the next job's ends are to be kept (``math.inf``: none pending)."""
        return self._keep_due[0][0] if self._keep_due else float("inf")

    def keep_ends_due(self, now: float) -> list[JobKey]:
        """Jobs held ``keep_ends_after_s`` and not settled: their LMs are to keep their
        ends from now on (marked so here)."""
        due = self._keep_due
        out: list[JobKey] = []
        while due and due[0][0] <= now:
            _, jk = due.popleft()
            record = self.jobs.get(jk)
            if record is not None and not record.settled and not record.keeps_ends:
                record.keeps_ends = True
                out.append(jk)
        return out

    # ------------------------------------------------------------ events
    def current(self, ev: TaskEvent) -> tuple[Task | None, InFlight | None]:
        """The task an event is about, if the event is about its current attempt or a
        newer one its LM made (a relaunch whose event is still on its way).  An event
        that overtook the LM's answer to its request settles that request: the task is
        placed, and the request it was in flight with is returned too."""
        key = (ev.user, ev.task_id)
        fl = self.inflight.get(key)
        if fl is not None:
            if ev.attempt < fl.task.attempt or fl.lm != ev.lm:
                return None, None
            fl.task.attempt = ev.attempt  # newer: the LM relaunched it meanwhile
            del self.inflight[key]
            self.placed[key] = fl.task
            fl.task.lm = fl.lm
            return fl.task, fl
        task = self.placed.get(key)
        if task is None or ev.attempt < task.attempt:
            return None, None
        if ev.attempt > task.attempt:
            # only its LM makes newer attempts (a relaunch): this event overtook the
            # RELAUNCHED one, which will come as stale
            if ev.lm != task.lm:
                return None, None
            task.attempt = ev.attempt
        return task, None

    def relaunched(self, ev: TaskEvent) -> Task | None:
        """Its LM relaunched a placed task (its worker was lost) as a newer attempt: the
        task, so updated (None: stale, not placed or not newer)."""
        task = self.placed.get((ev.user, ev.task_id))
        if task is None or ev.attempt <= task.attempt:
            return None
        if ev.started_at >= 0:
            task.start(ev.started_at)
        task.mark(Phase.COMMUNICATION, ev.at)
        task.attempt = ev.attempt
        task.lm = ev.lm
        return task

    def took(self, task: Task, ev: TaskEvent, now: float) -> None:
        """An event about ``task``'s current attempt (``current``): its times; a task
        that ended or came back (preempted, requeued) leaves ``placed``."""
        if ev.worker_at >= 0:
            task.mark(_WORKER_QUEUEING, ev.worker_at)
        at = ev.started_at
        if at >= 0:  # ``Task.start``, its in-order mark appended inline
            marks = task.marks
            if marks and at < marks[-1][0]:
                task.mark(_RUNNING, at)
            else:
                marks.append((at, _RUNNING))
            if at > task.started_at:
                task.started_at = at
            if task.first_started_at < 0 or at < task.first_started_at:
                task.first_started_at = at
        kind = ev.kind
        if kind == _STARTED:
            return
        spec = task.spec
        del self.placed[(spec.user, spec.task_id)]
        if kind in (_FINISHED, _FAILED):
            task.finished_at = ev.at
            return
        task.mark(_COMMUNICATION, ev.at)
        task.mark(_QUEUEING, now)


def round_trip(task: Task, request_sent: float, received: float, sent: float) -> None:
    """A request's trip, in the task's allocation-time ledger: on the wire, validated
    at the LM, on the wire back."""
    # ``Task.mark`` three times, its in-order case written out (every answered task
    # passes here): a mark no earlier than the last is appended, else it is sorted in
    marks = task.marks
    if request_sent >= 0:
        if marks and request_sent < marks[-1][0]:
            task.mark(_COMMUNICATION, request_sent)
        else:
            marks.append((request_sent, _COMMUNICATION))
    if marks and received < marks[-1][0]:
        task.mark(_PROCESSING, received)
    else:
        marks.append((received, _PROCESSING))
    if marks and sent < marks[-1][0]:
        task.mark(_COMMUNICATION, sent)
    else:
        marks.append((sent, _COMMUNICATION))
