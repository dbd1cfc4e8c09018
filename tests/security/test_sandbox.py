"""Task commands: refused with a reason unless allowed; unprivileged, limited, alone.

Tests that spawn (marker ``sandbox``) need root: each runs real executables as uids of
a block no account and no process uses (every process of a task's uid is counted and
killed), with its lock files in a directory of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from common.config import parse_config
from common.errors import ConfigError
from security import uids as uid_leases
from security.sandbox import (
    CommandResult,
    Outcome,
    Sandbox,
    SandboxPolicy,
    processes_of,
    resolve,
)
from security.uids import UidPool, check_range

F = TypeVar("F", bound=Callable[..., object])
SH, TRUE, ENV, HEAD, SLEEP = (
    "/bin/sh",
    "/bin/true",
    "/usr/bin/env",
    "/usr/bin/head",
    "/usr/bin/sleep",
)
PYTHON = "/usr/bin/python3"
BLOCK = 8
"""Uids of a test's block (``uids_per_pool``)."""


def spawns(test: F) -> F:
    marked = pytest.mark.sandbox(test)
    return pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")(marked)  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def not_a_subreaper_after() -> Iterator[None]:
    """A sandbox makes its process the subreaper of its tasks' orphans: not pytest's for
    the tests after these."""
    yield
    uid_leases._call_prctl(uid_leases.PR_SET_CHILD_SUBREAPER, 0)


