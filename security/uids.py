"""Uids for tasks: every running task has a uid (and the gid of that number) to itself.

Invariants of a ``UidPool`` (one per worker pool, over that pool's slice of the range):

* a uid is leased to one running task at a time, and while leased this process holds
  an ``flock`` on ``<lock_dir>/<uid>``, whose content says "leased": two pools whose
  ranges overlap (another federation on the host) never lease the same uid at once;
* a uid goes back to the free uids only once no process of it is left: at a task's end
  every process of the uid is killed (the uid is the task's alone, so that is the task
  and whatever of it escaped its process group) and reaped (the pool is their
  subreaper), and a uid whose processes will not die stays out (``draining``),
  retried at the next lease;
* a lock file that still says "leased" while nobody holds its lock belongs to a pool
  that died with that task running: the processes of its uid are that task's orphans,
  killed before the uid is leased again (and, at start, every such uid of the range);
* processes of a uid in the range that no pool of ours started (no lock file says
  "leased"), found when the pool starts, are never killed: that uid is set aside,
  counted and logged;
* with every uid leased, a task is refused (``uids_exhausted``), never given a shared uid.

Processes are found by their *real* uid in ``/proc/<pid>/status`` (a task cannot change
it: it has no capability and ``no_new_privs``) and killed through a pidfd opened before
their uid is checked, so a pid reused by another process in between is never hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import grp
import logging
import os
import pwd
import signal
import stat
from collections import Counter, deque
from collections.abc import Collection
from pathlib import Path

from common.errors import ConfigError

log = logging.getLogger("megha.sandbox")

LEASED = b"leased\n"
COUNTERS = (
    "sandbox_uid_leases",
    "sandbox_uids_exhausted",
    "sandbox_uid_held_elsewhere",
    "sandbox_orphans_ended",
)
PR_SET_CHILD_SUBREAPER = 36
KILL_ROUNDS = 400
"""Rounds of "find the uid's processes, SIGKILL them" (5 ms apart) before a uid is
left draining: 2 s, for a fork bomb that forks while it is killed."""


def _status(pid_dir: str) -> tuple[int, bool, int] | None:
    """``(real uid, exited, parent pid)`` of a process, None if it is gone."""
    try:
        with open(f"{pid_dir}/status", "rb") as f:
            text = f.read(2048)
    except OSError:
        return None

    def field(name: bytes) -> bytes:
        return text.split(b"\n" + name + b":", 1)[1].split(None, 1)[0]

    return int(field(b"Uid")), field(b"State") in (b"Z", b"X"), int(field(b"PPid"))


def scan(uids: Collection[int]) -> dict[int, list[int]]:
    """Pids of the live (not exited) processes whose real uid is in ``uids``, by uid."""
    found: dict[int, list[int]] = {}
    for pid, uid, exited, _ in _processes(uids):
        if not exited:
            found.setdefault(uid, []).append(pid)
    return found


def _processes(uids: Collection[int]) -> list[tuple[int, int, bool, int]]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _status(entry.path)
            if st is not None and st[0] in uids:
                found.append((int(entry.name), *st))
    return found


def processes_of(uid: int) -> list[int]:
    """Pids of the running processes whose real uid is ``uid``."""
    return scan((uid,)).get(uid, [])


def kill_round(uid: int) -> int:
    """SIGKILL every live process of ``uid`` and reap those that exited as our children
    (orphans come to us: ``become_subreaper``); how many were still alive."""
    alive = 0
    for pid, _, exited, parent in _processes((uid,)):
        if exited:
            if parent == os.getpid():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            continue  # another's zombie: dead, its parent reaps it
        alive += 1
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            st = _status(f"/proc/{pid}")  # read after the pidfd pinned the process
            if st is not None and st[0] == uid:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass  # exited meanwhile
        finally:
            os.close(fd)
    return alive


def become_subreaper() -> None:
    """The processes a task leaves behind (their parent killed) become children of this
    process, not of init: ``kill_round`` reaps them, even where init reaps nothing (a
    container without one), so none of them lingers as a zombie of its uid."""
    _call_prctl(PR_SET_CHILD_SUBREAPER, 1)


def _call_prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}): {os.strerror(err)}")


async def end_uid(uid: int) -> bool:
    """Kill every process of ``uid`` until none is left; False if some would not die."""
    loop = asyncio.get_running_loop()
    for _ in range(KILL_ROUNDS):
        if not await loop.run_in_executor(None, kill_round, uid):
            return True
        await asyncio.sleep(0.005)  # SIGKILL is delivered asynchronously
    return False


def check_range(uids: range) -> None:
    """Refuse a range holding root, this process's own uid, nobody or an account."""
    if 0 in uids:
        raise ConfigError("sandbox: the uid range includes root (0)", reason="root_uid")
    own = os.geteuid()
    if own in uids:
        raise ConfigError(
            f"sandbox: the uid range includes the pool's own uid {own}: a task could "
            "read its secrets and signal it",
            reason="service_uid",
        )
    if 65534 in uids or uids.stop > 2**32 - 1:
        raise ConfigError(
            f"sandbox: uids {uids.start}-{uids.stop - 1}: nobody (65534) and uids past "
            "4294967294 are not a task's own",
            reason="bad_sandbox",
        )
    for kind, names in (("uid", pwd.getpwall()), ("gid", grp.getgrall())):
        for entry in names:
            number = entry[2]
            if number in uids:
                raise ConfigError(
                    f"sandbox: {kind} {number} ({entry[0]}) of the range "
                    f"{uids.start}-{uids.stop - 1} is an account of this host",
                    reason="bad_sandbox",
                )


