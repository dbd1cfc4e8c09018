"""The wire form: every message round-trips; every kind of bad body is refused precisely.

The Hypothesis strategies are derived from the same declarations msgspec decodes
(``msgspec.inspect``), so a message added to ``common.messages`` is covered without
touching this file.
"""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import inspect as mi

from common import codec
from common.errors import DecodeError, ValidationError
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.messages import LaunchRequest, SnapshotRequest, SubmitJob
from common.model import N_CONSTRAINTS, TaskSpec
from common.schema import MAX_ID_LEN, REGISTRY

ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@+-"


def strategy(t: mi.Type) -> st.SearchStrategy[Any]:
    """Values the schema accepts for a field of msgspec type ``t``."""
    if isinstance(t, mi.Metadata):
        if (t.extra or {}).get("kind") == "id":
            return st.text(ID_CHARS, min_size=1, max_size=12)
        return strategy(t.type)
    if isinstance(t, mi.StructType):
        return st.builds(t.cls, **{f.name: strategy(f.type) for f in t.fields})
    if isinstance(t, mi.UnionType):
        return st.one_of(*(strategy(a) for a in t.types))
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        lo = -(2**40) if t.ge is None else t.ge
        return st.integers(lo, 2**40 if t.le is None else t.le)
    if isinstance(t, mi.FloatType):
        lo = -1.0 if t.ge is None or t.ge < -1.0 else float(t.ge)
        return st.floats(min_value=lo, max_value=2e9, allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.StrType):
        return st.text(max_size=20)
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=40)
    if isinstance(t, mi.TupleType):
        return st.tuples(*(strategy(a) for a in t.item_types))
    if isinstance(t, mi.VarTupleType | mi.ListType):
        lo_n = t.min_length or 0
        hi_n = lo_n + 3 if t.max_length is None else min(t.max_length, lo_n + 3)
        items = st.lists(strategy(t.item_type), min_size=lo_n, max_size=hi_n)
        return items.map(tuple) if isinstance(t, mi.VarTupleType) else items
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy(t.key_type), strategy(t.value_type), max_size=3)
    raise TypeError(f"no strategy for {t!r}")


def of(cls: type) -> st.SearchStrategy[Any]:
    return strategy(mi.type_info(cls))


messages = st.sampled_from(sorted(REGISTRY)).flatmap(lambda tag: of(REGISTRY[tag]))


@settings(max_examples=400, deadline=None)
@given(messages)
def test_every_message_round_trips(msg: object) -> None:
    assert codec.decode(codec.encode(msg)) == msg


@pytest.mark.parametrize("tag", sorted(REGISTRY))
def test_each_message_type_round_trips(tag: str) -> None:
    """Every registered type, at least once (the sampled strategy may miss a rare one)."""

    @settings(max_examples=20, deadline=None)
    @given(of(REGISTRY[tag]))
    def check(msg: object) -> None:
        assert codec.decode(codec.encode(msg)) == msg

    check()


# ------------------------------------------------------------------- bad input
SPEC = TaskSpec(task_id=TaskId("t1"), job_id=JobId("j1"), user=UserId("u0"), demand=(1, 2),
                duration=1.0)  # fmt: skip


def _job_fields(**task_over: object) -> dict[str, object]:
    task = msgspec.to_builtins(SPEC)
    task.update(task_over)
    return {"job_id": "j1", "user": "u0", "token": "", "submitted_at": 0.0, "tasks": [task]}


