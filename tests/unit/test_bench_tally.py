"""The benchmark client keeps no task once it ended: a row in tasks.csv, its figures in
compact columns, and the summary is what the whole list of tasks would have given."""

from __future__ import annotations

import csv
import gc
import random
from pathlib import Path

from common.config import FederationConfig
from common.ids import GmId, JobId, TaskId, UserId
from common.metrics import nearest_rank, percentiles
from common.model import Phase, Task, TaskSpec, UserConfig, new_task
from reporting.fairness import usage_from_tasks
from reporting.live import job_metrics, job_metrics_of
from reporting.tally import FloatColumns, jct_stats, summarize_tasks
from reporting.tasks import write_records_csv
from request_generator.bench import (
    BenchOptions,
    RunTally,
    _OfRun,
    _run_prefix,
    build_workload,
    sink_into,
)
from request_generator.submitter import Outcomes
from workload.dags import dag_stats, synthetic_dag_jobs
from workload.jobs import specs_of

T0 = 1_700_000_000.0


def ledger(spec: TaskSpec, at: float, i: int) -> Task:
    """A task's ledger as its GM reports it, the same for the same ``i``."""
    rng = random.Random(i)
    t = new_task(spec, at + rng.uniform(0.001, 0.01))
    now = t.submitted_at + rng.uniform(0.0, 0.05)
    t.mark(Phase.PROCESSING, now)
    t.waits[rng.randrange(len(t.waits))] += rng.choice([0, 1, 2])
    t.start(now + rng.uniform(0.001, 0.02))
    if i % 7 == 0:  # preempted, started again
        t.start(t.started_at + rng.uniform(0.1, 1.0))
    t.finished_at = t.started_at + rng.expovariate(2.0)
    return t


def count_tasks() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Task)


def test_a_run_keeps_no_task_and_summarizes_as_the_whole_list(tmp_path: Path) -> None:
    cfg = FederationConfig(gms=2, lms=2, nodes_per_lm=4).validate()
    jobs = build_workload(cfg, BenchOptions(jobs=120, tasks_per_job=3, job_rate=40.0))
    specs = [(j, s) for j in jobs for s in specs_of(j)]
    for j in jobs:
        j.arrival += T0
    tally = RunTally(cfg, jobs, tmp_path / "tasks.csv", spill_rows=16)
    out = Outcomes(keep=False, owns=_OfRun(_run_prefix(jobs)).__contains__)
    out.sink = sink_into(tally, out)
    for j in jobs:
        out.submitted(specs_of(j), j.arrival)
    lost_at, failed_at, late_at = 5, 11, 17  # never heard of; failed; failed, then finished
    before = count_tasks()
    for i, (j, s) in enumerate(specs):
        if i == lost_at:
            continue
        t = ledger(s, j.arrival, i)
        if i in (failed_at, late_at):
            t.finished_at = -1.0
            out.record(t, False, "worker_lost")
        else:
            out.record(t, True)
            out.record(ledger(s, j.arrival, i), True)  # a GM re-reports it: a duplicate
        del t
    out.record(ledger(specs[late_at][1], specs[late_at][0].arrival, late_at), True)
    foreign = TaskSpec(
        task_id=TaskId("other.t0"),
        job_id=JobId("other"),
        user=specs[0][1].user,
        demand=(1,),
        duration=1.0,
    )
    out.record(new_task(foreign, T0), True)  # another run's task: not counted
    out.settle()
    for spec, at in out.outstanding.values():
        tally.add(new_task(spec, at), at)
    tally.csv.close()

    # nothing of a task is left but its figures (bounded in memory: the rest on disk)
    assert count_tasks() == before + 1  # the failed one, until the end (it may finish)
    assert list(out.outstanding) == [(specs[lost_at][1].user, specs[lost_at][1].task_id)]
    assert not out.finished
    assert list(out.failed) == [(specs[failed_at][1].user, specs[failed_at][1].task_id)]
    assert not tally._open
    assert tally.tasks.values.held <= 16 * len(tally.tasks.values.names)
    assert out.n_finished == len(specs) - 2
    assert out.duplicates == len(specs) - 3

    # the same figures as from every task held at once
    tasks = []
    for i, (j, s) in enumerate(specs):
        if i == lost_at:
            tasks.append(new_task(s, j.arrival))
            continue
        t = ledger(s, j.arrival, i)
        if i == failed_at:
            t.finished_at = -1.0
        tasks.append(t)
    assert tally.tasks.summary() == summarize_tasks(tasks)
    started = [(t, j.arrival) for t, (j, _) in zip(tasks, specs, strict=True) if t.started_at >= 0]
    publish = tally.publish.columns()
    assert percentiles(publish["submission"]) == percentiles(
        [t.submitted_at - a for t, a in started]
    )
    assert percentiles(publish["submit_to_start"]) == percentiles(
        [t.started_at - a for t, a in started]
    )
    assert sorted(tally.tasks.allocation_times()) == sorted(t.allocation_time for t, _ in started)
    whole = job_metrics(cfg, jobs, tasks)
    assert job_metrics_of(cfg, jobs, tally.job_end, tally.spans()) == whole
    assert 0 < whole["jobs_completed"] < len(jobs)
    # tasks.csv: every task's row, as write_records_csv writes them
    failed_key = (specs[failed_at][1].user, specs[failed_at][1].task_id)
    write_records_csv(tmp_path / "all.csv", tasks, {failed_key: "worker_lost"})
    streamed = (tmp_path / "tasks.csv").read_text().splitlines()
    full = (tmp_path / "all.csv").read_text().splitlines()
    assert streamed[0] == full[0]
    assert sorted(streamed[1:]) == sorted(full[1:])
    # ... each saying how it ended: the failed one with why, the late one finished
    with (tmp_path / "tasks.csv").open() as fh:
        ended = {r["task_id"]: (r["state"], r["failure"]) for r in csv.DictReader(fh)}
    assert ended[specs[failed_at][1].task_id] == ("failed", "worker_lost")
    assert ended[specs[late_at][1].task_id] == ("finished", "")
    assert ended[specs[lost_at][1].task_id] == ("unfinished", "")
    assert sum(state == "finished" for state, _ in ended.values()) == len(specs) - 2
    tally.close()


