"""Task commands, run only when the operator allows them, unprivileged and limited.

Guarantees of ``run_command(argv, policy)`` (it never raises for a bad command;
every refusal and every failure is a ``CommandResult`` with a reason):

* nothing runs unless ``policy.enabled`` (``commands_disabled``);
* ``argv[0]`` must resolve -- an absolute path, or a name looked up in the fixed
  ``PATH`` -- to the same file as an entry of ``policy.allow`` (``not_allowed``),
  a root-owned regular executable nobody else may write, in a directory nobody
  else may write (``unsafe_executable``);
* it runs as ``policy.uid``/``policy.gid`` with no supplementary groups; a
  policy naming uid or gid 0 cannot be built, and the service's own uid is
  refused (``service_uid``) -- a task could read the service's secrets;
* with rlimits: CPU seconds (``cpu_limit``), address space, open files,
  processes of that uid, file size, no core files; in a new session, so a
  wall-clock timeout (``timeout``) kills its whole process group, and the group
  is killed when the command ends, too (no daemon outlives its task);
* with a scrubbed environment: ``PATH`` (fixed), ``HOME`` and ``TMPDIR`` (the work
  directory), ``LANG``; nothing inherited;
* in a private work directory (0700, owned by that uid, inside a root-owned
  directory so the task cannot move it away), removed afterwards;
* stdout (its head) and stderr (its tail) captured up to ``max_output_bytes``,
  through files bounded by RLIMIT_FSIZE (``file_size_limit``).

A process that calls ``setsid`` leaves the process group; with
``dedicated_uid`` (the uid runs nothing but this one task at a time) every
process of that uid is killed at the end too.  Without it such a process lives
on, bounded by its rlimits: give each worker slot a uid of its own.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

from common.errors import ConfigError

NOBODY = 65534
MAX_ARGV_BYTES = 128 * 1024
_READ_CHUNK = 64 * 1024


class Outcome(StrEnum):
    """``CommandResult.reason``."""

    OK = "ok"
    DISABLED = "commands_disabled"
    BAD_ARGV = "bad_argv"
    NOT_ALLOWED = "not_allowed"
    UNSAFE_EXECUTABLE = "unsafe_executable"
    SERVICE_UID = "service_uid"
    SPAWN_FAILED = "spawn_failed"
    EXIT_STATUS = "exit_status"
    SIGNAL = "killed_by_signal"
    CPU_LIMIT = "cpu_limit"
    FILE_SIZE_LIMIT = "file_size_limit"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class SandboxPolicy:
    """What the operator allows; the ``[sandbox]`` table of the configuration."""

    enabled: bool = False
    allow: tuple[str, ...] = ()
    """Absolute paths of the executables a task may name."""
    uid: int = NOBODY
    gid: int = NOBODY
    cpu_s: int = 60
    address_space_bytes: int = 1 << 30
    open_files: int = 64
    processes: int = 32
    """RLIMIT_NPROC: counts every process of ``uid`` on the host."""
    file_size_bytes: int = 64 << 20
    timeout_s: float = 300.0
    path: str = "/usr/local/bin:/usr/bin:/bin"
    work_root: str = tempfile.gettempdir()
    max_output_bytes: int = 64 * 1024
    dedicated_uid: bool = False
    """``uid`` runs only this task: kill every process of it at the end."""

    def __post_init__(self) -> None:
        def bad(why: str, reason: str = "bad_sandbox") -> ConfigError:
            return ConfigError(f"sandbox: {why}", reason=reason)

        if not isinstance(self.allow, tuple) or not all(
            isinstance(a, str) and os.path.isabs(a) for a in self.allow
        ):
            raise bad("allow must list absolute paths")
        ints = (
            "uid",
            "gid",
            "cpu_s",
            "address_space_bytes",
            "open_files",
            "processes",
            "file_size_bytes",
            "max_output_bytes",
        )
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad(f"{name} must be a non-negative int")
        if self.uid == 0 or self.gid == 0:
            raise bad("commands never run as root (uid or gid 0)", reason="root_uid")
        if min(self.cpu_s, self.address_space_bytes, self.open_files, self.processes) < 1:
            raise bad("limits must be at least 1")
        if self.timeout_s <= 0 or self.max_output_bytes < 1 or self.file_size_bytes < 1:
            raise bad("timeout_s, file_size_bytes and max_output_bytes must be positive")
        if not os.path.isabs(self.work_root) or not all(
            os.path.isabs(p) for p in self.path.split(":")
        ):
            raise bad("work_root and every PATH entry must be absolute")
        if self.dedicated_uid and self.uid == NOBODY:
            raise bad("nobody (65534) is shared by many programs: it cannot be a dedicated uid")

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> SandboxPolicy:
        """From a TOML table; unknown keys are refused, ``allow`` may be a list."""
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
def _limits(policy: SandboxPolicy) -> list[tuple[int, tuple[int, int]]]:
    return [
        # soft CPU limit -> SIGXCPU; the hard one, a second later, SIGKILLs a task ignoring it
        (resource.RLIMIT_CPU, (policy.cpu_s, policy.cpu_s + 1)),
        (resource.RLIMIT_AS, (policy.address_space_bytes,) * 2),
        (resource.RLIMIT_NOFILE, (policy.open_files,) * 2),
        (resource.RLIMIT_NPROC, (policy.processes,) * 2),
        (resource.RLIMIT_FSIZE, (policy.file_size_bytes,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
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


def _make_workdir(policy: SandboxPolicy) -> tuple[Path, Path]:
    """A root-owned 0711 holder with the task's 0700 directory inside."""
    holder = Path(tempfile.mkdtemp(prefix="megha-task-", dir=policy.work_root))
    os.chmod(holder, 0o711)
    work = holder / "work"
    work.mkdir(mode=0o700)
    os.chown(work, policy.uid, policy.gid)
    return holder, work


