"""Issue 35 item 2: a simulation holds what is in flight, not the trace.  Each task, as it
ends, goes into exact running figures and the task CSV's rows and is forgotten; the
workload is made as it arrives.  Every output must be what the whole list of tasks gave:
these tests compute the files the old way (every task kept to the end, the jobs added
before the run) beside the streamed run, and compare them byte for byte."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.cluster import make_federation, parse_users, profile
from common.ids import GmId, JobId, TaskId, UserId
from common.metrics import percentiles
from common.model import COMPONENTS, Phase, Task, TaskSpec, UserConfig, new_task
from megha_cli.main import build_parser, main
from reporting.plots import plot_cdfs
from reporting.tally import FloatColumns, jct_stats, summarize_tasks, tails
from reporting.tasks import OrderedRows, write_records_csv
from simulator import trace_run
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation, SimResult
from simulator.records import RunRecords
from simulator.sparrow import SparrowConfig, SparrowSimulation
from workload.jobs import Job
from workload.synthetic import WorkloadSpec, iter_synthetic_jobs, jobs_from_trace
from workload.traces import TraceJob

CLOCK_KEYS = frozenset({"wall_s", "cpu_s", "timing", "cpu_ms_per_task"})


def _strip(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k not in CLOCK_KEYS}
    return doc


# ------------------------------------------------------- the reference: the old way
def old_summary(r: SimResult) -> dict[str, Any]:
    """A scheduler's summary as it was made from every task kept to the end."""
    s = summarize_tasks(r.tasks)
    s["jct_s"] = jct_stats(r.job_completion)
    s["makespan_s"] = r.makespan_s
    s["counters"] = dict(sorted(r.counters.items()))
    s["failed_tasks"] = len(r.failed)
    s["stuck_tasks"] = r.stuck
    s["jobs_completed"] = len(r.job_completion)
    s["jobs_failed"] = len(r.failed_jobs)
    classes = sorted({t.spec.priority for t in r.tasks})
    if classes != [0]:
        s["classes"] = {}
        for c in classes:
            mine = [t for t in r.tasks if t.spec.priority == c and t.started_at >= 0]
            s["classes"][str(c)] = {
                "tasks": sum(1 for t in r.tasks if t.spec.priority == c),
                "allocation_time_s": percentiles([t.allocation_time for t in mine]),
                "first_start_s": percentiles([t.first_allocation_time for t in mine]),
            }
    return s


