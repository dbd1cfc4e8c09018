"""DAG runs' usage sampling (each user's dominant share every second) costs what the
usage's changes cost, not the run's length: a quiet span is one run of a step function,
added without ticking.  And the figures are the same: every sample (time and value),
Jain's index per window, every policy's numbers, with or without skipping."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import pytest
from msgspec.structs import replace

from common.cluster import ClusterSpec
from common.dag import DagJob
from common.ids import GmId, JobId, LmId, UserId
from common.model import NodeSpec, UserConfig
from global_master.policy import make_policy
from reporting.fairness import jain
from simulator.config import SimConfig
from simulator.dag_run import JAIN_WINDOW_S, jain_windows, run_policies
from simulator.megha_sim import MeghaSimulation, SimResult
from simulator.usage import UsageSeries
from workload.dags import synthetic_dag_jobs

GMS = [GmId("gm0"), GmId("gm1")]
USERS = [
    UserConfig(UserId("a"), GMS[0], 0.25),
    UserConfig(UserId("b"), GMS[0], 0.25),
    UserConfig(UserId("c"), GMS[1], 0.5),
]
CLUSTERS = [
    ClusterSpec(
        LmId(f"lm{k}"), [NodeSpec((100,)) for _ in range(4)], [GMS[0], GMS[0], GMS[1], GMS[1]]
    )
    for k in range(2)
]


def _jobs(gap: float = 0.0, duration_scale: float = 1.0) -> list[DagJob]:
    """12 synthetic DAGs; the last four ``gap`` s later, durations scaled."""
    jobs = synthetic_dag_jobs(12, rate=0.5, users=USERS, node_capacity=(100,), rng=random.Random(5))
    for k, j in enumerate(jobs):
        if k >= 8:
            j.arrival += gap
        for t in j.tasks:
            t.spec = replace(t.spec, duration=t.spec.duration * duration_scale)
    return jobs


def _sim(jobs: list[DagJob], policy: str = "drf") -> SimResult:
    cfg = SimConfig(sample_usage_every_s=1.0)
    factory = make_policy(policy, USERS, seed=1)
    sim = MeghaSimulation(CLUSTERS, GMS, USERS, cfg, queues_factory=factory)
    sim.add_jobs(copy.deepcopy(jobs))
    return sim.run()


def test_a_long_idle_gap_and_long_tasks_cost_no_sampling_events() -> None:
    near = _sim(_jobs(gap=100.0))
    far = _sim(_jobs(gap=200_000.0))
    # one sample a second through the gap was ~200,000 events on its own
    assert far.events < 2 * near.events
    assert len(far.usage_samples) > 200_000  # every second is still a sample ...
    assert len(far.usage_samples.runs) < 2 * len(near.usage_samples.runs)  # ... in few runs
    gap_run = max(far.usage_samples.runs, key=lambda r: r.count)
    assert gap_run.count > 199_000
    assert gap_run.last - gap_run.first == pytest.approx(gap_run.count - 1)
    slow = _sim(_jobs(duration_scale=1_000.0))  # tasks of hours, nothing else going on
    assert slow.makespan_s > 10_000
    assert slow.events < 20 * near.events
    assert len(slow.usage_samples.runs) < len(slow.usage_samples) / 50


def _jain_over_a_list(
    samples: list[tuple[float, dict[UserId, float]]],
    result: SimResult,
    users: Sequence[UserConfig],
    jobs: Iterable[DagJob],
    every: float = 1.0,
) -> dict[str, float]:
    """``jain_windows``'s definition over a list of every sample: the reference.  Sample
    ``i`` (its tick's place on the grid) is in window ``floor(i * every / 60)``; sums
    are exact, rounded once (``math.fsum``)."""
    share = {u.user: u.share for u in users}
    spans: dict[UserId, list[tuple[float, float]]] = {}
    for j in jobs:
        end = j.arrival + result.job_completion.get(j.job_id, float("inf"))
        spans.setdefault(j.user, []).append((j.arrival, end))
    t0 = samples[0][0]
    windows: dict[int, list[tuple[float, dict[UserId, float]]]] = {}
    for t, use in samples:
        i = round((t - t0) / every)
        windows.setdefault(math.floor(i * Fraction(every) / 60), []).append((t, use))
    idx: list[float] = []
    for w, pts in sorted(windows.items()):
        lo, hi = t0 + w * JAIN_WINDOW_S, t0 + (w + 1) * JAIN_WINDOW_S
        active = [
            u for u, sp in spans.items() if any(a < hi and e > lo for a, e in sp) and u in share
        ]
        if len(active) < 2:
            continue
        xs = [math.fsum(use.get(u, 0.0) for _, use in pts) / len(pts) / share[u] for u in active]
        idx.append(jain(xs))
    return {"mean": math.fsum(idx) / len(idx), "min": min(idx), "max": max(idx)}


@pytest.mark.parametrize("policy", ["drf", "carbyne"])
def test_skipping_changes_no_sample_and_no_figure(
    monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    jobs = _jobs(gap=3_000.0, duration_scale=30.0)
    results: dict[bool, SimResult] = {}
    summaries: dict[bool, dict[str, Any]] = {}
    for skip in (False, True):
        monkeypatch.setattr(MeghaSimulation, "SKIP_QUIET", skip)

        def runner(p: str, sim: MeghaSimulation, skip: bool = skip) -> SimResult:
            results[skip] = sim.run()
            return results[skip]

        cfg = SimConfig(sample_usage_every_s=1.0)
        out = run_policies(
            copy.deepcopy(jobs), CLUSTERS, GMS, USERS, [policy], cfg, 1, runner=runner
        )
        summaries[skip] = out["schedulers"][policy]
        del summaries[skip]["wall_s"]
    every, skipped = results[False], results[True]
    assert skipped.events < 0.8 * every.events  # it did skip (not while tasks wait)
    samples = list(every.usage_samples)
    assert list(skipped.usage_samples) == samples  # the same times, the same shares
    assert summaries[True] == summaries[False]  # JCTs, makespan, Jain, leftover, tails
    # and the step function's Jain is the one over a list of every sample
    want = _jain_over_a_list(samples, skipped, USERS, jobs)
    assert jain_windows(skipped, USERS, jobs) == want
    assert want["min"] < 1.0  # not a trivial index


def test_jain_of_runs_is_the_definition_over_every_sample() -> None:
    """Tasks of hours, several users active: long runs of equal samples spanning many
    windows, taken a run at a time, give the figures of every sample one by one."""
    jobs = _jobs(duration_scale=1_000.0)
    res = _sim(jobs)
    samples = list(res.usage_samples)
    assert len(res.usage_samples.runs) < len(samples) / 50
    want = _jain_over_a_list(samples, res, USERS, jobs)
    assert jain_windows(res, USERS, jobs) == want
    assert want["min"] < 1.0
    # the plot's points: each run's corners, the same line as every sample
    corners = list(res.usage_samples.corners())
    assert len(corners) <= 2 * len(res.usage_samples.runs)
    at = dict(samples)
    assert all(at[t] == shares for t, shares in corners)  # corners are samples
    kept = {t for t, _ in corners}
    # every sample left out lies on the flat line between two corners of its run
    assert all(at[t] == shares for t, shares in samples if t not in kept)


class _Result:
    """What ``jain_windows`` reads of a run."""

    def __init__(self, series: UsageSeries, completion: dict[JobId, float]) -> None:
        self.usage_samples = series
        self.job_completion = completion


@pytest.mark.timeout(20)
def test_jain_of_a_run_of_years_costs_its_runs_not_its_samples() -> None:
    """Two jobs running 10**12 s (or arriving years apart): 10**12 samples of 1 s were
    walked one by one (hours; and the plot listed every one of them, gigabytes)."""
    a, b = UserId("a"), UserId("b")
    users = [UserConfig(a, GMS[0], 0.5), UserConfig(b, GMS[0], 0.5)]
    long = 60 * 10**12 + 30  # the run ends on a window's end
    jobs = [DagJob(JobId("ja"), a, 0.0, []), DagJob(JobId("jb"), b, 0.0, [])]
    series = UsageSeries(1.0)
    series.add(0.0, {a: 0.5, b: 0.25}, 90, 89.0)
    series.add(90.0, {a: 0.25, b: 0.25}, long, float(89 + long))
    series.add(float(90 + long), {a: 0.5}, 30, float(119 + long))
    end_b = float(90 + long)  # b's job ends where the last run begins: a alone then
    result = _Result(series, {JobId("ja"): float(120 + long), JobId("jb"): end_b})
    got = jain_windows(result, users, jobs)  # type: ignore[arg-type]
    # window 0: 60 samples of (1, 0.5) x share; window 1: 30 of those and 30 of (0.5,
    # 0.5); then 10**12 windows of equal shares; the last, one user active, no index
    first = jain([1.0, 0.5])
    second = jain([math.fsum([0.5] * 30 + [0.25] * 30) / 60 / 0.5, 0.5])
    windows = 2 + 10**12
    assert (got["min"], got["max"]) == (first, 1.0)
    total = Fraction(first) + Fraction(second) + (windows - 2)
    assert got["mean"] == float(total) / windows
    assert len(list(series.corners())) == 6
