"""A lean HTTP/1.1 keep-alive client for the services' hops (GM -> LM, LM -> pool,
pool -> LM).

Why not aiohttp's client: a lone task's hop comes alone, after the processes have
idled, and what a hop then costs is mostly how much Python runs cold on the way.
Measured on this 2-vCPU machine, one POST every 20 ms against the same aiohttp
server: aiohttp's client 0.61 ms per round trip, this client 0.28 ms (back to back
0.23 vs 0.13 ms; on a slow hour 1.64 vs 1.11 ms) -- ``benchmarks/bench_hop.py``.
The servers stay aiohttp under gunicorn; only the caller's side is this module.

Scope, and its invariants:
- ``POST`` (and ``GET``) with a ``Content-Length`` body over plain TCP (the
  federation has no TLS); one request at a time per connection, no pipelining.
- A response is read whole: ``Content-Length``, chunked, or (without either) up to
  the connection's close (the peer's FIN: a reset or this side's close cuts it short,
  ``BrokenHop``); 1xx, 204 and 304 have no body.  A header block over 64 KiB
  (however it comes) breaks the connection (``BrokenHop``), and so does a status or
  ``Content-Length`` that is not plain ASCII digits; a response larger than
  ``max_body`` gives ``AnswerTooLarge`` (not worth another try) as soon as its
  ``Content-Length`` or a chunk's size says so, before its data is buffered.  A chunk
  size line or trailers over 64 KiB break it too.  The parser raises nothing else.
- A connection goes back to the idle pool only after a whole response without
  ``Connection: close``; anything else (an error, a timeout, a cancelled caller)
  closes it, so a late answer can never be read as the next request's.
- An idle connection is dropped after ``keepalive_s`` (the servers keep theirs
  longer), so a reused one is normally open; if the server closed it anyway the
  request fails with ``BrokenHop`` and the caller's retry policy decides, exactly as
  with aiohttp (a POST is never re-sent behind the caller's back).
- A chunked body is read only as framed: hex sizes, each chunk's data ended by CRLF
  (anything else is ``BrokenHop``, never a body cut elsewhere).
- Header names and values may not hold CR or LF (no header injection).
"""

from __future__ import annotations

import asyncio
import math
import re
import ssl
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

from security.signing import Fields
from security.tls import process_client_context

MAX_HEAD = 64 * 1024
"""The longest status line plus headers accepted."""


class BrokenHop(Exception):
    """The connection broke, or the answer was not HTTP this client reads: worth
    another try on a fresh connection."""


class AnswerTooLarge(Exception):
    """The answer is longer than the caller accepts: another try would be too."""


class Answer(NamedTuple):
    """One HTTP response, read whole (a tuple: as immutable as a frozen dataclass, made
    in a fraction of its time)."""

    status: int
    pairs: tuple[tuple[str, str], ...]
    """The headers as they came: names as sent, values without surrounding blanks."""
    body: bytes
    fields: Fields | None = None
    """The same headers by lower-case name, if no name came twice (None: one did),
    as ``security.signing`` reads them."""

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The headers as a case-insensitive multidict (made when asked: a peer's
        answer is read by ``fields``)."""
        return CIMultiDictProxy(CIMultiDict(self.pairs))


_new_answer = tuple.__new__
"""``Answer(...)`` without the generated ``__new__``'s Python call (every field given)."""


