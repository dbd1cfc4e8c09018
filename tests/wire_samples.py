"""One or more representative instances of every wire message, and their recorded bytes.

``tests/fixtures/wire_messages.json`` holds, per sample, the hex of ``codec.encode``
as the codec of commit f166df8 (the hand-written schema over msgpack-python) wrote
it: ``tests/unit/test_wire_bytes.py`` checks that today's codec writes exactly those
bytes and reads them back to equal messages.  The values are chosen to cross the
msgpack encodings' boundaries (fixint, uint8 to uint64, negative ints, float64,
fixstr / str8 / str16, empty and non-empty arrays and maps, nil, booleans, enums).

Re-record (only for a deliberate change of the wire form, with ``SCHEMA_VERSION``
bumped): ``PYTHONPATH=. python -m tests.wire_samples --record``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    AdmitJob,
    AdmitMore,
    CancelJob,
    CancelTasks,
    CheckLease,
    CheckWorkers,
    ClusterLayout,
    CommandExited,
    CommandStarted,
    CommitGang,
    Decide,
    EndedAttempt,
    EventKind,
    GangHold,
    GangRetry,
    Heartbeat,
    HeldTask,
    HoldLoan,
    JobKeep,
    JobRefusal,
    JournalDropped,
    JournalEnded,
    JournalHeld,
    JournalHold,
    JournalHoldGone,
    JournalKeep,
    JournalRestored,
    JournalTaken,
    JournalUnreported,
    KeepEnds,
    LaunchRequest,
    LaunchResponse,
    LeaseRenewed,
    PlacedRef,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    Refused,
    Registered,
    RegisterPool,
    RegisterWorkers,
    ReleaseGang,
    ReportKind,
    ReportsTaken,
    RequestFailed,
    RequestSnapshots,
    ReserveRequest,
    ReserveResponse,
    SnapshotRequest,
    StageSpec,
    StartTask,
    StartTasks,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    StopTask,
    StopTasks,
    StopUserTasks,
    SubmitJob,
    TaskDue,
    TaskEvent,
    TaskEvents,
    TaskOutcome,
    TaskOutcomes,
    UserAccess,
    UserTasksStopped,
    WorkerHeartbeat,
    WorkerReport,
    WorkerReports,
)
from common.model import Phase, Task, TaskSpec

FIXTURE = Path(__file__).parent / "fixtures" / "wire_messages.json"

GM, LM, USER, JOB = GmId("gm0"), LmId("lm-3.east"), UserId("alice@org"), JobId("job:42+b")
LONG_TEXT = "ä" * 20 + "x" * 300  # a str16 with multi-byte characters
SPEC = TaskSpec(task_id=TaskId("t.0001"), job_id=JOB, user=USER, demand=(2000, 4096), duration=12.5)
SPEC_FULL = TaskSpec(
    task_id=TaskId("t_" + "9" * 198),  # the longest id
    job_id=JOB,
    user=USER,
    demand=(0, 1, 255, 256, 65535, 65536, 2**32, 2**64 - 1),
    duration=0.0,
    constraints=(1 << 21) - 1,
    command=("/bin/sh", "-c", "sleep 1; echo ünïcode", ""),
    env=("LANG=C.UTF-8", "MEGHA_EMPTY=", "MEGHA_X=a=b ü"),
)
DELTA = StateDelta(
    lm=LM,
    epoch=7,
    version=1_000_000,
    base_version=-1,
    nodes=(NodeIndex(0), NodeIndex(127), NodeIndex(128), NodeIndex(70_000)),
    free=((1, 2), (0, 0), (64_000, 16_384), (3, 2**40)),
    node_versions=(1, 2, 300, 1_000_000),
    usage={USER: (5, 6), UserId("bob"): (0, 0)},
)
HOLDS_DELTA = StateDelta(
    lm=LM, version=9, base_version=4, nodes=(NodeIndex(2),), free=((0, 512),),
    node_versions=(9,),
    holds=(GangHold(gm=GM, user=USER, job_id=JOB, stage=1, node=NodeIndex(2), held=(4, 1024),
                    due=30.5, lease_until=31.0),),
)  # fmt: skip
EMPTY_DELTA = StateDelta(lm=LM, version=0, base_version=0, nodes=(), free=(), node_versions=())
PLACEMENT = Placement(
    spec=SPEC_FULL,
    attempt=3,
    node=NodeIndex(129),
    repartition=True,
    altruistic=True,
    queued_at=1.75,
)
REPORT = WorkerReport(
    kind=ReportKind.FINISHED,
    node=NodeIndex(4),
    user=USER,
    task_id=TaskId("t.0001"),
    attempt=1,
    gm=GM,
    at=100.25,
    worker_at=99.0,
)
REPORT_FULL = WorkerReport(
    kind=ReportKind.STOPPED,
    node=NodeIndex(40_000),
    user=USER,
    task_id=TaskId("t.2"),
    attempt=2**31,
    gm=GM,
    at=-0.0,
    worker_at=1e-300,
    started_at=1.5e9,
    detail=LONG_TEXT,
    job_id=JOB,
    queued_at=3.0,
)
START = StartTask(node=NodeIndex(4), spec=SPEC, attempt=1, gm=GM, altruistic=True, queued_at=0.5)
EVENT = TaskEvent(
    kind=EventKind.RELAUNCHED,
    lm=LM,
    gm=GM,
    user=USER,
    task_id=TaskId("t.0001"),
    attempt=2,
    node=NodeIndex(17),
    node_free=(1, 1),
    node_version=99,
    at=12.0,
    worker_at=11.5,
    started_at=11.75,
    detail="moved",
    job_id=JOB,
    queued_at=1.0,
)
LEDGER = Task(
    spec=SPEC,
    altruistic=True,
    gm=GM,
    lm=LM,
    attempt=2,
    submitted_at=1.0,
    first_started_at=2.0,
    started_at=3.5,
    finished_at=15.0,
    marks=[
        (1.0, Phase.QUEUEING),
        (1.5, Phase.PROCESSING),
        (1.6, Phase.COMMUNICATION),
        (2.0, Phase.RUNNING),
        (2.5, Phase.QUEUEING),
        (3.5, Phase.RUNNING),
    ],
    decisions=4,
    waits=[0, 1, 2, 3, 4, 5, 6],
)


def samples() -> dict[str, object]:
    """Every sample by name: ``<tag>`` or ``<tag>.<variant>``."""
    return {
        "admit_job": AdmitJob(
            job=SubmitJob(job_id=JOB, user=USER, token="", submitted_at=0.0, tasks=(SPEC,)),
            redelivered=True,
        ),
        "admit_more": AdmitMore(user=USER, job_id=JOB),
        "check_lease": CheckLease(lease=2.5),
        "check_workers": CheckWorkers(timeout=3.0, lost_after=30.0),
        "command_exited": CommandExited(
            user=USER,
            task_id=TaskId("t.0001"),
            attempt=1,
            ok=False,
            detail="exit status 1",
            exit_code=1,
            stdout=b"",
            stderr=b"\x00\xffno such file\n" * 20,
        ),
        "command_started": CommandStarted(user=USER, task_id=TaskId("t.0001"), attempt=1),
        "decide": Decide(max_tasks=64),
        "heartbeat": Heartbeat(),
        "job_refusal": JobRefusal(
            gm=GM,
            user=USER,
            job_id=JOB,
            submitted_at=1_700_000_000.125,
            reason="duration_too_long",
            detail=LONG_TEXT,
        ),
        "journal_dropped": JournalDropped(user=USER, task_id=TaskId("t.0001"), attempt=3),
        "journal_dropped.stopping": JournalDropped(
            user=USER, task_id=TaskId("t.0001"), attempt=3, stopping=True
        ),
        "journal_ended": JournalEnded(
            gm=GM,
            held=HeldTask(spec=SPEC_FULL, attempt=2, accepted_at=1.5, ended_at=9.0, ok=False),
            learnt_at=9.25,
        ),
        "journal_held": JournalHeld(start=START, accepted_at=1_700_000_000.5),
        "journal_held.stopping": JournalHeld(start=START, accepted_at=3.0, stopping=True),
        "journal_hold": JournalHold(
            gm=GM,
            user=USER,
            job_id=JOB,
            stage=1,
            placement=PLACEMENT,
            until=31.5,
            due=30.0,
            lent=(0, 2**20),
        ),
        "journal_hold.lent": JournalHold(
            gm=GM,
            user=USER,
            job_id=JOB,
            stage=0,
            placement=PLACEMENT,
            until=1_700_000_030.25,
            due=1_700_000_020.0,
            lent=(1, 256),
            loans=(HoldLoan(user=USER, task_id=TaskId("t-9"), attempt=3, amount=(1, 256)),),
            committed=True,
        ),
        "journal_hold_gone": JournalHoldGone(user=USER, task_id=TaskId("t.0001")),
        "journal_keep": JournalKeep(gm=GM, user=USER, job_id=JOB, keep=True, at=12.0),
        "journal_restored": JournalRestored(at=100.5),
        "journal_taken": JournalTaken(
            attempts=(PlacedRef(user=USER, task_id=TaskId("t.0001"), attempt=1),)
        ),
        "journal_unreported": JournalUnreported(
            ended=EndedAttempt(start=START, report=REPORT_FULL)
        ),
        "commit_gang": CommitGang(
            gm=GM,
            lm=LM,
            request_id=12,
            user=USER,
            job_id=JOB,
            stage=1,
            tasks=(PlacedRef(user=USER, task_id=TaskId("t.0001"), attempt=2),),
            known_version=9,
            sent_at=30.0,
        ),
        "gang_retry": GangRetry(user=USER, job_id=JOB, stage=0),
        "release_gang": ReleaseGang(gm=GM, lm=LM, user=USER, job_id=JOB, stage=2**16),
        "reserve": ReserveRequest(
            gm=GM,
            lm=LM,
            request_id=11,
            user=USER,
            job_id=JOB,
            stage=1,
            placements=(PLACEMENT,),
            lease_s=5.0,
            due_s=4.5,
            known_version=-1,
            sent_at=26.0,
        ),
        "reserve_response": ReserveResponse(
            gm=GM,
            lm=LM,
            request_id=11,
            results=(
                PlacementResult(accepted=True),
                PlacementResult(accepted=False, reason="insufficient_resources"),
            ),
            delta=HOLDS_DELTA,
            request_sent_at=26.0,
            received_at=26.25,
            sent_at=26.5,
        ),
        "keep_ends": KeepEnds(
            gm=GM,
            lm=LM,
            jobs=(
                JobKeep(user=USER, job_id=JOB, keep=False),
                JobKeep(user=USER, job_id=JobId("j2"), keep=True),
            ),
        ),
        "cancel_job": CancelJob(user=USER, job_id=JOB),
        "cancel_tasks": CancelTasks(
            gm=GM, lm=LM, tasks=(PlacedRef(user=USER, task_id=TaskId("t-1"), attempt=2**32),)
        ),
        "launch": LaunchRequest(
            gm=GM,
            lm=LM,
            request_id=2**33,
            placements=(PLACEMENT, Placement(spec=SPEC, attempt=0, node=NodeIndex(0))),
            known_version=-1,
            sent_at=123.456,
        ),
        "launch_response": LaunchResponse(
            gm=GM,
            lm=LM,
            request_id=5,
            results=(
                PlacementResult(accepted=True),
                PlacementResult(accepted=False, reason="insufficient_resources"),
                PlacementResult(accepted=True, reason="rerouted", attempt=4, node=300),
                PlacementResult(accepted=True, reason="duplicate", attempt=9, node=-1),
            ),
            delta=DELTA,
            request_sent_at=1.0,
            received_at=1.25,
            sent_at=1.5,
        ),
        "lease_renewed": LeaseRenewed(sent=17.0),
        "lease_renewed.default": LeaseRenewed(),
        "preempt": PreemptRequest(
            gm=GM,
            lm=LM,
            request_id=1,
            spec=SPEC_FULL,
            attempt=2,
            victim=UserId("bob"),
            known_version=12,
            sent_at=3.0,
            queued_at=0.25,
        ),
        "stop_user_tasks": StopUserTasks(gm=GM, lm=LM, user=USER),
        "user_access": UserAccess(user=USER),
        "user_access.restored": UserAccess(user=USER, revoked=False),
        "user_tasks_stopped": UserTasksStopped(
            gm=GM,
            lm=LM,
            user=UserId("bob"),
            stopped=(PlacedRef(user=UserId("bob"), task_id=TaskId("b.1"), attempt=300),),
        ),
        "preempt_response": PreemptResponse(
            gm=GM,
            lm=LM,
            request_id=1,
            accepted=True,
            reason="ok",
            node=NodeIndex(3),
            preempted=(
                PlacedRef(user=UserId("bob"), task_id=TaskId("b.1"), attempt=1),
                PlacedRef(user=UserId("bob"), task_id=TaskId("b.2"), attempt=300),
            ),
            attempt=2,
            delta=EMPTY_DELTA,
            request_sent_at=3.0,
            received_at=3.5,
            sent_at=4.0,
        ),
        "preempt_response.refused": PreemptResponse(
            gm=GM,
            lm=LM,
            request_id=2,
            accepted=False,
            reason="no_victim",
            node=None,
            preempted=(),
            delta=DELTA,
        ),
        "refused": Refused(reason="wrong_lm", detail="this is lm-3.east"),
        "register_pool": RegisterPool(),
        "register_workers": RegisterWorkers(
            lm=LM,
            nodes=tuple(NodeIndex(i) for i in range(20)),
            at=50.0,
            running=(START,),
            started=(REPORT,),
            ended=(EndedAttempt(start=START, report=REPORT_FULL),),
        ),
        "register_workers.empty": RegisterWorkers(lm=LM, nodes=(), at=0.0),
        "registered": Registered(lm=LM, epoch=2**20),
        "reports_taken": ReportsTaken(reports=(REPORT, REPORT_FULL)),
        "request_failed": RequestFailed(lm=LM, request_id=77, reason="unknown_gm"),
        "request_snapshots": RequestSnapshots(),
        "snapshot": StateSnapshot(
            layout=ClusterLayout(
                lm=LM,
                capacity=((64_000, 16_384), (1, 1)),
                constraints=(0, (1 << 21) - 1),
                home=(GM, GmId("gm1")),
            ),
            state=DELTA,
            held=(
                HeldTask(
                    spec=SPEC,
                    attempt=1,
                    queued_at=0.0,
                    accepted_at=0.5,
                    worker_at=0.75,
                    started_at=1.0,
                    ended_at=-1.0,
                    ok=True,
                ),
                HeldTask(spec=SPEC_FULL, attempt=2, ok=False),
            ),
        ),
        "snapshot_request": SnapshotRequest(gm=GM, lm=LM),
        "start_tasks": StartTasks(
            lm=LM,
            epoch=3,
            tasks=(START, StartTask(node=NodeIndex(5), spec=SPEC_FULL, attempt=2, gm=GmId("gm1"))),
        ),
        "state_updated": StateUpdated(delta=DELTA),
        "stop_tasks": StopTasks(
            lm=LM,
            tasks=(
                StopTask(node=NodeIndex(4), user=USER, task_id=TaskId("t.0001"), attempt=1, gm=GM),
            ),
        ),
        "submit_job": SubmitJob(
            job_id=JOB,
            user=USER,
            token="s3cr3t-token",
            submitted_at=1_700_000_000.5,
            tasks=(SPEC, SPEC_FULL, SPEC),
            stages=(
                StageSpec(stage_id=0, count=2),
                StageSpec(stage_id=1, parents=(0,), count=1, gang=True, min_count=1),
            ),
            resumes=JobId("job:41"),
            attempt=6,
        ),
        "submit_job.flat": SubmitJob(
            job_id=JOB, user=USER, token="t", submitted_at=2.0, tasks=tuple(SPEC for _ in range(20))
        ),
        "task_due": TaskDue(user=USER, task_id=TaskId("t.0001"), attempt=1),
        "task_events": TaskEvents(
            lm=LM,
            epoch=1,
            events=(
                EVENT,
                TaskEvent(
                    kind=EventKind.STARTED,
                    lm=LM,
                    gm=GM,
                    user=USER,
                    task_id=TaskId("t.3"),
                    attempt=1,
                    node=NodeIndex(0),
                    node_free=(0,),
                    node_version=0,
                    at=0.0,
                ),
            ),
        ),
        "task_outcome": TaskOutcome(task=LEDGER, finished=True),
        "task_outcomes": TaskOutcomes(
            gm=GM,
            outcomes=(
                TaskOutcome(task=LEDGER, finished=False, reason="lost"),
                TaskOutcome(task=Task(spec=SPEC_FULL), finished=True),
            ),
        ),
        "worker_heartbeat": WorkerHeartbeat(lm=LM, nodes=(NodeIndex(1), NodeIndex(300)), at=-1.0),
        "worker_reports": WorkerReports(lm=LM, reports=(REPORT, REPORT_FULL)),
        "worker_reports.empty": WorkerReports(lm=LM, reports=()),
    }


def record(path: Path = FIXTURE) -> int:
    """Write every sample's encoded bytes (hex) to ``path``; returns how many."""
    from common import codec

    out = {name: codec.encode(msg).hex() for name, msg in sorted(samples().items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return len(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--record", action="store_true", help=f"write {FIXTURE.name} anew")
    args = ap.parse_args(argv)
    if not args.record:
        ap.print_help()
        return 0
    print(f"wrote {record()} samples to {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
