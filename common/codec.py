"""The wire envelope: ``[tag, schema version, fields]`` in msgpack.

This module and ``common.schema`` are the only ones that know the wire form; this
is the only one that imports msgpack.  ``fields`` is the message's map as the
schema derives it from the declaration in ``common.messages``.  Decoding is strict:
the body size and every msgpack container are bounded, unknown tags and versions
raise ``DecodeError``, and every field is checked by the schema (``ValidationError``
naming the field).  Each message is encoded once per hop and decoded once.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgpack

from common import messages as _messages  # noqa: F401 - registers every message
from common.errors import DecodeError, ValidationError
from common.schema import REGISTRY, TAGS, decoder_of, encoder_of

SCHEMA_VERSION = 2
MAX_BODY = 8 * 1024 * 1024
"""Largest body any endpoint or consumer accepts (bytes), unless configured lower."""

M = TypeVar("M")


def tag_of(msg: object) -> str:
    try:
        return TAGS[type(msg)]
    except KeyError:
        raise TypeError(f"{type(msg).__name__} is not a wire message") from None


def encode(msg: object) -> bytes:
    """One message, enveloped."""
    cls = type(msg)
    out: bytes = msgpack.packb(
        [tag_of(msg), SCHEMA_VERSION, encoder_of(cls)(msg)], use_bin_type=True
    )
    return out


def _unpack(data: bytes, max_size: int) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
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
    obj = _unpack(data, max_size)
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
        return decoder_of(cls)(fields)
    except ValidationError as exc:
        raise exc.at(tag) from None


def pack_plain(obj: object) -> bytes:
    """Plain data (a pool's launch log) in msgpack, for clients that ask for it."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def unpack_plain(data: bytes, max_size: int = MAX_BODY) -> Any:
    """``pack_plain``'s data back, with the same limits as a message."""
    return _unpack(data, max_size)


def compile_all() -> int:
    """Build every registered message's decoder and encoder now (a service calls this
    at start): built on first use, they cost the first tasks after a start 10-20 ms.
    Returns how many message types there are."""
    for cls in REGISTRY.values():
        decoder_of(cls)
        encoder_of(cls)
    return len(REGISTRY)


def tags() -> frozenset[str]:
    return frozenset(REGISTRY)
