"""The wire form: every message round-trips; every kind of bad body is refused precisely."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import codec
from common.codec import SubmitJob, TaskReport, WorkerHeartbeat
from common.errors import DecodeError, ValidationError
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    ClusterLayout,
    LaunchRequest,
    LaunchResponse,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StartTask,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    StopTask,
    TaskEvent,
    TaskFailed,
    WorkerReport,
)
from common.model import N_CONSTRAINTS, Phase, Task, WaitReason

ident = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=12)
times = st.floats(min_value=-1.0, max_value=2e9, allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=2**40)
resources = st.lists(st.integers(0, 2**31), min_size=2, max_size=2).map(tuple)
masks = st.integers(0, (1 << N_CONSTRAINTS) - 1)
versions = st.integers(0, 2**40)


@st.composite
def tasks(draw: st.DrawFn) -> Task:
    return Task(
        task_id=TaskId(draw(ident)),
        job_id=JobId(draw(ident)),
        user=UserId(draw(ident)),
        demand=draw(resources),
        duration=draw(nonneg),
        constraints=draw(masks),
        command=tuple(draw(st.lists(st.text(max_size=8), max_size=3))),
        altruistic=draw(st.booleans()),
        gm=draw(st.none() | ident.map(GmId)),
        submitted_at=draw(times),
        started_at=draw(times),
        finished_at=draw(times),
        phase=draw(st.sampled_from(list(Phase))),
        phase_since=draw(times),
        spent=draw(st.lists(nonneg, min_size=len(Phase), max_size=len(Phase))),
        attempts=draw(counts),
        waits=draw(st.lists(counts, min_size=len(WaitReason), max_size=len(WaitReason))),
    )


@st.composite
def deltas(draw: st.DrawFn) -> StateDelta:
    n = draw(st.integers(0, 5))
    return StateDelta(
        lm=LmId(draw(ident)),
        version=draw(versions),
        base_version=draw(st.integers(-1, 2**40)),
        nodes=tuple(
            NodeIndex(i) for i in draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
        ),
        free=tuple(draw(st.lists(resources, min_size=n, max_size=n))),
        node_versions=tuple(draw(st.lists(versions, min_size=n, max_size=n))),
        usage=draw(st.dictionaries(ident.map(UserId), resources, max_size=3)),
    )


@st.composite
def layouts(draw: st.DrawFn) -> ClusterLayout:
    n = draw(st.integers(1, 5))
    return ClusterLayout(
        lm=LmId(draw(ident)),
        capacity=tuple(draw(st.lists(resources, min_size=n, max_size=n))),
        constraints=tuple(draw(st.lists(masks, min_size=n, max_size=n))),
        home=tuple(draw(st.lists(ident.map(GmId), min_size=n, max_size=n))),
    )


gm = ident.map(GmId)
lm = ident.map(LmId)
node = st.integers(0, 10**6).map(NodeIndex)
rid = st.integers(0, 2**40)
report_kinds = st.sampled_from(sorted(codec.REPORT_KINDS))
reports = st.builds(
    WorkerReport,
    lm=lm,
    node=node,
    task_id=ident.map(TaskId),
    kind=report_kinds,
    at=times,
    detail=st.text(max_size=20),
)

messages = st.one_of(
    tasks(),
    deltas(),
    layouts(),
    st.builds(StateSnapshot, layout=layouts(), state=deltas(),
              placed_by_gm=st.lists(ident.map(TaskId), max_size=3).map(tuple)),
    st.builds(StateUpdated, delta=deltas()),
    st.builds(SnapshotRequest, gm=gm, lm=lm),
    st.builds(
        LaunchRequest, gm=gm, lm=lm, request_id=rid, known_version=st.integers(-1, 2**40),
        placements=st.lists(
            st.builds(Placement, task=tasks(), node=node, repartition=st.booleans()), max_size=3
        ).map(tuple),
    ),
    st.builds(
        LaunchResponse, gm=gm, lm=lm, request_id=rid, delta=deltas(), received_at=times,
        sent_at=times,
        results=st.lists(
            st.builds(PlacementResult, task_id=ident.map(TaskId), accepted=st.booleans(),
                      reason=st.text(max_size=20)),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(PreemptRequest, gm=gm, lm=lm, request_id=rid, task=tasks(), victim=ident.map(UserId),
              known_version=st.integers(-1, 2**40)),
    st.builds(
        PreemptResponse, gm=gm, lm=lm, request_id=rid, task_id=ident.map(TaskId),
        accepted=st.booleans(), reason=st.text(max_size=20), node=st.none() | node,
        preempted=st.lists(ident.map(TaskId), max_size=3).map(tuple), delta=deltas(),
        received_at=times, sent_at=times,
    ),
    st.builds(StartTask, lm=lm, node=node, task=tasks()),
    st.builds(StopTask, lm=lm, node=node, task_id=ident.map(TaskId)),
    reports,
    st.builds(
        TaskEvent, kind=st.sampled_from(sorted(codec.EVENT_KINDS)), lm=lm, gm=gm, task=tasks(),
        node=node, node_free=resources, node_version=versions, at=times,
    ),
    st.builds(TaskFailed, gm=gm, task=tasks(), reason=st.text(max_size=30), at=times),
    st.builds(
        SubmitJob, job_id=ident.map(JobId), user=ident.map(UserId), token=st.text(max_size=64),
        submitted_at=nonneg, tasks=st.lists(tasks(), min_size=1, max_size=3).map(tuple),
    ),
    st.builds(TaskReport, report=reports, task=tasks()),
    st.builds(WorkerHeartbeat, lm=lm, nodes=st.lists(node, max_size=5).map(tuple), at=times),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(messages)
def test_every_message_round_trips(msg: codec.Message) -> None:
    assert codec.decode(codec.encode(msg)) == msg


@settings(max_examples=50, deadline=None)
@given(st.lists(messages, min_size=0, max_size=4))
def test_batches_round_trip(msgs: list[codec.Message]) -> None:
    assert codec.decode_batch(codec.encode_batch(msgs)) == msgs


def test_every_tag_has_a_strategy() -> None:
    names = {codec.tag_of(m) for m in (Task(TaskId("t"), JobId("j"), UserId("u"), (1,), 1.0),)}
    assert names <= codec.TAGS
    assert len(codec.TAGS) == 18


# ------------------------------------------------------------------- bad input
def _task_fields(**over: object) -> dict[str, object]:
    t = Task(TaskId("t1"), JobId("j1"), UserId("u0"), (1, 2), 1.0)
    f = codec.task_fields(t)
    f.update(over)
    return f


def _body(tag: str, fields: object, version: int = codec.SCHEMA_VERSION) -> bytes:
    out: bytes = msgpack.packb([tag, version, fields])
    return out


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xc1\xff\x00", "malformed_body"),
        (b"", "malformed_body"),
        (msgpack.packb({"a": 1}), "bad_envelope"),
        (_body("no_such_thing", {}), "unknown_tag"),
        (_body("task", _task_fields(), version=99), "unsupported_version"),
        (b"\x91" + b"\xdb" + (10**7).to_bytes(4, "big"), "malformed_body"),  # over max_str_len
    ],
)
def test_malformed_bodies_are_decode_errors(body: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        codec.decode(body, max_size=1_000_000)
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("fields", "reason", "where"),
    [
        ({k: v for k, v in _task_fields().items() if k != "demand"}, "missing_field", "demand"),
        (_task_fields(duration="long"), "wrong_type", "duration"),
        (_task_fields(id=5), "wrong_type", "id"),
        (_task_fields(demand=[1, -2]), "negative_value", "demand[1]"),
        (_task_fields(demand=[1.5, 2]), "wrong_type", "demand[0]"),
        (_task_fields(constraints=1 << N_CONSTRAINTS), "unknown_constraint", "constraints"),
        (_task_fields(constraints=-1), "negative_value", "constraints"),
        (_task_fields(duration=-1.0), "negative_value", "duration"),
        (_task_fields(altruistic=1), "wrong_type", "altruistic"),
        (_task_fields(spent=[0.0]), "invalid_field", "spent"),
    ],
)
def test_invalid_fields_name_the_field(fields: dict[str, object], reason: str, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        codec.decode(_body("task", fields))
    assert err.value.reason == reason
    assert where in str(err.value)


def test_oversized_body_is_refused_before_parsing() -> None:
    big = codec.encode(Task(TaskId("t"), JobId("j"), UserId("u"), (1,), 1.0, command=("x" * 5000,)))
    with pytest.raises(DecodeError) as err:
        codec.decode(big, max_size=1000)
    assert err.value.reason == "too_large"


def test_expect_refuses_other_messages() -> None:
    body = codec.encode(SnapshotRequest(gm=GmId("gm0"), lm=LmId("lm0")))
    with pytest.raises(DecodeError) as err:
        codec.decode(body, expect=LaunchRequest)
    assert err.value.reason == "unexpected_message"


def test_duplicate_task_ids() -> None:
    t = Task(TaskId("t"), JobId("j"), UserId("u"), (1,), 1.0)
    with pytest.raises(ValidationError) as err:
        codec.check_ids_unique([t, t])
    assert err.value.reason == "duplicate_task_id"


def test_empty_job_is_refused() -> None:
    body = _body(
        "submit_job", {"job": "j", "user": "u", "token": "", "submitted_at": 0.0, "tasks": []}
    )
    with pytest.raises(ValidationError) as err:
        codec.decode(body)
    assert err.value.reason == "empty_job"
