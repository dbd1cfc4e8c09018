"""The job book's history (``global_master.lifecycle``): the records a GM core hands
over as ``Record`` effects rebuild the same book after a restart -- each job's state,
timeline, and each task's attempts, exit code and output -- and so do the compacted
records; the bounds (``job_history_s``, ``job_history_per_user``) hold on the way back.
The real process restarted: ``tests/e2e/test_frontdoor.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.effects import JobRefused, JobSettled, Record
from common.ids import GmId, JobId, LmId, NodeIndex, UserId
from common.jobspec import JobDef
from common.messages import (
    AdmitJob,
    CancelJob,
    Decide,
    EventKind,
    JobRefusal,
    TaskEvent,
    TaskEvents,
)
from global_master.core import GlobalMaster
from global_master.lifecycle import HistoryRecord, JobBook
from tests.conftest import make_gm, make_lm, sync_views


class Recorded:
    """A GM core whose book keeps its history; each record it hands over, kept."""

    def __init__(self) -> None:
        self.gm: GlobalMaster = make_gm("gm0", ("lm0",), (("u0", "gm0", 1.0),))
        sync_views(self.gm, make_lm("lm0", [(1, 1), (1, 1)]))
        self.gm.book = JobBook(per_user=10, keep_s=100.0)
        self.gm.book.keep_history()
        self.records: list[HistoryRecord] = []

    def handle(self, msg: object, now: float) -> None:
        for e in self.gm.handle(msg, now):
            if isinstance(e, Record):
                self.records += e.records  # type: ignore[arg-type]

    def submit(self, job_id: str, demand: list[int], now: float, count: int = 1) -> None:
        job = JobDef.single(count, demand, 5.0, name=job_id)
        self.handle(AdmitJob(job=job.submission(job_id, "u0", "t", now)), now)

    def run(self, task_id: str, end: EventKind, now: float, **out: Any) -> None:
        self.handle(Decide(max_tasks=1), now)
        ev = TaskEvent(kind=EventKind.STARTED, lm=LmId("lm0"), gm=GmId("gm0"), user="u0",
                       task_id=task_id, attempt=1, node=NodeIndex(0), node_free=(0, 0),
                       node_version=1, at=now)  # fmt: skip
        self.handle(TaskEvents(lm=LmId("lm0"), events=(ev,)), now)
        fields = {f: getattr(ev, f) for f in ev.__struct_fields__}
        done = TaskEvent(**{**fields, "kind": end, "node_free": (1, 1), "node_version": 2,
                            "at": now + 1, **out})  # fmt: skip
        self.handle(TaskEvents(lm=LmId("lm0"), events=(done,)), now + 1)


def history() -> Recorded:
    h = Recorded()
    h.submit("ok", [1, 1], 1.0)
    h.run("ok.s0.t0", EventKind.FINISHED, 2.0, exit_code=0, stdout=b"hello\n")
    h.submit("bad", [1, 1], 4.0)
    h.run("bad.s0.t0", EventKind.FAILED, 5.0, exit_code=3, stderr=b"oops\n", detail="exit 3")
    h.submit("big", [5, 5], 7.0)  # refused: fits no node
    h.submit("stop", [1, 1], 8.0, count=2)
    h.handle(CancelJob(user=UserId("u0"), job_id=JobId("stop")), 9.0)
    h.submit("live", [1, 1], 10.0)
    return h


def views(book: JobBook, gm: GlobalMaster) -> dict[str, Any]:
    out = {}
    for (_, jid), rec in book.jobs.items():
        detail = book.detail(rec, gm.ledger)
        detail["logs"] = {t: (r.stdout, r.stderr) for t, r in rec.tasks.items()}
        out[jid] = detail
    return out


def test_the_records_rebuild_the_same_book() -> None:
    h = history()
    book = h.gm.book
    assert book is not None
    before = views(book, h.gm)
    assert {j: v["state"] for j, v in before.items()} == {
        "ok": "finished", "bad": "failed", "big": "failed", "stop": "cancelled", "live": "queued",
    }  # fmt: skip
    assert before["bad"]["task_list"][0]["exit_code"] == 3
    assert before["ok"]["logs"]["ok.s0.t0"] == (b"hello\n", b"")
    again = JobBook(per_user=10, keep_s=100.0)
    again.replay(h.records, now=12.0)
    assert views(again, h.gm) == before
    assert again.changes is None  # replaying made no records
    compacted = JobBook(per_user=10, keep_s=100.0)
    compacted.replay(book.records(), now=12.0)
    assert views(compacted, h.gm) == before
    assert list(compacted.ended["u0"]) == list(book.ended["u0"])  # the order they ended


def test_the_bounds_hold_on_the_way_back() -> None:
    h = history()
    late = JobBook(per_user=10, keep_s=100.0)
    late.replay(h.records, now=6.5 + 100.0)  # "ok" (at 3) and "bad" (6) ended > 100 s before
    assert sorted(j for _, j in late.jobs) == ["big", "live", "stop"]
    few = JobBook(per_user=1, keep_s=100.0)
    few.replay(h.records, now=12.0)
    assert sorted(j for _, j in few.jobs) == ["live", "stop"]  # the last ended, and the live
    assert few.task(UserId("u0"), "ok.s0.t0") is None  # type: ignore[arg-type]


def test_a_replayed_book_goes_on_recording() -> None:
    h = history()
    again = JobBook(per_user=10, keep_s=100.0)
    again.replay(h.records, now=12.0)
    again.keep_history()
    h.gm.book = again
    h.run("live.s0.t0", EventKind.FINISHED, 13.0, exit_code=0)
    rec = again.get(UserId("u0"), JobId("live"))
    assert rec is not None
    assert again.status(rec) == "finished"
    third = JobBook(per_user=10, keep_s=100.0)
    third.replay(h.records, now=20.0)  # the first life's records and the second's
    assert views(third, h.gm) == views(again, h.gm)


def test_a_restarted_gm_runs_no_job_of_its_history_again() -> None:
    """After a restart the core's memory of recent jobs is gone, but the book read back
    from the journal is not: a job it admitted before is not admitted again -- a
    submission published twice (a publisher's retry, a replay) is refused as before the
    restart, and a redelivery of a job that ended is acknowledged with nothing run
    (found by ``megha chaos --random 2 --wide``: a whole-federation restart, then the
    same submissions published again, ran 6 ended tasks a second time).  A redelivered
    job the book holds open is taken as any redelivered job (its tasks may never have
    run); a job the book holds only as refused may be sent again."""
    h = history()
    gm: GlobalMaster = make_gm("gm0", ("lm0",), (("u0", "gm0", 1.0),))
    sync_views(gm, make_lm("lm0", [(1, 1), (1, 1)]))
    gm.book = JobBook(per_user=10, keep_s=100.0)
    gm.book.replay(h.records, now=12.0)
    gm.book.keep_history()

    def admit(job_id: str, redelivered: bool, count: int = 1, demand: int = 1) -> list[object]:
        job = JobDef.single(count, [demand, demand], 5.0, name=job_id)
        sub = job.submission(job_id, "u0", "t", 13.0)
        return gm.handle(AdmitJob(job=sub, redelivered=redelivered), 13.0)

    for job_id, count in (("ok", 1), ("bad", 1), ("stop", 2), ("live", 1)):
        (refused,) = [e for e in admit(job_id, False, count) if isinstance(e, JobRefused)]
        assert refused.reason == "duplicate_job_id", job_id
    assert gm.ledger.live.per_user.get(UserId("u0"), 0) == 0
    for job_id, count in (("ok", 1), ("bad", 1), ("stop", 2)):  # ended: nothing to run
        assert admit(job_id, True, count) == [JobSettled(JobId(job_id), UserId("u0"))]
    assert gm.ledger.live.per_user.get(UserId("u0"), 0) == 0
    admit("live", True)  # open in the book: its delivery is the job
    assert gm.ledger.live.per_user.get(UserId("u0"), 0) == 1
    admit("big", False, demand=5)  # refused before, for its demand: sent again, checked again
    effects = admit("big", False)  # (and, fixed, taken)
    assert not [e for e in effects if isinstance(e, JobRefused)]
    assert gm.ledger.live.per_user.get(UserId("u0"), 0) == 2


def test_a_job_refused_before_the_core_is_recorded_and_read_back() -> None:
    """Its GM's service refused it before the core saw it (``user_backlog``,
    ``too_many_edges``, ``internal_error``): the book says so, where the front door said
    "submitted" until it forgot the job, then ``unknown_job``; a refused copy of a job
    the book holds leaves that job alone."""
    h = history()
    book = h.gm.book
    assert book is not None

    def refused(job_id: str) -> None:
        h.handle(JobRefusal(gm=GmId("gm0"), user=UserId("u0"), job_id=JobId(job_id),
                            submitted_at=-1.0, reason="user_backlog",
                            detail="u0 has 9 MiB unread"), 11.0)  # fmt: skip

    refused("shed")
    refused("live")  # a copy of a job it holds, shed: not that job's end
    rec = book.get(UserId("u0"), JobId("shed"))
    assert rec is not None
    assert rec.ended
    assert book.summary(rec, h.gm.ledger)["reason"] == "user_backlog: u0 has 9 MiB unread"
    live = book.get(UserId("u0"), JobId("live"))
    assert live is not None
    assert not live.ended
    assert not live.refused
    again = JobBook(per_user=10, keep_s=100.0)
    again.replay(h.records, now=12.0)
    assert views(again, h.gm) == views(book, h.gm)
    h.submit("shed", [1, 1], 13.0)  # sent again once the backlog drained: a new job
    rec = book.get(UserId("u0"), JobId("shed"))
    assert rec is not None
    assert not rec.refused
    assert not rec.ended
    later = JobBook(per_user=10, keep_s=100.0)
    later.replay(h.records, now=200.0)  # the refusal's end is past keep_s; the job is not
    assert views(later, h.gm)["shed"] == views(book, h.gm)["shed"]


@pytest.mark.parametrize("sync_s", [0.0, 1.0])
def test_the_journal_on_disk_round_trips(tmp_path: Path, sync_s: float) -> None:
    import asyncio

    from global_master.history import JobHistory

    h = history()
    assert h.gm.book is not None
    before = views(h.gm.book, h.gm)

    async def go() -> None:
        first = JobHistory(tmp_path, JobBook(per_user=10, keep_s=1e12), sync_s=sync_s)
        assert await first.open() == 0
        first.record(Record(tuple(h.records)))
        first.close()
        book = JobBook(per_user=10, keep_s=1e12)
        second = JobHistory(tmp_path, book, sync_s=sync_s)
        assert await second.open() == 5
        assert views(book, h.gm) == before
        assert book.changes == []  # recording again
        second.close()

    asyncio.run(go())


def test_the_records_of_a_loop_turn_go_in_one_write(tmp_path: Path) -> None:
    """A GM's messages of one loop turn cost one ``write`` of its history, at the end of
    the turn or at ``flush`` (the service's, before what depends on them leaves)."""
    import asyncio

    from global_master.history import JobHistory

    h = history()
    half = len(h.records) // 2

    async def go() -> None:
        jh = JobHistory(tmp_path, JobBook(per_user=10, keep_s=1e12), sync_s=1.0)
        await jh.open()
        jh.record(Record(tuple(h.records[:half])))
        jh.record(Record(tuple(h.records[half:-1])))
        assert (jh.writes, jh.journal.records_logged) == (0, 0)
        await asyncio.sleep(0)  # the turn ends
        assert (jh.writes, jh.journal.records_logged) == (1, len(h.records) - 1)
        jh.record(Record(tuple(h.records[-1:])))
        jh.flush()  # before the turn ends
        assert (jh.writes, jh.journal.records_logged) == (2, len(h.records))
        await asyncio.sleep(0)
        assert jh.writes == 2  # nothing left for the turn's end
        jh.close()

    asyncio.run(go())
    book = JobBook(per_user=10, keep_s=1e12)
    again = JobHistory(tmp_path, book, sync_s=1.0)
    asyncio.run(again.open())
    assert h.gm.book is not None
    assert views(book, h.gm) == views(h.gm.book, h.gm)
    again.close()


def test_a_compaction_takes_the_records_not_written_yet(tmp_path: Path) -> None:
    """Records not written yet are in the book a compaction writes: not written again."""
    import asyncio

    from global_master.history import JobHistory

    h = history()
    book = h.gm.book
    assert book is not None

    async def go() -> None:
        jh = JobHistory(tmp_path, book, sync_s=1.0)
        jh.journal.open()  # (``open`` would rebuild the book from the empty journal)
        jh.record(Record(tuple(h.records)))
        jh.compact()
        await asyncio.sleep(0)
        assert (jh.writes, jh.compactions, jh.journal.records_logged) == (0, 1, 0)
        jh.close()

    asyncio.run(go())
    again = JobBook(per_user=10, keep_s=1e12)
    reader = JobHistory(tmp_path, again, sync_s=1.0)
    asyncio.run(reader.open())
    assert views(again, h.gm) == views(book, h.gm)
    reader.close()