@pytest.mark.timeout(600)  # two runs of the point, three schedulers each, on a loaded box
@pytest.mark.parametrize("workers", [30, 300])
def test_simulate_writes_what_the_whole_list_of_tasks_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """``megha simulate``'s point streams every scheduler; the reference runs the same
    point with the jobs added before the run and every task kept, and makes the files
    the old way: the summary, every task CSV and the CDF plot are the same bytes.  30
    workers: an overloaded federation (preemptions by class, restarts, Sparrow's
    queues)."""
    argv = [
        "simulate", "--seed", "3", "--workload", "synthetic", "--jobs-count", "16",
        "--tasks-per-job", "8", "--rate", "5", "--mean-duration", "2", "--workers",
        str(workers), "--gms", "2", "--lms", "3", "--priorities", "2:0.2,1:0.3",
        "--cluster", "serial", "--quiet",
    ]  # fmt: skip
    out = tmp_path / "new"
    assert main([*argv, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())

    args = build_parser().parse_args([*argv, "--out", str(tmp_path / "ref")])
    args.workload = "synthetic"
    kept: dict[str, SimResult] = {}

    def keeping(label: str, total: int, outstanding: Any, run: Any) -> SimResult:
        kept[label] = run(lambda _: None)
        return kept[label]

    with monkeypatch.context() as m:  # the old way: every job added first, every task kept
        m.setattr(trace_run, "_streamed", lambda: {"records": RunRecords(rows=True)})
        m.setattr(MeghaSimulation, "stream_jobs", lambda s, jobs: s.add_jobs(list(jobs)))
        m.setattr(SparrowSimulation, "stream_jobs", lambda s, jobs: s.add_jobs(list(jobs)))
        trace_run.run_point(args, workers, 2, 3, tmp_path / "ref", keeping)

    restarted = 0
    for name, r in kept.items():
        ref = json.loads(json.dumps(old_summary(r)))
        assert _strip(summary["schedulers"][name]) == ref, name
        write_records_csv(tmp_path / f"old-{name}.csv", r.tasks, r.failed)
        old_csv = (tmp_path / f"old-{name}.csv").read_bytes()
        assert (out / f"tasks-{name}.csv").read_bytes() == old_csv, name
        restarted += sum(1 for t in r.tasks if t.started_at > t.first_started_at)
    assert set(kept) == {"megha", "sparrow", "centralized"}
    if workers == 30:
        assert restarted > 0  # the first-start series is drawn too
    # the CDF plot of the old series (lists of every started task, submission order)
    series: dict[str, list[float]] = {}
    for name, r in kept.items():
        started = [t for t in r.tasks if t.started_at >= 0]
        series[name] = [t.allocation_time for t in started]
        if any(t.started_at > t.first_started_at for t in started):
            series[f"{name} (first start)"] = [t.first_allocation_time for t in started]
    title = f"{workers} workers, 2 GMs x 3 LMs"
    plot_cdfs(tmp_path / "old.png", series, f"Allocation time: {title}")
    assert (out / "allocation_cdf.png").read_bytes() == (tmp_path / "old.png").read_bytes()


def _tie_trace() -> list[TraceJob]:
    """Whole-second arrivals, several jobs at one instant, whole-second durations: every
    kind of tie an event order can break."""
    rng = random.Random(7)
    return [
        TraceJob(float(k // 3), tuple(float(rng.randint(1, 4)) for _ in range(rng.randint(1, 6))))
        for k in range(60)
    ]


def _exact(tasks: list[Task]) -> list[tuple[Any, ...]]:
    return [
        (t.key, t.gm, t.lm, t.attempt, t.submitted_at, t.started_at, t.finished_at,
         list(t.marks), t.decisions, list(t.waits))
        for t in tasks
    ]  # fmt: skip


@pytest.mark.parametrize("scheduler", ["megha", "sparrow"])
def test_a_streamed_workload_runs_as_the_same_jobs_added_before_the_run(scheduler: str) -> None:
    """Arrivals streamed one at a time are ordered before every other event of their
    instant, as jobs added before the run were: the same run, tie for tie."""
    gm_ids = [GmId("gm0"), GmId("gm1")]
    users = parse_users("", gm_ids)
    clusters = make_federation(12, gm_ids, 2, profile("slots"), False, random.Random(1))
    # no costs at all: a GM's answer lands at the very instant of the next arrival
    cfg = SimConfig(network_delay_s=0.0, gm_decision_s=0.0, lm_validation_s=0.0)
    runs = []
    for streamed in (False, True):
        jobs = jobs_from_trace(_tie_trace(), WorkloadSpec(constraints=False), users,
                               random.Random(2))  # fmt: skip
        sim: MeghaSimulation | SparrowSimulation
        if scheduler == "megha":
            sim = MeghaSimulation(clusters, gm_ids, users, cfg)
        else:
            sim = SparrowSimulation(clusters, SparrowConfig(network_delay_s=0.0),
                                    random.Random(3))  # fmt: skip
        if streamed:
            sim.stream_jobs(jobs)
        else:
            sim.add_jobs(jobs)
        r = sim.run()
        runs.append((_exact(r.tasks), r.events, r.makespan_s, r.counters))
    assert runs[0] == runs[1]


def test_a_streamed_run_holds_only_what_is_in_flight() -> None:
    """2,000 tasks arriving over ~400 s on a federation that runs them as they come: the
    book never holds more than the jobs arrived and not done, far below the trace, and
    no task outlives the run's end (every figure is in the records)."""
    gm_ids = [GmId("gm0")]
    users = parse_users("", gm_ids)
    clusters = make_federation(200, gm_ids, 2, profile("slots"), False, random.Random(1))
    jobs = iter_synthetic_jobs(
        200, rate=0.5, tasks_per_job=10, mean_duration=1.0, spec=WorkloadSpec(constraints=False),
        users=users, rng=random.Random(4),
    )  # fmt: skip
    sim = MeghaSimulation(clusters, gm_ids, users, SimConfig(), keep_tasks=False)
    peak = 0
    add = sim.book.add

    def counting(job: Job) -> None:
        nonlocal peak
        add(job)
        peak = max(peak, sim.book.outstanding)

    sim.book.add = counting  # type: ignore[method-assign, assignment]
    sim.stream_jobs(jobs)
    r = sim.run()
    assert r.records.tasks == 2000
    assert r.records.summary()["tasks_started"] == 2000
    assert peak <= 100, peak  # a few jobs in flight at a time (of 200), never the trace
    assert r.kept is None
    with pytest.raises(ValueError, match="kept no task"):
        _ = r.tasks
    r.records.close()


def test_the_lazy_synthetic_workload_is_the_list_made_the_old_way() -> None:
    """The list drew every arrival and duration, then every constraint and demand; the
    lazy generator draws them from two streams and must make the same jobs."""
    users = [UserConfig(UserId(f"u{i}"), GmId("gm0"), 0.5) for i in range(2)]
    for prof, mean in (("slots", 2.0), ("paper", 3.0), ("paper", 0.0)):
        spec = WorkloadSpec(profile=prof)
        rng = random.Random(11)
        trace, t = [], 0.0
        for _ in range(30):
            t += rng.expovariate(4.0)
            durations = tuple(rng.expovariate(1.0 / mean) if mean > 0 else 0.0 for _ in range(5))
            trace.append(TraceJob(t, durations))
        old = jobs_from_trace(trace, spec, users, rng)
        new = list(
            iter_synthetic_jobs(
                30,
                rate=4.0,
                tasks_per_job=5,
                mean_duration=mean,
                spec=spec,
                users=users,
                rng=random.Random(11),
            )
        )
        assert [(j.job_id, j.user, j.arrival, j.tasks) for j in new] == [
            (j.job_id, j.user, j.arrival, j.tasks) for j in old
        ], (prof, mean)


def _task(i: int, failed: bool = False) -> Task:
    spec = TaskSpec(
        task_id=TaskId(f"j{i // 3}.t{i % 3}"), job_id=JobId(f"j{i // 3}"), user=UserId("u,1"),
        demand=(1,), duration=1.0,
    )  # fmt: skip
    t = new_task(spec, float(i))
    if not failed:
        t.mark(Phase.PROCESSING, i + 0.25)
        t.start(i + 0.5)
        t.finished_at = i + 1.5
    return t


def test_ordered_rows_write_the_csv_in_submission_order_whatever_the_end_order(
    tmp_path: Path,
) -> None:
    """Rows taken in a shuffled order, spilled in runs of 7 and merged 3 at a time (so
    merged runs are merged again), come out as the list of tasks in order writes them."""
    tasks = [_task(i, failed=i % 11 == 0) for i in range(500)]
    why = {t.key: 'refused: "bad", really' for i, t in enumerate(tasks) if i % 11 == 0}
    write_records_csv(tmp_path / "old.csv", tasks, why)
    rows = OrderedRows(run_rows=7, fan_in=3)
    order = list(range(500))
    random.Random(5).shuffle(order)
    for i in order:
        rows.add(i, tasks[i], why.get(tasks[i].key))
    rows.write(tmp_path / "new.csv")
    rows.close()
    assert (tmp_path / "new.csv").read_bytes() == (tmp_path / "old.csv").read_bytes()


def test_one_column_read_back_from_a_spilled_file_is_every_value() -> None:
    cols = FloatColumns(("a", "b", "c"), spill_rows=4)
    for i in range(23):
        cols.add(float(i), -float(i), i / 7)
    for name, want in zip(
        ("a", "b", "c"),
        ([float(i) for i in range(23)], [-float(i) for i in range(23)], [i / 7 for i in range(23)]),
        strict=True,
    ):
        assert cols.column(name).tolist() == want
        assert list(cols.columns()[name]) == want
    cols.close()


def test_tails_of_an_array_are_the_percentiles_of_the_list() -> None:
    rng = random.Random(9)
    for n in (0, 1, 2, 999, 1000, 1001, 4567):
        xs = [rng.lognormvariate(0.0, 2.0) for _ in range(n)]
        assert tails(np.asarray(xs)) == percentiles(xs)
        assert tails(xs) == percentiles(xs)
    assert COMPONENTS  # the tally's columns are the components' names
