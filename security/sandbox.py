"""Task commands, run only when the operator allows them, unprivileged, limited, alone.

Guarantees of ``Sandbox.run(argv)`` (it never raises for a bad command; every refusal
and every failure is a ``CommandResult`` with a reason):

* nothing runs unless ``policy.enabled`` (``commands_disabled``);
* ``argv[0]`` must resolve -- an absolute path, or a name looked up in the fixed
  ``PATH`` -- to the same file as an entry of ``policy.allow`` (``not_allowed``),
  a root-owned regular executable nobody else may write, in a directory nobody
  else may write (``unsafe_executable``);
* each running task has a uid (and gid) to itself, leased from its pool's slice of
  the configured range (``security.uids``): no other task can signal it, trace it,
  read its ``/proc/<pid>`` or its files.  With every uid of the slice running a task,
  the next is refused (``uids_exhausted``), never given a shared uid.  A range holding
  root, the pool's own uid, nobody or an account of the host is refused at start;
* it starts through ``security.launch`` (a fresh single-threaded interpreter: nothing
  runs between fork and exec in the pool's threaded process): its own mount and IPC
  namespaces and, unless ``host_network``, its own network namespace with only a
  loopback; every mount read-only; its work directory, ``/tmp``, ``/var/tmp`` and
  ``/dev/shm`` on one tmpfs of ``scratch_bytes`` and ``scratch_files`` inodes that no
  other task sees and that is gone with its last process; ``/proc`` showing its own
  processes only; no supplementary groups and ``no_new_privs``;
* with rlimits: CPU seconds (``cpu_limit``), address space, open files, processes
  (RLIMIT_NPROC counts the uid's processes: the task's alone), file size (one file:
  the scratch bounds them together), no core files; in a new session, so a wall-clock
  timeout (``timeout``) kills its process group;
* at its end (exit, timeout, or the run cancelled) its process group is killed, and
  then every process of its uid -- the task's alone, so whatever escaped the group
  with ``setsid`` -- before the uid is leased again;
* with a scrubbed environment: ``PATH`` (fixed), ``HOME`` and ``TMPDIR`` (the work
  directory), ``LANG``, then the task's own variables the pool let through (``env``:
  the operator's ``task_env_allow``, ``common.taskenv``); nothing inherited;
* stdout (its head) and stderr (its tail) captured up to ``max_output_bytes``,
  through files in a root-owned directory of ``work_root`` (removed afterwards),
  each bounded by RLIMIT_FSIZE (``file_size_limit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

from common.config import SANDBOX_UID_FIRST, SANDBOX_UIDS_PER_POOL
from common.errors import ConfigError
from security.uids import UidPool, check_range, processes_of

__all__ = ["CommandResult", "Outcome", "Sandbox", "SandboxPolicy", "processes_of", "resolve"]

MAX_ARGV_BYTES = 128 * 1024
LAUNCHER = str(Path(__file__).with_name("launch.py"))
MAX_UID = 2**32 - 2
GONE_KEYS = {"uid", "gid", "dedicated_uid"}


class Outcome(StrEnum):
    """``CommandResult.reason``."""

    OK = "ok"
    DISABLED = "commands_disabled"
    BAD_ARGV = "bad_argv"
    NOT_ALLOWED = "not_allowed"
    UNSAFE_EXECUTABLE = "unsafe_executable"
    NO_UID = "uids_exhausted"
    SPAWN_FAILED = "spawn_failed"
    EXIT_STATUS = "exit_status"
    SIGNAL = "killed_by_signal"
    CPU_LIMIT = "cpu_limit"
    FILE_SIZE_LIMIT = "file_size_limit"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What the operator allows; the ``[federation.sandbox]`` table of the configuration."""

    enabled: bool = False
    allow: tuple[str, ...] = ()
    """Absolute paths of the executables a task may name."""
    uid_first: int = SANDBOX_UID_FIRST
    uids_per_pool: int = SANDBOX_UIDS_PER_POOL
    """The pool of LM ``j`` leases uids ``uid_first + j * uids_per_pool`` onwards, one
    per running task (gid: the same number); at most this many of its tasks run."""
    cpu_s: int = 60
    address_space_bytes: int = 1 << 30
    open_files: int = 64
    processes: int = 32
    """RLIMIT_NPROC: the processes of the task's uid, so of the task."""
    file_size_bytes: int = 64 << 20
    scratch_bytes: int = 64 << 20
    """One tmpfs (memory) per task: its work directory, /tmp, /var/tmp and /dev/shm."""
    scratch_files: int = 4096
    """Inodes of that tmpfs: files and directories the task may make."""
    host_network: bool = False
    """False: the task has a network namespace of its own (only a loopback)."""
    shared_dir: str = ""
    """A host directory every task may write as well as read (as a cluster's shared
    filesystem: how the stages of a job hand data on; ``examples/wordcount``).  Tasks
    write there as their own uids, 0600 unless they open files up; no isolation between
    users beyond that.  Empty: none (the host is read-only to every task)."""
    timeout_s: float = 300.0
    path: str = "/usr/local/bin:/usr/bin:/bin"
    work_root: str = tempfile.gettempdir()
    max_output_bytes: int = 64 * 1024
    lock_dir: str = "/run/megha/sandbox-uids"
    """Where a pool locks the uids it leases (root's, 0700)."""

    def __post_init__(self) -> None:
        def bad(why: str, reason: str = "bad_sandbox") -> ConfigError:
            return ConfigError(f"sandbox: {why}", reason=reason)

        if not isinstance(self.allow, tuple) or not all(
            isinstance(a, str) and os.path.isabs(a) for a in self.allow
        ):
            raise bad("allow must list absolute paths")
        ints = (
            "uid_first", "uids_per_pool", "cpu_s", "address_space_bytes", "open_files",
            "processes", "file_size_bytes", "scratch_bytes", "scratch_files", "max_output_bytes",
        )  # fmt: skip
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"{name} must be an int")
        if self.uid_first < 1:
            raise bad("commands never run as root (uid 0)", reason="root_uid")
        if min(getattr(self, name) for name in ints) < 1:
            raise bad(f"{', '.join(ints)} must be positive")
        if self.uid_first + self.uids_per_pool - 1 > MAX_UID:
            raise bad(f"uids end past {MAX_UID}")
        if self.scratch_files < 64:
            raise bad("scratch_files must be at least 64")
        if not isinstance(self.host_network, bool) or not isinstance(self.enabled, bool):
            raise bad("enabled and host_network are true or false")
        if self.timeout_s <= 0:
            raise bad("timeout_s must be positive")
        if self.shared_dir and not os.path.isabs(self.shared_dir):
            raise bad("shared_dir must be an absolute path")
        if not all(os.path.isabs(p) for p in (self.work_root, self.lock_dir)) or not all(
            os.path.isabs(p) for p in self.path.split(":")
        ):
            raise bad("work_root, lock_dir and every PATH entry must be absolute")

    def uids(self, pool: int) -> range:
        """The uids of the worker pool of the ``pool``-th LM."""
        first = self.uid_first + pool * self.uids_per_pool
        return range(first, first + self.uids_per_pool)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> SandboxPolicy:
        """From a TOML table; unknown keys are refused, ``allow`` may be a list."""
        gone = sorted(GONE_KEYS & set(table))
        if gone:
            raise ConfigError(
                f"sandbox: {', '.join(gone)}: gone; each task runs as a uid of its own "
                "from uid_first and uids_per_pool (config/federation.example.toml)",
                reason="bad_sandbox",
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(f"sandbox: unknown keys {', '.join(unknown)}", reason="bad_sandbox")
        values = dict(table)
        if isinstance(values.get("allow"), list):
            values["allow"] = tuple(values["allow"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class CommandResult:
    ok: bool
    reason: Outcome
    exit_code: int | None = None
    signal: int | None = None
    stdout: bytes = b""
    stderr_tail: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    detail: str = ""
    uid: int | None = None
    """The uid the command ran as (None if it never ran)."""


def _refused(reason: Outcome, detail: str) -> CommandResult:
    return CommandResult(ok=False, reason=reason, detail=detail)


# ------------------------------------------------------------ checks
def _check_argv(argv: object) -> str | None:
    if not isinstance(argv, list | tuple) or not argv:
        return "argv must be a non-empty list of strings"
    if not all(isinstance(a, str) for a in argv):
        return "argv must be a non-empty list of strings"
    if any("\0" in a for a in argv):
        return "argv contains a NUL character"
    if not argv[0]:
        return "argv[0] is empty"
    if sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in argv) > MAX_ARGV_BYTES:
        return f"argv is longer than {MAX_ARGV_BYTES} bytes"
    return None


def _writable_by_others(st: os.stat_result) -> bool:
    return bool(st.st_mode & 0o022) or st.st_uid not in (0, os.geteuid())


def resolve(name: str, policy: SandboxPolicy) -> tuple[Outcome, str]:
    """``(OK, real path)`` of the allowed executable ``name`` names, else why not."""
    if "/" in name and not os.path.isabs(name):
        return Outcome.NOT_ALLOWED, f"relative path {name!r}"
    found = [name] if "/" in name else [os.path.join(d, name) for d in policy.path.split(":")]
    candidate = next((c for c in found if os.path.exists(c)), None)
    if candidate is None:
        return Outcome.NOT_ALLOWED, f"{name!r} is not in PATH {policy.path}"
    real = os.path.realpath(candidate)
    if real not in {os.path.realpath(a) for a in policy.allow}:
        return Outcome.NOT_ALLOWED, f"{name!r} ({real}) is not on the allow-list"
    try:
        st, dir_st = os.stat(real), os.stat(os.path.dirname(real))
    except OSError as exc:
        return Outcome.NOT_ALLOWED, f"{real}: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
        return Outcome.NOT_ALLOWED, f"{real} is not an executable file"
    if _writable_by_others(st) or _writable_by_others(dir_st):
        return Outcome.UNSAFE_EXECUTABLE, f"{real} or its directory may be changed by others"
    return Outcome.OK, real


def _traversable(path: Path) -> bool:
    """Can any user reach ``path`` by name (every directory on the way has o+x)?"""
    try:
        p = path.resolve(strict=True)
        return all(os.stat(d).st_mode & stat.S_IXOTH for d in (p, *p.parents))
    except OSError:
        return False


# ------------------------------------------------------------ running
def _limits(policy: SandboxPolicy) -> list[tuple[int, int, int]]:
    return [
        # soft CPU limit -> SIGXCPU; the hard one, a second later, SIGKILLs a task ignoring it
        (resource.RLIMIT_CPU, policy.cpu_s, policy.cpu_s + 1),
        (resource.RLIMIT_AS, policy.address_space_bytes, policy.address_space_bytes),
        (resource.RLIMIT_NOFILE, policy.open_files, policy.open_files),
        (resource.RLIMIT_NPROC, policy.processes, policy.processes),
        (resource.RLIMIT_FSIZE, policy.file_size_bytes, policy.file_size_bytes),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def _head(path: Path, limit: int) -> tuple[bytes, bool]:
    with path.open("rb") as f:
        data = f.read(limit + 1)
    return data[:limit], len(data) > limit


def _tail(path: Path, limit: int) -> tuple[bytes, bool]:
    with path.open("rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read(limit), size > limit


def _private_file(path: Path) -> BinaryIO:
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


def _make_holder(policy: SandboxPolicy) -> Path:
    """A root-owned 0711 directory for the output files; in the task's namespace the
    scratch tmpfs (its work directory inside) is mounted on it."""
    holder = Path(tempfile.mkdtemp(prefix="megha-task-", dir=policy.work_root))
    os.chmod(holder, 0o711)
    return holder


async def _readable(fd: int) -> None:
    """Until ``fd`` (a pipe, a pidfd: readable once its process exited) is readable."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _read_to_end(fd: int, limit: int = 8192) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    while len(data) < limit:
        await _readable(fd)
        with contextlib.suppress(BlockingIOError):
            chunk = os.read(fd, limit)
            if not chunk:
                break
            data += chunk
    return data


async def _exited(pid: int) -> None:
    """Until process ``pid`` (a child not yet reaped) has exited; it stays unreaped."""
    pidfd = os.pidfd_open(pid)
    try:
        await _readable(pidfd)
    finally:
        os.close(pidfd)


async def _end(proc: subprocess.Popen[bytes]) -> int:
    """Kill the task's process group, wait for its first process, reap it."""
    # Not reaped yet, the first process keeps its pid -- the group's id -- from being
    # reused: this SIGKILL reaches the task's group and no one else's.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    await _exited(proc.pid)
    return proc.wait()  # it has exited: at once


async def _spawn(cmd: list[str], env: dict[str, str], out: BinaryIO, err: BinaryIO,
                 status_fd: int) -> subprocess.Popen[bytes]:  # fmt: skip
    """``security.launch`` started in a new session.  Forked in a thread (the event
    loop's own subprocess support cannot be used: uvloop's cannot set a umask), and
    never lost: a run cancelled meanwhile kills it once it exists."""

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd, executable=sys.executable, cwd="/", env=env, stdin=subprocess.DEVNULL,
            stdout=out, stderr=err, pass_fds=(status_fd,), start_new_session=True, umask=0o077,
        )  # fmt: skip

    started = asyncio.get_running_loop().run_in_executor(None, spawn)
    try:
        return await asyncio.shield(started)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            await _end(await started)
        raise


def _classify(returncode: int, timed_out: bool) -> tuple[bool, Outcome, int | None, int | None]:
    if timed_out:
        return False, Outcome.TIMEOUT, None, signal.SIGKILL
    if returncode == 0:
        return True, Outcome.OK, 0, None
    if returncode > 0:
        return False, Outcome.EXIT_STATUS, returncode, None
    sig = -returncode
    reason = {signal.SIGXCPU: Outcome.CPU_LIMIT, signal.SIGXFSZ: Outcome.FILE_SIZE_LIMIT}.get(
        signal.Signals(sig), Outcome.SIGNAL
    )
    return False, reason, None, sig


def _result(
    returncode: int, timed_out: bool, holder: Path, policy: SandboxPolicy, uid: int
) -> CommandResult:
    stdout, stdout_cut = _head(holder / "stdout", policy.max_output_bytes)
    stderr, stderr_cut = _tail(holder / "stderr", policy.max_output_bytes)
    ok, reason, code, sig = _classify(returncode, timed_out)
    if reason is Outcome.TIMEOUT:
        detail = f"killed after {policy.timeout_s:g} s"
    elif reason is Outcome.CPU_LIMIT:
        detail = f"over {policy.cpu_s} s of CPU"
    elif reason is Outcome.FILE_SIZE_LIMIT:
        detail = f"wrote a file (or output) over {policy.file_size_bytes} bytes"
    elif sig is not None:
        detail = f"killed by {signal.Signals(sig).name}"
    else:
        detail = "" if ok else f"exit status {code}"
    return CommandResult(
        ok=ok, reason=reason, exit_code=code, signal=sig, stdout=stdout, stderr_tail=stderr,
        stdout_truncated=stdout_cut, stderr_truncated=stderr_cut, detail=detail, uid=uid,
    )  # fmt: skip


def _launch_spec(
    policy: SandboxPolicy, holder: Path, uid: int, real: str, env: Mapping[str, str]
) -> dict[str, Any]:
    """What ``security.launch`` does before it becomes the task (less the status fd)."""
    work = str(holder / "work")
    base = {"PATH": policy.path, "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
    return {
        "holder": str(holder), "work": work, "uid": uid, "gid": uid, "executable": real,
        "scratch_bytes": policy.scratch_bytes, "scratch_files": policy.scratch_files,
        "host_network": policy.host_network, "shared_dir": policy.shared_dir,
        "limits": _limits(policy),
        "env": {**base, **env},
    }  # fmt: skip


async def _run(
    argv: list[str],
    spec: dict[str, Any],
    policy: SandboxPolicy,
    on_start: Callable[[], None] | None,
) -> CommandResult:
    holder, uid = Path(spec["holder"]), spec["uid"]
    # Output goes to files the task cannot reach by name (root-owned holder, covered by
    # its scratch in its namespace), not pipes: nothing to drain, no reader left hanging
    # by a process that escaped the group, and RLIMIT_FSIZE bounds each.
    status_r, status_w = os.pipe()
    blob = marshal.dumps({**spec, "status_fd": status_w}).hex()  # the same interpreter reads it
    cmd = [sys.executable, "-I", "-S", LAUNCHER, blob]
    try:
        with _private_file(holder / "stdout") as out, _private_file(holder / "stderr") as err:
            proc = await _spawn([*cmd, *argv], spec["env"], out, err, status_w)
    except BaseException as exc:  # cancelled too: no descriptor left behind
        os.close(status_r)
        if isinstance(exc, OSError | subprocess.SubprocessError):
            return _refused(Outcome.SPAWN_FAILED, f"{argv[0]}: {exc}")
        raise
    finally:
        os.close(status_w)
    timed_out = False
    try:
        async with asyncio.timeout(policy.timeout_s):
            failure = await _read_to_end(status_r)  # nothing: the launcher became the task
            if failure:
                return _refused(Outcome.SPAWN_FAILED, failure.decode("utf-8", "replace"))
            if on_start is not None:
                on_start()
            await _exited(proc.pid)
    except TimeoutError:
        timed_out = True
    finally:  # also when the run is cancelled (the task stopped): its group is killed
        os.close(status_r)
        returncode = await _end(proc)
    return _result(returncode, timed_out, holder, policy, uid)


class Sandbox:
    """Runs task commands under a policy, each as a uid of its own (module docstring)."""

    def __init__(self, policy: SandboxPolicy, pool: int = 0) -> None:
        self.policy = policy
        uids = policy.uids(pool)
        if policy.enabled:
            check_range(uids)
        self.uids = UidPool(uids, policy.lock_dir)

    def _check(self, argv: Sequence[str]) -> CommandResult | str:
        """The allowed executable's real path, or the refusal."""
        policy = self.policy
        if not policy.enabled:
            return _refused(Outcome.DISABLED, "task commands are off (task_commands = false)")
        problem = _check_argv(argv)
        if problem is not None:
            return _refused(Outcome.BAD_ARGV, problem)
        verdict, real = resolve(argv[0], policy)
        if verdict is not Outcome.OK:
            return _refused(verdict, real)
        if not _traversable(Path(policy.work_root)):
            return _refused(
                Outcome.SPAWN_FAILED, f"work_root {policy.work_root} is not reachable by every uid"
            )
        return real

    async def run(
        self, argv: Sequence[str], *, on_start: Callable[[], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:  # fmt: skip
        """Run ``argv``; the result says how it ended, or why it never ran.
        ``on_start`` is called once the command runs (not for a command refused);
        ``env``: variables over the sandbox's own (the caller allowed each).

        Cancelled (the task stopped), it raises ``CancelledError`` only once the
        command's processes are killed and its uid handled: the run goes on in a task
        of its own, cancelled once, so its clean-up runs in order and whole, however
        often the caller is cancelled meanwhile."""
        real = self._check(argv)
        if isinstance(real, CommandResult):
            return real
        job = asyncio.ensure_future(self._leased(list(argv), real, on_start, dict(env or {})))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            job.cancel()
            while not job.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(job)
            raise

    async def _leased(
        self, argv: list[str], real: str, on_start: Callable[[], None] | None,
        env: dict[str, str],
    ) -> CommandResult:  # fmt: skip
        uid = await self.uids.lease()
        if uid is None:
            return _refused(Outcome.NO_UID, self.uids.why_none())
        try:
            try:
                holder = _make_holder(self.policy)
            except OSError as exc:
                return _refused(Outcome.SPAWN_FAILED, f"work directory: {exc}")
            try:
                spec = _launch_spec(self.policy, holder, uid, real, env)
                return await _run(argv, spec, self.policy, on_start)
            finally:
                shutil.rmtree(holder, ignore_errors=True)
        finally:  # whatever of the uid is left is killed before the uid is leased again
            await self.uids.release(uid)
