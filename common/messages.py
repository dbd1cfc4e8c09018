"""Every message between users, GMs, LMs and worker pools, declared once.

Commands are imperative (``LaunchRequest``, ``Decide``), facts are in the past tense
(``StateUpdated``, ``TaskEvent`` kinds).  All are frozen, slotted, keyword-only
dataclasses; ``common.schema`` derives their msgpack form and strict decoders from
these declarations, and ``common.codec`` adds the envelope.  A message registered
with ``@message`` may stand alone on the wire; the others travel inside one.

Who sends what (→ is HTTP, ⇒ is RabbitMQ, ↺ is a timer or the driver itself)::

    user  ⇒ GM      SubmitJob                     GM ⇒ user    TaskOutcomes
    GM    → LM      LaunchRequest, PreemptRequest, SnapshotRequest, KeepEnds
    LM    → GM      LaunchResponse, PreemptResponse, StateSnapshot (the HTTP answers)
    LM    ⇒ GMs     StateUpdated (fan-out), TaskEvents (to the placing GM)
    LM    → pool    StartTasks, StopTasks         pool → LM   WorkerReports, WorkerHeartbeat,
                                                              RegisterWorkers (-> Registered)
    ↺ GM            AdmitJob, Decide, RequestSnapshots, RequestFailed
    ↺ LM            Heartbeat, CheckWorkers       ↺ pool      TaskDue, CommandStarted/Exited
    any → caller    Refused (a request a core will not take, with the reason)

State travels as ``StateDelta``: the LM's version plus, for every node changed since
``base_version``, its free resources and the version at which it changed.  A GM
applies a node only if its version is newer than what it holds, so deltas apply in
any order; a gap (``base_version`` newer than the GM's view) is answered with a full
snapshot.  ``epoch`` is the LM's incarnation: a restarted LM's versions start again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Annotated

from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.model import Resources, Seconds, Task, TaskSpec, Time
from common.schema import Length, Range, message

Version = Annotated[int, Range(-1, None)]
"""An LM state version (``-1``: nothing known yet)."""
MAX_JOB_TASKS = 100_000
MAX_STAGES = 10_000


class EventKind(IntEnum):
    """What became of a task at its LM (``TaskEvent.kind``)."""

    STARTED = 0
    FINISHED = 1
    FAILED = 2
    PREEMPTED = 3  # stopped to make room: back to the front of its queue
    REQUEUED = 4  # its worker died and no node of its partition could take it
    RELAUNCHED = 5  # its worker died; the LM started a new attempt on another node


class ReportKind(IntEnum):
    """What a worker says about a task (``WorkerReport.kind``)."""

    STARTED = 0
    FINISHED = 1
    FAILED = 2
    LOST = 3  # the pool stopped it itself: it lost touch with its LM (its lease expired)
    STOPPED = 4  # the pool stopped it on its LM's order (preempted), or no longer ran it


# -------------------------------------------------------------------- state
@dataclass(frozen=True, slots=True, kw_only=True)
class StateDelta:
    """What changed in an LM's cluster between ``base_version`` and ``version``."""

    lm: LmId
    epoch: int = 0
    version: Version
    base_version: Version
    nodes: tuple[NodeIndex, ...]
    free: tuple[Resources, ...]
    node_versions: tuple[int, ...]
    usage: dict[UserId, Resources] = field(default_factory=dict)
    """Resources in use per user on this LM's cluster (all users, every time)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterLayout:
    """The static part of an LM's cluster: what a GM needs once, in a full snapshot."""

    lm: LmId
    capacity: tuple[Resources, ...]
    constraints: tuple[Annotated[int, Range(0, None)], ...]
    home: tuple[GmId, ...]
    """The GM whose partition each physical node belongs to."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacedRef:
    """A task an LM holds for a GM: which attempt, where."""

    user: UserId
    task_id: TaskId
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldTask:
    """A task an LM holds (or held lately) for a GM, with what the LM knows of it."""

    spec: TaskSpec
    attempt: int
    queued_at: Time = -1.0
    """When it entered its GM's queue (the GM said so in the placement)."""
    accepted_at: Time = -1.0
    worker_at: Time = -1.0
    started_at: Time = -1.0
    ended_at: Time = -1.0
    """When it finished or failed (``-1``: it still runs)."""
    ok: bool = True