@pytest.fixture
def work_root() -> Iterator[Path]:
    """Under /tmp, reachable by any uid (pytest's tmp_path is root-only)."""
    root = Path(tempfile.mkdtemp(prefix="megha-sandbox-test-"))
    os.chmod(root, 0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _spare(first: int, count: int) -> bool:
    block = range(first, first + count)
    accounts = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    return not accounts & set(block) and not uid_leases.scan(block)


def spare_block(count: int) -> int:
    """The first of ``count`` uids of no account and no process: safe to count and kill
    every process of each."""
    for _ in range(100):
        first = random.randrange(61_000, 65_500 - count, BLOCK)
        if _spare(first, count):
            return first
    pytest.skip("no spare block of uids")


@pytest.fixture
def task_uids() -> int:
    return spare_block(BLOCK)


@pytest.fixture
def lock_dir(tmp_path: Path) -> str:
    return str(tmp_path / "locks")


def policy(
    work_root: Path, first: int = 61_000, locks: str = "/nonexistent", **kw: object
) -> SandboxPolicy:
    base = SandboxPolicy(
        enabled=True,
        allow=(SH, TRUE, ENV, HEAD, SLEEP, "/bin/false"),
        uid_first=first,
        uids_per_pool=BLOCK,
        cpu_s=30,
        timeout_s=20.0,
        work_root=str(work_root),
        lock_dir=locks,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.fixture
def pol(work_root: Path, task_uids: int, lock_dir: str) -> SandboxPolicy:
    """A policy over this test's block of uids."""
    return policy(work_root, task_uids, lock_dir)


def run(argv: list[str], pol: SandboxPolicy) -> CommandResult:
    return asyncio.run(Sandbox(pol).run(argv))


def sh(script: str, pol: SandboxPolicy) -> CommandResult:
    return run([SH, "-c", script], pol)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def block_is_empty(pol: SandboxPolicy) -> bool:
    return not uid_leases.scan(pol.uids(0))


# ------------------------------------------------------ policy and refusals
def test_a_policy_never_runs_commands_as_root() -> None:
    with pytest.raises(ConfigError) as exc:
        SandboxPolicy(enabled=True, allow=(TRUE,), uid_first=0)
    assert exc.value.reason == "root_uid"
    with pytest.raises(ConfigError) as exc:
        parse_config({"federation": {"sandbox": {"uid_first": 0}}})
    assert exc.value.reason == "root_uid"


@pytest.mark.parametrize(
    "kw",
    [
        {"allow": ("true",)},
        {"allow": ["/bin/true"]},
        {"cpu_s": 0},
        {"processes": -1},
        {"uid_first": True},
        {"uids_per_pool": 0},
        {"uid_first": 2**32 - 2, "uids_per_pool": 2},
        {"scratch_bytes": 0},
        {"scratch_files": 10},
        {"host_network": 1},
        {"timeout_s": 0},
        {"work_root": "relative"},
        {"lock_dir": "run/megha"},
        {"path": "/bin:bin"},
    ],
)
def test_bad_policies_are_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as exc:
        SandboxPolicy(enabled=True, **kw)  # type: ignore[arg-type]
    assert exc.value.reason == "bad_sandbox"


def test_policy_from_a_toml_table() -> None:
    pol = SandboxPolicy.from_mapping({"enabled": True, "allow": ["/bin/true"], "cpu_s": 5})
    assert pol.allow == ("/bin/true",)
    assert pol.cpu_s == 5
    with pytest.raises(ConfigError, match="unknown keys run_as_root"):
        SandboxPolicy.from_mapping({"run_as_root": True})
    for gone in ("uid", "gid", "dedicated_uid"):  # one uid for every task: no more
        with pytest.raises(ConfigError, match=f"{gone}: gone; each task runs as a uid"):
            SandboxPolicy.from_mapping({gone: 61_000})
        with pytest.raises(ConfigError, match=f"sandbox.{gone}: gone"):
            parse_config({"federation": {"sandbox": {gone: 61_000}}})


def test_each_pool_has_a_slice_of_the_range_and_the_federation_checks_them_all() -> None:
    pol = SandboxPolicy(uid_first=70_000, uids_per_pool=100)
    assert [pol.uids(j) for j in range(3)] == [
        range(70_000, 70_100),
        range(70_100, 70_200),
        range(70_200, 70_300),
    ]
    assert parse_config({"federation": {"lms": 3, "sandbox": {"uid_first": 70_000}}})
    for sandbox, lms in (
        ({"uid_first": 65_000, "uids_per_pool": 200}, 3),  # nobody in lm2's
        ({"uid_first": 2**32 - 2048, "uids_per_pool": 1024}, 3),
    ):  # past the end
        with pytest.raises(ConfigError) as exc:
            parse_config({"federation": {"lms": lms, "sandbox": sandbox}})
        assert exc.value.reason == "bad_sandbox"


def test_a_range_with_root_the_pools_own_uid_nobody_or_an_account_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError) as exc:
        check_range(range(10))
    assert exc.value.reason == "root_uid"
    monkeypatch.setattr(os, "geteuid", lambda: 61_005)  # a pool running as 61005
    with pytest.raises(ConfigError) as exc:
        check_range(range(61_000, 61_010))
    assert exc.value.reason == "service_uid"
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="nobody"):
        check_range(range(65_530, 65_540))
    account = pwd.getpwall()[-1]
    if account.pw_uid != 65534:
        with pytest.raises(ConfigError, match=f"\\({account.pw_name}\\).*an account of this host"):
            check_range(range(account.pw_uid, account.pw_uid + 1))
    pol = SandboxPolicy(enabled=True, uid_first=1, uids_per_pool=10)  # uid 1: daemon
    if any(p.pw_uid in range(1, 11) for p in pwd.getpwall()):
        with pytest.raises(ConfigError, match="an account of this host"):
            Sandbox(pol)
    Sandbox(replace(pol, enabled=False))  # commands off: the range is never used


def test_commands_are_off_by_default(work_root: Path) -> None:
    res = run([TRUE], SandboxPolicy(allow=(TRUE,), work_root=str(work_root)))
    assert (res.ok, res.reason) == (False, Outcome.DISABLED)
    assert not list(work_root.iterdir())


@pytest.mark.parametrize(
    "argv",
    [[], [""], [TRUE, "a\0b"], "true", [TRUE, 5], [TRUE, "x" * 200_000]],
    ids=["empty", "empty-name", "nul", "string", "non-str", "huge"],
)
def test_bad_argv_is_refused(argv: object, work_root: Path) -> None:
    res = asyncio.run(Sandbox(policy(work_root)).run(argv))  # type: ignore[arg-type]
    assert res.reason is Outcome.BAD_ARGV
    assert not list(work_root.iterdir())


