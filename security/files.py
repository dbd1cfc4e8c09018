"""Private files: secrets, token hashes and broker passwords on disk.

Guarantees: a file written here is created with mode 0600 from its first byte
(never chmod-ed after the fact), is replaced atomically (a reader sees the old
content or the new, never a mix; a crash leaves no partial file), and is made
durable (fsync of the file and its directory) before the call returns.  A file
read here is refused unless it is a regular file (not a symlink), owned by this
process's effective user, with no group or other permission bits.

An orchestrator mounts secrets its own way: a Kubernetes secret volume holds
root-owned files (``defaultMode``, plus group read for ``fsGroup``) behind
``..data`` symlinks.  With ``MEGHA_SECRET_MOUNTED=1`` (set by the manifests, never
by ``megha up``) a file is also accepted when it is what such a mount gives and
nothing a local user could have made: on a read-only mount, reached through
symlinks that stay inside its own directory, owned by root or by this process,
writable by nobody, readable by no "other" and by a group only if this process
is in it (``check_mounted``).  The single-host rule above is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from common.errors import ConfigError

PRIVATE_MODE = 0o600
MOUNTED_ENV = "MEGHA_SECRET_MOUNTED"
"""Set to 1 by orchestrator manifests whose secret files are mounted read-only."""
MOUNTED_MODE_BITS = 0o440
"""The only permission bits a mounted file may have: read for its owner and group."""


def mounted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process's secret files come from an orchestrator's read-only mount."""
    return environ.get(MOUNTED_ENV, "") not in ("", "0")


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) mode 0700 if absent; an existing one is kept as is."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _write_temp(directory: Path, name: str, data: bytes) -> Path:
    tmp = directory / f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)  # the umask may only have narrowed it; make it exact
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``, mode 0600."""
    tmp = _write_temp(path.parent, path.name, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def create_private(path: Path, data: bytes) -> None:
    """Atomically create ``path`` with ``data``, mode 0600; ``FileExistsError`` if it exists.

    The content is complete before the name appears (``link`` of a finished temp
    file), so a concurrent reader never sees a half-written secret."""
    tmp = _write_temp(path.parent, path.name, data)
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def check_private(st: os.stat_result, path: Path) -> None:
    """Raise ``ConfigError`` unless ``st`` describes a private regular file of ours."""
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is not a regular file", reason="file_not_regular")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"{path} belongs to uid {st.st_uid}, not to this process (uid {os.geteuid()})",
            reason="file_wrong_owner",
        )
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: other users may read or change "
            f"it; run `chmod 600 {path}` (and consider the secret in it exposed)",
            reason="file_not_private",
        )


def check_mounted(
    st: os.stat_result,
    path: Path,
    *,
    read_only_mount: bool,
    euid: int,
    groups: Iterable[int],
) -> None:
    """Raise ``ConfigError`` unless ``st`` is a secret an orchestrator mounted for a
    process of ``euid`` in ``groups``: see the module docstring."""
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path} is not a regular file", reason="file_not_regular")
    if not read_only_mount:
        raise ConfigError(
            f"{path} is not on a read-only mount: {MOUNTED_ENV} accepts only files an "
            "orchestrator mounted read-only (elsewhere, make the file 0600 and ours)",
            reason="file_not_mounted",
        )
    if st.st_uid not in (0, euid):
        raise ConfigError(
            f"{path} belongs to uid {st.st_uid}: a mounted secret must belong to root or "
            f"to this process (uid {euid})",
            reason="file_wrong_owner",
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o222:
        raise ConfigError(
            f"{path} has mode {mode:04o}: a mounted secret must be read-only "
            "(Kubernetes: defaultMode: 0400)",
            reason="file_writable",
        )
    if mode & ~MOUNTED_MODE_BITS or (mode & 0o040 and st.st_gid not in set(groups)):
        raise ConfigError(
            f"{path} has mode {mode:04o} (gid {st.st_gid}): others, or a group this process "
            "is not in, may read it",
            reason="file_not_private",
        )


def _on_read_only_mount(fd: int) -> bool:
    return bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)


def _mounted_target(path: Path) -> Path:
    """Where ``path`` leads; symlinks (Kubernetes' ``..data``) must stay in its directory."""
    real = Path(os.path.realpath(path))
    home = Path(os.path.realpath(path.parent))
    if real == home or not real.is_relative_to(home):
        raise ConfigError(
            f"{path} leads to {real}, outside {path.parent}", reason="file_not_regular"
        )
    return real


def read_private(path: Path, *, mounted_ok: bool | None = None) -> bytes:
    """Read a private file, refusing a symlink or one others may read or write.

    ``mounted_ok`` (default: ``$MEGHA_SECRET_MOUNTED``) also accepts a file an
    orchestrator mounted (``check_mounted``)."""
    if mounted_ok is None:
        mounted_ok = mounted()
    target = _mounted_target(path) if mounted_ok else path
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist", reason="file_missing") from None
    except OSError as exc:  # ELOOP: a symlink
        raise ConfigError(
            f"cannot open {path}: {exc.strerror}", reason="file_not_regular"
        ) from None
    with contextlib.closing(os.fdopen(fd, "rb")) as f:
        st = os.fstat(fd)
        try:
            check_private(st, path)
        except ConfigError:
            if not mounted_ok:
                raise
            check_mounted(
                st,
                path,
                read_only_mount=_on_read_only_mount(fd),
                euid=os.geteuid(),
                groups={os.getegid(), *os.getgroups()},
            )
        return f.read()
