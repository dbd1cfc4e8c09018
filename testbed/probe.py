"""Small network probes run inside test-bed hosts: TCP echo and round trips, UDP counts.

A script (standard library only, ``python probe.py MODE ...``) so it runs in any
namespace without an import path. Every mode is bounded in time and exits by itself:

* ``echo ADDR PORT SECONDS``: a TCP echo server; prints ``ready`` once listening and
  serves connections one after another until ``SECONDS`` have passed.
* ``rtt ADDR PORT COUNT TIMEOUT``: connects, does ``COUNT`` 64-byte round trips with
  ``TCP_NODELAY`` and prints ``{"connect_ms": ..., "rtt_ms": [...]}``; exits 1 with a
  reason when anything takes longer than ``TIMEOUT`` seconds or fails.
* ``udp-sink ADDR PORT SECONDS``: prints ``ready``, counts datagrams until ``SECONDS``
  have passed or 1 s passes without one after the first, prints the count.
* ``udp-send ADDR PORT COUNT``: sends ``COUNT`` datagrams, 1 ms apart.
"""

from __future__ import annotations

import json
import socket
import sys
import time

MESSAGE = b"m" * 64


def echo(addr: str, port: int, seconds: float) -> None:
    """Echo every byte back, one connection at a time, until ``seconds`` pass."""
    end = time.monotonic() + seconds
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((addr, port))
        server.listen(16)
        print("ready", flush=True)
        while (left := end - time.monotonic()) > 0:
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(max(0.01, end - time.monotonic()))
                try:
                    while data := conn.recv(65536):
                        conn.sendall(data)
                except OSError:
                    continue


def rtt(addr: str, port: int, count: int, timeout: float) -> int:
    """Time a connect and ``count`` round trips; print them as JSON."""
    start = time.perf_counter()
    try:
        with socket.create_connection((addr, port), timeout=timeout) as conn:
            connect_ms = (time.perf_counter() - start) * 1000.0
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            samples = []
            for _ in range(count):
                sent = time.perf_counter()
                conn.sendall(MESSAGE)
                got = b""
                while len(got) < len(MESSAGE):
                    chunk = conn.recv(len(MESSAGE) - len(got))
                    if not chunk:
                        raise ConnectionError("echo server closed the connection")
                    got += chunk
                samples.append((time.perf_counter() - sent) * 1000.0)
    except OSError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"connect_ms": connect_ms, "rtt_ms": samples}))
    return 0


def udp_sink(addr: str, port: int, seconds: float) -> None:
    """Count datagrams; stop 1 s after the last one or after ``seconds``."""
    end = time.monotonic() + seconds
    count = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((addr, port))
        print("ready", flush=True)
        while (left := end - time.monotonic()) > 0:
            sock.settimeout(min(left, 1.0) if count else left)
            try:
                sock.recv(65536)
            except TimeoutError:
                break
            count += 1
    print(count, flush=True)


def udp_send(addr: str, port: int, count: int) -> None:
    """Send ``count`` datagrams 1 ms apart."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(count):
            sock.sendto(MESSAGE, (addr, port))
            time.sleep(0.001)


def main(argv: list[str]) -> int:
    """Dispatch on the mode word."""
    mode, addr, port = argv[0], argv[1], int(argv[2])
    if mode == "echo":
        echo(addr, port, float(argv[3]))
    elif mode == "rtt":
        return rtt(addr, port, int(argv[3]), float(argv[4]))
    elif mode == "udp-sink":
        udp_sink(addr, port, float(argv[3]))
    elif mode == "udp-send":
        udp_send(addr, port, int(argv[3]))
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
