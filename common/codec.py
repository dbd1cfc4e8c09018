"""The wire envelope: ``[tag, schema version, fields]`` in msgpack.

This module and ``common.schema`` are the only ones that know the wire form.
``fields`` is the message's map, in declaration order, as msgspec encodes the struct
declared in ``common.messages``.  Decoding is strict: the body size is bounded, unknown
tags and versions raise ``DecodeError``, and every field is checked against its
declaration (``ValidationError`` naming the field).  Each message is encoded once per
hop and decoded once.

Decoding takes msgspec's fast path: the envelope (its head read off the bytes when it
is as msgspec writes it, ``_HEADS``), then the fields straight into the struct, in C;
then the characters of all its ids, in one pass (``common.schema.ids_ok``; msgspec
checked their lengths).  Only a body refused there takes the explaining path, which
answers it exactly as the codec always has: msgpack-python unpacks it with the same
limits as before (a body it cannot read is ``malformed_body``), the envelope is checked
part by part, and ``common.schema.explain`` names the reason and the field.  msgspec
and the explaining path read the same declarations; the tests hold them to the same
verdicts (``tests/unit/test_wire_refusals.py``).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar, overload

import msgpack
import msgspec

from common import messages as _messages  # noqa: F401 - registers every message
from common.errors import DecodeError, ValidationError
from common.schema import REGISTRY, TAGS, explain, ids_ok

SCHEMA_VERSION = 2
MAX_BODY = 8 * 1024 * 1024
"""Largest body any endpoint or consumer accepts (bytes), unless configured lower."""

M = TypeVar("M")


class _Envelope(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """``[tag, version, fields]``, the fields left undecoded until the tag is known."""

    tag: str
    version: int
    fields: msgspec.Raw


_ENCODER = msgspec.msgpack.Encoder()
_ENVELOPE = msgspec.msgpack.Decoder(_Envelope)
_HEADS: dict[bytes, type] = {
    head: cls
    for tag, cls in REGISTRY.items()
    if len(head := _ENCODER.encode((tag, SCHEMA_VERSION, None))[:-1]) == len(tag.encode()) + 3
}
"""``[tag, version,`` in msgpack, by the message class it names, where it is 3 bytes
and the tag's: an array of 3, a fixstr (``0xa0`` + its length) and a fixint.  Read
off the bytes it saves the envelope's decoder a walk over the fields (0.6 to 0.9 us of
5.3 for a 10-task launch)."""
_DECODERS: dict[type, msgspec.msgpack.Decoder[Any]] = {}
_BYTES = (bytes, bytearray, memoryview)
"""What a body may be (a tuple made once: ``bytes | bytearray | memoryview`` in a call
makes a union each time)."""


def _decoder(cls: type) -> msgspec.msgpack.Decoder[Any]:
    dec = _DECODERS.get(cls)
    if dec is None:
        dec = _DECODERS[cls] = msgspec.msgpack.Decoder(cls)
    return dec


def tag_of(msg: object) -> str:
    try:
        return TAGS[type(msg)]
    except KeyError:
        raise TypeError(f"{type(msg).__name__} is not a wire message") from None


def encode(msg: object) -> bytes:
    """One message, enveloped (``tag_of``, looked up here: one call less per message)."""
    try:
        tag = TAGS[type(msg)]
    except KeyError:
        raise TypeError(f"{type(msg).__name__} is not a wire message") from None
    return _ENCODER.encode((tag, SCHEMA_VERSION, msg))


@overload
def decode(data: bytes, *, expect: type[M], max_size: int = MAX_BODY) -> M: ...
@overload
def decode(
    data: bytes, *, expect: tuple[type, ...] | None = None, max_size: int = MAX_BODY
) -> Any: ...
def decode(
    data: bytes, *, expect: type | tuple[type, ...] | None = None, max_size: int = MAX_BODY
) -> Any:
    """One message; ``expect`` restricts which types are acceptable here."""
    if not isinstance(data, _BYTES):
        raise DecodeError("body is not bytes")
    if len(data) > max_size:
        raise DecodeError(f"body of {len(data)} bytes exceeds {max_size}", reason="too_large")
    if not data:
        raise DecodeError("empty body", reason="empty_body")
    try:
        cls, fields = _split(data)
        if cls is not None and (expect is None or issubclass(cls, expect)):
            msg = (_DECODERS.get(cls) or _decoder(cls)).decode(fields)
            if ids_ok(msg):
                return msg
        refusal = None
    except msgspec.MsgspecError as exc:
        refusal = exc
    return _explain(data, expect, refusal)


def _split(data: bytes | bytearray | memoryview) -> tuple[type | None, Any]:
    """The class of a body's message (None: no such tag, or another version) and its
    fields, undecoded.  A head as msgspec and msgpack write it (``_HEADS``) is read
    off the bytes; any other goes through the envelope's decoder, which must step
    over the fields in full to find their end."""
    if type(data) is bytes and len(data) > 2:
        end = data[1] - 0x9D  # after a fixstr of n bytes (0xa0 + n): n + 3
        cls = _HEADS.get(data[:end])
        if cls is not None:
            return cls, memoryview(data)[end:]
    env = _ENVELOPE.decode(data)
    return (REGISTRY.get(env.tag) if env.version == SCHEMA_VERSION else None), env.fields


def _unpack(data: bytes, max_size: int) -> Any:
    if not isinstance(data, _BYTES):
        raise DecodeError("body is not bytes")
    if len(data) > max_size:
        raise DecodeError(f"body of {len(data)} bytes exceeds {max_size}", reason="too_large")
    if not data:
        raise DecodeError("empty body", reason="empty_body")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=1 << 20,
            max_bin_len=1 << 20,
            max_array_len=1 << 20,
            max_map_len=1 << 20,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not valid msgpack: {type(exc).__name__}: {exc}") from None


def _explain(
    data: bytes, expect: type | tuple[type, ...] | None, refusal: msgspec.MsgspecError | None
) -> Any:
    """The explaining path: the body the fast path did not take, checked part by part."""
    obj = _unpack(data, len(data))
    if not isinstance(obj, list) or len(obj) != 3 or not isinstance(obj[0], str):
        raise DecodeError("expected [tag, version, fields]", reason="bad_envelope")
    tag, version, fields = obj
    if version != SCHEMA_VERSION:
        raise DecodeError(
            f"schema version {version!r:.20} not supported (want {SCHEMA_VERSION})",
            reason="unsupported_version",
        )
    cls = REGISTRY.get(tag)
    if cls is None:
        raise DecodeError(f"unknown message tag {tag!r:.40}", reason="unknown_tag")
    if expect is not None and not issubclass(cls, expect):
        raise DecodeError(f"unexpected message {tag!r} here", reason="unexpected_message")
    try:
        # msgspec refused the bytes but may take the map msgpack made of them (a key
        # given twice: the last one counts, as it always has); msgpack has bytes of its
        # own, so a string is no bytes here either (convert would take it as base64)
        msg = msgspec.convert(fields, cls, builtin_types=_NATIVE)
        if ids_ok(msg):
            return msg
    except msgspec.ValidationError as exc:
        refusal = exc
    err = explain(cls, fields) or _as_validation_error(refusal)
    raise err.at(tag) from None


_NATIVE = (bytes, bytearray)
"""Types msgpack carries itself: ``msgspec.convert`` takes them only as themselves."""

_AT = re.compile(r" - at `\$\.?(.*)`$")


def _as_validation_error(exc: msgspec.MsgspecError | None) -> ValidationError:
    """msgspec's own words, for a refusal ``explain`` has no name for (none is known)."""
    text = str(exc)
    m = _AT.search(text)
    return ValidationError(text[: m.start()] if m else text, path=m.group(1) if m else "")


def pack_plain(obj: object) -> bytes:
    """Plain data (a pool's launch log) in msgpack, for clients that ask for it."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def unpack_plain(data: bytes, max_size: int = MAX_BODY) -> Any:
    """``pack_plain``'s data back, with the same limits as a message."""
    return _unpack(data, max_size)


def compile_all() -> int:
    """Build every registered message's decoder now (a service calls this at start, so
    the first task after a start does not pay for it).  Returns how many message types
    there are."""
    for cls in REGISTRY.values():
        _decoder(cls)
    return len(REGISTRY)


def tags() -> frozenset[str]:
    return frozenset(REGISTRY)