@message("snapshot")
@dataclass(frozen=True, slots=True, kw_only=True)
class StateSnapshot:
    """A full snapshot: layout plus a delta from version 0."""

    layout: ClusterLayout
    state: StateDelta
    held: tuple[HeldTask, ...] = ()
    """Tasks of the receiving GM this LM runs, or ended in the last few minutes: a
    restarted, stateless GM adopts the running ones (their events and outcomes come to
    it) and never runs an ended one again when its job is redelivered."""


@message("state_updated")
@dataclass(frozen=True, slots=True, kw_only=True)
class StateUpdated:
    """Periodic LM heartbeat, fanned out to all GMs."""

    delta: StateDelta


@message("snapshot_request")
@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotRequest:
    gm: GmId
    lm: LmId


ENDS_RETAINED_S = 120.0
"""How long an LM keeps an ended attempt for its GM's snapshot (``LocalMaster.retain_s``):
a restarted GM learns from it what of a redelivered job ended, and runs none of it
again.  A job whose delivery is held longer than a fraction of this is ``KeepEnds``'d."""


@message("keep_ends")
@dataclass(frozen=True, slots=True, kw_only=True)
class KeepEnds:
    """GM -> every LM: keep (or, ``keep`` False, stop keeping) the ended attempts of one
    of its jobs past ``ENDS_RETAINED_S``.  Its delivery is still held, so the job comes
    back if the GM dies, possibly long after some of its tasks (a DAG's first stages, a
    flat job's head under overload) ended: the snapshot must still say so."""

    gm: GmId
    lm: LmId
    user: UserId
    job_id: JobId
    keep: bool


# --------------------------------------------------------------- placement
@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Launch attempt ``attempt`` of a task on ``node``; ``repartition`` when the node
    is in another GM's partition (it becomes a logical node of the requester's)."""

    spec: TaskSpec
    attempt: int
    node: NodeIndex
    repartition: bool = False
    altruistic: bool = False
    queued_at: Time = -1.0
    """When the task entered its GM's queue (kept by the LM for a restarted GM)."""


@message("launch")
@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    gm: GmId
    lm: LmId
    request_id: int
    placements: Annotated[tuple[Placement, ...], Length(1, MAX_JOB_TASKS)]
    known_version: Version
    sent_at: Time = -1.0
    """When the request left the GM (stamped by its driver; echoed in the response)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementResult:
    """The LM's verdict on one placement, in request order."""

    accepted: bool
    reason: str = "ok"
    """``ok``; ``duplicate`` (the LM already holds this or a newer attempt: idempotent),
    ``finished`` / ``failed`` (that attempt already ended here); ``rerouted`` (placed
    on ``node`` instead: the one asked for had no room); ``insufficient_resources``,
    ``constraints_unmet``, ``node_down``, ``unknown_node``."""
    attempt: int = 0
    """For a duplicate: the attempt the LM holds (or held), which the GM takes on."""
    node: Annotated[int, Range(-1, None)] = -1
    """For ``rerouted`` (the node asked for had no room): the node the LM used."""


@message("launch_response")
@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchResponse:
    gm: GmId
    lm: LmId
    request_id: int
    results: tuple[PlacementResult, ...]
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    """When the LM received the request; with ``sent_at`` it splits the round trip
    into communication and LM processing exactly."""
    sent_at: Time = 0.0


@message("preempt")
@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptRequest:
    """Free room for attempt ``attempt`` of ``spec`` by preempting tasks of ``victim``,
    then launch it."""

    gm: GmId
    lm: LmId
    request_id: int
    spec: TaskSpec
    attempt: int
    victim: UserId
    known_version: Version
    sent_at: Time = -1.0
    queued_at: Time = -1.0


