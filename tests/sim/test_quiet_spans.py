"""A quiet span (nothing can change before the next arrival or task end) costs no
events: heartbeats and the watchdog skip it, whether it is an idle gap or days of tasks
running.  And skipping changes nothing: every figure equals the run that simulates
every tick (``MeghaSimulation.SKIP_QUIET = False``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from common.cluster import PROFILES, default_users, make_federation
from common.ids import GmId
from common.overload import OVERLOAD_DEFAULTS, OverloadPolicy
from global_master.policy import make_policy
from global_master.queues import UserQueues
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation, SimResult
from workload.synthetic import WorkloadSpec, jobs_from_trace
from workload.traces import TraceJob

GMS = [GmId("gm0"), GmId("gm1")]


def _run(
    trace: Sequence[TraceJob],
    cfg: SimConfig,
    *,
    gms: Sequence[GmId] = GMS,
    workers: int = 40,
    lms: int = 4,
    constraints: bool = False,
    policy: str | None = None,
) -> tuple[SimResult, MeghaSimulation]:
    users = default_users(gms)
    prof = PROFILES["slots"]
    clusters = make_federation(workers, gms, lms, prof, constraints, random.Random(1))
    spec = WorkloadSpec(constraints=constraints)
    jobs = jobs_from_trace(trace, spec, users, random.Random(2))
    factory = make_policy(policy, users, seed=1) if policy else None
    sim = MeghaSimulation(clusters, gms, users, cfg, queues_factory=factory)
    sim.add_jobs(jobs)
    return sim.run(), sim


def _long(duration: float) -> list[TraceJob]:
    return [TraceJob(0.0, (duration, 0.9 * duration, 0.8 * duration)), TraceJob(5.0, (3.0,))]


def test_tasks_running_for_days_cost_the_events_of_their_changes_not_of_their_length() -> None:
    cfg = SimConfig(update_period_s=10.0)
    short, _ = _run(_long(1_000.0), cfg)
    long, _ = _run(_long(200_000.0), cfg)
    # every heartbeat of 4 LMs to 2 GMs for 200,000 s was ~400,000 events
    assert long.events < 2 * short.events
    assert long.makespan_s == pytest.approx(200_000.0)
    assert long.stuck == 0
    assert not long.failed
    # the skipped heartbeats count as applied (empty) updates, as if simulated
    assert long.counters["updates_applied"] > 200_000 / 10 * 4 * 2 * 0.9
    # nothing declared lost: the simulator models no worker liveness, and no LM
    # watchdog ran on skipped heartbeats
    assert long.counters["workers_lost"] == 0


def _same(a: SimResult, b: SimResult) -> None:
    assert a.tasks == b.tasks  # every timestamp, attempt, mark and wait reason
    assert a.job_completion == b.job_completion
    assert a.counters == b.counters
    assert a.makespan_s == b.makespan_s
    assert a.failed == b.failed
    assert a.failed_jobs == b.failed_jobs
    assert a.stuck == b.stuck
    assert a.virtual_s == b.virtual_s


def _both(
    monkeypatch: pytest.MonkeyPatch, trace: Sequence[TraceJob], cfg: SimConfig, **kw: Any
) -> tuple[SimResult, SimResult]:
    monkeypatch.setattr(MeghaSimulation, "SKIP_QUIET", False)
    every, sim_every = _run(trace, cfg, **kw)
    monkeypatch.setattr(MeghaSimulation, "SKIP_QUIET", True)
    skip, sim_skip = _run(trace, cfg, **kw)
    _same(skip, every)
    # the accounting of the skipped heartbeats: each server's messages and busy time
    load_every, load_skip = sim_every.server_load(), sim_skip.server_load()
    for name, load in load_every.items():
        assert load_skip[name]["handled"] == load["handled"], name
        assert load_skip[name]["busy_s"] == pytest.approx(load["busy_s"], rel=1e-9), name
    return skip, every


def _mixed() -> list[TraceJob]:
    """Long and short tasks, bursts over capacity, idle gaps, a span of long tasks only."""
    rng = random.Random(7)
    trace: list[TraceJob] = []
    t = 0.0
    for _ in range(40):
        t += rng.choice((0.5, 3.0, 40.0, 900.0))
        n = rng.choice((1, 4, 30))
        trace.append(TraceJob(t, tuple(rng.choice((1.5, 20.0, 2_500.0)) for _ in range(n))))
    trace.append(TraceJob(t + 5_000.0, (7.0, 8.0)))
    return trace


def test_skipping_changes_no_figure_on_a_mixed_workload(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = SimConfig(update_period_s=5.0, overload=OVERLOAD_DEFAULTS)
    skip, every = _both(
        monkeypatch, _mixed(), cfg, gms=[GmId("gm0"), GmId("gm1"), GmId("gm2")], workers=30,
        lms=6, constraints=True,
    )  # fmt: skip
    assert skip.events < 0.9 * every.events  # it did skip (not while tasks wait for room)
    assert skip.stuck == 0
    assert skip.counters["preemptions"] > 0  # tasks waited for room and were preempted for
    assert skip.counters["repartitions"] > 0


def _live_costs(overload: OverloadPolicy) -> SimConfig:
    """Hop delays drawn from live samples (a seeded random stream) and service costs."""
    return SimConfig(
        update_period_s=5.0,
        hop_samples_s=(0.0002, 0.0011, 0.004, 0.0007),
        gm_service_s=0.0006,
        lm_service_s=0.0007,
        lm_update_node_s=1e-6,
        overload=overload,
    )


def test_skipping_changes_no_figure_with_live_hop_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hop delays drawn from live samples (a seeded random stream): the skipped
    heartbeats' draws are taken all the same, so every later hop is the same."""
    cfg = _live_costs(OVERLOAD_DEFAULTS)
    skip, every = _both(monkeypatch, _mixed(), cfg, workers=40, lms=4, constraints=True)
    assert skip.events < every.events / 2


