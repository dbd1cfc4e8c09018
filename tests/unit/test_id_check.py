"""Ids are checked once per decoded message (``common.schema.ids_ok``), no longer by a
regex per field in msgspec: the codec takes and refuses exactly what the field's old
``Meta(min_length=1, max_length=MAX_ID_LEN, pattern=ID_PATTERN)`` took and refused, with
the same reason and field."""

from __future__ import annotations

import inspect
import re
import textwrap
from typing import Annotated, Any

import msgpack
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import Meta
from msgspec import inspect as mi

from common import codec
from common.errors import ValidationError
from common.ids import ID_PATTERN, MAX_ID_LEN, is_id_text
from common.schema import REGISTRY, ids_function, ids_ok, ids_source
from tests.unit.test_codec import ID_CHARS, of

OLD_ID = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LEN, pattern=ID_PATTERN)]
"""How msgspec checked an id field before (the oracle)."""


def old_takes(text: str) -> bool:
    try:
        msgspec.convert(text, OLD_ID)
    except msgspec.ValidationError:
        return False
    return True


ODD = "\n\r\t \x00\x7fé\u2028\u0660\uff5a/\\$^#"
"""Near misses: newlines, blanks, NUL, DEL, letters and digits outside ASCII ..."""
IDS = st.one_of(
    st.text(),  # any unicode
    st.text(ID_CHARS + ODD, max_size=12),
    st.text(ID_CHARS, max_size=3).map(lambda s: s + "\n"),  # ``$`` before a newline
    st.text(ID_CHARS, min_size=MAX_ID_LEN - 2, max_size=MAX_ID_LEN + 2),
    st.sampled_from(["", "\n", "a\n", "a\nb", "a" * MAX_ID_LEN, "a" * (MAX_ID_LEN + 1)]),
)


@settings(max_examples=2000, deadline=None)
@given(IDS)
def test_an_id_of_id_text_within_the_lengths_is_what_the_pattern_took(text: str) -> None:
    assert (1 <= len(text) <= MAX_ID_LEN and is_id_text(text)) == old_takes(text)


@settings(max_examples=1000, deadline=None)
@given(st.lists(IDS.filter(bool), max_size=6))
def test_ids_joined_are_id_text_exactly_when_each_is(texts: list[str]) -> None:
    assert is_id_text("".join(texts)) == all(re.search(ID_PATTERN, t) for t in texts)


def _launch(gm: str, lm: str, specs: list[tuple[str, str, str]]) -> dict[str, Any]:
    return {"gm": gm, "lm": lm, "request_id": 1, "known_version": 0,
            "placements": [{"spec": {"task_id": t, "job_id": j, "user": u, "demand": [1],
                                     "duration": 1.0}, "attempt": 1, "node": 0}
                           for t, j, u in specs]}  # fmt: skip


@settings(max_examples=1000, deadline=None)
@given(IDS, IDS, st.lists(st.tuples(IDS, IDS, IDS), min_size=1, max_size=3))
def test_the_codec_refuses_what_the_pattern_refused_naming_the_first(
    gm: str, lm: str, specs: list[tuple[str, str, str]]
) -> None:
    """Every id of a launch drawn at random: taken if the old check took each one, else
    ``bad_id`` at the first the old check refused, in declaration order."""
    body = msgpack.packb(["launch", codec.SCHEMA_VERSION, _launch(gm, lm, specs)])
    where = [("gm", gm), ("lm", lm)] + [
        (f"placements[{i}].spec.{name}", text)
        for i, spec in enumerate(specs)
        for name, text in zip(("task_id", "job_id", "user"), spec, strict=True)
    ]
    refused = [path for path, text in where if not old_takes(text)]
    if not refused:
        assert codec.decode(body).placements[-1].spec.user == specs[-1][2]
        return
    with pytest.raises(ValidationError) as err:
        codec.decode(body)
    assert (err.value.reason, err.value.path) == ("bad_id", f"launch.{refused[0]}")


def _ids_walked(value: Any, t: mi.Type) -> list[str]:
    """The ids in ``value``, found by walking its declaration (the oracle)."""
    if isinstance(t, mi.Metadata):
        if (t.extra or {}).get("kind") == "id":
            return [value]
        return _ids_walked(value, t.type)
    if isinstance(t, mi.StructType):
        return [i for f in t.fields for i in _ids_walked(getattr(value, f.name), f.type)]
    if isinstance(t, mi.UnionType):
        inner = [u for u in t.types if not isinstance(u, mi.NoneType)]
        return [] if value is None else _ids_walked(value, inner[0])
    if isinstance(t, mi.VarTupleType | mi.ListType):
        return [i for v in value for i in _ids_walked(v, t.item_type)]
    if isinstance(t, mi.TupleType):
        return [i for v, vt in zip(value, t.item_types, strict=True) for i in _ids_walked(v, vt)]
    if isinstance(t, mi.DictType):
        return [i for k, v in value.items()
                for i in _ids_walked(k, t.key_type) + _ids_walked(v, t.value_type)]  # fmt: skip
    return []


@pytest.mark.parametrize("tag", sorted(REGISTRY))
def test_the_ids_listed_are_every_id_of_the_message(tag: str) -> None:
    cls = REGISTRY[tag]
    ids = ids_function(cls)

    @settings(max_examples=30, deadline=None)
    @given(of(cls))
    def check(msg: Any) -> None:
        assert sorted(ids(msg)) == sorted(_ids_walked(msg, mi.type_info(cls)))

    check()


def test_the_source_of_a_launch_is_the_one_documented() -> None:
    doc = inspect.cleandoc(ids_source.__doc__ or "").split("::\n\n", 1)[1]
    assert ids_source(REGISTRY["launch"]) == textwrap.dedent(doc).strip()


def test_a_message_without_ids_passes() -> None:
    assert ids_ok(REGISTRY["decide"](max_tasks=5))


def _task(i: int, **over: object) -> dict[str, object]:
    return {"task_id": f"t{i}", "job_id": "j", "user": "u", "demand": [1], "duration": 1.0,
            **over}  # fmt: skip


def _job_refusal(tasks: list[dict[str, object]]) -> ValidationError:
    job = {"job_id": "j", "user": "u", "token": "", "submitted_at": 0.0, "tasks": tasks}
    with pytest.raises(ValidationError) as err:
        codec.decode(msgpack.packb(["submit_job", codec.SCHEMA_VERSION, job]))
    return err.value


def test_a_bad_id_before_what_msgspec_refuses_is_named_first() -> None:
    """msgspec no longer stops at a bad id: the explaining path looks for one before
    the item msgspec refused (``_first_refused``)."""
    tasks = [_task(i) for i in range(5_000)]
    tasks[1_234] = _task(1_234, user="u\n")
    tasks[3_456] = _task(3_456, duration=-1.0)
    err = _job_refusal(tasks)
    assert (err.reason, err.path) == ("bad_id", "submit_job.tasks[1234].user")


def test_a_bad_id_deep_in_a_large_job_is_named_by_its_index() -> None:
    tasks = [_task(i) for i in range(5_000)]
    tasks[4_321] = _task(4_321, task_id="t 4321")
    err = _job_refusal(tasks)
    assert (err.reason, err.path) == ("bad_id", "submit_job.tasks[4321].task_id")
