"""Private files: secrets, token hashes and broker passwords on disk.

Guarantees: a file written here is created with mode 0600 from its first byte
(never chmod-ed after the fact), is replaced atomically (a reader sees the old
content or the new, never a mix; a crash leaves no partial file), and is made
durable (fsync of the file and its directory) before the call returns.  A file
read here is refused unless it is a regular file (not a symlink), owned by this
process's effective user, with no group or other permission bits.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from common.errors import ConfigError

PRIVATE_MODE = 0o600


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


def read_private(path: Path) -> bytes:
    """Read a private file, refusing a symlink or one others may read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist", reason="file_missing") from None
    except OSError as exc:  # ELOOP: a symlink
        raise ConfigError(
            f"cannot open {path}: {exc.strerror}", reason="file_not_regular"
        ) from None
    with contextlib.closing(os.fdopen(fd, "rb")) as f:
        check_private(os.fstat(fd), path)
        return f.read()
