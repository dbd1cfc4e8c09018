"""Long spans of virtual time: the ticks of a quiet span are skipped in one step.

A quiet span is skipped, but its heartbeats were still counted one float addition at
a time (``_advance``): a task of 10**9 s under a 10-s heartbeat was 10**8 additions
per LM, 10**11 for a task of 10**12 s (hours), and where ``t + step == t`` the count
never ended.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from common.cluster import PROFILES, default_users, make_federation
from common.ids import GmId, JobId
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation, _advance
from workload.synthetic import WorkloadSpec, jobs_from_trace
from workload.traces import TraceJob

GMS = [GmId("gm0"), GmId("gm1")]


def _ticking(t: float, step: float, until: float, cap: int) -> tuple[float, int, float] | None:
    """The loop ``_advance`` stands for; None past ``cap`` ticks."""
    k, last = 0, t
    while t < until:
        last, t, k = t, t + step, k + 1
        if k > cap:
            return None
    return t, k, last


starts = st.one_of(
    st.just(0.0),
    st.floats(min_value=0, max_value=2.0**33, allow_nan=False),
    # just below a power of two: ticks cross into the next binade of floats
    st.builds(lambda e, n: 2.0**e - n * 2.0 ** (e - 53), st.integers(-10, 33), st.integers(1, 400)),
)
steps = st.one_of(
    st.sampled_from([10.0, 0.1, 1.0, 30.0, 1e-3, 0.5, 1 / 3]),
    st.floats(min_value=1e-6, max_value=100.0, allow_nan=False),
)


@given(t=starts, step=steps, ticks=st.floats(min_value=0.0, max_value=3000.0))
def test_advance_gives_the_floats_ticking_gives(t: float, step: float, ticks: float) -> None:
    until = t + step * ticks
    expected = _ticking(t, step, until, cap=20_000)
    assume(expected is not None)
    assert _advance(t, step, until) == expected


@given(e=st.integers(-20, 30), a=st.integers(1, 6), below=st.integers(1, 3000))
def test_advance_rounds_ties_to_even_as_ticking_does(e: int, a: int, below: int) -> None:
    """A step of a + 1/2 ulps: each addition is a tie, rounded to the even float."""
    ulp = 2.0 ** (e - 52)
    t = 2.0 ** (e + 1) - below * ulp  # odd or even, and crossing the binade's top
    step = (a + 0.5) * ulp
    until = t + 4000 * step
    expected = _ticking(t, step, until, cap=20_000)
    assume(expected is not None)
    assert _advance(t, step, until) == expected


@pytest.mark.timeout(10)
def test_a_span_of_ten_to_the_eleven_ticks_is_counted_at_once() -> None:
    t, k, last = _advance(0.0, 10.0, 1e12)
    assert k == 10**11
    assert last < 1e12 <= t
    assert t - last == pytest.approx(10.0)


def test_a_step_that_cannot_move_time_is_an_error_not_a_hang() -> None:
    with pytest.raises(ValueError, match="cannot move time"):
        _advance(2.0**60, 10.0, 2.0**61)


@pytest.mark.timeout(20)
def test_a_task_of_a_billion_seconds_runs_at_a_ten_second_heartbeat() -> None:
    """10**8 heartbeats per LM were stepped one by one (about a minute here)."""
    users = default_users(GMS)
    clusters = make_federation(40, GMS, 4, PROFILES["slots"], False, random.Random(1))
    trace = [TraceJob(0.0, (1e9, 2.0)), TraceJob(5.0, (1.0,))]
    jobs = jobs_from_trace(trace, WorkloadSpec(constraints=False), users, random.Random(2))
    sim = MeghaSimulation(clusters, GMS, users, SimConfig(update_period_s=10.0))
    sim.add_jobs(jobs)
    res = sim.run()
    assert not res.failed
    assert res.stuck == 0
    assert res.job_completion[JobId("j0")] == pytest.approx(1e9, abs=1.0)
    assert res.job_completion[JobId("j1")] == pytest.approx(1.0, abs=0.1)


def test_a_run_spares_the_collector_and_gives_its_settings_back() -> None:
    """During a run the collector's young generation waits for ``GC_YOUNG`` objects
    and what existed before is frozen; after it, the thresholds and the frozen objects
    are as they were (the simulator's time only: no decision depends on it)."""
    import gc

    from simulator.megha_sim import GC_YOUNG, _few_collections

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    with _few_collections():
        assert gc.get_threshold() == (GC_YOUNG, *before[1:])
        assert gc.get_freeze_count() >= frozen
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen
    assert GC_YOUNG >= 1_000_000  # at 50,000: ~6 s of a 200,000-task run's 54 s