def test_float_columns_spill_to_disk_and_read_back_in_order() -> None:
    cols = FloatColumns(("a", "b"), spill_rows=3)
    for i in range(10):
        cols.add(float(i), -0.1 * i)
        assert cols.held <= 6
    back = cols.columns()
    assert list(back["a"]) == [float(i) for i in range(10)]
    assert list(back["b"]) == [-0.1 * i for i in range(10)]
    cols.add(10.0, 1.0)
    assert list(cols.columns()["a"]) == [float(i) for i in range(11)]
    cols.close()


def _usage_by_sweep(
    tasks: list[Task], capacity: list[int], first: float, last: float
) -> list[tuple[float, dict[str, float]]]:
    """The users' shares as ``usage_from_tasks`` measured them before: a sweep over
    every start and end, sorted (kept here to check the one that needs no list)."""
    edges = sorted(
        ((e, sign, t) for t in tasks if 0 <= t.started_at <= t.finished_at
         for e, sign in ((t.started_at, 1), (t.finished_at, -1))),
        key=lambda e: (e[0], e[1]),
    )  # fmt: skip
    used: dict[str, list[int]] = {}
    out: list[tuple[float, dict[str, float]]] = []
    k, now = 0, first
    while now <= last:
        while k < len(edges) and edges[k][0] <= now:
            _, sign, t = edges[k]
            acc = used.setdefault(t.user, [0] * len(capacity))
            for r, x in enumerate(t.demand):
                acc[r] += sign * x
            k += 1
        out.append((now, {u: max(x / c for x, c in zip(v, capacity, strict=True) if c > 0)
                          for u, v in used.items()}))  # fmt: skip
        now += 1.0
    return out


def test_usage_samples_are_the_sweeps() -> None:
    rng = random.Random(5)
    for _ in range(100):
        tasks = []
        for i in range(rng.randrange(40)):
            spec = TaskSpec(
                task_id=TaskId(f"t{i}"),
                job_id=JobId("j"),
                user=UserId(f"u{rng.randrange(3)}"),
                demand=(rng.randrange(3), rng.randrange(5)),
                duration=1.0,
            )
            t = new_task(spec, rng.uniform(0, 20))
            if rng.random() < 0.8:
                t.start(t.submitted_at + rng.choice([0.0, rng.uniform(0, 5)]))
                t.finished_at = t.started_at + rng.choice([0.0, rng.uniform(0, 9), -0.5])
            tasks.append(t)
        first, last = rng.uniform(-2, 5), rng.uniform(0, 40)
        assert usage_from_tasks(tasks, [4, 10], first, last) == _usage_by_sweep(
            tasks, [4, 10], first, last
        )


def test_every_summary_takes_percentiles_by_nearest_rank() -> None:
    """One definition: a measured value (no interpolation), the smallest with at least
    the share asked at or below it; the same for task tails, JCTs and DAG shapes."""
    xs = [float(i) for i in range(1, 101)]
    assert [nearest_rank(xs, q) for q in (0.5, 0.9, 0.95, 0.99, 1.0)] == [50, 90, 95, 99, 100]
    assert nearest_rank([1.0, 2.0], 0.5) == 1.0  # not 1.5
    assert nearest_rank([], 0.5) == 0.0
    assert percentiles([3.0, 1.0, 2.0])["p50"] == 2.0
    assert jct_stats({JobId(f"j{i}"): x for i, x in enumerate(xs)})["p95"] == 95.0
    users = [UserConfig(UserId("u0"), GmId("gm0"), 1.0)]
    jobs = synthetic_dag_jobs(40, rate=0.5, users=users, node_capacity=(100,), rng=random.Random(1))
    stages = sorted(float(len(j.stages)) for j in jobs)
    assert dag_stats(jobs)["stages_p50"] == nearest_rank(stages, 0.5)
