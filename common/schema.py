"""One declarative schema for every message on the wire, and the msgpack codec derived from it.

A message is a dataclass declared once, with typed fields, and registered with
``@message("tag")``.  From its field list and annotations this module compiles, per
type, an encoder (a map of field name -> value, ready for msgpack) and a strict
decoder: every field's type and range is checked, unknown fields and missing required
fields are refused, and each error names its field (``placements[3].spec.demand[0]``).
Nothing else in the project knows the wire layout; ``common.codec`` adds the envelope.

Type rules (from the annotations; ``typing.Annotated`` with ``Range`` / ``Length`` narrows):

* ``int``: an integer (never a bool), ``>= 0`` unless a ``Range`` says otherwise;
  an ``IntEnum``: one of its values; a ``NewType`` of ``int`` (``NodeIndex``): ``>= 0``.
* ``float``: a finite number (an integer is accepted), any sign unless a ``Range`` says.
* ``str``: text of at most ``MAX_TEXT`` characters; an id (a ``NewType`` of ``str``:
  ``GmId``, ``TaskId`` ...): 1..``MAX_ID_LEN`` characters of ``[A-Za-z0-9._:@+-]``.
* ``bool``; ``bytes`` of at most ``MAX_BYTES``.
* ``tuple[T, ...]`` and ``list[T]``: at most ``MAX_ITEMS`` items, each a ``T``;
  ``dict[K, V]``; ``T | None``; another dataclass (nested, without a tag).

Decoders are generated Python source (compiled once per type, on first use): simple
fields are checked inline, so a well-formed message costs little more than building it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING
from typing import Any, TypeVar

from common.errors import ValidationError

MAX_ID_LEN = 200
MAX_TEXT = 4096
MAX_BYTES = 1 << 20
MAX_ITEMS = 1 << 20

_ID = re.compile(r"[A-Za-z0-9._:@+-]{1,%d}" % MAX_ID_LEN).fullmatch  # noqa: UP031


@dataclasses.dataclass(frozen=True, slots=True)
class Range:
    """Bounds of a number (``None``: unbounded on that side); ``above`` names the
    refusal of a value over ``hi`` (default ``out_of_range``)."""

    lo: float | None = 0
    hi: float | None = None
    above: str = "out_of_range"


@dataclasses.dataclass(frozen=True, slots=True)
class Length:
    """Bounds on the number of items of a tuple, list or dict; ``below`` names the
    refusal of too few (default ``too_small``)."""

    lo: int = 0
    hi: int = MAX_ITEMS
    below: str = "too_small"


REGISTRY: dict[str, type] = {}
"""Every message that may stand alone on the wire, by tag."""
TAGS: dict[type, str] = {}

T = TypeVar("T")


def message(tag: str) -> Callable[[type[T]], type[T]]:
    """Register a dataclass as a top-level wire message under ``tag``."""

    def register(cls: type[T]) -> type[T]:
        if tag in REGISTRY and REGISTRY[tag] is not cls:
            raise TypeError(f"tag {tag!r} registered twice")
        REGISTRY[tag] = cls
        TAGS[cls] = tag
        return cls

    return register


# ------------------------------------------------------------------ errors
def _tname(x: object) -> str:
    return type(x).__name__


def _bad(want: str, x: object, reason: str = "wrong_type") -> ValidationError:
    return ValidationError(f"expected {want}, got {_tname(x)} {x!r:.60}", reason=reason)


def _range_error(x: object, lo: object, hi: object, above: str = "out_of_range") -> ValidationError:
    if lo == 0 and isinstance(x, int | float) and x < 0:
        reason = "negative_value"
    elif isinstance(x, int | float) and isinstance(hi, int | float) and x > hi:
        reason = above
    else:
        reason = "out_of_range"
    return ValidationError(f"{x!r:.40} not in [{lo}, {hi}]", reason=reason)


def _len_error(n: int, lo: int, hi: int, below: str = "too_small") -> ValidationError:
    reason = "too_large" if n > hi else below
    return ValidationError(f"{n} items, expected {lo}..{hi}", reason=reason)


def _keys_error(
    name: str, got: dict[Any, Any], known: frozenset[str], required: frozenset[str]
) -> ValidationError:
    extra = sorted(str(k) for k in got.keys() - known)
    if extra:
        return ValidationError(
            f"unknown field {extra[0]!r} in {name} (known: {', '.join(sorted(known))})",
            reason="unknown_field",
            path=extra[0],
        )
    missing = sorted(required - got.keys())
    return ValidationError(f"missing field in {name}", reason="missing_field", path=missing[0])


# --------------------------------------------------------------- type analysis
@dataclasses.dataclass(frozen=True)
class _Spec:
    """A field type, unwrapped: its origin, arguments and bounds."""

    tp: Any
    rng: Range | None = None
    length: Length | None = None


def unwrap(tp: Any) -> tuple[Any, Range | None, Length | None]:
    """A field type without its ``Annotated`` wrapper, and its bounds."""
    spec = _unwrap(tp)
    return spec.tp, spec.rng, spec.length


def _unwrap(tp: Any) -> _Spec:
    rng = length = None
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        for m in meta:
            if isinstance(m, Range):
                rng = m
            elif isinstance(m, Length):
                length = m
        tp = base
    return _Spec(tp, rng, length)


def _is_id(tp: Any) -> bool:
    return isinstance(tp, typing.NewType) and tp.__supertype__ is str


def _is_newint(tp: Any) -> bool:
    return isinstance(tp, typing.NewType) and tp.__supertype__ is int


def _is_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None


# ------------------------------------------------------------------ compiler
class _Compiler:
    """Generates and caches one decoder and one encoder per type."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {
            "_ID": _ID,
            "_isfinite": math.isfinite,
            "_bad": _bad,
            "_range_error": _range_error,
            "_len_error": _len_error,
            "_keys_error": _keys_error,
            "VE": ValidationError,
            "MAX_TEXT": MAX_TEXT,
            "MAX_BYTES": MAX_BYTES,
        }
        self.dec: dict[Any, Callable[[Any], Any]] = {}
        self.enc: dict[type, Callable[[Any], Any]] = {}
        self._n = 0

    def _name(self, stem: str) -> str:
        self._n += 1
        return f"_{stem}{self._n}"

    def _const(self, value: Any, stem: str = "c") -> str:
        name = self._name(stem)
        self.ns[name] = value
        return name

    def _exec(self, src: str, name: str) -> Callable[[Any], Any]:
        exec(compile(src, f"<schema {name}>", "exec"), self.ns)
        fn: Callable[[Any], Any] = self.ns[name]
        return fn

    # ------------------------------------------------------------- inline checks
    def inline(self, spec: _Spec, x: str, indent: str) -> list[str] | None:
        """Statements that check (and convert in place) variable ``x``; None if not simple."""
        tp, rng = spec.tp, spec.rng
        if tp is bool:
            return [f"{indent}if type({x}) is not bool: raise _bad('a boolean', {x})"]
        if tp is int or _is_newint(tp) or (isinstance(tp, type) and issubclass(tp, enum.IntEnum)):
            if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
                # a dict lookup: calling the enum class costs ~10x as much
                members = self._const({int(v): v for v in tp}, "members")
                return [
                    f"{indent}if type({x}) is not int or {x} not in {members}: "
                    f"raise _bad('one of ' + str(sorted({members})), {x})",
                    f"{indent}{x} = {members}[{x}]",
                ]
            lo = 0 if rng is None else rng.lo
            hi = None if rng is None else rng.hi
            cond = [f"type({x}) is not int"]
            lines = [f"{indent}if {' or '.join(cond)}: raise _bad('an integer', {x})"]
            bounds = []
            if lo is not None:
                bounds.append(f"{x} < {int(lo)}")
            if hi is not None:
                bounds.append(f"{x} > {int(hi)}")
            if bounds:
                above = "out_of_range" if rng is None else rng.above
                lines.append(
                    f"{indent}if {' or '.join(bounds)}: "
                    f"raise _range_error({x}, {lo!r}, {hi!r}, {above!r})"
                )
            return lines
        if tp is float:
            lo = None if rng is None else rng.lo
            hi = None if rng is None else rng.hi
            lines = [
                f"{indent}if type({x}) is not float:",
                f"{indent}    if type({x}) is not int: raise _bad('a number', {x})",
                f"{indent}    {x} = float({x})",
            ]
            bounds = [f"not _isfinite({x})"]
            if lo is not None:
                bounds.append(f"{x} < {float(lo)!r}")
            if hi is not None:
                bounds.append(f"{x} > {float(hi)!r}")
            lines.append(
                f"{indent}if {' or '.join(bounds)}: raise _range_error({x}, {lo!r}, {hi!r})"
            )
            return lines
        if _is_id(tp):
            return [
                f"{indent}if type({x}) is not str or not _ID({x}): "
                f"raise _bad('an id (1..{MAX_ID_LEN} of A-Z a-z 0-9 . _ : @ + -)', {x}, "
                f"'bad_id' if type({x}) is str else 'wrong_type')"
            ]
        if tp is str:
            return [
                f"{indent}if type({x}) is not str: raise _bad('a string', {x})",
                f"{indent}if len({x}) > MAX_TEXT: raise VE('text longer than {MAX_TEXT}', "
                f"reason='too_large')",
            ]
        if tp is bytes:
            return [
                f"{indent}if type({x}) is not bytes: raise _bad('bytes', {x})",
                f"{indent}if len({x}) > MAX_BYTES: raise VE('more than {MAX_BYTES} bytes', "
                f"reason='too_large')",
            ]
        return None

    # ------------------------------------------------------------- converters
    def decoder(self, tp: Any) -> Callable[[Any], Any]:
        """A function that checks and converts one wire value of type ``tp``."""
        key = tp
        fn = self.dec.get(key)
        if fn is not None:
            return fn
        spec = _unwrap(tp)
        if dataclasses.is_dataclass(spec.tp) and isinstance(spec.tp, type):
            fn = self._message_decoder(spec.tp)
        else:
            fn = self._value_decoder(spec)
        self.dec[key] = fn
        return fn

    def _value_decoder(self, spec: _Spec) -> Callable[[Any], Any]:
        name = self._name("d")
        simple = self.inline(spec, "x", "    ")
        if simple is not None:
            src = "\n".join([f"def {name}(x):", *simple, "    return x"])
            return self._exec(src, name)
        tp = spec.tp
        inner = _is_optional(tp)
        if inner is not None:
            sub = self._const(self.decoder(inner), "sub")
            return self._exec(f"def {name}(x):\n    return None if x is None else {sub}(x)", name)
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        length = spec.length or Length()
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return self._fixed_tuple_decoder(name, args)
        if origin in (tuple, list):
            return self._sequence_decoder(name, args[0], length, as_tuple=origin is tuple)
        if origin is dict:
            kd = self._const(self.decoder(args[0]), "kd")
            vd = self._const(self.decoder(args[1]), "vd")
            src = f"""
def {name}(x):
    if type(x) is not dict: raise _bad('a map', x)
    if not {length.lo} <= len(x) <= {length.hi}:
        raise _len_error(len(x), {length.lo}, {length.hi}, {length.below!r})
    out = {{}}
    for k, v in x.items():
        try:
            out[{kd}(k)] = {vd}(v)
        except VE as e:
            raise e.at('[' + repr(k)[:40] + ']') from None
    return out
"""
            return self._exec(src, name)
        raise TypeError(f"no wire rule for {tp!r}")

    def _fixed_tuple_decoder(self, name: str, args: tuple[Any, ...]) -> Callable[[Any], Any]:
        """``tuple[A, B]``: an array of exactly those items."""
        n = len(args)
        lines = [
            f"def {name}(x):",
            f"    if type(x) is not list or len(x) != {n}: raise _bad('an array of {n}', x)",
        ]
        for k, a in enumerate(args):
            sub = self._const(self.decoder(a), "sub")
            lines.append(f"    try: y{k} = {sub}(x[{k}])")
            lines.append(f"    except VE as e: raise e.at('[{k}]') from None")
        lines.append(f"    return ({', '.join(f'y{k}' for k in range(n))},)")
        return self._exec("\n".join(lines), name)

    def _sequence_decoder(
        self, name: str, elem: Any, length: Length, *, as_tuple: bool
    ) -> Callable[[Any], Any]:
        espec = _unwrap(elem)
        ed = self._const(self.decoder(elem), "ed")
        wrap = "tuple" if as_tuple else "list"
        head = f"""
def {name}(x):
    if type(x) is not list: raise _bad('an array', x)
    if not {length.lo} <= len(x) <= {length.hi}:
        raise _len_error(len(x), {length.lo}, {length.hi}, {length.below!r})
"""
        # fast paths for long arrays of plain numbers and ids: one C-level pass
        fast = None
        if espec.tp is int or _is_newint(espec.tp):
            lo = 0 if espec.rng is None else espec.rng.lo
            hi = None if espec.rng is None else espec.rng.hi
            cond = "(not x or (set(map(type, x)) == {int}"
            if lo is not None:
                cond += f" and min(x) >= {int(lo)}"
            if hi is not None:
                cond += f" and max(x) <= {int(hi)}"
            fast = f"    if {cond})): return {wrap}(x)\n"
        elif espec.tp is float and espec.rng is None:
            fast = (
                "    if not x or (set(map(type, x)) <= {float, int} and all(map(_isfinite, x))):"
                f" return {wrap}(map(float, x))\n"
            )
        elif _is_id(espec.tp):
            fast = f"    if set(map(type, x)) <= {{str}} and all(map(_ID, x)): return {wrap}(x)\n"
        slow = f"""
    try:
        return {wrap}([{ed}(e) for e in x])
    except VE:
        pass
    for i, e in enumerate(x):
        try:
            {ed}(e)
        except VE as err:
            raise err.at('[' + str(i) + ']') from None
    raise AssertionError('unreachable')
"""
        return self._exec(head + (fast or "") + slow, name)

    def _message_decoder(self, cls: type) -> Callable[[Any], Any]:
        name = self._name("m_" + cls.__name__)
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        known = frozenset(f.name for f in fields)
        required = frozenset(
            f.name for f in fields if f.default is MISSING and f.default_factory is MISSING
        )
        cname = self._const(cls, "cls")
        kn = self._const(known, "known")
        rq = self._const(required, "req")
        lines = [
            f"def {name}(v):",
            f"    if type(v) is not dict: raise _bad('a map ({cls.__name__})', v)",
            f"    if v.keys() != {kn}:",
            f"        if not (v.keys() <= {kn} and v.keys() >= {rq}):",
            f"            raise _keys_error({cls.__name__!r}, v, {kn}, {rq})",
        ]
        args = []
        for k, f in enumerate(fields):
            var = f"a{k}"
            # a field left out takes its default as it is: only what was sent is decoded
            at = "    "
            if f.name not in required:
                default = (
                    self._const(f.default, "dflt")
                    if f.default is not MISSING
                    else f"{self._const(f.default_factory, 'fac')}()"
                )
                lines.append(f"    if {f.name!r} not in v: {var} = {default}")
                lines.append("    else:")
                at = "        "
            lines.append(f"{at}{var} = v[{f.name!r}]")
            spec = _unwrap(hints[f.name])
            check = self.inline(spec, var, at + "    ")
            if check is not None:
                lines.append(f"{at}try:")
                lines.extend(check)
                lines.append(f"{at}except VE as e: raise e.at({f.name!r}) from None")
            else:
                sub = self._const(self.decoder(hints[f.name]), "sub")
                lines.append(f"{at}try: {var} = {sub}({var})")
                lines.append(f"{at}except VE as e: raise e.at({f.name!r}) from None")
            args.append(f"{f.name}={var}")
        lines.append(f"    return {cname}({', '.join(args)})")
        fn = self._exec("\n".join(lines), name)
        self.dec[cls] = fn
        return fn

    # --------------------------------------------------------------- encoders
    def encoder(self, cls: type) -> Callable[[Any], Any]:
        fn = self.enc.get(cls)
        if fn is not None:
            return fn
        name = self._name("e_" + cls.__name__)
        hints = typing.get_type_hints(cls, include_extras=True)
        items = []
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            items.append(f"{f.name!r}: {self._encode_expr(hints[f.name], f'm.{f.name}')}")
        src = f"def {name}(m):\n    return {{{', '.join(items)}}}"
        fn = self._exec(src, name)
        self.enc[cls] = fn
        return fn

    def _encode_expr(self, tp: Any, expr: str) -> str:
        tp = _unwrap(tp).tp
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            return f"{self._const(self.encoder(tp), 'enc')}({expr})"
        inner = _is_optional(tp)
        if inner is not None:
            sub = self._encode_expr(inner, "y")
            if sub == "y":
                return expr
            fn = self._const(eval(f"lambda y: {sub}", self.ns), "opt")
            return f"(None if {expr} is None else {fn}({expr}))"
        origin = typing.get_origin(tp)
        if origin in (tuple, list):
            sub = self._encode_expr(typing.get_args(tp)[0], "y")
            return expr if sub == "y" else f"[{sub} for y in {expr}]"
        if origin is dict:
            sub = self._encode_expr(typing.get_args(tp)[1], "y")
            return expr if sub == "y" else f"{{k: {sub} for k, y in {expr}.items()}}"
        return expr


_COMPILER = _Compiler()


def decoder_of(cls: type) -> Callable[[Any], Any]:
    """The strict decoder of a dataclass type (wire map -> instance)."""
    return _COMPILER.decoder(cls)


def encoder_of(cls: type) -> Callable[[Any], Any]:
    """The encoder of a dataclass type (instance -> wire map)."""
    return _COMPILER.encoder(cls)
