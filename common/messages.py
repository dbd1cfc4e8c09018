"""Every message between users, GMs, LMs and worker pools, declared once.

Commands are imperative (``LaunchRequest``, ``Decide``), facts are in the past tense
(``StateUpdated``, ``TaskEvent`` kinds).  All are frozen, keyword-only msgspec
structs (``common.schema.Wire``) whose annotations carry every bound: msgspec encodes
and strictly decodes them from these declarations, and ``common.codec`` adds the
envelope.  A message registered with ``@message`` may stand alone on the wire; the
others travel inside one.  Change one with ``msgspec.structs.replace``.

Who sends what (→ is HTTP, ⇒ is RabbitMQ, ↺ is a timer or the driver itself)::

    user  ⇒ GM      SubmitJob                     GM ⇒ user    TaskOutcomes
    GM    → LM      LaunchRequest, PreemptRequest, SnapshotRequest, KeepEnds, CancelTasks,
                    StopUserTasks, ReserveRequest, CommitGang, ReleaseGang
    LM    → GM      LaunchResponse, PreemptResponse, StateSnapshot, UserTasksStopped,
                    ReserveResponse (the HTTP answers)
    LM    ⇒ GMs     StateUpdated (fan-out), TaskEvents (to the placing GM)
    LM    → pool    StartTasks, StopTasks         pool → LM   WorkerReports, WorkerHeartbeat,
                                                              RegisterWorkers (-> Registered)
    ↺ GM            AdmitJob, CancelJob, Decide, RequestSnapshots, RequestFailed, UserAccess
    ↺ LM            Heartbeat, CheckWorkers       ↺ pool      TaskDue, CommandStarted/Exited
    any → caller    Refused (a request a core will not take, with the reason)

State travels as ``StateDelta``: the LM's version plus, for every node changed since
``base_version``, its free resources and the version at which it changed.  A GM
applies a node only if its version is newer than what it holds, so deltas apply in
any order; a gap (``base_version`` newer than the GM's view) is answered with a full
snapshot.  ``epoch`` is the LM's incarnation: a restarted LM's versions start again.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated

import msgspec
from msgspec import Meta

from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.model import Resources, Seconds, Task, TaskSpec, Time
from common.schema import Map, Seq, Text, UInt, Wire, in_range, message, n_items

Version = Annotated[int, in_range(-1, None)]
"""An LM state version (``-1``: nothing known yet)."""
MAX_JOB_TASKS = 100_000
MAX_STAGES = 10_000
OUTPUT_BYTES = 64 * 1024
"""Of a task's stdout and of its stderr, the last this many bytes travel with its end."""
Output = Annotated[bytes, Meta(max_length=OUTPUT_BYTES)]
"""What a task's command wrote (commands on), cut to its last ``OUTPUT_BYTES``."""
ExitCode = Annotated[int, in_range(0, 255)] | None
"""A command's exit status (None: a synthetic task, or a command ended by a signal)."""


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
class GangHold(Wire, frozen=True, kw_only=True):
    """Resources an LM holds for a gang stage of ``gm``'s (its reservation), idle until
    the gang commits: ``held`` on ``node`` (what is not lent to backfill), reserved
    until ``lease_until`` and due (the gang expected to start) at ``due``, in the LM's
    time.  Other tasks may use it only if they end before ``due`` (backfill)."""

    gm: GmId
    user: UserId
    job_id: JobId
    stage: UInt
    node: NodeIndex
    held: Resources
    due: Time
    lease_until: Time


class StateDelta(Wire, frozen=True, kw_only=True):
    """What changed in an LM's cluster between ``base_version`` and ``version``."""

    lm: LmId
    epoch: UInt = 0
    version: Version
    base_version: Version
    nodes: Seq[NodeIndex]
    free: Seq[Resources]
    node_versions: Seq[UInt]
    usage: Map[UserId, Resources] = {}
    """Resources in use per user on this LM's cluster (all users, every time)."""
    holds: Seq[GangHold] = ()
    """Every gang hold this LM keeps (all of them, every time): what is reserved-but-idle
    where, until when (``local_master.reservations``)."""


