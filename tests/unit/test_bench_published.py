"""``megha bench --trace-format``: a published production trace's jobs submitted live,
read as ``megha simulate`` reads them (``workload.published``); a job a federation
cannot take is skipped and counted, not the run refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from common.config import load_config
from common.dag import DagJob
from common.errors import ConfigError
from common.messages import MAX_JOB_TASKS
from megha_cli.live import _bench_options
from megha_cli.main import build_parser
from request_generator.bench import BenchOptions, build_workload
from tests.unit.test_trace_readers import EVENTS_2011, batch_task, task_event, write
from workload.jobs import Job


def _opts(**kw: object) -> BenchOptions:
    return BenchOptions(progress=False, **kw)  # type: ignore[arg-type]


def test_google2011_jobs_are_submitted_relative_to_the_first_arrival(tmp_path: Path) -> None:
    f = write(tmp_path / "part-00000.csv.gz", [task_event(*e) for e in EVENTS_2011], gz=True)
    read: dict[str, object] = {}
    jobs = build_workload(
        load_config(None), _opts(trace_format="google2011", trace_files=(str(f),)), read
    )
    assert [len(j.tasks) for j in jobs] == [2, 1, 1]
    assert [j.arrival for j in jobs] == [0.0, 2.0, 6.0]
    assert all(isinstance(j, Job) for j in jobs)
    assert [sorted(t.duration for t in j.tasks) for j in jobs] == [[5.0, 10.0], [2.0], [5.0]]
    assert len({j.job_id.split(".")[0] for j in jobs}) == 1  # stamped for this run
    assert read["format"] == "google2011"
    assert read["unsubmittable_jobs"] == 0


def test_alibaba2018_dags_past_what_a_job_holds_are_skipped_and_counted(tmp_path: Path) -> None:
    rows = [
        batch_task("M1", 2, "j_1", "Terminated", 100, 110),
        batch_task("R2_1", 1, "j_1", "Terminated", 110, 115),
        batch_task("M1", MAX_JOB_TASKS + 1, "j_2", "Terminated", 105, 200),
        batch_task("task_x", 3, "j_3", "Terminated", 120, 130),
    ]
    f = write(tmp_path / "batch_task.csv", rows)
    read: dict[str, object] = {}
    opts = _opts(trace_format="alibaba2018", trace_files=(str(f),), duration_scale=0.1)
    jobs = build_workload(load_config(None), opts, read)
    assert [len(j.tasks) for j in jobs] == [3, 3]
    dag = jobs[0]
    assert isinstance(dag, DagJob)
    assert [t.spec.duration for t in dag.tasks] == pytest.approx([1.0, 1.0, 0.5])
    assert read["unsubmittable_jobs"] == 1
    assert jobs[1].arrival == 20.0
    limited = build_workload(load_config(None), replace(opts, limit_jobs=1))
    assert len(limited) == 1


def test_a_trace_with_nothing_to_submit_says_what_was_read(tmp_path: Path) -> None:
    f = write(tmp_path / "batch_task.csv", [batch_task("M1", 2, "j_1", "Failed", 1, 2)])
    with pytest.raises(ConfigError, match=r"no job to submit \(read: .*") as err:
        build_workload(load_config(None), _opts(trace_format="alibaba2018", trace_files=(str(f),)))
    assert err.value.reason == "empty_workload"


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["bench", "t.csv"], "missing_trace"),
        (["bench", "--trace-format", "google2011"], "missing_trace"),
        (["bench", "--trace-format", "google2011", "--trace", "x.tr", "t.csv"], "two_workloads"),
    ],
    ids=["files-without-format", "format-without-files", "format-and-trace"],
)
def test_bench_trace_arguments_that_do_not_go_together(argv: list[str], reason: str) -> None:
    args = build_parser().parse_args(argv)
    with pytest.raises(ConfigError) as err:
        _bench_options(args)
    assert err.value.reason == reason


def test_bench_takes_a_published_trace_s_files() -> None:
    args = build_parser().parse_args(
        ["bench", "--trace-format", "alibaba2018", "a.tar.gz", "--limit-jobs", "5"]
    )
    opts = _bench_options(args)
    assert (opts.trace_format, opts.trace_files, opts.limit_jobs) == (
        "alibaba2018",
        ("a.tar.gz",),
        5,
    )