# ------------------------------------------------------------------ parsing
class ResponseParser:
    """Sans-IO: ``feed`` bytes as they come; ``answer`` is set once a whole response
    has been read (``eof`` marks the connection's end, which completes a body read
    to the close)."""

    def __init__(self, max_body: int, *, head_only: bool = False) -> None:
        self.max_body = max_body
        self.head_only = head_only
        self.buf = bytearray()
        self.answer: Answer | None = None
        self.keep_alive = True
        self._status = 0
        self._headers: tuple[tuple[str, str], ...] | None = None
        """The head's headers, once read."""
        self._fields: Fields | None = None
        self._length: int | None = None  # None: to the close; -1: chunked
        self._chunks = bytearray()

    def feed(self, data: bytes) -> None:
        """Take ``data``; raise ``BrokenHop`` on anything that is not a response."""
        if self.answer is None and self._headers is None and not self.buf:
            # the usual answer: whole in one read, read from it without copies
            end = data.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
            if 0 <= end <= MAX_HEAD and self._head(data[:end]):
                at = end + 4
                length = self._length
                if length is not None and 0 <= length <= len(data) - at:
                    self._finish(data[at : at + length])
                    self.buf += data[at + length :]
                    return
                data = data[at:]
            elif 0 <= end <= MAX_HEAD:  # a 1xx, read: the rest as any bytes
                data = data[end + 4 :]
        self.buf += data
        if self.answer is None:
            self._advance()

    def eof(self) -> None:
        """The peer closed: a body read to the close is complete, anything else broken."""
        self.keep_alive = False
        if self.answer is None and self._headers is not None and self._length is None:
            self._finish(bytes(self.buf))
            self.buf.clear()
        if self.answer is None:
            raise BrokenHop("connection closed before a whole answer")

    def _advance(self) -> None:
        while True:
            if self._headers is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0 or end > MAX_HEAD:
                    if len(self.buf) > MAX_HEAD:
                        raise BrokenHop("answer head too long")
                    return
                final = self._head(bytes(self.buf[:end]))
                del self.buf[: end + 4]
                if not final:  # a 1xx: the real answer follows
                    continue
                if self._length == 0:
                    self._finish(b"")
                    return
            if self._length is None:
                if len(self.buf) > self.max_body:
                    raise AnswerTooLarge(f"answer over {self.max_body} bytes")
                return
            if self._length >= 0:
                if len(self.buf) < self._length:
                    return
                body = bytes(self.buf[: self._length])
                del self.buf[: self._length]
                self._finish(body)
                return
            self._chunk()
            return

    def _head(self, head: bytes) -> bool:
        """Read the status line and headers; False for an interim (1xx) answer."""
        first, _, block = head.partition(b"\r\n")
        parts = first.split(b" ", 2)
        code = parts[1] if len(parts) > 1 else b""
        if not parts[0].startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise BrokenHop(f"not an HTTP/1.x answer: {first[:80]!r}")
        status = int(code)
        if 100 <= status < 200:
            return False
        fields = _fields(block) if block else ((), Fields())
        if fields is None:  # a name twice, or a line the quick reading does not take
            return self._head_lines(status, parts[0], head.split(b"\r\n")[1:])
        self._status = status
        self._headers, low = fields
        self._fields = low
        if "close" in low.get("connection", "").lower() or parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        coding = low.get("transfer-encoding", "").lower()
        length = low.get("content-length")
        self._frame(status, coding, None if length is None else {length})
        return True

    def _head_lines(self, status: int, version: bytes, lines: list[bytes]) -> bool:
        """``_head``'s reading of any header lines (one by one, a name maybe twice)."""
        headers: CIMultiDict[str] = CIMultiDict()
        for line in lines:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise BrokenHop(f"bad header line {line[:80]!r}")
            headers.add(name.decode("latin-1"), value.strip().decode("latin-1"))
        self._status, self._headers = status, tuple(headers.items())
        # every line of a header counts: "chunked" then "gzip" is a gzipped body
        connection = ", ".join(headers.getall("Connection", ())).lower()
        if "close" in connection or version == b"HTTP/1.0":
            self.keep_alive = False
        coding = ", ".join(headers.getall("Transfer-Encoding", ())).lower()
        lengths = set(headers.getall("Content-Length")) if "Content-Length" in headers else None
        self._frame(status, coding, lengths)
        return True

    def _frame(self, status: int, coding: str, lengths: set[str] | None) -> None:
        """How the body comes: by the status, the transfer coding and the lengths given
        (None: no ``Content-Length``)."""
        if self.head_only or status in (204, 304):
            self._length = 0
        elif coding:
            if coding != "chunked":
                raise BrokenHop(f"transfer coding {coding!r} not read")
            self._length = -1
        elif lengths is not None:
            if len(lengths) != 1 or not _digits(text := lengths.pop(), 18):
                raise BrokenHop("bad Content-Length")
            self._length = int(text)
            if self._length > self.max_body:
                raise AnswerTooLarge(f"answer of {self._length} bytes, over {self.max_body}")
        else:
            self._length = None
            self.keep_alive = False

    def _chunk(self) -> bool:
        """Read chunks; True once the last one (and its trailers) is in."""
        while True:
            end = self.buf.find(b"\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    raise BrokenHop("chunk size line too long")
                return False
            size_text = bytes(self.buf[:end]).split(b";", 1)[0].strip()
            # HEXDIG only: int(..., 16) also takes '-3', '+3', '0x3' and '0_3'
            if not 0 < len(size_text) <= 16 or size_text.strip(b"0123456789abcdefABCDEF"):
                raise BrokenHop(f"bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                trailers_end = self.buf.find(b"\r\n\r\n", end)
                if trailers_end < 0:
                    if len(self.buf) > MAX_HEAD:
                        raise BrokenHop("trailers too long")
                    return False
                del self.buf[: trailers_end + 4]
                self._finish(bytes(self._chunks))
                return True
            if len(self._chunks) + size > self.max_body:  # before its data is buffered
                raise AnswerTooLarge(f"answer over {self.max_body} bytes")
            if len(self.buf) < end + 2 + size + 2:
                return False
            if self.buf[end + 2 + size : end + 4 + size] != b"\r\n":
                raise BrokenHop("chunk data not followed by CRLF")
            self._chunks += self.buf[end + 2 : end + 2 + size]
            del self.buf[: end + 2 + size + 2]

    def _finish(self, body: bytes) -> None:
        assert self._headers is not None
        self.answer = _new_answer(Answer, (self._status, self._headers, body, self._fields))


_T = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
_FIELD = re.compile(
    rf"^([{_T}]+):[ \t]*([\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?|)\r\n", re.MULTILINE
)
"""A header line read at once, from its start to its CRLF: a token, a colon, printable
ASCII or tabs, the value's last character not a space or a tab (any other, still a header
line to ``_head_lines``, is read one by one).  Its name, and its value without the
whitespace before it; each match is one whole line."""


def _fields(block: bytes) -> tuple[tuple[tuple[str, str], ...], Fields] | None:
    """The header lines ``block`` (CRLF between them) read at once -- as sent, and by
    lower-case name -- or None if one is not of ``_FIELD`` (the lines, CRLFs with no LF
    alone, are more than the matches) or a name comes twice: ``_head_lines`` reads them
    then, with the same verdict on every line read here."""
    text = block.decode("latin-1") + "\r\n"
    pairs: list[tuple[str, str]] = _FIELD.findall(text)
    lines = text.count("\r\n")
    if len(pairs) != lines or text.count("\n") != lines:
        return None
    low = Fields({name.lower(): value for name, value in pairs})
    if len(low) != len(pairs):
        return None
    return tuple(pairs), low


def _digits(text: str, most: int) -> bool:
    """Only ASCII digits, at most ``most`` of them (``str.isdigit`` takes '²', and
    ``int`` refuses over 4300 digits: either would raise ValueError, not ``BrokenHop``)."""
    return 0 < len(text) <= most and text.isascii() and text.isdigit()


# --------------------------------------------------------------- connection
class _Connection(asyncio.Protocol):
    """One keep-alive TCP connection: a request in flight at most."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop it was made in, asked once: on Python 3.11 each
        ``asyncio.get_running_loop()`` is a system call (``getpid``)."""
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.closed = False
        self.idle_since = 0.0
        self.deadline = math.inf
        """When the request in flight times out (inf: it is not timed here)."""
        self.timer: asyncio.TimerHandle | None = None
        """Set for ``timer_at``, at or before ``deadline``: one timer per connection,
        moved on when it fires early, instead of one made and cancelled per request."""
        self.timer_at = math.inf

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        if self.parser is None or self.waiter is None or self.waiter.done():
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        try:
            self.parser.feed(data)
        except (BrokenHop, AnswerTooLarge) as exc:
            self._fail(exc)
            return
        if self.parser.answer is not None:
            self.waiter.set_result(self.parser.answer)

    def eof_received(self) -> bool:
        """The peer's end: it completes a body read to the close."""
        self.closed = True
        if self.parser is None or self.waiter is None or self.waiter.done():
            return False
        try:
            self.parser.eof()
        except BrokenHop as exc:
            self._fail(exc)
            return False
        assert self.parser.answer is not None
        self.waiter.set_result(self.parser.answer)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """A reset, or this side's close (without the peer's end first): an answer
        still awaited is cut short, even one read to the close."""
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(BrokenHop(f"connection lost: {exc!r}"))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()

    def time_out(self) -> None:
        """No whole answer within the client's timeout: ``TimeoutError``, as
        ``asyncio.timeout`` raises, and the connection closed."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(TimeoutError())
        self.close()

    def _timer_fired(self) -> None:
        """The timer's time: the request in flight times out if its deadline passed;
        one sent since (a later deadline) moves the timer on; none in flight, or one
        not timed here, leaves it off until a timed request sets it again."""
        self.timer = None
        waiter, loop = self.waiter, self.loop
        if waiter is None or waiter.done() or loop is None or self.deadline == math.inf:
            return
        if loop.time() >= self.deadline:
            self.time_out()
        else:
            self._set_timer(loop)

    def _set_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = self.deadline
        self.timer = loop.call_at(self.deadline, self._timer_fired)

    def send(
        self, request: bytes, parser: ResponseParser, timeout_s: float | None = None
    ) -> asyncio.Future[Answer]:
        """Write ``request`` (in one write) and return the future of its answer, which
        times out (``time_out``) after ``timeout_s`` (None: not timed here)."""
        loop = self.loop
        if self.transport is None or self.closed or loop is None:
            raise BrokenHop("connection closed")
        self.parser = parser
        self.waiter = waiter = loop.create_future()
        if timeout_s is None:
            self.deadline = math.inf
        else:
            self.deadline = loop.time() + timeout_s
            if self.timer is None or self.deadline < self.timer_at:
                self._set_timer(loop)
        self.transport.write(request)
        return waiter


# ------------------------------------------------------------------- client
class _Slots(asyncio.Semaphore):
    """An origin's slots for requests in flight: a semaphore that a request also takes
    at once, without a coroutine, when one is free."""

    def take(self) -> bool:
        """Take a slot if one is free and nobody waits for one (``acquire`` would not
        wait then: ``locked`` is False); ``release`` gives it back."""
        if self._value > 0 and not self._waiters:
            self._value -= 1
            return True
        return False


@dataclass(frozen=True, slots=True)
class _Origin:
    host: str
    port: int
    host_header: bytes
    tls: bool = False


class Client:
    """Keep-alive connections to the service's peers, at most ``limit_per_host``
    open (busy or idle) per host and port."""

    def __init__(
        self,
        *,
        limit_per_host: int = 16,
        keepalive_s: float = 240.0,
        timeout_s: float = 10.0,
        max_body: int = 64 * 1024 * 1024,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.tls = tls
        """For ``https://``: the federation CA's client context (None: ``$MEGHA_TLS_CA``'s)."""
        self.limit_per_host = limit_per_host
        self.keepalive_s = keepalive_s
        self.timeout_s = timeout_s
        self.max_body = max_body
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._slots: dict[_Origin, _Slots] = {}
        self._origins: dict[str, tuple[_Origin, str, _Slots, list[_Connection]]] = {}
        self._open: set[_Connection] = set()
        self.closed = False

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, max_body: int | None = None
    ) -> Coroutine[Any, Any, Answer]:
        """POST ``body`` to ``url``; the whole answer, whatever its status (``request``'s
        coroutine itself: no frame of its own to go through)."""
        return self.request("POST", url, body, headers, max_body=max_body)

    async def request(
        self,
        method: str,
        url: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        *,
        max_body: int | None = None,
    ) -> Answer:
        """Send one request and read its answer; ``BrokenHop`` or ``TimeoutError`` if
        none came whole within the client's timeout."""
        if self.closed:
            raise BrokenHop("client closed")
        origin, target, slots, idle = self._origin(url)
        request = _request_bytes(method, target, origin.host_header, body, headers or {})
        parser = ResponseParser(self.max_body if max_body is None else max_body,
                                head_only=method == "HEAD")  # fmt: skip
        if slots.take():
            conn = self._idle_connection(idle)
            try:
                if conn is not None:  # the usual hop: nothing to wait for but the answer
                    return await self._exchange(idle, conn, request, parser, timed=True)
            finally:
                slots.release()
        async with asyncio.timeout(self.timeout_s), slots:
            conn = self._idle_connection(idle) or await self._connect(origin)
            return await self._exchange(idle, conn, request, parser, timed=False)

    async def _exchange(
        self, idle: list[_Connection], conn: _Connection, request: bytes,
        parser: ResponseParser, *, timed: bool,
    ) -> Answer:  # fmt: skip
        """Send ``request`` on ``conn`` and read its answer (``timed``: within the
        client's timeout, else the caller's ``asyncio.timeout`` bounds it); ``conn``
        goes back to the idle ones of its origin (``idle``) only after a whole answer
        it may be reused after."""
        try:
            answer = await conn.send(request, parser, self.timeout_s if timed else None)
        except BaseException:
            conn.close()
            self._open.discard(conn)
            raise
        if parser.keep_alive and not conn.closed and not parser.buf and not self.closed:
            conn.parser = conn.waiter = None
            conn.idle_since = time.monotonic()
            idle.append(conn)
        else:
            conn.close()
            self._open.discard(conn)
        return answer

    async def close(self) -> None:
        """Close every connection; requests in flight, waiting or later fail, and open
        none."""
        self.closed = True
        for conn in self._open:
            conn.close()
        self._open.clear()
        for idle in self._idle.values():
            idle.clear()

    def _origin(self, url: str) -> tuple[_Origin, str, _Slots, list[_Connection]]:
        """``url``'s origin, its target, and the origin's slots and idle connections
        (kept by URL: an origin is hashed once, not per request)."""
        known = self._origins.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"only http(s):// URLs are served by this client: {url!r}")
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
            host = parts.hostname
            shown = f"[{host}]" if ":" in host else host
            origin = _Origin(host, port, f"{shown}:{port}".encode("ascii"), tls)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            slots = self._slots.setdefault(origin, _Slots(self.limit_per_host))
            known = self._origins[url] = (origin, target, slots, self._idle.setdefault(origin, []))
        return known

    def _idle_connection(self, idle: list[_Connection]) -> _Connection | None:
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the warmest
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
            self._open.discard(conn)
        return None

    async def _connect(self, origin: _Origin) -> _Connection:
        self._refuse_if_closed()  # closed while this request waited for a slot
        loop = asyncio.get_running_loop()
        ctx = (self.tls or process_client_context()) if origin.tls else None
        if origin.tls and ctx is None:
            raise BrokenHop(
                f"https://{origin.host}:{origin.port} but no CA to trust (MEGHA_TLS_CA)"
            )
        try:
            _, conn = await loop.create_connection(
                _Connection, origin.host, origin.port, ssl=ctx,
                server_hostname=origin.host if ctx is not None else None,
            )  # fmt: skip
        except (OSError, ssl.SSLError) as exc:
            raise BrokenHop(f"cannot connect to {origin.host}:{origin.port}: {exc}") from exc
        if self.closed:  # closed while it connected: nothing would ever close this one
            conn.close()
            raise BrokenHop("client closed")
        self._open.add(conn)
        return conn

    def _refuse_if_closed(self) -> None:
        """``BrokenHop`` once closed (a call: an ``if`` would leave mypy sure that
        ``self.closed`` is still False after the await that follows)."""
        if self.closed:
            raise BrokenHop("client closed")


