"""The published traces' rows as the real tables have them: duplicates, events out of
the order a task's life would give, tasks that fail and are never run again.  What
cannot be replayed is counted under its own reason; what is replayed has the trace's
own numbers."""

from __future__ import annotations

from pathlib import Path

from workload.alibaba import AlibabaReplay, TraceStage


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
