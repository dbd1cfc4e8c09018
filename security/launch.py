"""The first process of a task's command: namespaces, mounts, rlimits and uid, then exec.

``security.sandbox`` starts ``python -I -S launch.py SPEC ARGV...`` (SPEC: a dict,
``marshal``-ed by the same interpreter, in hex) as root in a new
session; this file runs alone in that fresh, single-threaded interpreter (the standard
library only: ``-I -S`` gives it no site-packages and no path of ours), so nothing runs
between fork and exec in the pool's own, threaded, process (no ``preexec_fn``).  In
order, each step failing closed:

1. new mount and IPC namespaces, and a new network namespace (only a loopback, brought
   up) unless the policy allows the host network;
2. every mount made private, then read-only for the task (bind-remounted, keeping
   nosuid/nodev/noexec): the task writes nowhere on the host but through the output
   files it was given;
3. one tmpfs of ``scratch_bytes`` and ``scratch_files`` inodes on the task's holder
   directory, holding its work directory (0700, its own) and the directories bound on
   ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (1777): together bounded, seen by no other
   task, gone with the namespace when the task's last process ends;
4. ``/proc`` mounted afresh with ``hidepid=invisible``: the task sees its own
   processes only (per-mount proc options need Linux 5.8);
5. the rlimits, SIGPIPE and SIGXFSZ back to their default action (Python ignores
   them, and an ignored signal stays ignored across exec: RLIMIT_FSIZE would not
   kill), ``no_new_privs`` (no setuid or file-capability executable gains
   anything), no supplementary groups, the task's gid and uid (real, effective and
   saved), its work directory, then ``execve`` with its environment.

Before the exec, a failure writes ``step: error`` to the status descriptor the pool
passed and exits 127; the exec closes that descriptor (close-on-exec), so the pool
reads end of file with nothing written once the command runs.
"""

from __future__ import annotations

# Only modules that are built in or cheap: under load, json, socket and signal (with the
# re and enum they pull in) made up most of the launcher's start-up.
import _signal  # type: ignore[import-not-found]  # (no stubs) signal without its enum
import _socket
import ctypes
import fcntl
import marshal
import os
import resource
import sys

TYPE_CHECKING = False  # typing itself (with the re it imports) costs more than the rest
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x00020000, 0x08000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
KEPT_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}  # fmt: skip
"""Per-mount flags a read-only bind remount must repeat (else it would clear them)."""
PR_SET_NO_NEW_PRIVS = 38
SIOCSIFFLAGS, IFF_UP = 0x8914, 0x1
SCRATCH_DIRS = (("tmp", ("/tmp", "/var/tmp")), ("shm", ("/dev/shm",)))

_libc = ctypes.CDLL(None, use_errno=True)


class Step(Exception):
    """A step that failed: the launch is refused with what and why."""


