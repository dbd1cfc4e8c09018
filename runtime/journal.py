"""A service's write-ahead journal on local disk: what must outlive every process of a host.

An LM's active task list and retained ends, and a worker pool's running attempts and
unreported ends, exist only in process memory; a restart of the whole federation (a
host reboot, ``megha down`` then ``up``, ``docker compose down && up``) would lose them.
Each such service appends what changed to its journal before it answers anyone, and
reads the journal back at its next start.

Layout in the service's state directory (``NAME`` is the service):

* ``NAME.lock`` -- an exclusive ``flock`` held for the life of the process: a second
  process (a standby, a leftover) cannot write the same journal (``JournalBusy``);
* ``NAME.snap`` -- the compacted state: a header frame naming its generation ``G``,
  then one frame per record;
* ``NAME.G.log`` -- the records appended since that snapshot, in order.

A frame is ``length (4 bytes, big-endian) | crc32 (4) | payload``.  A torn or corrupt
frame ends the file: what follows is dropped and the log is truncated there (a record
is written whole by one ``write`` before anything depends on it).  ``rewrite`` makes a
new generation atomically (snapshot written, fsynced and renamed, then a new empty log),
so a crash at any point leaves either the old generation or the new one, never a mix.

Durability: ``append`` puts records in the kernel's page cache, which survives the death
of the process (SIGKILL, OOM, ``docker kill``); ``sync`` (``fdatasync``) makes them survive
the host losing power.  How often to sync is the service's choice (``journal_sync_s``).
Payloads are opaque bytes here: the service encodes its records (``common.codec``).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from common import codec
from common.effects import Record
from common.errors import ConfigError, MeghaError

_FRAME = struct.Struct(">II")
_MAGIC = b"megha-journal/1 gen="
MAX_RECORD = 16 << 20
"""A record larger than this is taken as corruption (no service writes one)."""


class JournalBusy(RuntimeError):
    """Another live process holds this journal's lock."""


def frame(payload: bytes) -> bytes:
    """One record as written on disk."""
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def framed(payloads: Iterable[bytes]) -> bytes:
    """Records as written on disk, one after the other: ``frame`` of each, joined (the
    payloads are not copied into a frame each first)."""
    pack, crc32 = _FRAME.pack, zlib.crc32
    parts: list[bytes] = []
    add = parts.append
    for p in payloads:
        add(pack(len(p), crc32(p)))
        add(p)
    return b"".join(parts)


def read_frames(data: bytes) -> tuple[list[bytes], int]:
    """The whole frames at the start of ``data`` and the offset where they end (a torn or
    corrupt frame, or the end of the data)."""
    out: list[bytes] = []
    at, end = 0, len(data)
    while at + _FRAME.size <= end:
        n, crc = _FRAME.unpack_from(data, at)
        start = at + _FRAME.size
        if n > MAX_RECORD or start + n > end:
            break
        payload = data[start : start + n]
        if zlib.crc32(payload) != crc:
            break
        out.append(payload)
        at = start + n
    return out, at