class _NeverDecides(UserQueues):
    """Queues a GM never takes a task from: whatever arrives is stuck."""

    def has_work(self) -> bool:
        return False


def test_a_stuck_run_is_still_declared_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks queued that no GM will ever place: quiet until the last arrival (skipped),
    then nothing is to come, so the watchdog ticks and declares them stuck, as before."""
    users = default_users(GMS)
    trace = [TraceJob(0.0, (5.0, 6.0)), TraceJob(50_000.0, (5.0,))]

    def run() -> SimResult:
        clusters = make_federation(40, GMS, 4, PROFILES["slots"], False, random.Random(1))
        jobs = jobs_from_trace(trace, WorkloadSpec(constraints=False), users, random.Random(2))
        sim = MeghaSimulation(
            clusters, GMS, users, SimConfig(), queues_factory=lambda g, mine: _NeverDecides(mine)
        )
        sim.add_jobs(jobs)
        return sim.run()

    monkeypatch.setattr(MeghaSimulation, "SKIP_QUIET", False)
    every = run()
    monkeypatch.setattr(MeghaSimulation, "SKIP_QUIET", True)
    skip = run()
    _same(skip, every)
    assert skip.stuck == 3
    assert skip.events < every.events / 10


def test_a_large_jobs_slices_are_not_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job over the GM's admission slice is admitted by the GM's own timers
    (``AdmitMore``): pending, they are messages on the wire, so nothing parks until the
    last slice is in; then the quiet span until the next job is skipped."""
    big = [TraceJob(0.0, tuple(0.5 + (i % 7) for i in range(2_500)))]
    trace = [*big, TraceJob(30_000.0, (4_000.0, 3_000.0)), TraceJob(30_001.0, (5.0,))]
    skip, every = _both(monkeypatch, trace, SimConfig(), gms=[GmId("gm0")], workers=120, lms=2)
    assert len(skip.tasks) == 2_503
    assert skip.stuck == 0
    assert every.events - skip.events > 20_000  # ~34,000 s of heartbeats of 2 LMs


# ------------------------------------------------- overload: tasks waiting for room