@message("preempt_response")
@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptResponse:
    gm: GmId
    lm: LmId
    request_id: int
    accepted: bool
    reason: str
    node: NodeIndex | None
    preempted: tuple[PlacedRef, ...]
    attempt: int = 0
    """For a duplicate: the attempt the LM holds (or held)."""
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    sent_at: Time = 0.0


@message("request_failed")
@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFailed:
    """A GM's driver could not get an answer to request ``request_id`` (the LM refused
    it with a 4xx): the core treats it as a refusal of everything it asked for."""

    lm: LmId
    request_id: int
    reason: str


# -------------------------------------------------------------- task events
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskEvent:
    """LM -> the GM that placed attempt ``attempt`` of a task.

    ``node_free`` piggybacks the node's fresh free resources so the placing GM learns
    of freed resources at once, not at the next heartbeat.  Worker-side times:
    ``worker_at`` (the StartTask reached the worker) and ``started_at`` (the attempt
    started); ``at`` is when the event happened.
    """

    kind: EventKind
    lm: LmId
    gm: GmId
    user: UserId
    task_id: TaskId
    attempt: int
    node: NodeIndex
    node_free: Resources
    node_version: int
    at: Time
    worker_at: Time = -1.0
    started_at: Time = -1.0
    detail: str = ""
    job_id: JobId | None = None
    """The task's job and when it entered its GM's queue, as the LM holds them: a GM
    that restarted and has no record of the task can still tell its user of its end."""
    queued_at: Time = -1.0


@message("task_events")
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskEvents:
    """The task events one LM has for one GM, batched per loop turn."""

    lm: LmId
    epoch: int = 0
    """The LM incarnation that sent them (node states of an older one are not taken)."""
    events: Annotated[tuple[TaskEvent, ...], Length(1, MAX_JOB_TASKS)]


@message("task_outcome")
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOutcome:
    """GM -> the task's user: it finished, or failed for good (with the reason).
    Carries the whole ledger: what the user's reports are made of."""

    task: Task
    finished: bool
    reason: str = ""


@message("task_outcomes")
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskOutcomes:
    """The outcomes one GM has for one user, batched per loop turn."""

    gm: GmId
    outcomes: Annotated[tuple[TaskOutcome, ...], Length(1, MAX_JOB_TASKS)]


@message("job_refusal")
@dataclass(frozen=True, slots=True, kw_only=True)
class JobRefusal:
    """GM -> a job's user, on the user's outcome stream: the job was refused whole, none
    of its tasks queued, for ``reason`` (the dead letter's).  Only for a job whose
    submitter the GM has authenticated: a forged job gets no word to anyone."""

    gm: GmId
    user: UserId
    job_id: JobId
    submitted_at: Time
    """The refused job's own ``submitted_at``: a client that submitted a job of that id
    again tells the two apart."""
    reason: str
    detail: str = ""


# ------------------------------------------------------------------ jobs
@dataclass(frozen=True, slots=True, kw_only=True)
class StageSpec:
    """One stage of a DAG job: its id, the stages it waits for, how many tasks."""

    stage_id: int
    parents: Annotated[tuple[int, ...], Length(0, MAX_STAGES)] = ()
    count: Annotated[int, Range(1, None)]


@message("submit_job")
@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitJob:
    """A job into its user's queue; ``token`` is the user's credential.  A DAG job
    lists its tasks stage by stage and ``stages`` gives the layout."""

    job_id: JobId
    user: UserId
    token: str
    submitted_at: Time
    tasks: Annotated[tuple[TaskSpec, ...], Length(1, MAX_JOB_TASKS, below="empty_job")]
    stages: Annotated[tuple[StageSpec, ...], Length(1, MAX_STAGES)] | None = None
    resumes: JobId | None = None
    """Set by a GM on tasks of an acknowledged job that came back to its queue
    (preempted, requeued): kept on the broker until they are placed again, so a GM
    killed meanwhile loses none of them."""
    attempt: Annotated[int, Range(0, None)] = 0
    """With ``resumes``: the attempt the returned task last ran as (a GM that queues it
    again places a newer one, which no worker has stopped yet); 0 on a user's job."""