def _live(pid_dir: str) -> tuple[int, int] | None:
    """``(process group, real uid)`` of a process that has not exited yet."""
    try:
        stat_line = Path(pid_dir, "stat").read_text()
        status = Path(pid_dir, "status").read_text()
    except OSError:
        return None
    fields_after_name = stat_line.rsplit(")", 1)[1].split()
    if fields_after_name[0] in ("Z", "X"):  # exited, not yet reaped
        return None
    uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
    return int(fields_after_name[2]), uid


def _processes(*, pgid: int | None = None, uid: int | None = None) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            live = _live(entry.path)
            if live is not None and pgid in (None, live[0]) and uid in (None, live[1]):
                found.append(int(entry.name))
    return found


def processes_of(uid: int) -> list[int]:
    """Pids of the running processes whose real uid is ``uid``."""
    return _processes(uid=uid)


async def _kill_group(pgid: int) -> None:
    """SIGKILL the group and wait (briefly) until none of it runs any more."""
    for _ in range(200):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if not _processes(pgid=pgid):
            return
        await asyncio.sleep(0.005)  # SIGKILL is delivered asynchronously


async def _kill_uid(policy: SandboxPolicy) -> int:
    """Kill every process of the dedicated uid: ``kill -KILL -1`` run *as* that uid
    reaches exactly its processes, even those that left the process group."""
    for _ in range(20):
        if not processes_of(policy.uid):
            return 0
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            "kill -KILL -1",
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            user=policy.uid,
            group=policy.gid,
            extra_groups=[],
        )
        await proc.wait()
    return len(processes_of(policy.uid))


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


async def run_command(
    argv: Sequence[str], policy: SandboxPolicy, *, on_start: Callable[[], None] | None = None
) -> CommandResult:
    """Run ``argv`` under ``policy``; the result says how it ended, or why it never ran.
    ``on_start`` is called once the process exists (not for a command refused)."""
    if not policy.enabled:
        return _refused(Outcome.DISABLED, "task commands are off (sandbox.enabled = false)")
    problem = _check_argv(argv)
    if problem is not None:
        return _refused(Outcome.BAD_ARGV, problem)
    if policy.uid == os.geteuid():
        return _refused(Outcome.SERVICE_UID, f"uid {policy.uid} is the service's own")
    verdict, real = resolve(argv[0], policy)
    if verdict is not Outcome.OK:
        return _refused(verdict, real)
    if not _traversable(Path(policy.work_root)):
        return _refused(
            Outcome.SPAWN_FAILED,
            f"work_root {policy.work_root} is not reachable by uid {policy.uid}",
        )
    try:
        holder, work = _make_workdir(policy)
    except OSError as exc:
        return _refused(Outcome.SPAWN_FAILED, f"work directory: {exc}")
    try:
        return await _run(list(argv), real, holder, work, policy, on_start)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


async def _run(
    argv: list[str],
    real: str,
    holder: Path,
    work: Path,
    policy: SandboxPolicy,
    on_start: Callable[[], None] | None,
) -> CommandResult:
    limits = _limits(policy)

    def apply_limits() -> None:  # in the child, after setuid, before exec: syscalls only
        for which, pair in limits:
            resource.setrlimit(which, pair)

    env = {"PATH": policy.path, "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"}
    # Output goes to files the task cannot reach by name (root-owned holder), not pipes:
    # nothing to drain, no reader left hanging by a process that escaped the group, and
    # RLIMIT_FSIZE bounds what a task can write.
    out_path, err_path = holder / "stdout", holder / "stderr"
    # Spawned with the standard library, not the event loop's subprocess support: some
    # loops (uvloop, which the services run on) cannot set uid, gid, groups and umask.
    loop = asyncio.get_running_loop()
    with _private_file(out_path) as out, _private_file(err_path) as err:
        spawn = functools.partial(
            subprocess.Popen,
            argv,
            executable=real,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            user=policy.uid,
            group=policy.gid,
            extra_groups=[],
            umask=0o077,
            preexec_fn=apply_limits,
        )
        try:
            proc = await loop.run_in_executor(None, spawn)
        except (OSError, subprocess.SubprocessError) as exc:
            return _refused(Outcome.SPAWN_FAILED, f"{argv[0]}: {exc}")
    if on_start is not None:
        on_start()
    waiter = loop.run_in_executor(None, proc.wait)
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(waiter), policy.timeout_s)
        except TimeoutError:
            timed_out = True
    finally:  # also when the task is cancelled (stopped): nothing of it survives
        await _kill_group(proc.pid)
        if policy.dedicated_uid:
            await _kill_uid(policy)
        returncode = await waiter
    stdout, stdout_cut = _head(out_path, policy.max_output_bytes)
    stderr, stderr_cut = _tail(err_path, policy.max_output_bytes)
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
        ok=ok,
        reason=reason,
        exit_code=code,
        signal=sig,
        stdout=stdout,
        stderr_tail=stderr,
        stdout_truncated=stdout_cut,
        stderr_truncated=stderr_cut,
        detail=detail,
    )
