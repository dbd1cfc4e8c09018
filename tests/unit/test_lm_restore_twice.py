"""Two LM restarts in a row forget no end the first restored one still kept.

A restored end is kept at least ``retain_s`` after the restore (``Ends.restored``).  The
next incarnation replays the same journal, and a keep written meanwhile expires the ends
older than its own ``retain_s`` as it did live; before the restore was journaled
(``JournalRestored``), that replay dropped an end the first restored incarnation still
kept, so a GM asking after the second restart placed its finished task again.
"""

from __future__ import annotations

from common.ids import JobId
from common.messages import (
    Heartbeat,
    JobKeep,
    JournalRestored,
    KeepEnds,
    LaunchResponse,
    ReportKind,
    WorkerReports,
)
from common.model import TaskSpec
from local_master.core import LocalMaster
from tests.conftest import launch_req, make_task
from tests.unit.test_lm_journal import GM0, LM0, durable_lm, reborn, records, register, report


def _finished_then_restarted() -> tuple[list[object], LocalMaster, TaskSpec]:
    """An end learnt at 10, the LM restarted at 100 and, after its pool registered, a
    keep of another job at 100 + retain_s (past the end's own retention, within the
    restore's): the journal of both incarnations, the second one, the task."""
    lm = durable_lm()
    t = make_task(job="j")
    journal = records(lm.handle(launch_req(t, node=0), 9.0))
    rep = report(ReportKind.FINISHED, t, 0, 1, 10.0)
    journal += records(lm.handle(WorkerReports(lm=LM0, reports=(rep,)), 10.0))
    first = reborn(journal, 100.0)
    retain = first.ends.retain_s
    journal += records(register(first, 101.0))
    keep = KeepEnds(gm=GM0, lm=LM0, jobs=(JobKeep(user=t.user, job_id=JobId("other"), keep=True),))
    journal += records(first.handle(keep, 100.0 + retain * 0.5))
    journal += records(first.handle(Heartbeat(), 100.0 + retain * 0.5))
    assert (t.user, t.task_id) in first.ends  # the first restored one keeps it
    return journal, first, t


def test_the_second_restart_keeps_the_ends_the_first_restored_one_kept() -> None:
    journal, first, t = _finished_then_restarted()
    key = (t.user, t.task_id)
    assert any(isinstance(r, JournalRestored) and r.at == 100.0 for r in journal)
    retain = first.ends.retain_s
    for written in (journal, first.records()):  # as written, and compacted
        second = reborn(written, 100.0 + retain * 0.6)
        assert key in second.ends
        register(second, 100.0 + retain * 0.6)
        again = second.handle(launch_req(t, node=1), 100.0 + retain * 0.7)
        (answer,) = [e.msg for e in again if isinstance(e.msg, LaunchResponse)]
        assert answer.results[0].reason == "finished"
