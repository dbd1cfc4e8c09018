"""An idle span between arrivals costs no events: the heartbeats and the watchdog skip it."""

from __future__ import annotations

import random

import pytest

from common.cluster import PROFILES, default_users, make_federation
from common.ids import GmId
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation, SimResult
from workload.synthetic import WorkloadSpec, jobs_from_trace
from workload.traces import TraceJob

GMS = [GmId("gm0"), GmId("gm1")]


def _run(gap: float) -> SimResult:
    users = default_users(GMS)
    clusters = make_federation(40, GMS, 4, PROFILES["slots"], False, random.Random(1))
    trace = [TraceJob(0.0, (1.0, 2.0, 1.5)), TraceJob(gap, (1.0, 2.0, 1.5))]
    jobs = jobs_from_trace(trace, WorkloadSpec(constraints=False), users, random.Random(2))
    sim = MeghaSimulation(clusters, GMS, users, SimConfig(update_period_s=10.0))
    sim.add_jobs(jobs)
    return sim.run()


def test_a_long_idle_gap_costs_no_events_and_changes_no_figure() -> None:
    near, far = _run(100.0), _run(200_000.0)
    # 200,000 s of heartbeats from 4 LMs to 2 GMs were hundreds of thousands of events
    assert far.events < 2 * near.events
    assert far.stuck == near.stuck == 0
    assert not far.failed
    # the same figures (to float precision at an arrival 200,000 s later)
    assert far.job_completion == pytest.approx(near.job_completion, abs=1e-6)
    alloc = [t.allocation_time for t in near.tasks]
    assert [t.allocation_time for t in far.tasks] == pytest.approx(alloc, abs=1e-6)
    assert far.counters["internal_inconsistencies"] == 0
    assert far.counters["external_inconsistencies"] == 0
