"""DAG runs' usage sampling (each user's dominant share every second) costs what the
usage's changes cost, not the run's length: a quiet span is one run of a step function,
added without ticking.  And the figures are the same: every sample (time and value),
Jain's index per window, every policy's numbers, with or without skipping."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from msgspec.structs import replace

from common.cluster import ClusterSpec
from common.dag import DagJob
from common.ids import GmId, LmId, UserId
from common.model import NodeSpec, UserConfig
from global_master.policy import make_policy
from reporting.fairness import jain
from simulator.config import SimConfig
from simulator.dag_run import JAIN_WINDOW_S, jain_windows, run_policies
from simulator.megha_sim import MeghaSimulation, SimResult
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
) -> dict[str, float]:
    """``jain_windows`` as it was, over a list of every sample: the reference."""
    share = {u.user: u.share for u in users}
    spans: dict[UserId, list[tuple[float, float]]] = {}
    for j in jobs:
        end = j.arrival + result.job_completion.get(j.job_id, float("inf"))
        spans.setdefault(j.user, []).append((j.arrival, end))
    t0 = samples[0][0]
    windows: dict[int, list[tuple[float, dict[UserId, float]]]] = {}
    for t, use in samples:
        windows.setdefault(int((t - t0) // JAIN_WINDOW_S), []).append((t, use))
    idx: list[float] = []
    for w, pts in sorted(windows.items()):
        lo, hi = t0 + w * JAIN_WINDOW_S, t0 + (w + 1) * JAIN_WINDOW_S
        active = [
            u for u, sp in spans.items() if any(a < hi and e > lo for a, e in sp) and u in share
        ]
        if len(active) < 2:
            continue
        xs = [sum(use.get(u, 0.0) for _, use in pts) / len(pts) / share[u] for u in active]
        idx.append(jain(xs))
    return {"mean": sum(idx) / len(idx), "min": min(idx), "max": max(idx)}


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