class ClusterLayout(Wire, frozen=True, kw_only=True):
    """The static part of an LM's cluster: what a GM needs once, in a full snapshot."""

    lm: LmId
    capacity: Seq[Resources]
    constraints: Seq[UInt]
    home: Seq[GmId]
    """The GM whose partition each physical node belongs to."""


class PlacedRef(Wire, frozen=True, kw_only=True):
    """A task an LM holds for a GM: which attempt, where."""

    user: UserId
    task_id: TaskId
    attempt: UInt


class HeldTask(Wire, frozen=True, kw_only=True):
    """A task an LM holds (or held lately) for a GM, with what the LM knows of it."""

    spec: TaskSpec
    attempt: UInt
    queued_at: Time = -1.0
    """When it entered its GM's queue (the GM said so in the placement)."""
    accepted_at: Time = -1.0
    worker_at: Time = -1.0
    started_at: Time = -1.0
    ended_at: Time = -1.0
    """When it finished or failed (``-1``: it still runs)."""
    ok: bool = True


@message("snapshot")
class StateSnapshot(Wire, frozen=True, kw_only=True):
    """A full snapshot: layout plus a delta from version 0."""

    layout: ClusterLayout
    state: StateDelta
    held: Seq[HeldTask] = ()
    """Tasks of the receiving GM this LM runs, or ended in the last few minutes: a
    restarted, stateless GM adopts the running ones (their events and outcomes come to
    it) and never runs an ended one again when its job is redelivered."""


@message("state_updated")
class StateUpdated(Wire, frozen=True, kw_only=True):
    """Periodic LM heartbeat, fanned out to all GMs."""

    delta: StateDelta