class UidPool:
    """The uids of one worker pool's running tasks."""

    def __init__(self, uids: range, lock_dir: str) -> None:
        self.uids = uids
        self.lock_dir = Path(lock_dir)
        self.free: deque[int] = deque(uids)
        self.leased: dict[int, int] = {}
        """uid -> the descriptor of its lock file (locked)."""
        self.draining: dict[int, int] = {}
        """Leased uids whose task ended with processes that would not die."""
        self.foreign: set[int] = set()
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        self._opened = False
        self._opening = asyncio.Lock()

    def gauges(self) -> dict[str, int]:
        return {
            "sandbox_uids_free": len(self.free),
            "sandbox_uids_leased": len(self.leased),
            "sandbox_uids_draining": len(self.draining),
            "sandbox_uids_foreign": len(self.foreign),
        }

    async def open(self) -> None:
        """The lock directory; the orphans of a dead pool's tasks ended, foreign uids
        set aside (one scan of the whole range), before the first lease."""
        async with self._opening:
            if not self._opened:
                await self._open()
                self._opened = True

    async def _open(self) -> None:
        become_subreaper()
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.stat(self.lock_dir, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ConfigError(
                f"sandbox: {self.lock_dir} must be a directory of uid {os.geteuid()} "
                "nobody else may write",
                reason="bad_sandbox",
            )
        running = await asyncio.get_running_loop().run_in_executor(None, scan, self.uids)
        for uid, pids in sorted(running.items()):
            fd = self._lock(uid)
            if fd is None:
                continue  # leased by a live pool whose range overlaps: its task
            if self._says_leased(fd):
                self.counters["sandbox_orphans_ended"] += len(pids)
                self.free.remove(uid)
                await self._end(uid, fd)
            else:
                self._unlock(fd)
                self._set_aside(uid, pids)

    async def lease(self) -> int | None:
        """A uid for a task to have alone, or None if every uid is taken."""
        await self.open()
        for uid in list(self.draining):
            await self._end(uid, self.draining.pop(uid))  # free again, or back to draining
        for _ in range(len(self.free)):
            uid = self.free.popleft()
            try:
                fd = self._lock(uid)
            except OSError:
                self.free.appendleft(uid)
                raise
            if fd is None:
                self.counters["sandbox_uid_held_elsewhere"] += 1
                self.free.append(uid)
                continue
            if self._says_leased(fd) and not await self._ended(uid, fd):
                continue  # a dead pool's task that will not die: draining
            os.pwrite(fd, LEASED, 0)
            self.leased[uid] = fd
            self.counters["sandbox_uid_leases"] += 1
            return uid
        self.counters["sandbox_uids_exhausted"] += 1
        return None

    def why_none(self) -> str:
        return (
            f"all {len(self.uids)} uids of this pool ({self.uids.start}-{self.uids.stop - 1}) "
            f"are taken: {len(self.leased)} by running tasks, {len(self.draining)} by "
            f"processes still dying, {len(self.foreign)} by processes megha did not start"
        )

    async def release(self, uid: int) -> None:
        """The task of ``uid`` has ended: kill what is left of the uid, then free it."""
        await self._end(uid, self.leased.pop(uid))

    async def _end(self, uid: int, fd: int) -> None:
        """Every process of ``uid`` killed, then the uid freed (else draining)."""
        if await self._ended(uid, fd):
            os.ftruncate(fd, 0)
            self._unlock(fd)
            self.free.append(uid)

    async def _ended(self, uid: int, fd: int) -> bool:
        """Kill every process of ``uid``; if some survive (or this is cancelled), the
        uid is left draining, still locked."""
        ended = False
        try:
            ended = await end_uid(uid)
        finally:
            if not ended:
                log.error("uid %d: processes left; kept out until they are gone", uid)
                self.draining[uid] = fd
        return ended

    def _lock(self, uid: int) -> int | None:
        path = self.lock_dir / str(uid)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def _unlock(fd: int) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @staticmethod
    def _says_leased(fd: int) -> bool:
        return os.pread(fd, len(LEASED), 0) == LEASED

    def _set_aside(self, uid: int, pids: list[int]) -> None:
        log.error(
            "uid %d of the sandbox range runs processes megha did not start (pids %s): "
            "not used; give the sandbox a range of its own",
            uid,
            pids[:10],
        )
        self.foreign.add(uid)
        with contextlib.suppress(ValueError):
            self.free.remove(uid)
