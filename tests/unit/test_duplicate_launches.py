"""``common.metrics.DuplicateLaunches``: what counts as a task run twice."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, cast

import pytest

from common import codec
from common.config import load_config
from common.metrics import DuplicateLaunches, duplicate_launches
from request_generator.bench import LaunchLog


def row(what: str, task: str, attempt: int, at: float, user: str = "u0") -> dict[str, Any]:
    return {"what": what, "user": user, "task_id": task, "attempt": attempt, "at": at}


def test_preempted_then_rerun_in_turn_is_not_a_duplicate() -> None:
    log = [row("start", "a", 1, 0.0), row("stop", "a", 1, 1.0), row("start", "a", 2, 1.5),
           row("end", "a", 2, 2.0)]  # fmt: skip
    assert duplicate_launches(log) == {"count": 0, "tasks": []}


def test_each_kind_of_double_run_is_found() -> None:
    log = [
        # two attempts at once (a zombie attempt 1 that ran on after attempt 2 began)
        row("start", "overlap", 1, 0.0), row("start", "overlap", 2, 0.5),
        row("end", "overlap", 2, 1.0), row("end", "overlap", 1, 2.0),
        # one attempt started twice
        row("start", "again", 1, 0.0), row("end", "again", 1, 1.0), row("start", "again", 1, 2.0),
        # ended twice, one run after the other
        row("start", "twice", 1, 0.0), row("end", "twice", 1, 1.0),
        row("start", "twice", 2, 2.0), row("end", "twice", 2, 3.0),
    ]  # fmt: skip
    found = duplicate_launches(log)
    assert found["count"] == 3
    assert found["why"] == {
        "u0/again": "attempt 1 started twice",
        "u0/overlap": "two attempts at once",
        "u0/twice": "ended twice",
    }
    assert found["tasks"] == list(found["why"])


def test_read_in_pieces_and_pool_by_pool_the_answer_is_the_same() -> None:
    """Polled incrementally, rows of different pools interleave in any order."""
    pool_a = [row("start", "x", 1, 0.0), row("end", "x", 1, 5.0)]
    pool_b = [row("start", "x", 2, 1.0), row("end", "x", 2, 2.0), row("start", "y", 1, 3.0)]
    check = DuplicateLaunches()
    for r in pool_b + pool_a:
        check.add(r)
    assert check.result() == duplicate_launches(pool_a + pool_b)
    assert check.result()["tasks"] == ["u0/x"]
    assert check.result(only={("u0", "y")}) == {"count": 0, "tasks": []}


def test_with_a_horizon_ended_tasks_are_judged_then_forgotten() -> None:
    """A long run: what a task leaves behind once it ended and went quiet is at most
    its verdict; the verdicts are those of the whole log."""
    log: list[dict[str, Any]] = []
    for i in range(2000):
        t0 = i * 0.1
        log += [row("start", f"t{i}", 1, t0), row("end", f"t{i}", 1, t0 + 0.5)]
        if i % 500 == 7:  # a zombie first attempt beside the second
            log += [row("start", f"t{i}", 2, t0 + 0.2), row("end", f"t{i}", 2, t0 + 0.6)]
        if i % 500 == 9:  # the same attempt started again (after its end)
            log.append(row("start", f"t{i}", 1, t0 + 0.7))
    check = DuplicateLaunches(horizon_s=5.0)
    most = 0
    for r in log:
        check.add(r)
        most = max(most, len(check.spans), len(check.ends))
    assert most <= 5.0 / 0.1 + 10  # the tasks of the last 5 s, not all 2000
    assert check.result() == duplicate_launches(log)
    assert check.result()["count"] == 8


def test_without_a_horizon_nothing_is_forgotten() -> None:
    check = DuplicateLaunches()
    for i in range(100):
        check.add(row("start", f"t{i}", 1, i * 10.0))
        check.add(row("end", f"t{i}", 1, i * 10.0 + 1))
    assert len(check.spans) == 100


def pool_row(what: str, task: str, attempt: int, at: float, pool: str, inc: str) -> dict[str, Any]:
    """A row as ``LaunchLog`` hands it on: with its pool and that pool process."""
    return {**row(what, task, attempt, at), "pool": pool, "incarnation": inc}


def test_attempts_of_a_killed_pool_end_with_it() -> None:
    """The outside run of issue 32: lm2-workers SIGKILLed with attempt 1 running (no end
    row), back 2 s later under a new process, attempt 2 relaunched there 5 s later.
    Not a duplicate: the attempt died with its process."""
    log = [
        pool_row("start", "a", 1, 10.0, "lm2-workers", "p1"),
        pool_row("start", "b", 1, 10.5, "lm2-workers", "p1"),
        pool_row("end", "b", 1, 11.0, "lm2-workers", "p1"),
        pool_row("start", "a", 2, 16.0, "lm2-workers", "p2"),
        pool_row("end", "a", 2, 17.0, "lm2-workers", "p2"),
        # the same attempt again (the LM re-sent its start): it died too
        pool_row("start", "c", 1, 10.2, "lm2-workers", "p1"),
        pool_row("start", "c", 1, 16.1, "lm2-workers", "p2"),
        pool_row("end", "c", 1, 17.1, "lm2-workers", "p2"),
    ]
    assert duplicate_launches(log) == {"count": 0, "tasks": []}
    # read as the bench reads it: the new process answered before it logged anything,
    # and the relaunch of "a" was on another pool
    check = DuplicateLaunches(horizon_s=5.0)
    check.heard("lm2-workers", "p1", 9.0)
    check.add(log[0])
    check.heard("lm2-workers", "p1", 12.0)  # its last answer; killed after
    check.heard("lm2-workers", "p2", 15.0)  # back, under another process
    check.add(pool_row("start", "a", 2, 16.0, "lm0-workers", "q1"))
    check.add(pool_row("end", "a", 2, 17.0, "lm0-workers", "q1"))
    assert check.result() == {"count": 0, "tasks": []}
    assert check.restarts == 1


def test_a_pool_restart_hides_no_real_duplicate() -> None:
    """Two attempts both running, or both ending finished, are still found, whatever
    pool restarted in between."""
    log = [
        # attempt 1 runs on in lm0-workers (never restarted) beside attempt 2
        pool_row("start", "both", 1, 1.0, "lm0-workers", "q1"),
        pool_row("start", "both", 2, 2.0, "lm1-workers", "r1"),
        pool_row("end", "both", 2, 3.0, "lm1-workers", "r1"),
        # attempt 1 finished before its pool died; attempt 2 finished in the new process
        pool_row("start", "ended", 1, 1.0, "lm2-workers", "p1"),
        pool_row("end", "ended", 1, 2.0, "lm2-workers", "p1"),
        pool_row("start", "ended", 2, 6.0, "lm2-workers", "p2"),
        pool_row("end", "ended", 2, 7.0, "lm2-workers", "p2"),
        # relaunched elsewhere while the first process still answered: both ran
        pool_row("start", "early", 1, 1.0, "lm2-workers", "p1"),
        pool_row("start", "early", 2, 3.0, "lm1-workers", "r1"),
        pool_row("end", "early", 2, 3.5, "lm1-workers", "r1"),
        pool_row("start", "late", 1, 4.0, "lm2-workers", "p1"),  # p1 heard of at 4.0
        pool_row("start", "z", 1, 6.5, "lm2-workers", "p2"),
    ]
    found = duplicate_launches(log)
    assert found["why"] == {
        "u0/both": "two attempts at once",
        "u0/early": "two attempts at once",
        # seen in scripts/compose-e2e: the task's end logged 0.3 s before its pool was
        # SIGKILLed, never reported, and the task run again by the pool's next process
        "u0/ended": "ended twice, first in a process of lm2-workers that has been replaced since",
    }
    assert found["count"] == 3


class FakePool:
    """``LaunchLog._fetch`` of pools whose process may change: ``rows`` numbered from 1."""

    def __init__(self) -> None:
        self.incarnation = "p1"
        self.rows: list[dict[str, Any]] = []
        self.now = 0.0

    def restart(self, now: float) -> None:
        self.incarnation, self.rows, self.now = self.incarnation + "'", [], now

    async def fetch(self, _session: object, _lm: object, after: int) -> bytes:
        return codec.pack_plain(
            {
                "lm": "lm0",
                "launches": [{**r, "node": 0} for r in self.rows[after:]],
                "next": len(self.rows),
                "missed": 0,
                "incarnation": self.incarnation,
                "at": self.now,
            }
        )


def test_the_bench_tells_a_restarted_pool_by_its_incarnation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool back under a new process whose log already grew past the bench's cursor
    (the old test, "next went down", misses it): its log is read from its start, and
    the attempt that died with the old process is no duplicate of its relaunch."""
    cfg = replace(load_config(None), lms=1)
    pool = FakePool()
    log = LaunchLog(cfg, cast(Any, None), horizon_s=120.0)
    monkeypatch.setattr(log, "_fetch", pool.fetch)

    async def run() -> None:
        await log.poll(cast(Any, None), record=False)
        pool.rows, pool.now = [row("start", "a", 1, 1.0), row("start", "b", 1, 1.1)], 1.5
        await log.poll(cast(Any, None))
        pool.restart(now=8.0)  # killed; back; the LM relaunched both at once
        pool.rows = [row("start", "b", 2, 8.1), row("start", "a", 2, 8.2), row("end", "a", 2, 9)]
        await log.poll(cast(Any, None))

    asyncio.run(run())
    assert log.check.rows == 5  # all of the new process's rows, none skipped
    assert log.check.restarts == 1
    assert log.check.result() == {"count": 0, "tasks": []}
