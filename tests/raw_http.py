"""Bytes no HTTP client would send, over a plain socket: what a service answers to a
request aiohttp's parser cannot read (tests/security/test_http_boundary.py in-process,
tests/e2e/test_attacks.py against gunicorn)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

TLS_CLIENT_HELLO = bytes.fromhex("16 0301 0200  01 0001fc 0303") + bytes(range(32))
"""The start of a TLS ClientHello (record: handshake, TLS 1.0, length; ClientHello, its
length, TLS 1.2; the random): an https:// URL on the plain HTTP port."""

MALFORMED: list[tuple[str, bytes, str]] = [
    ("TLS on the plain port", TLS_CLIENT_HELLO, "bad_http_method"),
    ("binary garbage", b"\x00\x01\x02\x03\r\n\r\n", "bad_http_method"),
    ("an unknown HTTP version", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", "bad_http_request"),
    ("a bare LF after the request line", b"GET /health HTTP/1.1\nHost: x\n\n", "bad_http_request"),
    (
        "a control byte in a header value",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
        "bad_http_request",
    ),
    (
        "a space in a header name",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX A: b\r\n\r\n",
        "bad_http_request",
    ),
    (
        "a header line too long",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 8200 + b"\r\n\r\n",
        "line_too_long",
    ),
    (
        "a request line too long",
        b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "line_too_long",
    ),
    (
        "too many headers",
        b"GET /health HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
        + b"\r\n",
        "bad_http_request",
    ),
    (
        "Content-Length not a number",
        b"POST /v1/ping HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        "bad_http_request",
    ),
    (
        "Content-Length twice",
        b"POST /v1/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "bad_http_request",
    ),
    (
        "Content-Length with chunked (request smuggling)",
        b"POST /v1/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "bad_http_request",
    ),
    (
        "a chunk size not in hex",
        b"POST /v1/ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        "bad_http_request",
    ),
]
"""(what, the bytes, the reason they are refused with): each a 400."""


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


def exchange(port: int, data: bytes, host: str = "127.0.0.1", timeout: float = 10.0) -> Answer:
    """Send ``data`` on a new connection and read the answer until the service closes the
    connection (``TimeoutError`` if it keeps it open)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(data)
        got = bytearray()
        while chunk := sock.recv(65536):
            got += chunk
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return Answer(
        status=int(status_line.split()[1]),
        content_type=headers.get("content-type", "").split(";")[0],
        body=body,
        headers=headers,
    )
