"""The lean server path's HTTP/1.1 reading and writing (``runtime.http._Connection``).

A service's peers post messages the one way ``runtime.h1`` writes them: ``POST`` to a
message route, HTTP/1.1, ``Content-Length``, keep-alive, a dozen ASCII headers.  Such a
request is read here, and its answer written, without aiohttp's request, response and
middleware objects (about a fifth of an LM's CPU).  Anything else -- another method or
path, HTTP/1.0, chunked, ``Expect``, ``Upgrade``, ``Content-Encoding``, ``Connection``
other than keep-alive, a repeated header, a byte outside printable ASCII, a long head,
obs-fold, a header value ending in whitespace -- or a head that did not come whole in
one read is ``HANDOVER``: the connection gives every byte it holds, unread, to aiohttp,
which answers it (or refuses it) exactly as it does without this path.  What this
module accepts, aiohttp's parser reads the same (``tests/unit/test_fastpath.py``).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE

from security.signing import Fields

MAX_HEAD: Final = 8190
"""The longest head read here (aiohttp's line limit: any line of a head this long is
one aiohttp takes); a longer one is handed over, to be read or refused there."""
MAX_FIELDS: Final = 24
"""Header lines read here (a signed call has about ten); more are handed over."""
MAX_LENGTH_DIGITS: Final = 10

_PREFIX: Final = b"POST /"
_VERSION: Final = b" HTTP/1.1"
_REFUSED_FIELDS: Final = frozenset(
    {"transfer-encoding", "expect", "upgrade", "content-encoding", "te", "trailer"}
)
"""Fields that change how a request is framed, decoded or answered: aiohttp's."""


class _Handover:
    __slots__ = ()

    def __repr__(self) -> str:
        return "HANDOVER"


HANDOVER: Final = _Handover()
"""Not a request this path reads: aiohttp reads it."""


class Head(NamedTuple):
    """A request head read here: ``POST path HTTP/1.1`` and its fields (a tuple: as
    immutable as a frozen dataclass, made in a fraction of its time)."""

    path: str
    fields: tuple[tuple[str, str], ...]
    """Names as sent, values without surrounding whitespace, in order."""
    length: int
    """The body's ``Content-Length``."""
    size: int
    """Bytes of the head, its blank line included: the body starts there."""
    low: Fields
    """The same fields by lower-case name (each name once: a name twice is handed
    over), as ``security.signing`` reads them."""


_new_head = tuple.__new__
"""``Head(...)`` without the generated ``__new__``'s Python call (every field given)."""


def parse_head(buf: bytes, routes: frozenset[bytes]) -> Head | _Handover:
    """The head at the start of ``buf`` if this path reads it, else ``HANDOVER``.  A
    head not whole in ``buf`` is handed over too: a peer writes each request in one
    write, so its head comes whole (``buf`` is what came); one that trickles in is
    aiohttp's to read, to time out or to refuse, as if this path did not exist."""
    end = buf.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0 or not buf.startswith(_PREFIX):
        return HANDOVER
    first = buf.find(b"\r\n")
    line = buf[:first]
    path = line[5 : -len(_VERSION)]
    if not line.endswith(_VERSION) or path not in routes:
        return HANDOVER  # the request line is exactly ``POST <a route> HTTP/1.1``
    # each byte of the fields is one character; any outside printable ASCII (and tab)
    # leaves its line unmatched by ``_FIELD``, and the head to aiohttp
    block = buf[first + 2 : end + 2].decode("latin-1")
    fields = tuple(_FIELD.findall(block))
    lines = block.count("\r\n")
    if not 0 < len(fields) == lines <= MAX_FIELDS or block.count("\n") != lines:
        return HANDOVER  # a line not of ``_FIELD`` (each match is a whole line), too many
    low = Fields({name.lower(): value for name, value in fields})
    if len(low) != len(fields) or not _REFUSED_FIELDS.isdisjoint(low):
        return HANDOVER  # a name twice, or a framing field: aiohttp's
    if low.get("connection", "keep-alive").lower() != "keep-alive":
        return HANDOVER
    length = _length(low)
    if length is None:
        return HANDOVER
    return _new_head(Head, (path.decode("ascii"), fields, length, end + 4, low))


_T = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
_FIELD = re.compile(
    rf"^([{_T}]+):[ \t]*([\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?|)\r\n", re.MULTILINE
)
"""A header line read here, from its start to its CRLF: a token, a colon, printable
ASCII or tabs, the value's last character not a space or a tab (no obs-fold, no lone CR
or LF, no space before the colon; a value with whitespace at its end is aiohttp's to
read).  Its name, and its value without the whitespace before it.  Each match is one
whole line: a block is read here if its lines (CRLFs; no LF alone) are as many as the
matches."""


def _length(low: dict[str, str]) -> int | None:
    """The ``Content-Length`` of a request with a ``Host`` (aiohttp refuses one
    without), if read here; ``low``: the fields by lower-case name."""
    digits = low.get("content-length", "")
    if (
        "host" not in low
        or not digits.isascii()
        or not digits.isdigit()
        or len(digits) > MAX_LENGTH_DIGITS
        or (len(digits) > 1 and digits[0] == "0")
    ):
        return None
    return int(digits)


_PHRASES: Final = {
    200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 409: "Conflict", 413: "Request Entity Too Large",
    422: "Unprocessable Entity", 500: "Internal Server Error", 503: "Service Unavailable",
}  # fmt: skip


def answer_bytes(
    status: int, body: bytes, headers: dict[str, str], *, close: bool, phrase: str = ""
) -> bytes:
    """An answer as aiohttp writes it (status line, ``headers``, ``Content-Length``
    unless a 204, ``Date``, ``Server``, ``Connection: close`` when closing), in one
    piece for one ``transport.write``."""
    lines = [f"HTTP/1.1 {status} {phrase or _PHRASES.get(status, '')}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
    if status != 204:
        lines.append(f"Content-Length: {len(body)}\r\n")
    lines.append(f"Date: {rfc822_formatted_time()}\r\n")
    lines.append(_CLOSING if close else _KEEPING)
    return "".join(lines).encode("latin-1") + body


_KEEPING: Final = f"Server: {SERVER_SOFTWARE}\r\n\r\n"
_CLOSING: Final = f"Server: {SERVER_SOFTWARE}\r\nConnection: close\r\n\r\n"