@message("snapshot_request")
class SnapshotRequest(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId


ENDS_RETAINED_S = 120.0
"""How long an LM keeps an ended attempt for its GM's snapshot (``LocalMaster.retain_s``):
a restarted GM learns from it what of a redelivered job ended, and runs none of it
again.  A job whose delivery is held longer than a fraction of this is ``KeepEnds``'d."""


@message("keep_ends")
class KeepEnds(Wire, frozen=True, kw_only=True):
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
class Placement(Wire, frozen=True, kw_only=True):
    """Launch attempt ``attempt`` of a task on ``node``; ``repartition`` when the node
    is in another GM's partition (it becomes a logical node of the requester's)."""

    spec: TaskSpec
    attempt: UInt
    node: NodeIndex
    repartition: bool = False
    altruistic: bool = False
    queued_at: Time = -1.0
    """When the task entered its GM's queue (kept by the LM for a restarted GM)."""


@message("launch")
class LaunchRequest(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId
    request_id: UInt
    placements: Annotated[tuple[Placement, ...], n_items(1, MAX_JOB_TASKS)]
    known_version: Version
    sent_at: Time = -1.0
    """When the request left the GM (stamped by its driver; echoed in the response)."""


class PlacementResult(Wire, frozen=True, kw_only=True):
    """The LM's verdict on one placement, in request order."""

    accepted: bool
    reason: Text = "ok"
    """``ok``; ``duplicate`` (the LM already holds this or a newer attempt: idempotent),
    ``finished`` / ``failed`` (that attempt already ended here); ``rerouted`` (placed
    on ``node`` instead: the one asked for had no room); ``insufficient_resources``,
    ``constraints_unmet``, ``node_down``, ``unknown_node``."""
    attempt: UInt = 0
    """For a duplicate: the attempt the LM holds (or held), which the GM takes on."""
    node: Annotated[int, in_range(-1, None)] = -1
    """For ``rerouted`` (the node asked for had no room): the node the LM used."""


@message("launch_response")
class LaunchResponse(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId
    request_id: UInt
    results: Seq[PlacementResult]
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    """When the LM received the request; with ``sent_at`` it splits the round trip
    into communication and LM processing exactly."""
    sent_at: Time = 0.0


@message("preempt")
class PreemptRequest(Wire, frozen=True, kw_only=True):
    """Free room for attempt ``attempt`` of ``spec`` by preempting tasks of ``victim``,
    then launch it."""

    gm: GmId
    lm: LmId
    request_id: UInt
    spec: TaskSpec
    attempt: UInt
    victim: UserId
    known_version: Version
    sent_at: Time = -1.0
    queued_at: Time = -1.0
    lower_only: bool = False
    """A higher class's preemption: stop tasks of any user in a class below ``spec``'s
    (``victim`` is not read), whatever they have run; else tasks of ``victim`` in
    ``spec``'s class or below (Alg. 2, shares within a class)."""


@message("preempt_response")
class PreemptResponse(Wire, frozen=True, kw_only=True):
    gm: GmId
    lm: LmId
    request_id: UInt
    accepted: bool
    reason: Text
    node: NodeIndex | None
    preempted: Seq[PlacedRef]
    attempt: UInt = 0
    """For a duplicate: the attempt the LM holds (or held)."""
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    sent_at: Time = 0.0


@message("stop_user_tasks")
class StopUserTasks(Wire, frozen=True, kw_only=True):
    """GM -> LM: stop every attempt of ``user`` that GM ``gm`` placed here (its token
    was revoked: ``reason``).  Each goes back to the GM as ``PREEMPTED`` once its pool
    stopped it, and the GM ends it with ``reason``."""

    gm: GmId
    lm: LmId
    user: UserId
    reason: Text = "user_revoked"


@message("user_tasks_stopped")
class UserTasksStopped(Wire, frozen=True, kw_only=True):
    """LM -> GM: the attempts of ``user`` it stopped for ``StopUserTasks``."""

    gm: GmId
    lm: LmId
    user: UserId
    stopped: Seq[PlacedRef]


@message("request_failed")
class RequestFailed(Wire, frozen=True, kw_only=True):
    """A GM's driver could not get an answer to request ``request_id`` (the LM refused
    it with a 4xx): the core treats it as a refusal of everything it asked for."""

    lm: LmId
    request_id: UInt
    reason: Text


# -------------------------------------------------------------- task events
class TaskEvent(Wire, frozen=True, kw_only=True):
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
    attempt: UInt
    node: NodeIndex
    node_free: Resources
    node_version: UInt
    at: Time
    worker_at: Time = -1.0
    started_at: Time = -1.0
    detail: Text = ""
    job_id: JobId | None = None
    """The task's job and when it entered its GM's queue, as the LM holds them: a GM
    that restarted and has no record of the task can still tell its user of its end."""
    queued_at: Time = -1.0
    spec: TaskSpec | None = None
    """The task itself, on the events that give it back to its GM (requeued, preempted):
    a GM that restarted and holds no record of it queues it again from this (its job's
    delivery may have been acknowledged before: nothing else holds the task)."""
    exit_code: ExitCode = None
    stdout: Output = b""
    stderr: Output = b""
    """An end's exit status and output (commands on), for its user (``megha logs``)."""


@message("task_events")
class TaskEvents(Wire, frozen=True, kw_only=True):
    """The task events one LM has for one GM, batched per loop turn."""

    lm: LmId
    epoch: UInt = 0
    """The LM incarnation that sent them (node states of an older one are not taken)."""
    events: Annotated[tuple[TaskEvent, ...], n_items(1, MAX_JOB_TASKS)]


@message("task_outcome")
class TaskOutcome(Wire, frozen=True, kw_only=True):
    """GM -> the task's user: it finished, or failed for good (with the reason).
    Carries the whole ledger: what the user's reports are made of."""

    task: Task
    finished: bool
    reason: Text = ""


@message("task_outcomes")
class TaskOutcomes(Wire, frozen=True, kw_only=True):
    """The outcomes one GM has for one user, batched per loop turn."""

    gm: GmId
    outcomes: Annotated[tuple[TaskOutcome, ...], n_items(1, MAX_JOB_TASKS)]


@message("job_refusal")
class JobRefusal(Wire, frozen=True, kw_only=True):
    """GM -> a job's user, on the user's outcome stream: the job was refused whole, none
    of its tasks queued, for ``reason`` (the dead letter's).  Only for a job whose
    submitter the GM has authenticated: a forged job gets no word to anyone."""

    gm: GmId
    user: UserId
    job_id: JobId
    submitted_at: Time
    """The refused job's own ``submitted_at``: a client that submitted a job of that id
    again tells the two apart."""
    reason: Text
    detail: Text = ""


# ------------------------------------------------------------------ gangs
@message("reserve")
class ReserveRequest(Wire, frozen=True, kw_only=True):
    """GM -> LM: hold room for these placements of gang stage ``stage`` of a job (each
    validated as a launch is, nothing started) for ``lease_s`` seconds from receipt;
    the gang is due (expected to commit) within ``due_s``.  Holds of the same task
    replace the older one; ``CommitGang`` starts them, ``ReleaseGang`` or the lease
    ends them."""

    gm: GmId
    lm: LmId
    request_id: UInt
    user: UserId
    job_id: JobId
    stage: UInt
    placements: Annotated[tuple[Placement, ...], n_items(1, MAX_JOB_TASKS)]
    lease_s: Seconds
    due_s: Seconds
    known_version: Version
    sent_at: Time = -1.0


@message("reserve_response")
class ReserveResponse(Wire, frozen=True, kw_only=True):
    """LM -> GM: per placement, in order, whether it is held (``node``: where)."""

    gm: GmId
    lm: LmId
    request_id: UInt
    results: Seq[PlacementResult]
    delta: StateDelta
    request_sent_at: Time = -1.0
    received_at: Time = 0.0
    sent_at: Time = 0.0


@message("commit_gang")
class CommitGang(Wire, frozen=True, kw_only=True):
    """GM -> LM: the whole gang (or its ``min``) holds: start these held attempts.
    Answered with a ``LaunchResponse`` (per task, in order)."""

    gm: GmId
    lm: LmId
    request_id: UInt
    user: UserId
    job_id: JobId
    stage: UInt
    tasks: Annotated[tuple[PlacedRef, ...], n_items(1, MAX_JOB_TASKS)]
    known_version: Version
    sent_at: Time = -1.0


@message("release_gang")
class ReleaseGang(Wire, frozen=True, kw_only=True):
    """GM -> LM: give back every hold of this gang stage (it did not fill, or it
    failed); answered with nothing (204)."""

    gm: GmId
    lm: LmId
    user: UserId
    job_id: JobId
    stage: UInt


@message("gang_retry")
class GangRetry(Wire, frozen=True, kw_only=True):
    """GM core -> itself (an ``After`` timer): a gang that backed off tries again."""

    user: UserId
    job_id: JobId
    stage: UInt


# ------------------------------------------------------------------ jobs
class StageSpec(Wire, frozen=True, kw_only=True):
    """One stage of a DAG job: its id, the stages it waits for, how many tasks.  A
    ``gang`` stage starts all-or-nothing across LMs (``global_master.gang``): all its
    tasks, or at least ``min`` of them (``0``: all; Armada's minimum cardinality)."""

    stage_id: UInt
    parents: Annotated[tuple[UInt, ...], n_items(0, MAX_STAGES)] = ()
    count: Annotated[int, in_range(1, None)]
    gang: bool = False
    min_count: UInt = msgspec.field(default=0, name="min")


@message("submit_job")
class SubmitJob(Wire, frozen=True, kw_only=True):
    """A job into its user's queue; ``token`` is the user's credential.  A DAG job
    lists its tasks stage by stage and ``stages`` gives the layout."""

    job_id: JobId
    user: UserId
    token: Text
    submitted_at: Time
    tasks: Annotated[tuple[TaskSpec, ...], n_items(1, MAX_JOB_TASKS, below="empty_job")]
    stages: Annotated[tuple[StageSpec, ...], n_items(1, MAX_STAGES)] | None = None
    resumes: JobId | None = None
    """Set by a GM on tasks of an acknowledged job that came back to its queue
    (preempted, requeued): kept on the broker until they are placed again, so a GM
    killed meanwhile loses none of them."""
    attempt: UInt = 0
    """With ``resumes``: the attempt the returned task last ran as (a GM that queues it
    again places a newer one, which no worker has stopped yet); 0 on a user's job."""


@message("admit_job")
class AdmitJob(Wire, frozen=True, kw_only=True):
    """GM driver -> core: a submission was delivered (``redelivered``: again, after a
    consumer or GM failure).  The core admits it or answers ``JobRefused``."""

    job: SubmitJob
    redelivered: bool = False


@message("admit_more")
class AdmitMore(Wire, frozen=True, kw_only=True):
    """GM core -> itself (an ``After`` timer): admit the next slice of a large job, so
    that one submission of many tasks does not hold the GM for the whole of it."""

    user: UserId
    job_id: JobId


# --------------------------------------------------------------- workers
class StartTask(Wire, frozen=True, kw_only=True):
    """LM -> worker pool: run attempt ``attempt`` of ``spec`` on ``node``.  The pool keeps
    what the LM knows of the placement, so a restarted LM can learn it back."""

    node: NodeIndex
    spec: TaskSpec
    attempt: UInt
    gm: GmId
    altruistic: bool = False
    queued_at: Time = -1.0


@message("start_tasks")
class StartTasks(Wire, frozen=True, kw_only=True):
    """LM -> worker pool: start these attempts.  ``sent``: the LM's clock when it sent
    them (-1: not said); a pool whose lease lapsed runs none sent before it was back in
    touch with its LM (its LM may have given those attempts up and run them elsewhere)."""

    lm: LmId
    epoch: UInt = 0
    tasks: Annotated[tuple[StartTask, ...], n_items(1, MAX_JOB_TASKS)]
    sent: Time = -1.0


class StopTask(Wire, frozen=True, kw_only=True):
    """LM -> worker pool: stop a preempted (or superseded) attempt.  The pool answers
    with a ``STOPPED`` report for each: only then does a preempted task go back to its
    GM ``gm``, so its next attempt never overlaps this one."""

    node: NodeIndex
    user: UserId
    task_id: TaskId
    attempt: UInt
    gm: GmId


@message("stop_tasks")
class StopTasks(Wire, frozen=True, kw_only=True):
    lm: LmId
    epoch: UInt = 0
    tasks: Annotated[tuple[StopTask, ...], n_items(1, MAX_JOB_TASKS)]


class WorkerReport(Wire, frozen=True, kw_only=True):
    """Worker -> LM: attempt ``attempt`` of a task started, finished or failed."""

    kind: ReportKind
    node: NodeIndex
    user: UserId
    task_id: TaskId
    attempt: UInt
    gm: GmId
    """The GM that placed it: an LM that lost the task (it restarted) still tells it."""
    at: Time
    worker_at: Time
    started_at: Time = -1.0
    detail: Text = ""
    job_id: JobId | None = None
    """The task's job and queue time, from its start: an LM that does not hold the task
    (it restarted) passes them on, so its GM can tell the user of its end."""
    queued_at: Time = -1.0
    exit_code: ExitCode = None
    stdout: Output = b""
    stderr: Output = b""
    """An end's exit status and output (commands on), passed on in its ``TaskEvent``."""


@message("worker_reports")
class WorkerReports(Wire, frozen=True, kw_only=True):
    lm: LmId
    reports: Annotated[tuple[WorkerReport, ...], n_items(0, MAX_JOB_TASKS)]


@message("worker_heartbeat")
class WorkerHeartbeat(Wire, frozen=True, kw_only=True):
    """Worker pool -> LM: these nodes are alive at ``at``."""

    lm: LmId
    nodes: Seq[NodeIndex]
    at: Time


class EndedAttempt(Wire, frozen=True, kw_only=True):
    """An attempt that finished or failed on a pool whose report no LM has taken yet."""

    start: StartTask
    report: WorkerReport


@message("register_workers")
class RegisterWorkers(Wire, frozen=True, kw_only=True):
    """Worker pool -> its LM (a new LM incarnation, or the pool just started): these
    nodes are alive and run these attempts.  An LM takes no placement on a node
    before its pool has registered it, so it never counts a running task as free."""

    lm: LmId
    nodes: Seq[NodeIndex]
    at: Time
    """When the pool took stock (what its LM accepted later may still be on its way)."""
    running: Annotated[tuple[StartTask, ...], n_items(0, MAX_JOB_TASKS)] = ()
    started: Annotated[tuple[WorkerReport, ...], n_items(0, MAX_JOB_TASKS)] = ()
    """The start reports of what runs (worker and start times)."""
    ended: Annotated[tuple[EndedAttempt, ...], n_items(0, MAX_JOB_TASKS)] = ()
    """What ended while no LM took the reports: a new incarnation holds it as ended, so
    no GM places it again."""


@message("registered")
class Registered(Wire, frozen=True, kw_only=True):
    """LM -> its pool: registration taken; ``epoch`` is the LM's incarnation."""

    lm: LmId
    epoch: UInt


@message("register_pool")
class RegisterPool(Wire, frozen=True, kw_only=True):
    """Pool driver -> core: register with the LM (at start, or when the LM asks)."""


# ---------------------------------------------------------------- journals
# What an LM or a worker pool writes to its write-ahead journal on local disk
# (``runtime.journal``) so that a restart of every process at once loses nothing: each
# record stands alone on disk, enveloped like a wire message.
@message("journal_held")
class JournalHeld(Wire, frozen=True, kw_only=True):
    """LM journal: an attempt entered the active task list (``stopping``: the list of
    preempted attempts whose stop their pool has not confirmed)."""

    start: StartTask
    accepted_at: Time
    stopping: bool = False


@message("journal_dropped")
class JournalDropped(Wire, frozen=True, kw_only=True):
    """LM journal: attempt ``attempt`` of the task left the active (or stopping) list."""

    user: UserId
    task_id: TaskId
    attempt: UInt
    stopping: bool = False


@message("journal_ended")
class JournalEnded(Wire, frozen=True, kw_only=True):
    """LM journal: an attempt of ``gm``'s ended (``held.ended_at``); the LM learnt it at
    ``learnt_at`` and remembers it for its retention (longer if its job is kept)."""

    gm: GmId
    held: HeldTask
    learnt_at: Time


@message("journal_keep")
class JournalKeep(Wire, frozen=True, kw_only=True):
    """LM journal: ``gm`` asked that the ends of a job be kept (``keep``) or let go."""

    gm: GmId
    user: UserId
    job_id: JobId
    keep: bool
    at: Time


@message("journal_unreported")
class JournalUnreported(Wire, frozen=True, kw_only=True):
    """Pool journal: an attempt ended here; no LM has taken its report yet."""

    ended: EndedAttempt


@message("journal_taken")
class JournalTaken(Wire, frozen=True, kw_only=True):
    """Pool journal: the LM took the reports of these attempts."""

    attempts: Seq[PlacedRef]


# ------------------------------------------------------------------ timers
@message("decide")
class Decide(Wire, frozen=True, kw_only=True):
    """GM driver -> core: make up to ``max_tasks`` decisions (launches to one LM share
    one request)."""

    max_tasks: Annotated[int, in_range(1, None)] = 1


@message("user_access")
class UserAccess(Wire, frozen=True, kw_only=True):
    """GM driver -> core: ``user``'s token was revoked (its tasks end ``user_revoked``,
    queued or running), or issued again (``revoked`` false)."""

    user: UserId
    revoked: bool = True


@message("request_snapshots")
class RequestSnapshots(Wire, frozen=True, kw_only=True):
    """A (re)started GM asks every LM for a full snapshot."""


@message("heartbeat")
class Heartbeat(Wire, frozen=True, kw_only=True):
    """LM timer: publish the state delta since the previous heartbeat to every GM."""


@message("check_workers")
class CheckWorkers(Wire, frozen=True, kw_only=True):
    """LM timer: declare nodes silent for ``timeout`` seconds dead (nothing is placed on
    them); give up their tasks (run them again) once silent for ``lost_after`` seconds
    (at once if ``lost_after <= timeout``)."""

    timeout: Seconds
    lost_after: Seconds = 0.0


@message("reports_taken")
class ReportsTaken(Wire, frozen=True, kw_only=True):
    """Pool driver -> core: the LM took these reports (they need not be kept)."""

    reports: Seq[WorkerReport]


@message("lease_renewed")
class LeaseRenewed(Wire, frozen=True, kw_only=True):
    """Pool driver -> core: the LM answered (a heartbeat): the pool may go on running.
    The lease counts from ``sent``, when the answered request left (an answer read late,
    by a pool that was frozen meanwhile, renews nothing past it); -1: on receipt."""

    sent: Time = -1.0


@message("check_lease")
class CheckLease(Wire, frozen=True, kw_only=True):
    """Pool timer: has the pool been out of touch with its LM for longer than ``lease``?"""

    lease: Seconds


@message("task_due")
class TaskDue(Wire, frozen=True, kw_only=True):
    """Worker timer: a synthetic task's duration has elapsed."""

    user: UserId
    task_id: TaskId
    attempt: UInt


@message("command_started")
class CommandStarted(Wire, frozen=True, kw_only=True):
    """Worker runner -> core: a task's command is running."""

    user: UserId
    task_id: TaskId
    attempt: UInt


@message("command_exited")
class CommandExited(Wire, frozen=True, kw_only=True):
    """Worker runner -> core: a task's command ended."""

    user: UserId
    task_id: TaskId
    attempt: UInt
    ok: bool
    detail: Text = ""
    exit_code: ExitCode = None
    stdout: Output = b""
    stderr: Output = b""


# ----------------------------------------------------------------- answers
@message("refused")
class Refused(Wire, frozen=True, kw_only=True):
    """A request a core will not take: the reason (machine-readable) and why."""

    reason: Text
    detail: Text = ""


# ------------------------------------------------------------------ cancel
@message("cancel_job")
class CancelJob(Wire, frozen=True, kw_only=True):
    """A user (through its GM's front door) -> the GM core: cancel job ``job_id``.
    Its queued tasks are dropped, its running ones stopped (``CancelTasks``); each ends
    ``cancelled`` unless it ended otherwise first.  Idempotent."""

    user: UserId
    job_id: JobId


@message("cancel_tasks")
class CancelTasks(Wire, frozen=True, kw_only=True):
    """GM -> LM: stop these attempts of cancelled tasks, as a preemption stops them.
    Each goes back to its GM (``PREEMPTED``) once its pool confirms the stop; an
    attempt the LM no longer holds is ignored."""

    gm: GmId
    lm: LmId
    tasks: Annotated[tuple[PlacedRef, ...], n_items(1, MAX_JOB_TASKS)]


GmInput = (
    AdmitJob
    | CancelJob
    | Decide
    | RequestSnapshots
    | StateUpdated
    | StateSnapshot
    | LaunchResponse
    | PreemptResponse
    | RequestFailed
    | TaskEvents
    | UserAccess
    | UserTasksStopped
    | ReserveResponse
    | GangRetry
)
LmInput = (
    LaunchRequest
    | CancelTasks
    | PreemptRequest
    | SnapshotRequest
    | WorkerReports
    | WorkerHeartbeat
    | RegisterWorkers
    | Heartbeat
    | CheckWorkers
    | StopUserTasks
    | ReserveRequest
    | CommitGang
    | ReleaseGang
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
