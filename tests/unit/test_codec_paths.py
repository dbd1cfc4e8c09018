"""The codec's two paths agree: msgspec and ``ids_ok`` (the fast path) take a body exactly when the
explaining path (``common.schema.explain``) finds nothing wrong with it, so a refusal
always gets its reason and field, never msgspec's bare words.  And the refusals tests
rely on, named as they always were."""

from __future__ import annotations

from typing import Any

import msgpack
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import codec
from common.errors import DecodeError, ValidationError
from common.schema import REGISTRY, explain, ids_ok
from tests.unit.test_codec import of
from tests.wire_refusals import dropped_at, replaced_at

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([-1, 0, 1, 4, 5, 6, 255, 256, 1 << 20, (1 << 20) + 1, (1 << 21) - 1, 1 << 21]),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(["", "a b", "a\n", "x" * 201, "y" * 4097, "ok.id:1@x+y-z"]),
    st.lists(st.integers(-2, 2), max_size=3),
    st.lists(st.text("ab", max_size=2), max_size=17),
    st.dictionaries(st.text("ab", max_size=2), st.integers(-1, 1), max_size=2),
)


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    out = [(path, value)]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _places(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _places(v, (*path, i))
    return out


def _fast_takes(cls: type, plain: Any) -> bool:
    """msgspec takes it, and its ids are made of id characters (the codec's fast path)."""
    try:
        msg = msgspec.msgpack.decode(msgpack.packb(plain, use_bin_type=True), type=cls)
    except msgspec.ValidationError:
        return False
    return ids_ok(msg)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_msgspec_takes_a_broken_message_exactly_when_explain_finds_nothing(
    data: st.DataObject,
) -> None:
    cls = REGISTRY[data.draw(st.sampled_from(sorted(REGISTRY)))]
    plain = msgpack.unpackb(msgspec.msgpack.encode(data.draw(of(cls))))
    path, value = data.draw(st.sampled_from(_places(plain)))
    how = data.draw(st.sampled_from(["replace", "drop", "add"]))
    if how == "drop" and path:
        broken = dropped_at(plain, path)
    elif how == "add" and isinstance(value, dict):
        broken = replaced_at(
            plain, path, {**value, data.draw(st.text("abcdefgiklmnoprstu_", max_size=12)): 1}
        )
    else:
        broken = replaced_at(plain, path, data.draw(JUNK))
    why = explain(cls, broken)
    assert _fast_takes(cls, broken) == (why is None), why


def _refusal(tag: str, fields: object) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        codec.decode(msgpack.packb([tag, codec.SCHEMA_VERSION, fields], use_bin_type=True))
    return err.value


_DELTA = {"lm": "lm0", "version": 3, "base_version": 2, "nodes": [0], "free": [[1, 1]],
          "node_versions": [3]}  # fmt: skip


@pytest.mark.parametrize(
    ("tag", "fields", "reason", "where"),
    [
        ("snapshot_request", {"gm": "gm0", "lm": "lm0\n"}, "bad_id", "snapshot_request.lm"),
        ("snapshot_request", {"gm": "", "lm": "lm0"}, "bad_id", "snapshot_request.gm"),
        ("state_updated", {"delta": {**_DELTA, "version": -2}}, "out_of_range", "delta.version"),
        ("state_updated", {"delta": {**_DELTA, "usage": {"bad user": [1]}}}, "bad_id",
         "state_updated.delta.usage['bad user']"),
        ("state_updated", {"delta": {**_DELTA, "usage": {"u": []}}}, "too_small",
         "state_updated.delta.usage['u']"),
        ("state_updated", {"delta": {**_DELTA, "free": [[1] * 17]}}, "too_large",
         "state_updated.delta.free[0]"),
        ("decide", {"max_tasks": 0}, "out_of_range", "decide.max_tasks"),
        ("decide", {"max_tasks": True}, "wrong_type", "decide.max_tasks"),
        ("refused", {"reason": "r" * 4097}, "too_large", "refused.reason"),
        ("refused", {"reason": b"r"}, "wrong_type", "refused.reason"),
        ("check_lease", {"lease": float("nan")}, "out_of_range", "check_lease.lease"),
        ("check_lease", {"lease": float("-inf")}, "negative_value", "check_lease.lease"),
        ("lease_renewed", {"sent": float("inf")}, "out_of_range", "lease_renewed.sent"),
        ("worker_reports", {"lm": "lm0", "reports": [{"kind": 9}]}, "missing_field",
         "worker_reports.reports[0].at"),
        ("task_events", {"lm": "lm0", "events": [], "evil": 1}, "unknown_field",
         "task_events.evil"),
        ("task_events", {"lm": "lm0", "events": []}, "too_small", "task_events.events"),
    ],
)  # fmt: skip
def test_refusals_name_reason_and_field(tag: str, fields: object, reason: str, where: str) -> None:
    err = _refusal(tag, fields)
    assert (err.reason, err.path) == (reason, where if where.startswith(tag) else f"{tag}.{where}")


def test_an_unknown_field_is_named_before_a_wrong_value() -> None:
    """Whatever order the sender put them in (msgspec reads in wire order)."""
    err = _refusal("decide", {"max_tasks": "x", "zzz": 1})
    assert (err.reason, err.path) == ("unknown_field", "decide.zzz")


def test_a_key_given_twice_counts_once_the_last_as_always() -> None:
    body = b"\x93\xa6decide\x02\x82\xa9max_tasks\xa1x\xa9max_tasks\x05"
    assert codec.decode(body) == REGISTRY["decide"](max_tasks=5)


def test_an_ext_value_is_a_malformed_body() -> None:
    body = msgpack.packb(["decide", 2, {"max_tasks": msgpack.ExtType(1, b"x")}])
    with pytest.raises(DecodeError) as err:
        codec.decode(body)
    assert err.value.reason == "malformed_body"


def test_trailing_bytes_are_a_malformed_body() -> None:
    with pytest.raises(DecodeError) as err:
        codec.decode(msgpack.packb(["decide", 2, {}]) + b"\x00")
    assert err.value.reason == "malformed_body"


def _task(i: int, **over: object) -> dict[str, object]:
    return {"task_id": f"t{i}", "job_id": "j", "user": "u", "demand": [1], "duration": 1.0,
            **over}  # fmt: skip


def test_a_bad_task_deep_in_a_large_job_is_named_by_its_index() -> None:
    """The explaining path finds it in C (msgspec), then explains that one task."""
    tasks = [_task(i) for i in range(20_000)]
    tasks[17_345] = _task(17_345, duration=-1.0)
    job = {"job_id": "j", "user": "u", "token": "", "submitted_at": 0.0, "tasks": tasks}
    err = _refusal("submit_job", job)
    assert (err.reason, err.path) == ("negative_value", "submit_job.tasks[17345].duration")


def test_a_bad_field_after_a_large_array_of_good_tasks_is_named() -> None:
    tasks = [_task(i) for i in range(20_000)]
    job = {"job_id": "j", "user": "u", "token": "", "submitted_at": 0.0, "tasks": tasks,
           "stages": [{"stage_id": 0, "count": 0}]}  # fmt: skip
    err = _refusal("submit_job", job)
    assert (err.reason, err.path) == ("out_of_range", "submit_job.stages[0].count")
