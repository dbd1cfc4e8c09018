"""A consumer's record, on local disk, of the deliveries it is handling now: a delivery
that was being handled when the process died is never handled blindly again.

Classic queues count no deliveries: a job whose handling kills its GM (memory, a loop
blocked past gunicorn's timeout) is redelivered first to the GM that comes back, which
dies again, for ever.  So a GM writes a record (the delivery's key: queue, size and a
digest of its body) before it handles a delivery and removes it after.  The records are
slots of one file per process (``slots-<pid>``, ``SLOT`` bytes each), written in place
with one ``pwrite`` each: a file made and removed per delivery cost a GM two directory
operations and four system calls per job (5% of its CPU at 1,000 tasks/s).  Records left
when a process starts are deliveries its predecessor died in:

* the predecessor died **alone** -- its gunicorn master (pid and start time) is ours, so
  the worker died while its master lived: what a poison does -- and it was handling
  one delivery: that delivery is **poison**, dead-lettered unhandled when it comes back;
* otherwise (a kill of the whole service, a host restart, or several deliveries in
  hand) each is a **suspect**: handled again, alone (no other delivery is handled
  meanwhile) and recorded as such; a suspect found again at the next start is poison.

A poison message thus takes a GM down once, or twice when another delivery was in hand
at its first crash; and a GM killed from outside dead-letters nothing.  Verdicts wait on
disk (``v-<key>``) until their delivery comes back, for at most ``VERDICT_TTL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path

from common.config import CONFIG_ENV

RUN_DIR_ENV = "MEGHA_RUN_DIR"
"""Where a service keeps its records (default: ``run/`` beside its config file)."""
VERDICT_TTL_S = 24 * 3600.0
SLOT = 256
"""Bytes of one record's slot in a process's slot file (a record is ~110 bytes of JSON;
an empty slot begins with a NUL)."""
SAMPLE = 64 * 1024
"""A body's key hashes its first and last ``SAMPLE`` bytes (and its size and queue):
a delivery of 8 MiB costs two 64 KiB hashes, not one of 8 MiB."""

log = logging.getLogger("megha.poison")


class Verdict(StrEnum):
    FRESH = "fresh"
    SUSPECT = "suspect"
    POISON = "poison"


def delivery_key(queue: str, body: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{queue}\n{len(body)}\n".encode())
    h.update(body[:SAMPLE])
    h.update(body[-SAMPLE:] if len(body) > SAMPLE else b"")
    return h.hexdigest()


def _slot_records(data: bytes) -> list[dict[str, object]]:
    """The records of a slot file (empty and unreadable slots skipped)."""
    out = []
    for at in range(0, len(data), SLOT):
        chunk = data[at : at + SLOT]
        if not chunk or chunk[0] == 0:
            continue
        with contextlib.suppress(ValueError):
            rec = json.loads(chunk.rstrip(b" \0"))
            if isinstance(rec, dict) and "key" in rec:
                out.append(rec)
    return out


def master_identity() -> str:
    """The process that supervises this one (gunicorn's master): its pid and start time
    (a pid alone may be reused, e.g. pid 1 in a restarted container)."""
    ppid = os.getppid()
    try:
        stat = Path(f"/proc/{ppid}/stat").read_text()
        started = stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "?"
    return f"{ppid}:{started}"


def run_dir(federation: str, party: str) -> Path:
    """``$MEGHA_RUN_DIR/<party>``, or ``run/<party>`` beside the config file, or
    ``/tmp/megha-run/<federation>/<party>``."""
    base = os.environ.get(RUN_DIR_ENV)
    if base:
        return Path(base) / party
    config = os.environ.get(CONFIG_ENV)
    if config:
        return Path(config).resolve().parent / "run" / party
    return Path("/tmp/megha-run") / federation / party


class PoisonGuard:
    """The records of one process's deliveries in hand, and the verdicts its
    predecessors' records left."""

    def __init__(self, directory: Path, *, master: str | None = None) -> None:
        self.dir = directory
        self.master = master if master is not None else master_identity()
        self._master_json = json.dumps(self.master)
        self.verdicts: dict[str, Verdict] = {}
        self.poisoned = 0
        self._fd = -1
        """This process's slot file (opened at its first record)."""
        self._free: list[int] = []
        """Slots of the file free for the next record."""
        self._slots = 0
        self._active = 0
        self._exclusive = False
        self._waiting_exclusive = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._broken = False
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._judge_leftovers()
        except OSError as exc:
            self._disable(exc)

    def _disable(self, exc: OSError) -> None:
        if not self._broken:
            log.warning("no delivery records in %s (%s): a poison job may recur", self.dir, exc)
        self._broken = True

    def _judge_leftovers(self) -> None:
        now = time.time()
        records = []
        for p in self.dir.glob("r-*"):  # a record file of an earlier version
            with contextlib.suppress(OSError, ValueError):
                records.append(json.loads(p.read_text()))
            p.unlink(missing_ok=True)
        for p in self.dir.glob("slots-*"):
            with contextlib.suppress(OSError):
                records += _slot_records(p.read_bytes())
            p.unlink(missing_ok=True)
        alone = len(records) == 1
        for r in records:
            poison = bool(r.get("suspect")) or (alone and r.get("master") == self.master)
            verdict = Verdict.POISON if poison else Verdict.SUSPECT
            (self.dir / f"v-{r['key']}").write_text(verdict.value)
            log.warning("a delivery (%s) was in hand when the last process died: %s",
                        r["key"], verdict.value)  # fmt: skip
        for p in self.dir.glob("v-*"):
            if now - p.stat().st_mtime > VERDICT_TTL_S:
                p.unlink(missing_ok=True)
                continue
            with contextlib.suppress(ValueError):
                self.verdicts[p.name[2:]] = Verdict(p.read_text().strip())

    def verdict(self, key: str, *, redelivered: bool) -> Verdict:
        """What to do with a delivery: only one that was in hand at a death (and so comes
        back redelivered) has a verdict."""
        if not redelivered:
            return Verdict.FRESH
        return self.verdicts.get(key, Verdict.FRESH)

    def settle(self, key: str) -> None:
        """The delivery of ``key`` was dead-lettered or handled: its verdict is spent."""
        if self.verdicts.pop(key, None) is not None:
            with contextlib.suppress(OSError):
                (self.dir / f"v-{key}").unlink(missing_ok=True)

    def handling(self, key: str, verdict: Verdict = Verdict.FRESH) -> _Handling:
        """Hold a record of the delivery ``key`` while it is handled (``async with``); a
        suspect is handled alone."""
        return _Handling(self, key, verdict is Verdict.SUSPECT)

    def _record(self, key: str, *, suspect: bool) -> int | None:
        """Write the record of ``key`` into a free slot (in the page cache when this
        returns: it outlives the process); the slot, or None without a record."""
        if self._broken:
            return None
        # json.dumps({"key": key, "master": self.master, "suspect": suspect}), by parts
        data = (
            f'{{"key": {json.dumps(key)}, "master": {self._master_json}, '
            f'"suspect": {"true" if suspect else "false"}}}'
        ).encode()
        if len(data) >= SLOT:  # (a key is 32 hex digits, a master "pid:start")
            self._disable(OSError(f"a record of {len(data)} bytes does not fit a slot"))
            return None
        try:
            if self._fd < 0:
                path = str(self.dir / f"slots-{os.getpid()}")
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            slot = self._free.pop() if self._free else self._slots
            if slot == self._slots:
                self._slots += 1
            os.pwrite(self._fd, data.ljust(SLOT), slot * SLOT)
        except OSError as exc:
            self._disable(exc)
            return None
        return slot

    def _clear(self, slot: int) -> None:
        """The record in ``slot`` is done with: its first byte becomes a NUL."""
        try:
            os.pwrite(self._fd, b"\0", slot * SLOT)
        except OSError as exc:
            self._disable(exc)
            return
        self._free.append(slot)

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def _enter(self, alone: bool) -> None:
        if not alone:
            if self._exclusive or self._waiting_exclusive:
                await self._until(lambda: not self._exclusive and not self._waiting_exclusive)
            self._active += 1
            return
        self._waiting_exclusive += 1
        try:
            await self._until(lambda: not self._exclusive and not self._active)
        finally:
            self._waiting_exclusive -= 1
            self._wake()
        self._exclusive = True

    def _leave(self, alone: bool) -> None:
        if alone:
            self._exclusive = False
        else:
            self._active -= 1
        self._wake()


class _Handling:
    """``PoisonGuard.handling``'s context: the record of one delivery while it is handled
    (a class, not a generator-based context manager: one per job)."""

    __slots__ = ("alone", "guard", "key", "slot")

    def __init__(self, guard: PoisonGuard, key: str, alone: bool) -> None:
        self.guard, self.key, self.alone = guard, key, alone
        self.slot: int | None = None

    async def __aenter__(self) -> None:
        await self.guard._enter(self.alone)
        self.slot = self.guard._record(self.key, suspect=self.alone)

    async def __aexit__(self, *_: object) -> None:
        g = self.guard
        if self.slot is not None:
            g._clear(self.slot)
        g._leave(self.alone)
        if self.alone:
            g.settle(self.key)
