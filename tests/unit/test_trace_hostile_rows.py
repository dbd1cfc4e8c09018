"""The published traces' rows as the real tables have them: duplicates, events out of
the order a task's life would give, tasks that fail and are never run again.  What
cannot be replayed is counted under its own reason; what is replayed has the trace's
own numbers."""

from __future__ import annotations

from pathlib import Path

from workload.alibaba import AlibabaReplay, TraceStage
from workload.google import read_google
from workload.traces import TraceJob


def batch_task(
    name: str, n: int, job: str, start: int, end: int, status: str = "Terminated"
) -> str:
    """A ``batch_task`` row: task_name, instance_num, job_name, task_type, status,
    start_time, end_time, plan_cpu, plan_mem."""
    return f"{name},{n},{job},1,{status},{start},{end},100,0.39"


def replay(path: Path, rows: list[str]) -> AlibabaReplay:
    path.write_text("".join(r + "\n" for r in rows))
    return AlibabaReplay([path])


def test_a_row_written_twice_is_one_task(tmp_path: Path) -> None:
    """A duplicated ``M1`` row skipped its whole job as one whose names repeat a number;
    a duplicated ``task_...`` row ran its instances twice."""
    rows = [
        batch_task("M1", 2, "j_1", 100, 110),
        batch_task("M1", 2, "j_1", 100, 110),
        batch_task("R2_1", 1, "j_1", 110, 115),
        batch_task("task_Nzg3ODAw", 3, "j_2", 50, 70),
        batch_task("task_Nzg3ODAw", 3, "j_2", 50, 70),
        batch_task("M1", 1, "j_3", 10, 20),
        batch_task("M1", 1, "j_3", 10, 25),  # the same task with another end: which one?
    ]
    r = replay(tmp_path / "batch_task.csv", rows)
    jobs = {j.name: j.stages for j in r}
    assert jobs == {
        "j_1": (TraceStage(1, (), 2, 10.0), TraceStage(2, (1,), 1, 5.0)),
        "j_2": (TraceStage(1, (), 3, 20.0),),
    }
    assert (r.stats.duplicate_rows, r.stats.skipped_jobs, r.stats.tasks) == (2, 1, 6)


S = 1_000_000  # microseconds


def task_event(t: float, job: int, kind: int) -> str:
    """A 2011 ``task_events`` row of task 0 of ``job``."""
    return f"{int(t * S)},,{job},0,{'' if kind == 0 else 42},{kind},u=,2,0,0.03,0.01,0,0"


def test_a_task_failed_and_never_run_again_is_not_counted_cut(tmp_path: Path) -> None:
    """A task that FAILed (or was evicted) and was not submitted again stays open until
    the lookahead; it was then counted ``clipped`` (or ``unfinished`` at the trace's
    end), as if cut while running, though its time is the trace's to the second."""
    events = [(0, 1, 0), (1, 1, 1), (3, 1, 3), (0, 2, 0), (0, 2, 1), (2, 2, 2)]
    events += [(50, 3, 0), (50, 3, 1), (100, 4, 0), (101, 4, 1)]  # job 3 cut, 4 at the end
    events.sort(key=lambda e: e[0])
    path = tmp_path / "task_events.csv"
    path.write_text("".join(task_event(*e) + "\n" for e in events))
    r = read_google("google2011", [path], lookahead=10.0)
    assert list(r) == [
        TraceJob(0.0, (2.0,)),
        TraceJob(0.0, (2.0,)),
        TraceJob(50.0, (10.0,)),
        TraceJob(100.0, (0.0,)),
    ]
    assert (r.stats.clipped, r.stats.unfinished) == (1, 1)


def test_a_finish_without_a_schedule_is_counted_as_such(tmp_path: Path) -> None:
    """A task that FINISHed with its SCHEDULE missing from the trace ran, for a time not
    known: dropped, but not counted among the tasks killed before they ran."""
    events = [(0, 1, 0), (5, 1, 4), (0, 2, 0), (6, 2, 5), (7, 3, 0), (7, 3, 1), (9, 3, 4)]
    events.sort(key=lambda e: e[0])
    path = tmp_path / "task_events.csv"
    path.write_text("".join(task_event(*e) + "\n" for e in events))
    r = read_google("google2011", [path])
    assert list(r) == [TraceJob(7.0, (2.0,))]
    assert (r.stats.finished_unscheduled, r.stats.never_ran) == (1, 1)


def test_the_parents_dropped_are_those_of_jobs_replayed(tmp_path: Path) -> None:
    """A skipped job's self-dependency (``M1_1``) was counted among the dependencies
    dropped from the jobs replayed."""
    rows = [
        batch_task("M1_1", 1, "j_1", 10, 20),
        batch_task("M2_3", 1, "j_1", 10, 20),
        batch_task("M3_2", 1, "j_1", 10, 20),  # 2 and 3 form a cycle: j_1 is skipped
        batch_task("M1", 1, "j_2", 10, 20),
        batch_task("R2_1_7", 1, "j_2", 20, 30),  # no task 7
    ]
    r = replay(tmp_path / "batch_task.csv", rows)
    assert [j.name for j in r] == ["j_2"]
    assert (r.stats.skipped_jobs, r.stats.dropped_parents) == (1, 1)


def test_a_schedule_listed_after_its_own_finish_is_not_a_new_task(tmp_path: Path) -> None:
    """Events of one timestamp come in any order: a SCHEDULE listed after its task's
    FINISH at that time made a task of a new job, running to the lookahead (a day by
    default); it is counted ``reordered`` instead."""
    events = [(0, 1, 0), (2, 1, 1), (9, 1, 4), (3, 2, 0), (4, 2, 4), (4, 2, 1)]
    events += [(5, 3, 0), (6, 3, 1), (8, 3, 4)]
    events.sort(key=lambda e: e[0])  # (stable: at 4, job 2's FINISH stays first)
    path = tmp_path / "task_events.csv"
    path.write_text("".join(task_event(*e) + "\n" for e in events))
    r = read_google("google2011", [path], lookahead=1000.0)
    assert list(r) == [TraceJob(0.0, (7.0,)), TraceJob(5.0, (2.0,))]
    assert r.stats.reordered == 1
    assert r.stats.finished_unscheduled == 1
    assert (r.stats.clipped, r.stats.unfinished) == (0, 0)


def test_a_second_schedule_of_a_running_task_keeps_the_time_it_ran(tmp_path: Path) -> None:
    """A SCHEDULE of a task already running (its end record missing) restarted its
    clock: the time it had run was lost."""
    events = [(0, 1, 0), (1, 1, 1), (3, 1, 1), (6, 1, 4)]
    path = tmp_path / "task_events.csv"
    path.write_text("".join(task_event(*e) + "\n" for e in events))
    assert list(read_google("google2011", [path])) == [TraceJob(0.0, (5.0,))]