_OWN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
"""Headers this client writes itself: a caller's second copy would let the two ends
frame the request differently (a smuggled request behind the body)."""


_NAMES_CHECKED: set[str] = set()
"""Header names a request was written with before (a service sends a dozen): checked
once each, not per request."""
NAMES_CHECKED_MAX = 256
"""Names ``_NAMES_CHECKED`` holds at most (more are checked each time)."""


def _check_name(name: str) -> None:
    if "\r" in name or "\n" in name or ":" in name:
        raise ValueError(f"header {name!r} holds a line break or colon")
    if name.strip().lower() in _OWN_HEADERS:
        raise ValueError(f"header {name!r} is the client's own (framing, keep-alive)")
    if len(_NAMES_CHECKED) < NAMES_CHECKED_MAX:
        _NAMES_CHECKED.add(name)


def _request_bytes(
    method: str, target: str, host: bytes, body: bytes, headers: Mapping[str, str]
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\nHost: ".encode("ascii"), host, b"\r\n"]
    if not _NAMES_CHECKED.issuperset(headers):
        for name in headers:
            if name not in _NAMES_CHECKED:
                _check_name(name)
    fields = [f"{name}: {value}\r\n" for name, value in headers.items()]
    if fields:
        text = "".join(fields)
        # each field brought one CRLF: any other CR or LF is in a value (names are checked)
        if text.count("\r") != len(fields) or text.count("\n") != len(fields):
            bad = next(n for n, v in headers.items() if "\r" in v or "\n" in v)
            raise ValueError(f"header {bad!r} holds a line break or colon")
        lines.append(text.encode("latin-1"))
    if body or method in ("POST", "PUT"):
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)
