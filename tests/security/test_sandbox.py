"""Task commands: refused with a reason unless allowed; unprivileged, limited, cleaned up.

Tests that spawn (marker ``sandbox``) need root: they run real executables as
``nobody`` (65534), or -- where every process of the uid is counted or killed
(RLIMIT_NPROC, ``dedicated_uid``) -- as a uid no account and no process uses.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from common.errors import ConfigError
from security.sandbox import (
    NOBODY,
    CommandResult,
    Outcome,
    SandboxPolicy,
    processes_of,
    resolve,
    run_command,
)

F = TypeVar("F", bound=Callable[..., object])
SH, TRUE, ENV, HEAD, SLEEP = (
    "/bin/sh",
    "/bin/true",
    "/usr/bin/env",
    "/usr/bin/head",
    "/usr/bin/sleep",
)
PYTHON = "/usr/bin/python3"


def spawns(test: F) -> F:
    marked = pytest.mark.sandbox(test)
    return pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")(marked)  # type: ignore[no-any-return]


@pytest.fixture
def work_root() -> Iterator[Path]:
    """Under /tmp, reachable by any uid (pytest's tmp_path is root-only)."""
    root = Path(tempfile.mkdtemp(prefix="megha-sandbox-test-"))
    os.chmod(root, 0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def spare_uid() -> int:
    """A uid of no account and no process: safe to count and kill all of its processes."""
    for _ in range(100):
        uid = random.randrange(61_000, 62_000)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if not processes_of(uid):
                return uid
    pytest.skip("no spare uid")


def policy(work_root: Path, **kw: object) -> SandboxPolicy:
    base = SandboxPolicy(
        enabled=True,
        allow=(SH, TRUE, ENV, HEAD, SLEEP, "/bin/false"),
        uid=NOBODY,
        gid=NOBODY,
        cpu_s=30,
        timeout_s=20.0,
        work_root=str(work_root),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def run(argv: list[str], pol: SandboxPolicy) -> CommandResult:
    return asyncio.run(run_command(argv, pol))


def sh(script: str, pol: SandboxPolicy) -> CommandResult:
    return run([SH, "-c", script], pol)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ------------------------------------------------------ policy and refusals
def test_a_policy_never_runs_commands_as_root() -> None:
    for kw in ({"uid": 0}, {"gid": 0}):
        with pytest.raises(ConfigError) as exc:
            SandboxPolicy(enabled=True, allow=(TRUE,), **kw)  # type: ignore[arg-type]
        assert exc.value.reason == "root_uid"


@pytest.mark.parametrize(
    "kw",
    [
        {"allow": ("true",)},
        {"allow": ["/bin/true"]},
        {"cpu_s": 0},
        {"processes": -1},
        {"uid": True},
        {"timeout_s": 0},
        {"work_root": "relative"},
        {"path": "/bin:bin"},
        {"dedicated_uid": True},  # with uid nobody
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
    res = asyncio.run(run_command(argv, policy(work_root)))  # type: ignore[arg-type]
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


def test_the_services_own_uid_is_refused(work_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: NOBODY)  # a service running as nobody
    assert run([TRUE], policy(work_root)).reason is Outcome.SERVICE_UID


@spawns
def test_an_unreachable_work_root_is_refused(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    assert run([TRUE], policy(closed)).reason is Outcome.SPAWN_FAILED
    assert run([TRUE], policy(tmp_path / "absent")).reason is Outcome.SPAWN_FAILED


# ----------------------------------------------------------------- running
@spawns
def test_runs_unprivileged_without_supplementary_groups(work_root: Path) -> None:
    res = sh("id -u; id -g; id -G", policy(work_root))
    assert (res.ok, res.reason, res.exit_code) == (True, Outcome.OK, 0)
    assert res.stdout.split() == [b"65534"] * 3


@spawns
def test_environment_is_scrubbed(work_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGHA_SECRET_FILE", "/root/.megha/secret")
    monkeypatch.setenv("LD_PRELOAD", "/tmp/evil.so")
    res = run([ENV], policy(work_root, path="/usr/bin:/bin"))
    assert res.ok
    env = dict(line.split("=", 1) for line in res.stdout.decode().splitlines())
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG"}
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["HOME"] == env["TMPDIR"]
    assert Path(env["HOME"]).parent.parent == work_root


@spawns
def test_private_work_directory_removed_afterwards(work_root: Path) -> None:
    res = sh(
        'pwd; stat -c "%u %g %a" .; echo data > f; mkdir -p d/e; chmod 000 d', policy(work_root)
    )
    assert res.ok, res
    cwd, owner = res.stdout.decode().splitlines()
    assert Path(cwd).parent.parent == work_root
    assert owner == "65534 65534 700"
    assert not Path(cwd).exists()
    assert not list(work_root.iterdir())


@spawns
def test_exit_status_and_stderr_tail(work_root: Path) -> None:
    res = run(["/bin/false"], policy(work_root))
    assert (res.ok, res.reason, res.exit_code) == (False, Outcome.EXIT_STATUS, 1)
    res = sh("echo out; echo oops >&2; exit 3", policy(work_root))
    assert (res.reason, res.exit_code, res.stdout, res.stderr_tail) == (
        Outcome.EXIT_STATUS,
        3,
        b"out\n",
        b"oops\n",
    )


@spawns
def test_output_is_truncated(work_root: Path) -> None:
    pol = policy(work_root, max_output_bytes=1000)
    res = sh(
        "yes | head -c 300000; i=0; while [ $i -lt 500 ]; do echo line$i >&2; i=$((i+1)); done", pol
    )
    assert res.ok
    assert res.stdout == b"y\n" * 500
    assert res.stdout_truncated
    assert len(res.stderr_tail) == 1000
    assert res.stderr_tail.endswith(b"line499\n")
    assert res.stderr_truncated


@spawns
def test_a_timeout_kills_the_whole_process_group(work_root: Path) -> None:
    res = sh("sleep 60 & echo $!; while :; do :; done", policy(work_root, timeout_s=0.5))
    assert (res.ok, res.reason) == (False, Outcome.TIMEOUT)
    assert not alive(int(res.stdout))
    assert not list(work_root.iterdir())


@spawns
def test_nothing_outlives_its_task(work_root: Path) -> None:
    res = sh("sleep 60 & echo $!", policy(work_root))
    assert res.ok
    assert not alive(int(res.stdout))


@spawns
def test_cpu_limit(work_root: Path) -> None:
    res = sh("while :; do :; done", policy(work_root, cpu_s=1, timeout_s=60))
    assert (res.ok, res.reason) == (False, Outcome.CPU_LIMIT)


@spawns
def test_every_rlimit_is_set(work_root: Path) -> None:
    pol = policy(
        work_root,
        cpu_s=7,
        open_files=16,
        processes=9,
        address_space_bytes=256 << 20,
        file_size_bytes=1 << 20,
    )
    res = sh("ulimit -a", pol)
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
def test_file_size_limit_bounds_output(work_root: Path) -> None:
    res = run([HEAD, "-c", "300000", "/dev/zero"], policy(work_root, file_size_bytes=100_000))
    assert (res.ok, res.reason) == (False, Outcome.FILE_SIZE_LIMIT)


@spawns
def test_address_space_limit(work_root: Path) -> None:
    if not os.path.exists(PYTHON):
        pytest.skip("no system python to allocate with")
    pol = policy(work_root, allow=(PYTHON,), address_space_bytes=256 << 20)
    res = run([PYTHON, "-c", "b = bytearray(512 << 20)"], pol)
    assert (res.ok, res.reason) == (False, Outcome.EXIT_STATUS)
    assert b"MemoryError" in res.stderr_tail
    assert run([PYTHON, "-c", "b = bytearray(16 << 20)"], pol).ok


@spawns
def test_processes_are_limited(work_root: Path, spare_uid: int) -> None:
    pol = policy(work_root, uid=spare_uid, gid=spare_uid, processes=5, dedicated_uid=True)
    res = sh("for i in 1 2 3 4 5 6 7 8 9 10; do sleep 30 & done; wait", pol)
    assert not res.ok
    assert b"fork" in res.stderr_tail.lower()
    assert processes_of(spare_uid) == []


@spawns
def test_a_fork_bomb_is_contained_and_cleaned_up(work_root: Path, spare_uid: int) -> None:
    pol = policy(
        work_root, uid=spare_uid, gid=spare_uid, processes=12, timeout_s=2.0, dedicated_uid=True
    )
    res = sh("bomb() { bomb | bomb & }; bomb; while :; do sleep 1; done", pol)
    assert res.reason is Outcome.TIMEOUT
    assert b"Cannot fork" in res.stderr_tail  # RLIMIT_NPROC held it
    assert processes_of(spare_uid) == []
    assert not list(work_root.iterdir())


@spawns
def test_a_dedicated_uid_kills_processes_that_left_the_group(
    work_root: Path, spare_uid: int
) -> None:
    pol = policy(work_root, uid=spare_uid, gid=spare_uid, dedicated_uid=True)
    res = sh("setsid sleep 60 > /dev/null 2>&1 & echo started", pol)
    assert res.ok
    assert processes_of(spare_uid) == []


@spawns
def test_cancelling_the_task_kills_the_command(work_root: Path, spare_uid: int) -> None:
    pol = policy(work_root, uid=spare_uid, gid=spare_uid, dedicated_uid=True)

    async def stop_early() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run_command([SLEEP, "60"], pol), 0.5)

    asyncio.run(stop_early())
    assert processes_of(spare_uid) == []
    assert not list(work_root.iterdir())