@message("admit_job")
@dataclass(frozen=True, slots=True, kw_only=True)
class AdmitJob:
    """GM driver -> core: a submission was delivered (``redelivered``: again, after a
    consumer or GM failure).  The core admits it or answers ``JobRefused``."""

    job: SubmitJob
    redelivered: bool = False


@message("admit_more")
@dataclass(frozen=True, slots=True, kw_only=True)
class AdmitMore:
    """GM core -> itself (an ``After`` timer): admit the next slice of a large job, so
    that one submission of many tasks does not hold the GM for the whole of it."""

    user: UserId
    job_id: JobId


# --------------------------------------------------------------- workers
@dataclass(frozen=True, slots=True, kw_only=True)
class StartTask:
    """LM -> worker pool: run attempt ``attempt`` of ``spec`` on ``node``.  The pool keeps
    what the LM knows of the placement, so a restarted LM can learn it back."""

    node: NodeIndex
    spec: TaskSpec
    attempt: int
    gm: GmId
    altruistic: bool = False
    queued_at: Time = -1.0


@message("start_tasks")
@dataclass(frozen=True, slots=True, kw_only=True)
class StartTasks:
    lm: LmId
    epoch: int = 0
    tasks: Annotated[tuple[StartTask, ...], Length(1, MAX_JOB_TASKS)]


@dataclass(frozen=True, slots=True, kw_only=True)
class StopTask:
    """LM -> worker pool: stop a preempted (or superseded) attempt.  The pool answers
    with a ``STOPPED`` report for each: only then does a preempted task go back to its
    GM ``gm``, so its next attempt never overlaps this one."""

    node: NodeIndex
    user: UserId
    task_id: TaskId
    attempt: int
    gm: GmId


@message("stop_tasks")
@dataclass(frozen=True, slots=True, kw_only=True)
class StopTasks:
    lm: LmId
    epoch: int = 0
    tasks: Annotated[tuple[StopTask, ...], Length(1, MAX_JOB_TASKS)]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerReport:
    """Worker -> LM: attempt ``attempt`` of a task started, finished or failed."""

    kind: ReportKind
    node: NodeIndex
    user: UserId
    task_id: TaskId
    attempt: int
    gm: GmId
    """The GM that placed it: an LM that lost the task (it restarted) still tells it."""
    at: Time
    worker_at: Time
    started_at: Time = -1.0
    detail: str = ""
    job_id: JobId | None = None
    """The task's job and queue time, from its start: an LM that does not hold the task
    (it restarted) passes them on, so its GM can tell the user of its end."""
    queued_at: Time = -1.0


@message("worker_reports")
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerReports:
    lm: LmId
    reports: Annotated[tuple[WorkerReport, ...], Length(0, MAX_JOB_TASKS)]


@message("worker_heartbeat")
@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerHeartbeat:
    """Worker pool -> LM: these nodes are alive at ``at``."""

    lm: LmId
    nodes: tuple[NodeIndex, ...]
    at: Time


@dataclass(frozen=True, slots=True, kw_only=True)
class EndedAttempt:
    """An attempt that finished or failed on a pool whose report no LM has taken yet."""

    start: StartTask
    report: WorkerReport


@message("register_workers")
@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterWorkers:
    """Worker pool -> its LM (a new LM incarnation, or the pool just started): these
    nodes are alive and run these attempts.  An LM takes no placement on a node
    before its pool has registered it, so it never counts a running task as free."""

    lm: LmId
    nodes: tuple[NodeIndex, ...]
    at: Time
    """When the pool took stock (what its LM accepted later may still be on its way)."""
    running: Annotated[tuple[StartTask, ...], Length(0, MAX_JOB_TASKS)] = ()
    started: Annotated[tuple[WorkerReport, ...], Length(0, MAX_JOB_TASKS)] = ()
    """The start reports of what runs (worker and start times)."""
    ended: Annotated[tuple[EndedAttempt, ...], Length(0, MAX_JOB_TASKS)] = ()
    """What ended while no LM took the reports: a new incarnation holds it as ended, so
    no GM places it again."""


