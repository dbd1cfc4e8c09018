"""A GM's job history on local disk: what its users read of their jobs outlives its process.

The job book (``global_master.lifecycle``) is the GM's authority on its users' jobs --
states, each task's attempts, exit code and output tails.  Without this it lived in
the GM's memory only: after a restart (a crash, ``megha down`` then ``up``) ``megha job
ID`` answered ``unknown_job`` for every job that had ended.

With a state directory (``$MEGHA_STATE_DIR``, set by ``megha up``; ``journal = true``)
the book's changes are history records, which the core hands over as ``Record``
effects; each is appended to the GM's journal (``runtime.journal``: ``<state>/<gm>/
jobs.snap`` and ``jobs.<G>.log``) before the rest of its message's effects leave the
process: the records of one loop turn in one ``write`` (``runtime.journal.TurnWriter``),
at the end of the turn or at ``flush``, which the service calls before anything that may
depend on them leaves (an outcome, an ack, a request to an LM, an answer).  A write per
message was 40% of a GM's write calls.  At the next start the journal is read back into
the book (``JobBook.replay``) before the GM takes any job; jobs ended more than ``job_history_s`` ago and beyond
``job_history_per_user`` per user go, and the journal is compacted to what is left
(again whenever its log passes ``COMPACT_BYTES``).  ``fdatasync`` every
``journal_sync_s``, as LMs and pools do.  A record this version cannot read is
skipped and counted (``unreadable``): history is for users to read, and a GM that
refused to start over it would stop their jobs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import msgspec

from common.config import STATE_ENV, FederationConfig
from common.effects import Record
from global_master.lifecycle import HistoryRecord, JobBook
from runtime.clock import steady
from runtime.journal import COMPACT_BYTES, Journal, JournalBusy, TurnWriter, sync_every

log = logging.getLogger("megha.gm.history")

NAME = "jobs"
BUSY_WAIT_S = 0.25
"""A former process of this GM still holds the journal: look again this often."""

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(HistoryRecord)


class JobHistory:
    """A GM's job book, journaled (the module doc)."""

    def __init__(self, directory: Path | str, book: JobBook, *, sync_s: float) -> None:
        self.journal = Journal(directory, NAME)
        self.book = book
        self.sync_s = sync_s
        self.restored_jobs = 0
        self.unreadable = 0
        self.compactions = 0
        self.turn = TurnWriter(self.journal, _ENCODER.encode, sync_s)
        """The book's changes of this loop turn, written together (``flush``)."""

    async def open(self) -> int:
        """Take the journal (waiting for a former process of this GM to let it go),
        rebuild the book from it, compact it; from then on the book's changes are
        recorded.  Returns the jobs restored."""
        for attempt in range(1_000_000):
            try:
                payloads = self.journal.open()
                break
            except JournalBusy:
                if attempt % 40 == 0:
                    log.warning("%s: held by another process; waiting", self.journal.dir)
                await asyncio.sleep(BUSY_WAIT_S)
        self.book.replay(self._decoded(payloads), steady())
        self.restored_jobs = len(self.book.jobs)
        self.compact()
        self.book.keep_history()
        log.info("job history: %d jobs restored from %s", self.restored_jobs, self.journal.dir)
        return self.restored_jobs

    def _decoded(self, payloads: list[bytes]) -> list[HistoryRecord]:
        out: list[HistoryRecord] = []
        for p in payloads:
            try:
                out.append(_DECODER.decode(p))
            except msgspec.DecodeError:
                self.unreadable += 1
        if self.unreadable:
            log.warning("job history: %d records this version cannot read, skipped",
                        self.unreadable)  # fmt: skip
        return out

    def record(self, eff: Record) -> None:
        """Take the book's changes: in the page cache by the end of this loop turn or the
        next ``flush`` (``TurnWriter``); a log grown too long is compacted."""
        self.turn.take(eff.records)
        if self.journal.log_bytes > COMPACT_BYTES:
            self.compact()

    def flush(self) -> None:
        """Write the changes taken so far (one ``write``)."""
        self.turn.flush()

    @property
    def writes(self) -> int:
        return self.turn.writes

    def compact(self) -> None:
        """The journal becomes the book as it is now (changes not written yet are in it)."""
        self.turn.drop()
        self.journal.rewrite([_ENCODER.encode(r) for r in self.book.records()])
        self.compactions += 1

    async def sync_forever(self) -> None:
        """``fdatasync`` what was written, every ``sync_s`` (off the event loop)."""
        await sync_every(self.journal, self.sync_s)

    def close(self) -> None:
        self.flush()
        self.journal.sync()
        self.journal.close()

    def stats(self) -> dict[str, int]:
        return {
            "restored_jobs": self.restored_jobs, "unreadable": self.unreadable,
            "records_written": self.turn.records_written, "writes": self.writes,
            "compactions": self.compactions,
        }  # fmt: skip


def for_gm(cfg: FederationConfig, gm: str, book: JobBook | None) -> JobHistory | None:
    """The history of GM ``gm``'s book in ``$MEGHA_STATE_DIR/<gm>`` (None: no state
    directory, ``journal = false``, or no book)."""
    root = os.environ.get(STATE_ENV)
    if not root or not cfg.journal or book is None:
        return None
    return JobHistory(Path(root) / gm, book, sync_s=cfg.journal_sync_s)
