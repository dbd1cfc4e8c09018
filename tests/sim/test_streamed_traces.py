"""``megha simulate --trace-format google2011|google2019|alibaba2018 FILE...``: the
published traces replayed as they are read, the simulator taking each job only when
the one before it arrives."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.cluster import make_federation, parse_users, profile
from common.ids import GmId
from megha_cli.main import main
from simulator.megha_sim import MeghaSimulation
from simulator.sparrow import SparrowSimulation
from tests.unit.test_trace_readers import EVENTS_2011, batch_task, task_event, write
from workload.jobs import Job
from workload.synthetic import WorkloadSpec, synthetic_jobs

BASE = ["--workers", "20", "--gms", "2", "--lms", "2", "--quiet"]


def test_a_google2011_trace_replays_under_every_scheduler(tmp_path: Path) -> None:
    rows = [task_event(*e) for e in EVENTS_2011]
    a = write(tmp_path / "part-00000.csv.gz", rows[:9], gz=True)
    b = write(tmp_path / "part-00001.csv.gz", rows[9:], gz=True)
    out = tmp_path / "out"
    assert main(["simulate", "--trace-format", "google2011", str(a), str(b), *BASE,
                 "--out", str(out)]) == 0  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["jobs"], summary["tasks"]) == (3, 4)
    assert summary["trace"]["format"] == "google2011"
    assert (summary["trace"]["never_ran"], summary["trace"]["unfinished"]) == (1, 1)
    for name, s in summary["schedulers"].items():
        assert (s["jobs_completed"], s["failed_tasks"], s["stuck_tasks"]) == (3, 0, 0), name
    assert (out / "tasks-sparrow.csv").read_text().count("\n") == 5


def test_an_alibaba2018_trace_replays_its_dags(tmp_path: Path) -> None:
    rows = [
        batch_task("M1", 2, "j_1", "Terminated", 100, 110),
        batch_task("R2_1", 1, "j_1", "Terminated", 110, 115),
        batch_task("task_x", 3, "j_2", "Terminated", 50, 70),
        batch_task("J3_1_2", 4, "j_1", "Terminated", 115, 120),
    ]
    path = write(tmp_path / "batch_task.csv", rows)
    out = tmp_path / "out"
    args = ["simulate", "--trace-format", "alibaba2018", str(path), *BASE, "--out", str(out)]
    assert main(args) == 2  # Sparrow's model has no stages: said, not dropped
    assert main([*args, "--baselines", "centralized"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["jobs"], summary["tasks"]) == (2, 10)
    for name, s in summary["schedulers"].items():
        assert s["jobs_completed"] == 2, name
        # j_1's stage 3 starts once stages 1 and 2 are done: JCT at least 10 + 5 + 5
        assert s["jct_s"]["max"] >= 20.0, name


def test_streamed_trace_flags_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--trace-format", "google2019", *BASE]) == 2
    assert "needs the trace's FILEs" in capsys.readouterr().err
    path = write(tmp_path / "t.csv", ["0 1 1 1"])
    assert main(["simulate", str(path), *BASE]) == 2
    assert "give --trace-format" in capsys.readouterr().err


def test_a_trace_with_no_task_to_replay_is_an_error_not_a_table_of_zeros(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = write(tmp_path / "empty.csv", [])
    submitted_only = write(tmp_path / "part-00000.csv", [task_event(1.0, 7, 0, 0)])
    out = tmp_path / "out"
    for fmt, path, read in (
        ("google2011", empty, "read: nothing"),
        ("alibaba2018", empty, "read: nothing"),
        ("google2011", submitted_only, "never_ran 1"),
    ):
        argv = ["simulate", "--trace-format", fmt, str(path), *BASE, "--out", str(out)]
        assert main([*argv, "--baselines", ""]) == 2, (fmt, path)
        err = capsys.readouterr().err
        assert f"{path}: no task to replay" in err, err
        assert read in err, err
        assert not (out / "summary.json").exists()


def _pulled_lazily(sim: MeghaSimulation | SparrowSimulation, jobs: list[Job]) -> list[float]:
    """Feeds ``jobs`` as a stream; the virtual time at which each was taken."""
    taken: list[float] = []

    def stream() -> Iterator[Job]:
        for j in jobs:
            taken.append(sim.loop.now)
            yield j

    sim.stream_jobs(stream())
    result = sim.run()
    assert len(result.job_completion) == len(jobs)
    return taken


@pytest.mark.parametrize("scheduler", ["megha", "sparrow"])
def test_the_simulator_takes_each_job_only_when_the_one_before_arrives(scheduler: str) -> None:
    gm_ids = [GmId("gm0"), GmId("gm1")]
    users = parse_users("", gm_ids)
    clusters = make_federation(40, gm_ids, 2, profile("slots"), False, random.Random(3))
    jobs = synthetic_jobs(
        300, rate=20.0, tasks_per_job=3, mean_duration=0.5,
        spec=WorkloadSpec(constraints=False), users=users, rng=random.Random(1),
    )  # fmt: skip
    sim: MeghaSimulation | SparrowSimulation
    if scheduler == "megha":
        sim = MeghaSimulation(clusters, gm_ids, users)
    else:
        sim = SparrowSimulation(clusters)
    taken = _pulled_lazily(sim, jobs)
    assert len(taken) == len(jobs)
    for k in range(1, len(jobs)):
        assert taken[k] == pytest.approx(jobs[k - 1].arrival), k
