"""Admission: which jobs a GM takes into its users' queues, and how a large one is
taken in slices (paper §IV-C: each user queue belongs to exactly one GM).

Invariants:

* A job is admitted whole or refused whole, with a machine-readable reason
  (``Refusal``), before any of its tasks is queued: an unknown user, a GM without a
  view of every LM, a task of another job, a duplicate task id, a demand no node's
  capacity holds, a command where the federation runs none, a duration over the limit,
  a user that would pass ``max_user_tasks``, a DAG whose stages do not fit together.
* A job of more than ``slice`` tasks is admitted in slices, one step per message
  (``AdmitMore`` timers): first every task is checked (its id reserved), then its
  tasks are queued, ``slice`` at a time; a DAG's are made a slice at a time and queued
  in one step (its stages name each other).  Other messages are handled between the
  steps, except its user's next jobs, which wait behind it (``held``), in order.
  Until queued, a task of such a job is in no state of the ledger: it is its job's,
  here (``pending`` once the job's record exists).
* What may be stale: the node capacities a demand is checked against come from the
  views (a cluster's layout changes only with an LM's snapshot).

Who changes what: this piece holds the jobs being admitted and says what to do next
(``step``: a refusal, a slice to queue, or nothing yet); the core queues the tasks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Container, Sequence
from dataclasses import dataclass, field

from common import taskenv
from common.dag import DagJob, from_layout
from common.errors import ConfigError
from common.ids import GmId, JobId, UserId
from common.messages import AdmitJob, SubmitJob
from common.model import Phase, Resources, Task, TaskKey, TaskSpec, WaitReason, fits
from common.reasons import JobReason

JobKey = tuple[UserId, JobId]
_QUEUEING = Phase.QUEUEING
_WAIT_REASONS = len(WaitReason)


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """What a GM admits (beyond what the schema already checks)."""

    max_task_duration_s: float = 7 * 24 * 3600.0
    recent_jobs: int = 100_000
    """Completed job ids remembered per GM, so a reused id is refused (bounded)."""
    commands: bool = True
    """Whether a task may carry a command (the federation's ``task_commands``): without,
    a job with one is refused (``commands_disabled``) rather than run as if it had none."""
    max_user_tasks: int = 1_000_000
    """Tasks one user may have on this GM at once -- queued, being admitted, in flight or
    running (about 1 KB each); a job that would pass it is refused (``user_task_limit``)
    and the GM's memory stays bounded.  0: no limit."""
    env_allow: tuple[str, ...] = ()
    """The environment variables a task may name (``task_env_allow``, ``common.taskenv``):
    a job naming another is refused (``env_not_allowed``)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job is not admitted: a machine-readable reason and the detail."""

    reason: JobReason
    detail: str


@dataclass(slots=True)
class Admission:
    """A job being admitted in slices: ``checked`` of its tasks passed admission,
    ``queued`` of them are in its user's queue."""

    job: SubmitJob
    redelivered: bool
    at: float
    """When it entered the GM queue: its tasks' queueing starts then, not at their slice."""
    checked: int = 0
    queued: int = 0
    seen: set[TaskKey] = field(default_factory=set)
    built: list[Task] = field(default_factory=list)
    """A DAG's tasks made so far, a slice per step once all are checked; the DAG is
    queued whole once all are made (its stages name each other)."""
    pending: set[TaskKey] = field(default_factory=set)
    """Once its record exists: its tasks not yet queued.  One of them may end meanwhile
    (it ran before a restart and the job was redelivered): it is remembered as ended
    then, and its slice finds it so."""

    def keys(self) -> list[TaskKey]:
        """Every task of the job, in its order."""
        return [(spec.user, spec.task_id) for spec in self.job.tasks]

    def tasks_upto(self, end: int, gm: GmId) -> list[Task]:
        """The tasks from ``queued`` up to ``end``, made (a DAG's were made already):
        each enters the GM queue when its job came (``at``)."""
        if self.built:  # a DAG admitted in slices: made already
            tasks, self.built = self.built, []
            return tasks
        return new_tasks(self.job.tasks[self.queued : end], self.at, gm)

    def queued_upto(self, end: int, tasks: list[Task]) -> None:
        """``tasks`` (those up to ``end``) are queued; the rest are ``pending``."""
        if self.queued == 0:
            n = len(self.job.tasks)
            if end < n:
                self.pending = set(self.keys()[end:])
        else:
            self.pending.difference_update(t.key for t in tasks)
        self.queued = end


def new_tasks(specs: Sequence[TaskSpec], at: float, gm: GmId) -> list[Task]:
    """``common.model.new_task`` of each spec, entering the GM queue at ``at``: the lists
    its default factories would make given (a factory is a call per task; every task's
    first mark is the same tuple, immutable)."""
    first, n = (at, _QUEUEING), _WAIT_REASONS
    return [Task(spec=spec, gm=gm, submitted_at=at, marks=[first], waits=[0] * n) for spec in specs]


FIT_MEMO = 4096
"""Distinct demands whose fit ``Admissions.spec_error`` remembers (then it starts over)."""


@dataclass(frozen=True, slots=True)
class Cluster:
    """What admission checks a task's demand against: the federation as the views
    show it (its number of resources, the distinct node capacities)."""

    width: int
    node_caps: Collection[Resources]


class Admissions:
    """A GM's jobs being admitted in slices, and its users' jobs waiting behind them."""

    def __init__(self, gm: GmId, limits: AdmissionLimits, slice_size: int) -> None:
        if slice_size < 1:
            raise ConfigError(f"admit_slice must be >= 1, got {slice_size}")
        self.gm = gm
        self.limits = limits
        self.slice = slice_size
        """Tasks of one job checked or queued per step (larger jobs take several)."""
        self.admitting: dict[JobKey, Admission] = {}
        """Jobs admitted in slices, not yet wholly queued."""
        self.held: dict[UserId, deque[tuple[AdmitJob, float]]] = {}
        """Jobs that came while an earlier job of their user was in ``admitting``: they
        follow it, so that a user's jobs are queued in the order they came."""
        self._fit: tuple[Collection[Resources], dict[Resources, bool]] = (frozenset(), {})
        """Whether some node capacity covers a demand, per demand (at most ``FIT_MEMO``),
        for the capacities it was asked of (a job's tasks mostly share a few demands)."""

    # ------------------------------------------------------------- slices
    def hold(self, msg: AdmitJob, came: float) -> bool:
        """A job behind its user's job being admitted in slices (whose task ids are not
        yet all held): it waits its turn (True)."""
        held = self.held.get(msg.job.user)
        if held is None or (msg.job.user, msg.job.job_id) in self.admitting:
            return False
        held.append((msg, came))
        return True

    def begin(self, adm: Admission) -> None:
        """``adm`` is admitted in slices; its user's next jobs wait behind it."""
        self.admitting[(adm.job.user, adm.job.job_id)] = adm
        self.held[adm.job.user] = deque()

    def done(self, adm: Admission) -> deque[tuple[AdmitJob, float]]:
        """``adm`` is queued or refused: the jobs of its user that came meanwhile."""
        del self.admitting[(adm.job.user, adm.job.job_id)]
        return self.held.pop(adm.job.user)

    def follow(self, user: UserId, rest: deque[tuple[AdmitJob, float]]) -> bool:
        """A job of ``user`` just admitted is sliced again: ``rest`` follow that one."""
        following = self.held.get(user)
        if following is None:
            return False
        following.extend(rest)
        return True

    def pending(self, jk: JobKey, key: TaskKey) -> bool:
        """Task ``key`` of job ``jk`` is still to be queued by a slice."""
        adm = self.admitting.get(jk)
        return adm is not None and key in adm.pending

    def step(
        self, adm: Admission, live: Container[TaskKey], cluster: Cluster
    ) -> Refusal | int | None:
        """One slice of ``adm``: check the next ``slice`` tasks (reserving their ids), or
        once all are checked make a DAG's next ``slice`` tasks (None: nothing to queue
        yet), or say up to which task to queue now (a DAG: all at once)."""
        job = adm.job
        n = len(job.tasks)
        if adm.checked < n:
            return self.check(adm, min(n, adm.checked + self.slice), live, cluster)
        if job.stages is not None and len(adm.built) < n:
            # a DAG is queued whole (its stages name each other), its tasks made first
            made = len(adm.built)
            specs = job.tasks[made : made + self.slice]
            adm.built += new_tasks(specs, adm.at, self.gm)
            return None
        return n if job.stages is not None else min(n, adm.queued + self.slice)

    # ------------------------------------------------------------- checks
    def job_error(
        self, job: SubmitJob, *, has_queue: bool, ready: bool, redelivered: bool, held: int
    ) -> Refusal | None:
        """Why ``job`` as a whole is not admitted here (None: it may be); ``held``: the
        tasks its user holds here."""
        if not has_queue:
            return Refusal(JobReason.UNKNOWN_USER, f"user {job.user!r} has no queue on {self.gm}")
        if not ready:
            return Refusal(JobReason.NOT_READY, f"{self.gm} has no view of every LM yet")
        if job.attempt:
            return Refusal(
                JobReason.RESERVED_FIELD, "attempt is set by a GM, on the tasks it returns only"
            )
        return self.over_limit(job, redelivered, held)

    def over_limit(self, job: SubmitJob, redelivered: bool, held: int) -> Refusal | None:
        """Why ``job`` would take its user past ``max_user_tasks`` (None: it would not).
        A redelivered job was admitted before (its tasks may run): never refused for it."""
        limit = self.limits.max_user_tasks
        if not limit or redelivered:
            return None
        # (the user's job being admitted in slices, if any, holds this one back until
        # its tasks are all held)
        if held + len(job.tasks) <= limit:
            return None
        return Refusal(JobReason.USER_TASK_LIMIT, (
            f"user {job.user!r} has {held} tasks on {self.gm}; {len(job.tasks)} more would "
            f"pass its limit of {limit} (max_user_tasks)"
        ))  # fmt: skip

    def check(
        self, adm: Admission, end: int, live: Container[TaskKey], cluster: Cluster
    ) -> Refusal | None:
        """Check ``adm``'s tasks from ``adm.checked`` up to ``end``: why one is not
        admitted, or None (and ``checked`` moves on).  ``live``: the task ids in use."""
        job, redelivered, seen = adm.job, adm.redelivered, adm.seen
        # what ``spec_error`` found nothing wrong with, in this call: it reads a task's
        # demand, duration, environment and whether it has a command, nothing else of
        # it (its id only names it in a refusal), and a job's tasks are mostly alike
        passed: set[tuple[object, ...]] = set()
        for spec in job.tasks[adm.checked : end]:
            key = (spec.user, spec.task_id)
            if spec.user != job.user or spec.job_id != job.job_id:
                return Refusal(JobReason.WRONG_JOB, (
                    f"task {spec.task_id} belongs to {spec.user}/{spec.job_id}, "
                    f"not {job.user}/{job.job_id}"
                ))  # fmt: skip
            if key in seen or (key in live and not redelivered):
                return Refusal(
                    JobReason.DUPLICATE_TASK_ID, f"task id {spec.task_id!r} is already in use"
                )
            seen.add(key)
            shape = (spec.demand, spec.duration, spec.env, not spec.command)
            if shape not in passed:
                why = self.spec_error(spec, cluster)
                if why is not None:
                    return why
                passed.add(shape)
        adm.checked = end
        return None

    def spec_error(self, spec: TaskSpec, cluster: Cluster) -> Refusal | None:
        """Why task ``spec`` is not admitted for its demand, command or duration (None:
        it is)."""
        task_id, demand, duration = spec.task_id, spec.demand, spec.duration
        if len(demand) != cluster.width:
            return Refusal(JobReason.WRONG_RESOURCES, (
                f"task {task_id}: {len(demand)} resource amounts, "
                f"the federation has {cluster.width}"
            ))  # fmt: skip
        if not any(demand):
            return Refusal(JobReason.ZERO_DEMAND, f"task {task_id} asks for no resource at all")
        if spec.command and not self.limits.commands:
            return Refusal(JobReason.COMMANDS_DISABLED, (
                f"task {task_id} has a command; this federation runs none"
            ))  # fmt: skip
        if spec.env:
            bad = taskenv.refusal(spec.env, self.limits.env_allow)
            if bad is not None:
                return Refusal(JobReason(bad[0]), f"task {task_id}: {bad[1]}")
        caps, memo = self._fit
        if caps is not cluster.node_caps:
            caps, memo = self._fit = (cluster.node_caps, {})
        fit = memo.get(demand)
        if fit is None:
            if len(memo) >= FIT_MEMO:
                memo.clear()
            fit = memo[demand] = any(fits(cap, demand) for cap in caps)
        if not fit:
            return Refusal(JobReason.IMPOSSIBLE_RESOURCES, (
                f"task {task_id}: demand {demand} exceeds every node's capacity"
            ))  # fmt: skip
        limit = self.limits.max_task_duration_s
        if duration > limit:
            return Refusal(JobReason.DURATION_TOO_LONG, (
                f"task {task_id}: duration {duration:.6g} s exceeds {limit:g} s"
            ))  # fmt: skip
        return None


def dag_of(adm: Admission, tasks: list[Task]) -> DagJob | Refusal:
    """The DAG of a job with stages, made of its ``tasks``; refused if its stages do
    not fit together.  Its roots queue from when it came, as a flat job's tasks do."""
    job = adm.job
    assert job.stages is not None
    try:
        return from_layout(
            job.job_id,
            job.user,
            adm.at,
            tasks,
            tuple((s.stage_id, s.parents, s.count) for s in job.stages),
        )
    except ConfigError as exc:
        return Refusal(JobReason.BAD_DAG, str(exc))
