"""A userspace stand-in for ``tc netem``: delays, jitters and drops the frames a host sends.

This kernel has no ``sch_netem`` (``CONFIG_NET_SCH_NETEM`` is not set), so
``testbed.netns`` redirects what a host sends (``tc`` ingress on the host's bridge port,
``mirred egress redirect``) into a persistent tap device; this daemon reads each frame
from the tap, holds it, and writes it back into the tap, which is a port of the same
bridge, so the frame then goes on to its destination.

It is a script on purpose (standard library only, run as ``python delayd.py``), so it
starts fast and needs no import path. Commands arrive on stdin, one a line, and each
is answered on stdout by ``ok TAP`` or ``error TAP REASON``:

* ``set TAP DELAY_MS JITTER_MS LOSS_PCT`` attaches to the tap (or updates it);
* ``drop TAP`` sends every held frame at once and detaches.

Guarantees: a frame leaves no earlier than its arrival plus ``DELAY_MS`` plus a jitter
drawn uniformly from ``[-JITTER_MS, +JITTER_MS]``; frames of one tap leave in the order
they came (jitter never reorders, unlike netem); each frame is lost with probability
``LOSS_PCT / 100``; at most ``LIMIT`` frames wait per tap (more are dropped, like
netem's ``limit``). End of stdin (the owner exited, even by ``kill -9``) ends the daemon.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import random
import select
import struct
import sys
import time
from collections import deque

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
PR_SET_TIMERSLACK = 29
LIMIT = 10_000
FRAME_MAX = 65_536


class Link:
    """One tap: its parameters and the frames it holds."""

    def __init__(self, tap: str) -> None:
        self.tap = tap
        self.fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fcntl.ioctl(self.fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
        except OSError:
            os.close(self.fd)
            raise
        self.delay = 0.0
        self.jitter = 0.0
        self.loss = 0.0
        self.held: deque[tuple[float, bytes]] = deque()
        self.last = 0.0

    def take(self, now: float) -> None:
        """Read every frame waiting on the tap and schedule it."""
        while True:
            try:
                frame = os.read(self.fd, FRAME_MAX)
            except BlockingIOError:
                return
            if self.loss and random.random() * 100.0 < self.loss:
                continue
            if len(self.held) >= LIMIT:
                continue
            due = now + self.delay
            if self.jitter:
                due += random.uniform(-self.jitter, self.jitter)
            due = max(due, self.last)
            self.last = due
            self.held.append((due, frame))

    def send(self, now: float) -> None:
        """Write every frame that is due by ``now``."""
        while self.held and self.held[0][0] <= now:
            _, frame = self.held.popleft()
            with contextlib.suppress(OSError):
                os.write(self.fd, frame)

    def close(self) -> None:
        """Send what is held, then let go of the tap."""
        self.send(float("inf"))
        os.close(self.fd)


def command(line: str, links: dict[str, Link]) -> str:
    """Apply one command line; the answer to print."""
    words = line.split()
    if not words:
        return "error - empty command"
    tap = words[1] if len(words) > 1 else "-"
    try:
        if words[0] == "set" and len(words) == 5:
            link = links.get(tap) or Link(tap)
            links[tap] = link
            link.delay = float(words[2]) / 1000.0
            link.jitter = float(words[3]) / 1000.0
            link.loss = float(words[4])
            return f"ok {tap}"
        if words[0] == "drop" and len(words) == 2:
            gone = links.pop(tap, None)
            if gone is not None:
                gone.close()
            return f"ok {tap}"
    except (OSError, ValueError) as exc:
        return f"error {tap} {exc}"
    return f"error {tap} unknown command {line.strip()!r}"


def serve() -> None:
    """The loop: stdin commands, tap frames, due frames; until stdin closes."""
    with contextlib.suppress(OSError, AttributeError):
        # 1 µs timer slack (default 50 µs): wake up when the next frame is due.
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    with contextlib.suppress(OSError, AttributeError):
        # Real-time priority, as netem's softirq has: frames leave on time even when the
        # machine is busy. select() blocks between frames, so this costs no idle CPU.
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    links: dict[str, Link] = {}
    pending = b""
    while True:
        due = [link.held[0][0] for link in links.values() if link.held]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        by_fd = {link.fd: link for link in links.values()}
        readable, _, _ = select.select([0, *by_fd], [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            if fd != 0:
                link = by_fd[fd]
                if links.get(link.tap) is link:  # not dropped by a command just now
                    link.take(now)
                continue
            chunk = os.read(0, 4096)
            if not chunk:
                for link in links.values():
                    link.close()
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                sys.stdout.write(command(line.decode(), links) + "\n")
                sys.stdout.flush()
        now = time.monotonic()
        for link in links.values():
            link.send(now)


if __name__ == "__main__":
    serve()