def _call(what: str, ret: int) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise Step(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(what: str, source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:  # fmt: skip
    def c(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    _call(what, _libc.mount(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data)))


def _unescape(field: str) -> str:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes."""
    return os.fsdecode(field.encode().decode("unicode_escape").encode("latin-1"))


def read_only_everywhere() -> None:
    """Remount every mount this namespace sees read-only (a copy: the host's stay as
    they are).  A mount point gone since (deleted under a mount) is skipped."""
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in lines:
        fields = line.split()
        target, options = _unescape(fields[4]), fields[5].split(",")
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for opt in options:
            flags |= KEPT_FLAGS.get(opt, 0)
        try:
            _mount(f"read-only {target}", None, target, None, flags)
        except Step:
            if os.path.lexists(target):
                raise


def scratch(spec: dict[str, Any]) -> None:
    """One tmpfs for everything the task may write: its work directory and the
    directories bound on /tmp, /var/tmp and /dev/shm.  Mounted on the holder, and
    bound there again when the holder itself lay under one of those."""
    holder, work = spec["holder"], spec["work"]
    data = f"size={spec['scratch_bytes']},nr_inodes={spec['scratch_files']},mode=0711"
    _mount(f"tmpfs on {holder}", "megha-scratch", holder, "tmpfs", MS_NOSUID | MS_NODEV, data)
    root = os.open(holder, os.O_PATH | os.O_DIRECTORY)
    here = f"/proc/self/fd/{root}"  # the scratch, wherever the binds below put /tmp
    os.mkdir(work, 0o700)
    os.chown(work, spec["uid"], spec["gid"])
    for name, _ in SCRATCH_DIRS:
        os.mkdir(f"{here}/{name}")
        os.chmod(f"{here}/{name}", 0o1777)
    for name, targets in SCRATCH_DIRS:
        for target in filter(os.path.isdir, targets):
            _mount(f"scratch on {target}", f"{here}/{name}", target, None, MS_BIND)
    if not _same(holder, root):  # hidden by a bind above: made again inside it
        path = ""
        for part in os.path.normpath(holder).split("/")[1:]:
            path += "/" + part
            if not os.path.isdir(path):
                os.mkdir(path)
                os.chmod(path, 0o711)
        _mount(f"scratch on {holder}", here, holder, None, MS_BIND)
    os.close(root)


def _same(path: str, fd: int) -> bool:
    try:
        return os.path.samestat(os.stat(path), os.fstat(fd))
    except OSError:
        return False


def private_proc() -> None:
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    if (major, minor) < (5, 8):  # older kernels share one proc superblock: the host's
        raise Step(f"hidepid on a private /proc needs Linux 5.8, this is {major}.{minor}")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("proc on /proc", "proc", "/proc", "proc", flags, "hidepid=invisible")


def loopback_up() -> None:
    ifreq = b"lo".ljust(16, b"\0") + IFF_UP.to_bytes(2, sys.byteorder) + bytes(22)
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:  # struct ifreq: a 16-byte name, then the flags (40 bytes in all)
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, ifreq)
    except OSError as exc:
        raise Step(f"loopback up: {exc.strerror}") from exc
    finally:
        s.close()


def become(spec: dict[str, Any]) -> None:
    """Rlimits, no new privileges, the task's own gid and uid (after which nothing
    of root is left: setresuid to a non-zero uid clears every capability)."""
    for which, soft, hard in spec["limits"]:
        resource.setrlimit(which, (soft, hard))
    _call("no_new_privs", _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    uid, gid = spec["uid"], spec["gid"]
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # Python ignores them; exec keeps that
        _signal.signal(sig, _signal.SIG_DFL)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    os.chdir(spec["work"])


def launch(spec: dict[str, Any], argv: list[str]) -> None:
    """Every step, then the exec; raises ``Step`` or ``OSError`` on a failure."""
    flags = CLONE_NEWNS | CLONE_NEWIPC | (0 if spec["host_network"] else CLONE_NEWNET)
    _call("unshare", _libc.unshare(flags))
    _mount("private /", None, "/", None, MS_REC | MS_PRIVATE)
    read_only_everywhere()
    if spec.get("shared_dir"):  # the operator's shared directory: writable again
        shared = spec["shared_dir"]
        _mount(f"shared {shared}", shared, shared, None, MS_BIND)  # read-only as its source
        flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV
        _mount(f"shared {shared} writable", None, shared, None, flags)
    scratch(spec)
    private_proc()
    if not spec["host_network"]:
        loopback_up()
    become(spec)
    os.execve(spec["executable"], argv, spec["env"])


def main() -> None:
    spec = marshal.loads(bytes.fromhex(sys.argv[1]))
    status = int(spec["status_fd"])
    os.set_inheritable(status, False)  # closed by the exec: the pool reads EOF
    try:
        launch(spec, sys.argv[2:])
    except (Step, OSError) as exc:
        os.write(status, str(exc).encode("utf-8", "replace")[:4096])
        os._exit(127)


if __name__ == "__main__":
    main()
