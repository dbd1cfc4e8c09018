"""The wire form: every message round-trips; every kind of bad body is refused precisely.

The Hypothesis strategies are derived from the same declarations the schema compiles,
so a message added to ``common.messages`` is covered without touching this file.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import codec
from common.errors import DecodeError, ValidationError
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.messages import LaunchRequest, SnapshotRequest, SubmitJob
from common.model import N_CONSTRAINTS, TaskSpec
from common.schema import MAX_ID_LEN, REGISTRY, encoder_of, unwrap

ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@+-"


def strategy(tp: Any) -> st.SearchStrategy[Any]:
    """Values the schema accepts for a field of type ``tp``."""
    base, rng, length = unwrap(tp)
    if dataclasses.is_dataclass(base) and isinstance(base, type):
        hints = typing.get_type_hints(base, include_extras=True)
        fields = {f.name: strategy(hints[f.name]) for f in dataclasses.fields(base) if f.init}
        return st.builds(base, **fields)
    if isinstance(base, typing.NewType):
        if base.__supertype__ is str:
            return st.text(ID_CHARS, min_size=1, max_size=12).map(base)
        return st.integers(0, 2**31).map(base)
    origin = typing.get_origin(base)
    args = typing.get_args(base)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(st.none() if a is type(None) else strategy(a) for a in args))
    if isinstance(base, type) and issubclass(base, enum.IntEnum):
        return st.sampled_from(list(base))
    if base is bool:
        return st.booleans()
    if base is int:
        lo = 0 if rng is None else rng.lo
        hi = 2**40 if rng is None or rng.hi is None else rng.hi
        return st.integers(int(lo) if lo is not None else -(2**40), int(hi))
    if base is float:
        lo = None if rng is None else rng.lo
        return st.floats(
            min_value=-1.0 if lo is None else float(lo),
            max_value=2e9,
            allow_nan=False,
            allow_infinity=False,
        )
    if base is str:
        return st.text(max_size=20)
    if base is bytes:
        return st.binary(max_size=20)
    lo_n = 0 if length is None else length.lo
    hi_n = 3 if length is None else min(length.hi, lo_n + 3)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return st.tuples(*(strategy(a) for a in args))
    if origin is tuple:
        return st.lists(strategy(args[0]), min_size=lo_n, max_size=hi_n).map(tuple)
    if origin is list:
        return st.lists(strategy(args[0]), min_size=lo_n, max_size=hi_n)
    if origin is dict:
        return st.dictionaries(strategy(args[0]), strategy(args[1]), max_size=3)
    raise TypeError(f"no strategy for {tp!r}")


messages = st.sampled_from(sorted(REGISTRY)).flatmap(lambda tag: strategy(REGISTRY[tag]))


@settings(max_examples=400, deadline=None)
@given(messages)
def test_every_message_round_trips(msg: object) -> None:
    assert codec.decode(codec.encode(msg)) == msg


@pytest.mark.parametrize("tag", sorted(REGISTRY))
def test_each_message_type_round_trips(tag: str) -> None:
    """Every registered type, at least once (the sampled strategy may miss a rare one)."""

    @settings(max_examples=20, deadline=None)
    @given(strategy(REGISTRY[tag]))
    def check(msg: object) -> None:
        assert codec.decode(codec.encode(msg)) == msg

    check()


# ------------------------------------------------------------------- bad input
SPEC = TaskSpec(task_id=TaskId("t1"), job_id=JobId("j1"), user=UserId("u0"), demand=(1, 2),
                duration=1.0)  # fmt: skip


def _job_fields(**task_over: object) -> dict[str, object]:
    task = dict(encoder_of(TaskSpec)(SPEC))
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
    for f in dataclasses.fields(cls):
        if f.init and f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.init and f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@pytest.mark.parametrize("tag", sorted(REGISTRY))
def test_a_field_left_out_takes_its_default(tag: str) -> None:
    """A sender may leave out any field that has a default (a client that does not
    know a newer optional field, a hand-written job without ``command``)."""
    cls = REGISTRY[tag]
    defaults = _defaults(cls)

    @settings(max_examples=5, deadline=None)
    @given(strategy(cls))
    def check(msg: Any) -> None:
        msg = dataclasses.replace(msg, **defaults)
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
    from common import schema

    fresh = schema._Compiler()  # what this process built so far does not count
    monkeypatch.setattr(schema, "_COMPILER", fresh)
    assert codec.compile_all() == len(REGISTRY)
    built_dec, built_enc = set(fresh.dec), set(fresh.enc)
    assert set(REGISTRY.values()) <= built_dec
    assert set(REGISTRY.values()) <= built_enc
    codec.decode(codec.encode(SnapshotRequest(gm=GmId("gm0"), lm=LmId("lm0"))))
    assert set(fresh.dec) == built_dec  # nothing new was built on use