def _backlog(n: int, duration: float) -> list[TraceJob]:
    return [TraceJob(0.0, tuple(duration + i for i in range(n)))]


def test_tasks_waiting_at_the_gm_for_long_tasks_cost_no_heartbeat_events() -> None:
    """4 workers, 1e4-s tasks, the rest waiting at the GM (the waiting index): nothing
    but a task's end can change anything, so the heartbeats between ends are skipped.
    Each heartbeat of 2 LMs for ~30,000 s was ~17,000 events."""
    cfg = SimConfig(overload=OVERLOAD_DEFAULTS)
    one = [GmId("gm0")]
    short, _ = _run(_backlog(12, 10.0), cfg, gms=one, workers=4, lms=2)
    long, _ = _run(_backlog(12, 10_000.0), cfg, gms=one, workers=4, lms=2)
    assert long.counters["waited"] >= 8  # tasks did wait at the GM for room
    assert long.makespan_s > 30_000
    assert long.events < 2 * short.events
    assert long.events < 1_000
    assert long.counters["updates_applied"] > 30_000 / 10 * 2 * 0.9  # accounted


def _starving() -> list[TraceJob]:
    """gm0's user fills the federation with long tasks; gm1's user comes a second
    later, far below its share: starved, it preempts after its grace, rate limited;
    more jobs of both come, some long, with long gaps."""
    rng = random.Random(3)
    trace = [TraceJob(0.0, tuple(5_000.0 + rng.random() * 100 for _ in range(30)))]
    trace.append(TraceJob(1.0, tuple(3_000.0 + rng.random() * 100 for _ in range(10))))
    t = 2.0
    for _ in range(30):
        t += rng.choice((5.0, 200.0, 4_000.0))
        n = rng.choice((1, 5, 20))
        trace.append(TraceJob(t, tuple(rng.choice((30.0, 2_000.0, 9_000.0)) for _ in range(n))))
    return trace


@pytest.mark.parametrize("grace", [60.0, 3_000.0])
def test_skipping_while_tasks_wait_changes_no_figure(
    monkeypatch: pytest.MonkeyPatch, grace: float
) -> None:
    """Tasks wait at the GMs for most of the run, a user starves and preempts after its
    grace: every figure, and each server's load, as when every tick is simulated."""
    overload = replace(OVERLOAD_DEFAULTS, preempt_grace_s=grace)
    cfg = SimConfig(update_period_s=5.0, overload=overload)
    skip, every = _both(monkeypatch, _starving(), cfg, workers=12, lms=3)
    assert skip.events < every.events / 5  # it did skip while tasks waited
    assert skip.counters["waited"] > 100
    assert skip.counters["preemptions_deferred"] > 0  # the grace ran
    assert skip.counters["preemptions"] > 0
    assert skip.stuck == 0


def test_skipping_while_tasks_wait_with_constraints_hops_and_three_gms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same with placement constraints, live hop draws, service costs, three GMs
    and four LMs, and a GM that preempts as soon as its user is below its share."""
    overload = replace(OVERLOAD_DEFAULTS, victims_younger_than_wait=False, preempt_below=1.0)
    cfg = _live_costs(overload)
    gms = [GmId("gm0"), GmId("gm1"), GmId("gm2")]
    skip, every = _both(monkeypatch, _starving(), cfg, gms=gms, workers=18, lms=4, constraints=True)
    assert skip.events < every.events / 5
    assert skip.counters["waited"] > 100
    assert skip.counters["preemptions"] > 0
    assert skip.stuck == 0


def test_skipping_under_overload_with_carbyne_changes_no_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Job-aware queues keep their blocked tasks themselves (no waiting index); their
    plans change with events, never with time: the same figures as ticking."""
    cfg = SimConfig(update_period_s=5.0, overload=OVERLOAD_DEFAULTS)
    skip, every = _both(monkeypatch, _starving(), cfg, workers=12, lms=3, policy="carbyne")
    assert skip.events < every.events / 5
    assert skip.stuck == 0