def _body(tag: str, fields: object, version: int = codec.SCHEMA_VERSION) -> bytes:
    out: bytes = msgpack.packb([tag, version, fields])
    return out


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xc1\xff\x00", "malformed_body"),
        (b"", "empty_body"),
        (msgpack.packb({"a": 1}), "bad_envelope"),
        (_body("no_such_thing", {}), "unknown_tag"),
        (_body("submit_job", _job_fields(), version=99), "unsupported_version"),
        (b"\x91" + b"\xdb" + (10**7).to_bytes(4, "big"), "malformed_body"),  # over max_str_len
    ],
)
def test_malformed_bodies_are_decode_errors(body: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        codec.decode(body, max_size=1_000_000)
    assert err.value.reason == reason


def _without(key: str) -> dict[str, object]:
    f = _job_fields()
    task = dict(f["tasks"][0])  # type: ignore[index]
    del task[key]
    f["tasks"] = [task]
    return f


@pytest.mark.parametrize(
    ("fields", "reason", "where"),
    [
        (_without("demand"), "missing_field", "tasks[0].demand"),
        (_job_fields(duration="long"), "wrong_type", "tasks[0].duration"),
        (_job_fields(task_id=5), "wrong_type", "tasks[0].task_id"),
        (_job_fields(task_id="has space"), "bad_id", "tasks[0].task_id"),
        (_job_fields(task_id="x" * (MAX_ID_LEN + 1)), "bad_id", "tasks[0].task_id"),
        (_job_fields(demand=[1, -2]), "negative_value", "tasks[0].demand[1]"),
        (_job_fields(demand=[1.5, 2]), "wrong_type", "tasks[0].demand[0]"),
        (_job_fields(demand=[]), "too_small", "tasks[0].demand"),
        (_job_fields(constraints=1 << N_CONSTRAINTS), "unknown_constraint", "constraints"),
        (_job_fields(constraints=-1), "negative_value", "tasks[0].constraints"),
        (_job_fields(duration=-1.0), "negative_value", "tasks[0].duration"),
        (_job_fields(duration=float("inf")), "out_of_range", "tasks[0].duration"),
        (_job_fields(evil=1), "unknown_field", "tasks[0].evil"),
        (_job_fields(command=[1]), "wrong_type", "tasks[0].command[0]"),
        ({**_job_fields(), "tasks": []}, "empty_job", "tasks"),
        ({**_job_fields(), "extra": True}, "unknown_field", "submit_job.extra"),
    ],
)
def test_invalid_fields_name_the_field(fields: dict[str, object], reason: str, where: str) -> None:
    with pytest.raises(ValidationError) as err:
        codec.decode(_body("submit_job", fields))
    assert err.value.reason == reason
    assert where in str(err.value)
    assert err.value.to_dict()["field"].startswith("submit_job")


def _defaults(cls: type) -> dict[str, object]:
    """The fields of ``cls`` a sender may leave out, with the values they then take."""
    out: dict[str, object] = {}
    for f in msgspec.structs.fields(cls):
        if f.default is not msgspec.NODEFAULT:
            out[f.name] = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            out[f.name] = f.default_factory()
    return out


@pytest.mark.parametrize("tag", sorted(REGISTRY))
def test_a_field_left_out_takes_its_default(tag: str) -> None:
    """A sender may leave out any field that has a default (a client that does not
    know a newer optional field, a hand-written job without ``command``)."""
    cls = REGISTRY[tag]
    defaults = _defaults(cls)

    @settings(max_examples=5, deadline=None)
    @given(of(cls))
    def check(msg: Any) -> None:
        msg = msgspec.structs.replace(msg, **defaults)
        fields = msgpack.unpackb(codec.encode(msg))[2]
        for name in defaults:
            del fields[name]
        assert codec.decode(_body(tag, fields)) == msg

    check()


def test_a_task_without_command_or_constraints_is_accepted() -> None:
    fields = _without("command")
    del fields["tasks"][0]["constraints"]  # type: ignore[index]
    job = codec.decode(_body("submit_job", fields), expect=SubmitJob)
    assert job.tasks[0].command == ()
    assert job.tasks[0].constraints == 0


def test_oversized_body_is_refused_before_parsing() -> None:
    big = codec.encode(
        SubmitJob(job_id=JobId("j"), user=UserId("u"), token="x" * 4000, submitted_at=0.0,
                  tasks=(SPEC,))
    )  # fmt: skip
    with pytest.raises(DecodeError) as err:
        codec.decode(big, max_size=1000)
    assert err.value.reason == "too_large"


def test_expect_refuses_other_messages() -> None:
    body = codec.encode(SnapshotRequest(gm=GmId("gm0"), lm=LmId("lm0")))
    with pytest.raises(DecodeError) as err:
        codec.decode(body, expect=LaunchRequest)
    assert err.value.reason == "unexpected_message"


def test_large_batches_decode_whole() -> None:
    """A job of many tasks (a big body) decodes whole, not in pieces."""
    specs = tuple(
        TaskSpec(task_id=TaskId(f"t{i}"), job_id=JobId("j"), user=UserId("u"), demand=(1, 1),
                 duration=1.0)
        for i in range(20_000)
    )  # fmt: skip
    job = SubmitJob(job_id=JobId("j"), user=UserId("u"), token="", submitted_at=0.0, tasks=specs)
    body = codec.encode(job)
    assert len(body) > 1_000_000
    assert codec.decode(body, max_size=len(body)) == job


def test_compile_all_builds_every_message_codec_before_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Services call it at start, so no task pays for building a codec."""
    fresh: dict[type, Any] = {}  # what this process built so far does not count
    monkeypatch.setattr(codec, "_DECODERS", fresh)
    assert codec.compile_all() == len(REGISTRY)
    built = set(fresh)
    assert set(REGISTRY.values()) <= built
    codec.decode(codec.encode(SnapshotRequest(gm=GmId("gm0"), lm=LmId("lm0"))))
    assert set(fresh) == built  # nothing new was built on use


def _long_head(body: bytes) -> bytes:
    """``body`` with its tag as a str8 and its version as a uint8: the same message,
    in a head msgpack allows but does not write (so not read off the bytes)."""
    n = body[1] - 0xA0
    tag, version, fields = body[2 : 2 + n], body[2 + n], body[3 + n :]
    return b"\x93\xd9" + bytes([n]) + tag + b"\xcc" + bytes([version]) + fields


@settings(max_examples=300, deadline=None)
@given(messages, st.sampled_from(["long_head", "bytearray", "memoryview"]))
def test_every_head_and_buffer_decodes_the_same(msg: Any, how: str) -> None:
    """A head read off the bytes (``codec._HEADS``) and one the envelope's decoder
    reads give the same message."""
    body = codec.encode(msg)
    other = {"long_head": _long_head(body), "bytearray": bytearray(body)}.get(how)
    assert codec.decode(memoryview(body) if other is None else other) == msg


@pytest.mark.parametrize("how", ["short", "long"])
@pytest.mark.parametrize(
    ("fields", "reason"),
    [({"gm": "gm 0", "lm": "lm0"}, "bad_id"), ({"gm": "gm0"}, "missing_field")],
)
def test_a_refusal_is_the_same_whatever_the_head(how: str, fields: object, reason: str) -> None:
    body = _body("snapshot_request", fields)
    with pytest.raises(ValidationError) as err:
        codec.decode(body if how == "short" else _long_head(body))
    assert err.value.reason == reason


_SNAP = _body("snapshot_request", {"gm": "gm0", "lm": "lm0"})


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_SNAP[:18], "malformed_body"),  # cut after the tag
        (_SNAP[:19], "malformed_body"),  # cut after the version
        (_SNAP[:-1], "malformed_body"),
        (_SNAP + b"\xc0", "malformed_body"),  # a value after the array
        (b"\x94" + _SNAP[1:] + b"\xc0", "bad_envelope"),  # an array of 4
        (b"\x93\x00\x02\x80", "bad_envelope"),  # a tag that is no string
    ],
)
def test_a_head_without_its_fields_is_refused_as_before(body: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as err:
        codec.decode(body)
    assert err.value.reason == reason
