"""Process, command and ownership helpers shared by the test-bed modules.

Guarantees:

* ``run`` never waits longer than its timeout and raises ``TestbedError`` with the
  command's stderr when it fails.
* ``OwnerLock`` marks a run as alive: the lock is an ``flock`` on a file, so it is
  released by the kernel when its owner exits, even on ``kill -9``; a sweeper that can
  take the lock knows the owner is gone.
* ``MARKER`` is put in the environment of every process the test-bed starts, so
  leftovers of a crashed run can be found in ``/proc/*/environ`` and killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

MARKER = "MEGHA_TESTBED_RUN"
LOCK_DIR = Path("/run/megha-testbed")


class TestbedError(RuntimeError):
    """A test-bed operation failed; the message says which command and why."""

    __test__ = False  # not a pytest test class despite the name


def run(
    argv: Sequence[str],
    *,
    timeout: float = 20.0,
    check: bool = True,
    input_text: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to completion within ``timeout`` seconds, capturing its output."""
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"{' '.join(argv)}: no answer within {timeout:g} s") from exc
    except FileNotFoundError as exc:
        raise TestbedError(f"{argv[0]}: command not found") from exc
    if check and done.returncode != 0:
        raise TestbedError(
            f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}"
        )
    return done


class OwnerLock:
    """An exclusive, non-blocking ``flock`` on ``path``, held while the run lives."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; ``False`` if a live process does."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            # The file may have been unlinked by its previous owner between our open
            # and our flock: then we hold a lock nobody else can see; retry.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._fd = fd
                return True
            os.close(fd)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def release(self, *, unlink: bool = True) -> None:
        """Drop the lock (and the file, so finished runs leave nothing behind)."""
        if self._fd is None:
            return
        if unlink:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self._fd)
        self._fd = None


def marked_pids(value: str) -> list[int]:
    """Pids of processes whose environment has ``MARKER=value`` (the caller excluded)."""
    needle = f"{MARKER}={value}".encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_pids(pids: Iterable[int], *, grace: float = 2.0) -> None:
    """SIGTERM ``pids``, wait up to ``grace`` seconds, then SIGKILL the survivors."""
    alive = set(pids)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if pid_alive(pid)}
        if alive:
            time.sleep(0.05)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def free_ports(ip: str, count: int, *, low: int = 29000, high: int = 32000) -> list[int]:
    """``count`` distinct ports in ``[low, high)`` that ``ip`` can bind right now.

    The range sits below Linux's ephemeral ports, so outgoing connections do not take
    them between this check and the broker's bind (another process still could), and
    above the tests' federations (20000-28999, ``tests.conftest.free_base``).
    """
    picked: list[int] = []
    tries = 0
    while len(picked) < count:
        tries += 1
        if tries > 2000:
            raise TestbedError(f"no {count} free ports on {ip} in [{low}, {high})")
        port = random.randrange(low, high)
        if port in picked:
            continue
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((ip, port))
            except OSError:
                continue
        picked.append(port)
    return picked