@pytest.mark.parametrize(
    "name", ["/usr/bin/id", "./true", "bin/true", "no-such-program", "/nonexistent"]
)
def test_executables_off_the_allow_list_are_refused(name: str, work_root: Path) -> None:
    res = run([name], policy(work_root))
    assert res.reason is Outcome.NOT_ALLOWED
    assert not res.ok


def test_names_and_links_resolve_to_the_allowed_file(work_root: Path, tmp_path: Path) -> None:
    pol = policy(work_root)
    assert resolve("true", pol) == (Outcome.OK, os.path.realpath(TRUE))
    assert resolve(os.path.realpath(TRUE), pol)[0] is Outcome.OK
    link = tmp_path / "innocent"
    link.symlink_to("/usr/bin/id")
    assert resolve(str(link), pol)[0] is Outcome.NOT_ALLOWED


def test_an_allowed_executable_others_may_change_is_refused(tmp_path: Path) -> None:
    lax_file = tmp_path / "lax" / "true"
    lax_file.parent.mkdir()
    shutil.copy(TRUE, lax_file)
    os.chmod(lax_file, 0o777)
    lax_dir = tmp_path / "shared" / "true"
    lax_dir.parent.mkdir()
    os.chmod(lax_dir.parent, 0o777)
    shutil.copy(TRUE, lax_dir)
    os.chmod(lax_dir, 0o755)
    pol = SandboxPolicy(enabled=True, allow=(str(lax_file), str(lax_dir)), work_root="/tmp")
    for path in (lax_file, lax_dir):
        assert resolve(str(path), pol)[0] is Outcome.UNSAFE_EXECUTABLE


@spawns
def test_an_unreachable_work_root_is_refused(tmp_path: Path, pol: SandboxPolicy) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    assert run([TRUE], replace(pol, work_root=str(closed))).reason is Outcome.SPAWN_FAILED
    absent = replace(pol, work_root=str(tmp_path / "absent"))
    assert run([TRUE], absent).reason is Outcome.SPAWN_FAILED


@spawns
def test_commands_are_spawned_without_preexec_fn(
    pol: SandboxPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's process has threads (the executor, the event loop's): nothing of ours
    may run between its fork and exec.  The launcher is a fresh interpreter."""
    seen: list[tuple[list[str], dict[str, Any]]] = []
    real_popen = subprocess.Popen

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append((list(args[0]), kw))
        return real_popen(*args, **kw)

    monkeypatch.setattr(subprocess, "Popen", spy)
    assert sh("true", pol).ok
    ((argv, kw),) = seen
    assert kw.get("preexec_fn") is None
    assert argv[1:3] == ["-I", "-S"]
    assert argv[3].endswith("security/launch.py")
    assert argv[-3:] == [SH, "-c", "true"]


# ----------------------------------------------------------------- running
@spawns
def test_runs_as_a_uid_of_its_own_without_supplementary_groups(pol: SandboxPolicy) -> None:
    res = sh("id -u; id -g; id -G; grep NoNewPrivs /proc/self/status", pol)
    assert (res.ok, res.reason, res.exit_code) == (True, Outcome.OK, 0)
    assert res.uid in pol.uids(0)
    assert res.stdout.split() == [str(res.uid).encode()] * 3 + [b"NoNewPrivs:", b"1"]


@spawns
def test_environment_is_scrubbed(pol: SandboxPolicy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGHA_SECRET_FILE", "/root/.megha/secret")
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    res = run([ENV], replace(pol, path="/usr/bin:/bin"))
    assert res.ok
    env = dict(line.split("=", 1) for line in res.stdout.decode().splitlines())
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG"}
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["HOME"] == env["TMPDIR"]
    assert Path(env["HOME"]).parent.parent == Path(pol.work_root)


@spawns
def test_private_work_directory_removed_afterwards(pol: SandboxPolicy) -> None:
    res = sh('pwd; stat -c "%u %g %a" .; echo data > f; mkdir -p d/e; chmod 000 d', pol)
    assert res.ok, res
    cwd, owner = res.stdout.decode().splitlines()
    assert Path(cwd).parent.parent == Path(pol.work_root)
    assert owner == f"{res.uid} {res.uid} 700"
    assert not Path(cwd).exists()
    assert not list(Path(pol.work_root).iterdir())


@pytest.fixture
def open_to_all() -> Iterator[Path]:
    """A directory of the host anyone may write to (as /tmp is), off the scratch's paths."""
    path = Path(tempfile.mkdtemp(prefix="megha-open-", dir="/var/lib"))
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@spawns
def test_the_host_is_read_only_to_a_task(pol: SandboxPolicy, open_to_all: Path) -> None:
    """Nothing a task writes outlives it: not even where the host lets everyone write."""
    tag = f"megha-{os.getpid()}-{random.randrange(10**9)}"
    script = f"touch /var/tmp/{tag} /dev/shm/{tag} /tmp/{tag} && touch {open_to_all}/x || exit 3"
    res = sh(script, pol)
    assert (res.reason, res.exit_code) == (Outcome.EXIT_STATUS, 3), res
    assert b"Read-only file system" in res.stderr_tail
    assert not list(open_to_all.iterdir())
    for where in ("/var/tmp", "/dev/shm", "/tmp"):  # written in the task's own scratch
        assert not Path(where, tag).exists()


