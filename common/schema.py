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
  ``MAX_ID_LEN`` characters of ``[A-Za-z0-9._:@+-]`` (``common.ids``): msgspec checks
  the length, ``ids_ok`` the characters of all a decoded message's ids at once.
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

import itertools
import math
import re
import sys
from collections.abc import Callable, Iterator
from functools import cache
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta
from msgspec import inspect as mi

from common.errors import ValidationError
from common.ids import ID_PATTERN, MAX_ID_LEN, is_id_text

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
_ID_RE = re.compile(ID_PATTERN)


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
    if why.get("kind") == "id":  # ``common.ids``
        if type(x) is not str:
            return _bad(_ID_WANT, x)
        n = len(x)
        if not (t.min_length or 0) <= n <= (t.max_length or n) or not _ID_RE.search(x):
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
    the first item msgspec refuses, found in C, or an earlier one with an id it let pass
    (``ids_ok``); ``len(x)`` if there is none."""
    if not isinstance(t, mi.StructType):
        return 0
    try:
        taken = msgspec.convert(x, list[t.cls], builtin_types=(bytes, bytearray))  # type: ignore[name-defined]
        n = len(x)
    except msgspec.ValidationError as exc:
        m = _INDEX.search(str(exc))
        n = int(m.group(1)) if m else 0
        taken = msgspec.convert(x[:n], list[t.cls], builtin_types=(bytes, bytearray))  # type: ignore[name-defined]
    return next((i for i, item in enumerate(taken) if not ids_ok(item)), n)


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


# -------------------------------------------------------------------- the id check
_IDS: dict[type, Callable[[Any], list[str]]] = {}


def ids_ok(msg: msgspec.Struct) -> bool:
    """Every id in a decoded ``msg`` is made of id characters (msgspec checked each one's
    length): all of them joined, checked in one pass."""
    ids = _IDS.get(type(msg))
    if ids is None:
        ids = _IDS[type(msg)] = ids_function(type(msg))
    return is_id_text("".join(ids(msg)))


def ids_source(cls: type) -> str:
    """The source of a function listing the ids of a ``cls``, written from its
    declaration: plain attribute reads and loops run 3x faster than a walk of the
    declaration for each message (a 10-task launch: 0.9 us against 2.4).  For
    ``LaunchRequest``::

        def ids(v0):
            out = []
            for v1 in v0.placements:
                v2 = v1.spec
                out += (v2.task_id, v2.job_id, v2.user)
            out += (v0.gm, v0.lm)
            return out
    """
    lines, here = _gather(_info(cls), "v0", itertools.count(1))
    return "\n".join([*_block("def ids(v0):", ["out = []", *lines], here), "    return out"])


def ids_function(cls: type) -> Callable[[Any], list[str]]:
    """``ids_source(cls)``, compiled."""
    scope: dict[str, Any] = {}
    exec(compile(ids_source(cls), f"<ids of {cls.__qualname__}>", "exec"), scope)
    ids: Callable[[Any], list[str]] = scope["ids"]
    return ids


def _block(head: str, lines: list[str], here: list[str]) -> list[str]:
    """``head`` and, indented under it, ``lines`` then the ids in ``here`` added to
    ``out``, all at once; nothing if there is no id."""
    if here:
        lines = [*lines, f"out += ({', '.join(here)}{',' if len(here) == 1 else ''})"]
    return [head, *("    " + line for line in lines)] if lines else []


def _gather(t: mi.Type, expr: str, names: Iterator[int]) -> tuple[list[str], list[str]]:
    """Statements that add the ids in ``expr`` (a value of type ``t``) to ``out``, and
    the expressions of those it always has (the caller adds them to ``out``)."""
    if isinstance(t, mi.Metadata):
        if (t.extra or {}).get("kind") == "id":
            return [], [expr]
        return _gather(t.type, expr, names)
    if isinstance(t, mi.StructType):
        name, alias = _named(expr, names)
        return _gather_all([(f.type, f"{name}.{f.name}") for f in t.fields], alias, names)
    if isinstance(t, mi.TupleType):
        name, alias = _named(expr, names)
        items = [(item, f"{name}[{i}]") for i, item in enumerate(t.item_types)]
        return _gather_all(items, alias, names)
    if isinstance(t, mi.UnionType):  # ``T | None`` (the only union on the wire)
        (inner,) = (u for u in t.types if not isinstance(u, mi.NoneType))
        name, alias = _named(expr, names)
        block = _block(f"if {name} is not None:", *_gather(inner, name, names))
        return ([*alias, *block] if block else []), []
    if isinstance(t, mi.VarTupleType | mi.ListType | mi.SetType | mi.FrozenSetType):
        return _gather_items(t.item_type, expr, names), []
    if isinstance(t, mi.DictType):  # a loop over a map: over its keys
        lines = _gather_items(t.key_type, expr, names)
        return lines + _gather_items(t.value_type, f"{expr}.values()", names), []
    return [], []


def _named(expr: str, names: Iterator[int]) -> tuple[str, list[str]]:
    """A name for the value of ``expr``, read once, and the statement that gives it."""
    if expr.isidentifier():
        return expr, []
    name = f"v{next(names)}"
    return name, [f"{name} = {expr}"]


def _gather_all(
    parts: list[tuple[mi.Type, str]], alias: list[str], names: Iterator[int]
) -> tuple[list[str], list[str]]:
    """``_gather`` of the parts of a value (its fields, its items), after ``alias``."""
    lines: list[str] = []
    here: list[str] = []
    for t, expr in parts:
        more_lines, more_here = _gather(t, expr, names)
        lines += more_lines
        here += more_here
    return ([*alias, *lines], here) if lines or here else ([], [])


def _gather_items(t: mi.Type, expr: str, names: Iterator[int]) -> list[str]:
    """Statements that add the ids in the items of the iterable ``expr`` to ``out``."""
    item = f"v{next(names)}"
    lines, here = _gather(t, item, names)
    if not lines and here == [item]:  # the items are ids
        return [f"out += {expr}"]
    return _block(f"for {item} in {expr}:", lines, here)
