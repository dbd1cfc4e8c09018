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

from common.messages._base import (
    MAX_JOB_TASKS,
    MAX_STAGES,
    OUTPUT_BYTES,
    EventKind,
    ExitCode,
    Output,
    ReportKind,
    Version,
)
from common.messages.events import JobRefusal, TaskEvent, TaskEvents, TaskOutcome, TaskOutcomes
from common.messages.gangs import (
    CommitGang,
    GangRetry,
    ReleaseGang,
    ReserveRequest,
    ReserveResponse,
)
from common.messages.jobs import AdmitJob, AdmitMore, CancelJob, CancelTasks, StageSpec, SubmitJob
from common.messages.journal import (
    HoldLoan,
    JournalDropped,
    JournalEnded,
    JournalHeld,
    JournalHold,
    JournalHoldGone,
    JournalKeep,
    JournalRestored,
    JournalTaken,
    JournalUnreported,
)
from common.messages.placement import (
    LaunchRequest,
    LaunchResponse,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    RequestFailed,
    StopUserTasks,
    UserTasksStopped,
)
from common.messages.state import (
    ENDS_RETAINED_S,
    MAX_KEEPS,
    ClusterLayout,
    GangHold,
    HeldTask,
    JobKeep,
    KeepEnds,
    PlacedRef,
    SnapshotRequest,
    StateDelta,
    StateSnapshot,
    StateUpdated,
)
from common.messages.timers import (
    CheckLease,
    CheckWorkers,
    CommandExited,
    CommandStarted,
    Decide,
    Heartbeat,
    LeaseRenewed,
    Refused,
    ReportsTaken,
    RequestSnapshots,
    TaskDue,
    UserAccess,
)
from common.messages.workers import (
    EndedAttempt,
    Registered,
    RegisterPool,
    RegisterWorkers,
    StartTask,
    StartTasks,
    StopTask,
    StopTasks,
    WorkerHeartbeat,
    WorkerReport,
    WorkerReports,
)

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

__all__ = [
    "ENDS_RETAINED_S",
    "MAX_JOB_TASKS",
    "MAX_KEEPS",
    "MAX_STAGES",
    "OUTPUT_BYTES",
    "AdmitJob",
    "AdmitMore",
    "CancelJob",
    "CancelTasks",
    "CheckLease",
    "CheckWorkers",
    "ClusterLayout",
    "CommandExited",
    "CommandStarted",
    "CommitGang",
    "Decide",
    "EndedAttempt",
    "EventKind",
    "ExitCode",
    "GangHold",
    "GangRetry",
    "GmInput",
    "Heartbeat",
    "HeldTask",
    "HoldLoan",
    "JobKeep",
    "JobRefusal",
    "JournalDropped",
    "JournalEnded",
    "JournalHeld",
    "JournalHold",
    "JournalHoldGone",
    "JournalKeep",
    "JournalRestored",
    "JournalTaken",
    "JournalUnreported",
    "KeepEnds",
    "LaunchRequest",
    "LaunchResponse",
    "LeaseRenewed",
    "LmInput",
    "Output",
    "PlacedRef",
    "Placement",
    "PlacementResult",
    "PreemptRequest",
    "PreemptResponse",
    "Refused",
    "RegisterPool",
    "RegisterWorkers",
    "Registered",
    "ReleaseGang",
    "ReportKind",
    "ReportsTaken",
    "RequestFailed",
    "RequestSnapshots",
    "ReserveRequest",
    "ReserveResponse",
    "SnapshotRequest",
    "StageSpec",
    "StartTask",
    "StartTasks",
    "StateDelta",
    "StateSnapshot",
    "StateUpdated",
    "StopTask",
    "StopTasks",
    "StopUserTasks",
    "SubmitJob",
    "TaskDue",
    "TaskEvent",
    "TaskEvents",
    "TaskOutcome",
    "TaskOutcomes",
    "UserAccess",
    "UserTasksStopped",
    "Version",
    "WorkerHeartbeat",
    "WorkerInput",
    "WorkerReport",
    "WorkerReports",
]