@spawns
def test_exit_status_and_stderr_tail(pol: SandboxPolicy) -> None:
    res = run(["/bin/false"], pol)
    assert (res.ok, res.reason, res.exit_code) == (False, Outcome.EXIT_STATUS, 1)
    res = sh("echo out; echo oops >&2; exit 3", pol)
    assert (res.reason, res.exit_code, res.stdout, res.stderr_tail) == (
        Outcome.EXIT_STATUS,
        3,
        b"out\n",
        b"oops\n",
    )


@spawns
def test_output_is_truncated(pol: SandboxPolicy) -> None:
    res = sh(
        "yes | head -c 300000; i=0; while [ $i -lt 500 ]; do echo line$i >&2; i=$((i+1)); done",
        replace(pol, max_output_bytes=1000),
    )
    assert res.ok
    assert res.stdout == b"y\n" * 500
    assert res.stdout_truncated
    assert len(res.stderr_tail) == 1000
    assert res.stderr_tail.endswith(b"line499\n")
    assert res.stderr_truncated


@spawns
def test_a_timeout_kills_the_whole_process_group(pol: SandboxPolicy) -> None:
    res = sh("sleep 60 & echo $!; while :; do :; done", replace(pol, timeout_s=1.0))
    assert (res.ok, res.reason) == (False, Outcome.TIMEOUT)
    assert not alive(int(res.stdout))
    assert not list(Path(pol.work_root).iterdir())


@spawns
def test_nothing_outlives_its_task(pol: SandboxPolicy) -> None:
    res = sh("sleep 60 & echo $!", pol)
    assert res.ok
    assert not alive(int(res.stdout))


@spawns
def test_cpu_limit(pol: SandboxPolicy) -> None:
    res = sh("while :; do :; done", replace(pol, cpu_s=1, timeout_s=60))
    assert (res.ok, res.reason) == (False, Outcome.CPU_LIMIT)


