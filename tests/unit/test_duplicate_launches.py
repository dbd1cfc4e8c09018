"""``common.metrics.DuplicateLaunches``: what counts as a task run twice."""

from __future__ import annotations

from typing import Any

from common.metrics import DuplicateLaunches, duplicate_launches


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
    assert found == {"count": 3, "tasks": ["u0/again", "u0/overlap", "u0/twice"]}


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