class Journal:
    """An append-only record log with compaction into a snapshot (see the module doc)."""

    def __init__(self, directory: Path | str, name: str) -> None:
        self.dir = Path(directory)
        self.name = name
        self.generation = 0
        self.log_bytes = 0
        """Bytes appended to the current log (what compaction would save)."""
        self.records_logged = 0
        self.torn_bytes = 0
        """Bytes dropped at ``open`` after a torn or corrupt frame."""
        self._lock_fd = -1
        self._log_fd = -1
        self._dirty = False
        self._files = threading.Lock()
        """Held by ``sync`` (which may run in a thread) and by what swaps or closes files."""

    # ------------------------------------------------------------ open / read
    def open(self) -> list[bytes]:
        """Lock the journal and return every record it holds, snapshot first, in order."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock()
        records = self._read_snapshot()
        log = self._log_path(self.generation)
        data = log.read_bytes() if log.exists() else b""
        logged, end = read_frames(data)
        self.torn_bytes = len(data) - end
        records.extend(logged)
        self._log_fd = os.open(log, os.O_WRONLY | os.O_CREAT, 0o600)
        if self.torn_bytes:
            os.ftruncate(self._log_fd, end)
        os.lseek(self._log_fd, end, os.SEEK_SET)
        self.log_bytes = end
        self.records_logged = len(logged)
        self._drop_other_logs()
        return records

    def _lock(self) -> None:
        fd = os.open(self.dir / f"{self.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalBusy(f"{self.dir / self.name} is held by another process") from None
        self._lock_fd = fd

    def _read_snapshot(self) -> list[bytes]:
        snap = self.dir / f"{self.name}.snap"
        if not snap.exists():
            self.generation = 0
            return []
        frames, _ = read_frames(snap.read_bytes())
        if not frames or not frames[0].startswith(_MAGIC):
            # a snapshot is renamed into place only once whole: this is not ours
            raise ValueError(f"{snap} is not a journal snapshot")
        self.generation = int(frames[0][len(_MAGIC) :])
        return frames[1:]

    def _log_path(self, generation: int) -> Path:
        return self.dir / f"{self.name}.{generation}.log"

    def _drop_other_logs(self) -> None:
        keep = self._log_path(self.generation).name
        for p in self.dir.glob(f"{self.name}.*.log"):
            if p.name != keep:
                p.unlink(missing_ok=True)

    # ----------------------------------------------------------------- write
    def append(self, payloads: list[bytes]) -> None:
        """Append records (one ``write``): in the page cache when this returns."""
        if not payloads:
            return
        self.write_framed(framed(payloads), len(payloads))

    def write_framed(self, data: bytes, records: int) -> None:
        """Append ``records`` records already framed (``framed``) as ``data``, whole."""
        n = os.write(self._log_fd, data)
        if n < len(data):  # a short write (a signal, a full pipe): the rest follows
            view = memoryview(data)[n:]
            while view:
                view = view[os.write(self._log_fd, view) :]
        self.log_bytes += len(data)
        self.records_logged += records
        self._dirty = True

    @property
    def dirty(self) -> bool:
        """Records were appended since the last ``sync``."""
        return self._dirty

    def sync(self) -> None:
        """``fdatasync`` what was appended (blocking: call it off the event loop)."""
        with self._files:
            if self._dirty and self._log_fd >= 0:
                self._dirty = False
                os.fdatasync(self._log_fd)

    def rewrite(self, payloads: list[bytes]) -> None:
        """Replace everything by ``payloads`` (the service's whole state): a new
        generation, made atomically; the old log goes."""
        gen = self.generation + 1
        tmp = self.dir / f"{self.name}.snap.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "wb") as f:
            f.write(frame(_MAGIC + str(gen).encode()))
            f.write(framed(payloads))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / f"{self.name}.snap")
        new_fd = os.open(self._log_path(gen), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._fsync_dir()
        with self._files:
            old_fd, self._log_fd = self._log_fd, new_fd
            if old_fd >= 0:
                os.close(old_fd)
        self._log_path(self.generation).unlink(missing_ok=True)
        self.generation = gen
        self.log_bytes = 0
        self.records_logged = 0
        self._dirty = False

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Release the files and the lock (records stay as written)."""
        with self._files:
            for fd in (self._log_fd, self._lock_fd):
                if fd >= 0:
                    os.close(fd)
            self._log_fd = self._lock_fd = -1


COMPACT_BYTES = 8 << 20
"""A log past this many bytes is compacted into a snapshot of the service's state."""


async def sync_every(journal: Journal, sync_s: float) -> None:
    """``fdatasync`` what ``journal`` was written, every ``sync_s`` (off the event loop;
    0: never here, each write is synced as it is made)."""
    if sync_s == 0:
        return
    while True:
        await asyncio.sleep(sync_s)
        if journal.dirty:
            await asyncio.to_thread(journal.sync)


class TurnWriter:
    """Records taken during one loop turn, written to ``journal`` in one ``write`` at the
    end of the turn, or at ``flush``, which the service calls before anything that
    depends on them leaves (an answer, a report, an event, an outcome).  Without a
    running loop each is written at once; with ``sync_s`` 0 it is on disk too.  Records
    are frozen: they are encoded when written, all of a turn in one go."""

    def __init__(self, journal: Journal, encode: Callable[[object], bytes], sync_s: float) -> None:
        self.journal = journal
        self.encode = encode
        self.sync_s = sync_s
        self.records_written = 0
        self.writes = 0
        self._pending: list[object] = []

    def take(self, records: Sequence[object]) -> None:
        self.records_written += len(records)
        if self.sync_s == 0:
            self._pending.extend(records)
            self.flush()
            self.journal.sync()
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if not self._pending and loop is not None:
            loop.call_soon(self.flush)
        self._pending.extend(records)
        if loop is None:
            self.flush()

    def flush(self) -> None:
        """Write the records taken so far (one ``write``)."""
        if self._pending:
            pending, self._pending = self._pending, []
            encode = self.encode
            self.journal.write_framed(framed([encode(r) for r in pending]), len(pending))
            self.writes += 1

    def drop(self) -> None:
        """Forget the records not written yet (a compaction has them)."""
        self._pending = []


class DurableState:
    """A service's journal as its driver uses it: the records read back (decoded) at the
    start, each ``Record`` effect written before the rest of its message's effects leave,
    an ``fdatasync`` every ``sync_s`` (0: at once), compaction when the log grows.

    On an event loop, the records of one loop turn go out in one ``write`` (at the end
    of the turn, or at ``flush``, which the service calls before anything that depends
    on them leaves: an answer, a report, an event): a pool's task ends each came with a
    ``write`` of their own."""

    def __init__(self, directory: Path | str, name: str, *, sync_s: float) -> None:
        self.journal = Journal(directory, name)
        self.sync_s = sync_s
        self.compactions = 0
        self.turn = TurnWriter(self.journal, codec.encode, sync_s)

    def open(self) -> list[object]:
        """Lock the journal and decode what it holds (``JournalBusy``: another process
        of this service holds it)."""
        out: list[object] = []
        for payload in self.journal.open():
            try:
                out.append(codec.decode(payload))
            except MeghaError as exc:
                raise ConfigError(
                    f"{self.journal.dir / self.journal.name}: a record this version cannot "
                    f"read ({exc}); move the journal away to start without it",
                    reason="bad_journal",
                ) from exc
        return out

    def record(self, eff: Record) -> None:
        """Take ``eff``'s records (``TurnWriter``)."""
        self.turn.take(eff.records)

    def flush(self) -> None:
        self.turn.flush()

    @property
    def writes(self) -> int:
        return self.turn.writes

    @property
    def needs_compaction(self) -> bool:
        return self.journal.log_bytes > COMPACT_BYTES

    def compact(self, records: list[object]) -> None:
        """Replace the journal by ``records``: the service's whole state now."""
        self.flush()  # into the log the rewrite replaces (the state holds them)
        self.journal.rewrite([codec.encode(r) for r in records])
        self.compactions += 1

    async def sync_forever(self) -> None:
        """``fdatasync`` what was written, every ``sync_s`` (off the event loop)."""
        await sync_every(self.journal, self.sync_s)

    def close(self) -> None:
        self.flush()
        self.journal.sync()
        self.journal.close()