@spawns
def test_every_rlimit_is_set(pol: SandboxPolicy) -> None:
    limited = replace(
        pol,
        cpu_s=7,
        open_files=16,
        processes=9,
        address_space_bytes=256 << 20,
        file_size_bytes=1 << 20,
    )
    res = sh("ulimit -a", limited)
    assert res.ok, res
    limits = {
        line.rsplit(None, 1)[0]: line.rsplit(None, 1)[1]
        for line in res.stdout.decode().splitlines()
    }
    assert limits["time(seconds)"] == "7"
    assert limits["nofiles"] == "16"
    assert limits["process"] == "9"
    assert limits["vmemory(kbytes)"] == str(256 << 10)
    assert limits["file(blocks)"] == str((1 << 20) // 512)
    assert limits["coredump(blocks)"] == "0"


@spawns
def test_file_size_limit_bounds_output(pol: SandboxPolicy) -> None:
    res = run([HEAD, "-c", "300000", "/dev/zero"], replace(pol, file_size_bytes=100_000))
    assert (res.ok, res.reason) == (False, Outcome.FILE_SIZE_LIMIT)


@spawns
def test_address_space_limit(pol: SandboxPolicy) -> None:
    if not os.path.exists(PYTHON):
        pytest.skip("no system python to allocate with")
    limited = replace(pol, allow=(PYTHON,), address_space_bytes=256 << 20)
    res = run([PYTHON, "-c", "b = bytearray(512 << 20)"], limited)
    assert (res.ok, res.reason) == (False, Outcome.EXIT_STATUS)
    assert b"MemoryError" in res.stderr_tail
    assert run([PYTHON, "-c", "b = bytearray(16 << 20)"], limited).ok


@spawns
def test_processes_are_limited(pol: SandboxPolicy) -> None:
    res = sh("for i in 1 2 3 4 5 6 7 8 9 10; do sleep 30 & done; wait", replace(pol, processes=5))
    assert not res.ok
    assert b"fork" in res.stderr_tail.lower()
    assert block_is_empty(pol)


@spawns
def test_a_fork_bomb_is_contained_and_cleaned_up(pol: SandboxPolicy) -> None:
    # the shell waits by becoming sleep (exec: no fork, which the bomb's children may
    # have used up: a loop forking sleep died of "Cannot fork" before the timeout)
    bomb = "bomb() { bomb | bomb & }; bomb; exec sleep 60"
    res = sh(bomb, replace(pol, processes=12, timeout_s=2.0))
    assert res.reason is Outcome.TIMEOUT
    assert b"Cannot fork" in res.stderr_tail  # RLIMIT_NPROC held it
    assert block_is_empty(pol)
    assert not list(Path(pol.work_root).iterdir())


@spawns
def test_processes_that_left_the_group_are_killed_at_the_end(pol: SandboxPolicy) -> None:
    # the escapee is its own session leader (setsid) before the task ends
    script = (
        "setsid sleep 60 > /dev/null 2>&1 & p=$!; "
        'while [ "$(cut -d" " -f6 /proc/$p/stat)" != "$p" ]; do sleep 0.01; done; echo $p'
    )
    res = sh(script, pol)
    assert res.ok, res
    escapee = int(res.stdout)
    assert not alive(escapee)
    assert processes_of(res.uid or 0) == []


@spawns
def test_cancelling_the_run_kills_the_command(pol: SandboxPolicy) -> None:
    async def stop_once_it_runs() -> list[int]:
        started = asyncio.Event()
        box = Sandbox(pol)
        run = asyncio.create_task(box.run([SLEEP, "60"], on_start=started.set))
        await asyncio.wait_for(started.wait(), 30)
        (uid,) = box.uids.leased
        pids = [await _until_running(uid, "sleep")]
        run.cancel()
        await asyncio.sleep(0)
        run.cancel()  # stopped twice over: the clean-up still runs whole, in order
        with pytest.raises(asyncio.CancelledError):
            await run
        assert box.uids.gauges()["sandbox_uids_leased"] == 0
        return pids

    pids = asyncio.run(stop_once_it_runs())
    assert pids
    assert not any(alive(p) for p in pids)
    assert block_is_empty(pol)
    assert not list(Path(pol.work_root).iterdir())


# ---------------------------------------------------------- tenants, one uid each
def _pid_of(uid: int, comm: str) -> int | None:
    for pid in processes_of(uid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                return pid
    return None


async def _until_running(uid: int, comm: str) -> int:
    """The pid of ``comm`` once it runs as ``uid``."""
    for _ in range(3000):
        pid = _pid_of(uid, comm)
        if pid is not None:
            return pid
        await asyncio.sleep(0.01)
    raise AssertionError(f"{comm} never ran as {uid}")


async def _tenant_a(box: Sandbox) -> tuple[asyncio.Task[CommandResult], int, int]:
    """User A's task, running: files in its /tmp and /dev/shm, then a sleep.  Its run,
    uid and the pid of its sleep."""
    started = asyncio.Event()
    script = "echo secret > /tmp/a-file; echo secret > /dev/shm/a-shm; exec sleep 60"
    run = asyncio.create_task(box.run([SH, "-c", script], on_start=started.set))
    await asyncio.wait_for(started.wait(), 30)
    (uid,) = box.uids.leased
    return run, uid, await _until_running(uid, "sleep")


@spawns
def test_a_tenant_cannot_touch_another_tenants_task(pol: SandboxPolicy) -> None:
    """Users A and B at once: B cannot signal A, read A's /proc/<pid>/cwd or environ,
    or see A's /tmp and /dev/shm; A runs on, untouched."""

    async def both() -> tuple[CommandResult, bool, int, int]:
        box = Sandbox(pol)
        a, a_uid, a_pid = await _tenant_a(box)
        b = await box.run(
            [SH, "-c",
             f"kill -9 {a_pid}; echo kill=$?; kill -9 -1; "
             f"ls /proc/{a_pid}/cwd/; echo cwd=$?; cat /proc/{a_pid}/environ; echo env=$?; "
             "cat /tmp/a-file /dev/shm/a-shm; echo files=$?; ls -A /tmp /dev/shm; "
             "ls /proc | grep -c '^[0-9]'"],
        )  # fmt: skip
        a_alive = alive(a_pid)
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        return b, a_alive, a_uid, a_pid

    b, a_alive, a_uid, a_pid = asyncio.run(both())
    assert a_alive, "B's task killed A's"
    assert b.ok, b
    assert b.uid != a_uid
    out = b.stdout.decode()
    for step in ("kill", "cwd", "env", "files"):
        assert f"{step}=0" not in out, (step, out, b.stderr_tail)
    assert "a-file" not in out
    assert "a-shm" not in out
    assert "secret" not in out
    assert int(out.split()[-1]) <= 4  # /proc shows B its own processes only
    assert not alive(a_pid)
    assert block_is_empty(pol)


@spawns
def test_the_end_of_one_task_kills_nothing_of_another(pol: SandboxPolicy) -> None:
    """B leaves a process behind in a session of its own: B's end kills it, and every
    other process of B's uid; A's task, running meanwhile, is untouched."""

    async def both() -> tuple[CommandResult, bool]:
        box = Sandbox(pol)
        a, _, a_pid = await _tenant_a(box)
        b = await box.run([SH, "-c", "setsid sleep 60 > /dev/null 2>&1 & sleep 0.2; echo $!"])
        a_alive = alive(a_pid)
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        return b, a_alive

    b, a_alive = asyncio.run(both())
    assert b.ok, b
    assert not alive(int(b.stdout))
    assert a_alive
    assert block_is_empty(pol)


@spawns
def test_scratch_is_bounded_in_all_and_gone_after_the_task(pol: SandboxPolicy) -> None:
    """RLIMIT_FSIZE bounds one file; the scratch bounds them all: /tmp, /dev/shm and the
    work directory share ``scratch_bytes`` (and ``scratch_files`` inodes)."""
    small = replace(pol, scratch_bytes=1 << 20, scratch_files=64)
    script = (
        "head -c 400000 /dev/zero > /tmp/a && head -c 400000 /dev/zero > /dev/shm/b "
        "&& head -c 400000 /dev/zero > ./c; echo third=$?; rm -f /tmp/a /dev/shm/b ./c; "
        "i=0; while [ $i -lt 100 ] && true 2>/dev/null > /tmp/f$i; do i=$((i+1)); done; "
        "echo files=$i; grep -c megha-scratch /proc/self/mountinfo"
    )
    res = sh(script, small)
    assert res.ok, res
    third, files, mounts = res.stdout.decode().split()
    assert third == "third=1"  # the third 400 KB no longer fit in 1 MiB
    assert b"No space left on device" in res.stderr_tail
    assert 40 < int(files.split("=")[1]) < 64  # the inodes ran out
    assert int(mounts) >= 4  # the scratch: holder, /tmp, /var/tmp, /dev/shm
    procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    assert not any(_mounts_scratch(p, pol.work_root) for p in procs)
    again = sh("ls -A /tmp /dev/shm | grep -c '^f[0-9]'", small)  # the same uid: a new scratch
    assert again.uid == res.uid or len(pol.uids(0)) > 1
    assert again.stdout.strip() == b"0"


def _mounts_scratch(proc: Path, under: str) -> bool:
    """Whether process ``proc`` still has a scratch mounted under ``under`` (this test's
    work root: other tests' tasks may hold theirs meanwhile)."""
    try:
        lines = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any("megha-scratch" in ln and ln.split()[4].startswith(under) for ln in lines)


@spawns
def test_no_network_unless_the_operator_allows_it(pol: SandboxPolicy) -> None:
    """A listener on the host's loopback: unreachable from a task by default (its own
    namespace has only a loopback of its own, up), reachable with ``host_network``."""
    if not os.path.exists(PYTHON):
        pytest.skip("no system python to connect with")
    connect = (
        "import socket, sys\n"
        "own = socket.create_server(('127.0.0.1', 0))\n"
        "socket.create_connection(own.getsockname(), timeout=5).close()\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5).close()\n"
        "    print('reached')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    with socket.create_server(("127.0.0.1", 0)) as host:
        port = str(host.getsockname()[1])
        allowed = replace(pol, allow=(PYTHON,))
        cut = run([PYTHON, "-c", connect, port], allowed)
        reached = run([PYTHON, "-c", connect, port], replace(allowed, host_network=True))
    assert cut.ok, cut
    assert reached.ok, reached
    assert cut.stdout.split()[0] == b"refused"
    assert reached.stdout == b"reached\n"


@spawns
def test_an_exhausted_uid_range_refuses_the_next_task(pol: SandboxPolicy) -> None:
    one = replace(pol, uids_per_pool=1)

    async def two_at_once() -> tuple[CommandResult, CommandResult, Sandbox]:
        box = Sandbox(one)
        a, _, _ = await _tenant_a(box)
        b = await box.run([TRUE])
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        return b, await box.run([TRUE]), box

    b, later, box = asyncio.run(two_at_once())
    assert (b.ok, b.reason, b.uid) == (False, Outcome.NO_UID, None)
    assert f"all 1 uids of this pool ({one.uid_first}-{one.uid_first})" in b.detail
    assert "1 by running tasks" in b.detail
    assert box.uids.counters["sandbox_uids_exhausted"] == 1
    assert later.ok
    assert later.uid == one.uid_first


@spawns
def test_a_uid_is_leased_again_only_once_its_processes_are_gone(pol: SandboxPolicy) -> None:
    """One uid: A's escapee dies with A, so B -- the same uid -- sees no process of A."""
    one = replace(pol, uids_per_pool=1)

    async def one_after_the_other() -> tuple[CommandResult, CommandResult]:
        box = Sandbox(one)
        a = await box.run([SH, "-c", "setsid sleep 60 > /dev/null 2>&1 & sleep 0.2; echo $!"])
        b = await box.run([SH, "-c", "ps -eo pid=,comm="])
        return a, b

    a, b = asyncio.run(one_after_the_other())
    assert a.uid == b.uid == one.uid_first
    assert not alive(int(a.stdout))
    assert b.stdout.decode().split()[1::2] == [Path(os.path.realpath(SH)).name, "ps"]


def test_a_uid_whose_processes_will_not_die_stays_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A uid goes back to the free ones only once none of its processes is left."""
    survivors = {61_000: 1}  # processes of the uid that survive each round of kills
    monkeypatch.setattr(uid_leases, "KILL_ROUNDS", 3)
    monkeypatch.setattr(uid_leases, "kill_round", lambda uid: survivors.get(uid, 0))
    monkeypatch.setattr(uid_leases, "scan", lambda uids: {})

    async def leases() -> list[int | None]:
        pool = UidPool(range(61_000, 61_001), str(tmp_path / "locks"))
        got = [await pool.lease()]
        assert got[0] is not None
        await pool.release(got[0])  # its processes survive: draining
        assert pool.gauges()["sandbox_uids_draining"] == 1
        got.append(await pool.lease())
        assert "1 by processes still dying" in pool.why_none()
        survivors.clear()  # gone at last
        got.append(await pool.lease())
        return got

    assert asyncio.run(leases()) == [61_000, None, 61_000]


@spawns
def test_a_dead_pools_orphans_are_ended_and_foreign_processes_spared(
    pol: SandboxPolicy,
) -> None:
    """The lock file of a uid says "leased" but nobody holds its lock: the pool that
    leased it died with its task running; those processes are killed before the uid
    is used.  A process of the range that no pool leased is never killed."""
    orphan_uid, foreign_uid = pol.uid_first, pol.uid_first + 1
    locks = Path(pol.lock_dir)
    locks.mkdir(mode=0o700)
    (locks / str(orphan_uid)).write_bytes(uid_leases.LEASED)
    pids = [_orphan(uid) for uid in (orphan_uid, foreign_uid)]
    try:
        box = Sandbox(pol)
        asyncio.run(box.uids.open())
        assert not alive(pids[0])  # the orphan
        assert alive(pids[1])  # the foreign process, spared
        assert box.uids.foreign == {foreign_uid}
        assert box.uids.counters["sandbox_orphans_ended"] == 1
        assert foreign_uid not in box.uids.free
        assert orphan_uid in box.uids.free
    finally:
        uid_leases.kill_round(foreign_uid)


def _orphan(uid: int) -> int:
    """A process of ``uid`` whose parent has exited (as a dead pool's task's would be)."""
    out = subprocess.run(
        [SH, "-c", "sleep 60 > /dev/null 2>&1 & echo $!"],
        user=uid, group=uid, extra_groups=[], capture_output=True, check=True,
    )  # fmt: skip
    return int(out.stdout)


@spawns
def test_a_uid_locked_by_another_pool_is_skipped(pol: SandboxPolicy) -> None:
    """Two pools whose ranges overlap never lease the same uid at once."""
    one = replace(pol, uids_per_pool=2)

    async def two_pools() -> tuple[int | None, int | None, int | None]:
        first, second = UidPool(one.uids(0), one.lock_dir), UidPool(one.uids(0), one.lock_dir)
        a = await first.lease()
        b = await second.lease()
        c = await second.lease()
        return a, b, c

    a, b, c = asyncio.run(two_pools())
    assert {a, b} == set(one.uids(0))
    assert c is None


@spawns
def test_a_command_starts_while_many_run(pol: SandboxPolicy) -> None:
    """More commands running than the default executor has threads, and one more still
    starts: a running command holds no thread (the pool used to wait for each in one,
    so a new command waited for one of them to end)."""
    threads = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    many = replace(pol, uid_first=spare_block(threads + 1), uids_per_pool=threads + 1)

    async def all_started() -> int:
        box = Sandbox(many)
        started = asyncio.Semaphore(0)
        runs = []
        for n in range(threads + 1):
            runs.append(asyncio.create_task(box.run([SLEEP, "60"], on_start=started.release)))
            if n == threads - 1:  # the first ones run: then the last one
                for _ in range(threads):
                    await asyncio.wait_for(started.acquire(), 30)
        await asyncio.wait_for(started.acquire(), 30)
        running = box.uids.gauges()["sandbox_uids_leased"]
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        return running

    assert asyncio.run(all_started()) == threads + 1
    assert block_is_empty(many)