@message("registered")
@dataclass(frozen=True, slots=True, kw_only=True)
class Registered:
    """LM -> its pool: registration taken; ``epoch`` is the LM's incarnation."""

    lm: LmId
    epoch: int


@message("register_pool")
@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterPool:
    """Pool driver -> core: register with the LM (at start, or when the LM asks)."""


# ------------------------------------------------------------------ timers
@message("decide")
@dataclass(frozen=True, slots=True, kw_only=True)
class Decide:
    """GM driver -> core: make up to ``max_tasks`` decisions (launches to one LM share
    one request)."""

    max_tasks: Annotated[int, Range(1, None)] = 1


@message("request_snapshots")
@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSnapshots:
    """A (re)started GM asks every LM for a full snapshot."""


@message("heartbeat")
@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """LM timer: publish the state delta since the previous heartbeat to every GM."""


@message("check_workers")
@dataclass(frozen=True, slots=True, kw_only=True)
class CheckWorkers:
    """LM timer: declare nodes silent for ``timeout`` seconds dead (nothing is placed on
    them); give up their tasks (run them again) once silent for ``lost_after`` seconds
    (at once if ``lost_after <= timeout``)."""

    timeout: Seconds
    lost_after: Seconds = 0.0


@message("reports_taken")
@dataclass(frozen=True, slots=True, kw_only=True)
class ReportsTaken:
    """Pool driver -> core: the LM took these reports (they need not be kept)."""

    reports: tuple[WorkerReport, ...]


@message("lease_renewed")
@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRenewed:
    """Pool driver -> core: the LM answered (a heartbeat): the pool may go on running.
    The lease counts from ``sent``, when the answered request left (an answer read late,
    by a pool that was frozen meanwhile, renews nothing past it); -1: on receipt."""

    sent: Time = -1.0


@message("check_lease")
@dataclass(frozen=True, slots=True, kw_only=True)
class CheckLease:
    """Pool timer: has the pool been out of touch with its LM for longer than ``lease``?"""

    lease: Seconds


@message("task_due")
@dataclass(frozen=True, slots=True, kw_only=True)
class TaskDue:
    """Worker timer: a synthetic task's duration has elapsed."""

    user: UserId
    task_id: TaskId
    attempt: int


@message("command_started")
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandStarted:
    """Worker runner -> core: a task's command is running."""

    user: UserId
    task_id: TaskId
    attempt: int


@message("command_exited")
@dataclass(frozen=True, slots=True, kw_only=True)
class CommandExited:
    """Worker runner -> core: a task's command ended."""

    user: UserId
    task_id: TaskId
    attempt: int
    ok: bool
    detail: str = ""


# ----------------------------------------------------------------- answers
@message("refused")
@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """A request a core will not take: the reason (machine-readable) and why."""

    reason: str
    detail: str = ""


GmInput = (
    AdmitJob
    | Decide
    | RequestSnapshots
    | StateUpdated
    | StateSnapshot
    | LaunchResponse
    | PreemptResponse
    | RequestFailed
    | TaskEvents
)
LmInput = (
    LaunchRequest
    | PreemptRequest
    | SnapshotRequest
    | WorkerReports
    | WorkerHeartbeat
    | RegisterWorkers
    | Heartbeat
    | CheckWorkers
)
WorkerInput = (
    StartTasks
    | StopTasks
    | TaskDue
    | CommandStarted
    | CommandExited
    | RegisterPool
    | Registered
    | LeaseRenewed
    | CheckLease
    | ReportsTaken
)
