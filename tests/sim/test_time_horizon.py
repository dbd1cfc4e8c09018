"""Virtual times past the simulator's horizon are refused, naming the job.

A job arriving at 1e308 s never ended (``t + 10 == t`` there, so the heartbeats did
not move time), and one arriving at 1e300 s ran with a JCT of 0 s: its 1-s task
rounded to nothing.  A trace in epoch milliseconds is such a trace.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from common.cluster import PROFILES, default_users, make_federation
from common.dag import make_job
from common.errors import ConfigError
from common.ids import GmId
from megha_cli.main import main
from simulator.config import SimConfig
from simulator.jobs import HORIZON_S, JobBook
from simulator.megha_sim import MeghaSimulation
from workload.synthetic import WorkloadSpec, jobs_from_trace
from workload.traces import TraceJob

GMS = [GmId("gm0"), GmId("gm1")]


@pytest.mark.parametrize(
    ("arrival", "durations", "said"),
    [
        (1e308, (1.0,), "arrives at 1e+308 s"),
        (1e300, (1.0,), "arrives at 1e+300 s"),  # ran, with a JCT of 0 s
        (HORIZON_S * 2, (1.0,), "arrives at"),
        (0.0, (1.0, 1e12), "runs for 1e+12 s"),
        (HORIZON_S - 10.0, (20.0,), "runs for 20 s"),
    ],
)
def test_times_past_the_horizon_are_refused_naming_the_job(
    arrival: float, durations: tuple[float, ...], said: str
) -> None:
    users = default_users(GMS)
    jobs = jobs_from_trace(
        [TraceJob(0.0, (1.0,)), TraceJob(arrival, durations)],
        WorkloadSpec(constraints=False),
        users,
        random.Random(2),
    )
    clusters = make_federation(20, GMS, 2, PROFILES["slots"], False, random.Random(1))
    sim = MeghaSimulation(clusters, GMS, users, SimConfig())
    with pytest.raises(ConfigError, match=re.escape(said)) as err:
        sim.add_jobs(jobs)
    assert err.value.reason == "past_horizon"
    assert "job j1 " in str(err.value)


def test_a_dag_whose_critical_path_ends_past_the_horizon_is_refused() -> None:
    stages = [(0, [((1,), 3e9)], []), (1, [((1,), 3e9)], [0])]
    with pytest.raises(ConfigError, match="job d arrives at 0 s and runs for 6e"):
        JobBook().add(make_job("d", "u0", 0.0, stages))


def test_an_arrival_in_seconds_since_1970_is_inside_the_horizon() -> None:
    book = JobBook()
    book.add(make_job("d", "u0", 1.8e9, [(0, [((1,), 3600.0)], [])]))
    assert book.outstanding == 1


@pytest.mark.timeout(20)
def test_simulate_says_which_job_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arrivals in epoch milliseconds: an error naming the job and the way out."""
    trace = tmp_path / "ms.tr"
    trace.write_text("1764201600000 1 1 1\n1764201600500 1 1 1\n")
    args = ["simulate", "--quiet", "--trace", str(trace), "--workers", "20", "--gms", "2"]
    assert main([*args, "--lms", "2", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("megha simulate: job j0 arrives at 1.7642e+12 s: past")
    assert "--time-scale" in err
    assert "Traceback" not in err
