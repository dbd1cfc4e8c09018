"""One declarative schema for every message on the wire: msgspec Structs.

A message is a ``Wire`` struct (frozen, keyword-only, unknown fields refused) declared
once in ``common.messages`` and registered with ``@message("tag")``.  The declaration is
the schema: msgspec encodes it and decodes it strictly in C (``common.codec`` adds the
envelope), and ``common.schema_doc`` writes its JSON Schema.  Types and bounds are in
the annotations, as ``msgspec.Meta`` constraints:

* ``UInt``: an integer ``>= 0`` (a bool is not one); ``in_range(lo, hi, above=...)``
  narrows; an ``IntEnum``: one of its values; ``NodeIndex``: ``>= 0``.
* ``finite(lo, hi)``: a finite float (an integer is taken); ``Time`` and ``Seconds`` in
  ``common.model``.
* ``Text``: at most ``MAX_TEXT`` characters; an id (``GmId``, ``TaskId`` ...): 1..
  ``MAX_ID_LEN`` characters of ``[A-Za-z0-9._:@+-]`` (``common.ids``).
* ``Seq[T]`` (a tuple), ``Map[K, V]``: at most ``MAX_ITEMS`` items; ``n_items(lo, hi,
  below=...)`` narrows; ``T | None``; another struct (nested, without a tag).

msgspec says where a body breaks the schema, not in the words callers rely on
(``unknown_field``, ``negative_value``, ``bad_id`` ... and the field,
``placements[3].spec.demand[0]``).  ``explain`` gives them: run only on a body msgspec
refused, it walks the same declarations (``msgspec.inspect``) over the plain data and
names the first thing wrong: a map's keys first (unknown, then missing), then its
fields in declaration order, an array's items in order.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta
from msgspec import inspect as mi

from common.errors import ValidationError
from common.ids import MAX_ID_LEN

__all__ = [
    "MAX_ID_LEN",
    "MAX_ITEMS",
    "MAX_TEXT",
    "REGISTRY",
    "TAGS",
    "Map",
    "Seq",
    "Text",
    "UInt",
    "Wire",
    "explain",
    "finite",
    "in_range",
    "message",
    "n_items",
]

MAX_TEXT = 4096
MAX_ITEMS = 1 << 20
FLOAT_MAX = sys.float_info.max

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


class Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    """Base of every wire struct.  Frozen: a message is shared by reference between
    cores, drivers and the simulator; ``gc=False``: it holds no reference cycle (ids,
    numbers, tuples, other messages), so the collector need not walk the many a GM
    keeps."""


def in_range(lo: int | None = 0, hi: int | None = None, *, above: str = "out_of_range") -> Meta:
    """Bounds of an integer (``None``: unbounded on that side); ``above`` names the
    refusal of a value over ``hi``."""
    return Meta(ge=lo, le=hi, extra={"above": above} if above != "out_of_range" else None)


def finite(lo: float | None = None, hi: float | None = None) -> Meta:
    """A finite float within ``[lo, hi]`` (``None``: unbounded on that side)."""
    return Meta(ge=-FLOAT_MAX if lo is None else lo, le=FLOAT_MAX if hi is None else hi)


def n_items(lo: int = 0, hi: int = MAX_ITEMS, *, below: str = "too_small") -> Meta:
    """Bounds on the number of items of a tuple, list or map; ``below`` names the
    refusal of too few."""
    return Meta(
        min_length=lo or None,
        max_length=hi,
        extra={"below": below} if below != "too_small" else None,
    )


UInt = Annotated[int, Meta(ge=0)]
"""A count, attempt, epoch or request id: an integer ``>= 0``."""
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
"""Free text (a reason, a detail, a command argument)."""
Seq = Annotated[tuple[T, ...], Meta(max_length=MAX_ITEMS)]
Map = Annotated[dict[K, V], Meta(max_length=MAX_ITEMS)]

REGISTRY: dict[str, type[Wire]] = {}
"""Every message that may stand alone on the wire, by tag."""
TAGS: dict[type, str] = {}

W = TypeVar("W", bound=Wire)


def message(tag: str) -> Callable[[type[W]], type[W]]:
    """Register a struct as a top-level wire message under ``tag``."""

    def register(cls: type[W]) -> type[W]:
        if tag in REGISTRY and REGISTRY[tag] is not cls:
            raise TypeError(f"tag {tag!r} registered twice")
        REGISTRY[tag] = cls
        TAGS[cls] = tag
        return cls

    return register


# -------------------------------------------------------------- the explaining path
_ID_WANT = f"an id (1..{MAX_ID_LEN} of A-Z a-z 0-9 . _ : @ + -)"


def _tname(x: object) -> str:
    return type(x).__name__


def _bad(want: str, x: object, reason: str = "wrong_type") -> ValidationError:
    return ValidationError(f"expected {want}, got {_tname(x)} {x!r:.60}", reason=reason)


def _range_error(x: float, lo: object, hi: object, above: str) -> ValidationError:
    if lo == 0 and x < 0:
        reason = "negative_value"
    elif isinstance(hi, int | float) and x > hi:
        reason = above
    else:
        reason = "out_of_range"
    return ValidationError(f"{x!r:.40} not in [{lo}, {hi}]", reason=reason)


def _len_error(n: int, lo: int, hi: int, below: str) -> ValidationError:
    reason = "too_large" if n > hi else below
    return ValidationError(f"{n} items, expected {lo}..{hi}", reason=reason)


@cache
def _info(cls: type) -> mi.Type:
    return mi.type_info(cls)


def explain(cls: type, value: Any) -> ValidationError | None:
    """Why the plain ``value`` (a map of fields) is not a ``cls``, with the field; None
    if it is one."""
    return _check(value, _info(cls), {})


def _check(x: Any, t: mi.Type, why: dict[str, str]) -> ValidationError | None:
    """The first thing wrong with ``x`` as a ``t``; ``why`` holds the refusals'
    names a ``Meta(extra=...)`` gave (``above``, ``below``)."""
    if isinstance(t, mi.Metadata):
        return _check(x, t.type, {**why, **(t.extra or {})})
    check = _CHECKS.get(type(t))
    if check is None:
        raise TypeError(f"no wire rule for {t!r}")
    return check(x, t, why)


def _check_struct(x: Any, t: mi.StructType, why: dict[str, str]) -> ValidationError | None:
    name = t.cls.__name__
    if type(x) is not dict:
        return _bad(f"a map ({name})", x)
    known = {f.encode_name for f in t.fields}
    extra = sorted(str(k) for k in x.keys() - known)
    if extra:
        return ValidationError(
            f"unknown field {extra[0]!r} in {name} (known: {', '.join(sorted(known))})",
            reason="unknown_field",
            path=extra[0],
        )
    missing = sorted(f.encode_name for f in t.fields if f.required and f.encode_name not in x)
    if missing:
        return ValidationError(f"missing field in {name}", reason="missing_field", path=missing[0])
    for f in t.fields:
        if f.encode_name in x:  # a field left out takes its default as it is
            err = _check(x[f.encode_name], f.type, {})
            if err is not None:
                return err.at(f.encode_name)
    return None


def _check_int(x: Any, t: mi.IntType, why: dict[str, str]) -> ValidationError | None:
    if type(x) is not int:
        return _bad("an integer", x)
    lo = t.ge if t.gt is None else t.gt + 1
    hi = t.le if t.lt is None else t.lt - 1
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        return _range_error(x, lo, hi, why.get("above", "out_of_range"))
    return None


def _check_float(x: Any, t: mi.FloatType, why: dict[str, str]) -> ValidationError | None:
    if type(x) is not float:
        if type(x) is not int:
            return _bad("a number", x)
        x = float(x)
    lo = None if t.ge is None or t.ge == -FLOAT_MAX else t.ge
    hi = None if t.le is None or t.le == FLOAT_MAX else t.le
    if not math.isfinite(x) or (lo is not None and x < lo) or (hi is not None and x > hi):
        return _range_error(x, lo, hi, "out_of_range")
    return None


def _check_str(x: Any, t: mi.StrType, why: dict[str, str]) -> ValidationError | None:
    if t.pattern is not None:  # an id
        if type(x) is not str:
            return _bad(_ID_WANT, x)
        n = len(x)
        if not (t.min_length or 0) <= n <= (t.max_length or n) or not re.search(t.pattern, x):
            return _bad(_ID_WANT, x, "bad_id")
        return None
    if type(x) is not str:
        return _bad("a string", x)
    if t.max_length is not None and len(x) > t.max_length:
        return ValidationError(f"text longer than {t.max_length}", reason="too_large")
    return None


def _check_bytes(x: Any, t: mi.BytesType, why: dict[str, str]) -> ValidationError | None:
    """Raw bytes (a task's output)."""
    if type(x) is not bytes:
        return _bad("bytes", x)
    if t.max_length is not None and len(x) > t.max_length:
        return ValidationError(f"bytes longer than {t.max_length}", reason="too_large")
    return None


def _check_bool(x: Any, t: mi.BoolType, why: dict[str, str]) -> ValidationError | None:
    return None if type(x) is bool else _bad("a boolean", x)


def _check_enum(x: Any, t: mi.EnumType, why: dict[str, str]) -> ValidationError | None:
    values = sorted(v.value for v in t.cls)
    if type(x) is not int or x not in values:
        return _bad(f"one of {values}", x)
    return None


def _check_none(x: Any, t: mi.NoneType, why: dict[str, str]) -> ValidationError | None:
    return None if x is None else _bad("nil", x)


def _check_union(x: Any, t: mi.UnionType, why: dict[str, str]) -> ValidationError | None:
    """``T | None`` (the only union on the wire)."""
    if x is None and t.includes_none:
        return None
    (inner,) = (u for u in t.types if not isinstance(u, mi.NoneType))
    return _check(x, inner, why)


def _check_items(
    x: Any, t: mi.VarTupleType | mi.ListType, why: dict[str, str]
) -> ValidationError | None:
    if type(x) is not list:
        return _bad("an array", x)
    lo, hi = t.min_length or 0, MAX_ITEMS if t.max_length is None else t.max_length
    if not lo <= len(x) <= hi:
        return _len_error(len(x), lo, hi, why.get("below", "too_small"))
    for i in range(_first_refused(x, t.item_type), len(x)):
        err = _check(x[i], t.item_type, {})
        if err is not None:
            return err.at(f"[{i}]")
    return None


_INDEX = re.compile(r"at `\$\[(\d+)\]")


def _first_refused(x: list[Any], t: mi.Type) -> int:
    """Where to start looking in an array of structs (100,000 tasks, one bad at the end):
    the first item msgspec refuses, found in C; ``len(x)`` if it takes them all."""
    if not isinstance(t, mi.StructType):
        return 0
    try:
        msgspec.convert(x, list[t.cls])  # type: ignore[name-defined]
    except msgspec.ValidationError as exc:
        m = _INDEX.search(str(exc))
        return int(m.group(1)) if m else 0
    return len(x)


def _check_tuple(x: Any, t: mi.TupleType, why: dict[str, str]) -> ValidationError | None:
    """``tuple[A, B]``: an array of exactly those items."""
    n = len(t.item_types)
    if type(x) is not list or len(x) != n:
        return _bad(f"an array of {n}", x)
    for i, (e, et) in enumerate(zip(x, t.item_types, strict=True)):
        err = _check(e, et, {})
        if err is not None:
            return err.at(f"[{i}]")
    return None


def _check_dict(x: Any, t: mi.DictType, why: dict[str, str]) -> ValidationError | None:
    if type(x) is not dict:
        return _bad("a map", x)
    lo, hi = t.min_length or 0, MAX_ITEMS if t.max_length is None else t.max_length
    if not lo <= len(x) <= hi:
        return _len_error(len(x), lo, hi, why.get("below", "too_small"))
    for k, v in x.items():
        err = _check(k, t.key_type, {}) or _check(v, t.value_type, {})
        if err is not None:
            return err.at("[" + repr(k)[:40] + "]")
    return None


_CHECKS: dict[type, Callable[[Any, Any, dict[str, str]], ValidationError | None]] = {
    mi.StructType: _check_struct,
    mi.BytesType: _check_bytes,
    mi.IntType: _check_int,
    mi.FloatType: _check_float,
    mi.StrType: _check_str,
    mi.BoolType: _check_bool,
    mi.EnumType: _check_enum,
    mi.NoneType: _check_none,
    mi.UnionType: _check_union,
    mi.VarTupleType: _check_items,
    mi.ListType: _check_items,
    mi.TupleType: _check_tuple,
    mi.DictType: _check_dict,
}
