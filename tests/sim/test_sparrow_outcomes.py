"""The Sparrow baseline gives every task an outcome: more tasks than workers, tasks that
need more than a worker has free, tasks no worker could ever run."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from common.cluster import ClusterSpec
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.model import NodeSpec, Resources, TaskSpec
from simulator.megha_sim import SimResult
from simulator.sparrow import SparrowSimulation
from workload.jobs import Job

USER = UserId("u0")


def _job(name: str, arrival: float, tasks: Sequence[tuple[Resources, float]]) -> Job:
    specs = [
        TaskSpec(task_id=TaskId(f"{name}.t{i}"), job_id=JobId(name), user=USER,
                 demand=demand, duration=duration)
        for i, (demand, duration) in enumerate(tasks)
    ]  # fmt: skip
    return Job(JobId(name), USER, arrival, specs)


def _spins(t: float) -> None:
    pytest.fail(f"Sparrow still busy at virtual time {t} after 200,000 events")


def _run(capacities: Sequence[Resources], jobs: Sequence[Job]) -> SimResult:
    nodes = [NodeSpec(c) for c in capacities]
    clusters = [ClusterSpec(LmId("lm0"), nodes, [GmId("gm0")] * len(nodes))]
    sp = SparrowSimulation(clusters, rng=random.Random(1))
    sp.add_jobs(jobs)
    return sp.run(progress=_spins)


def _outcomes(r: SimResult) -> tuple[int, int]:
    return sum(1 for t in r.tasks if t.finished_at >= 0), len(r.failed)


def test_a_job_with_more_tasks_than_workers_runs_every_task() -> None:
    """Batch sampling places at most one reservation per worker: 3 workers hold 3 of the
    job's 5 tasks; once they are spent, the job probes again for the 2 left."""
    r = _run([(1,)] * 3, [_job("j", 0.0, [((1,), 1.0)] * 5)])
    assert _outcomes(r) == (5, 0)
    assert r.stuck == 0
    assert set(r.job_completion) == {JobId("j")}
    assert r.counters["resamples"] >= 1


def test_a_task_that_needs_more_than_is_free_waits_at_its_worker() -> None:
    """Some free, not enough (multi-resource): the reservation waits for the worker's
    running task to end, with no probing back and forth meanwhile."""
    r = _run([(10, 10)], [_job("long", 0.0, [((6, 1), 100.0)]), _job("next", 0.1, [((6, 1), 1.0)])])
    assert _outcomes(r) == (2, 0)
    assert r.events < 50
    nxt = next(t for t in r.tasks if t.job_id == JobId("next"))
    assert nxt.started_at == pytest.approx(100.0, abs=0.01)


def test_a_task_larger_than_every_worker_fails_and_its_job_with_it() -> None:
    jobs = [
        _job("too-big", 0.0, [((1, 1), 1.0), ((11, 1), 1.0)]),
        _job("fits", 0.0, [((10, 10), 2.0)]),
    ]
    r = _run([(10, 10)] * 2, jobs)
    assert _outcomes(r) == (2, 1)
    assert r.stuck == 0
    (why,) = r.failed.values()
    assert why.startswith("infeasible")
    assert r.failed_jobs == {JobId("too-big")}
    assert set(r.job_completion) == {JobId("fits")}


def test_a_task_that_ran_counts_its_launch_as_megha_counts_its_placements() -> None:
    """Every Sparrow row said ``attempt`` 0, the count of a task never placed, beside
    Megha's 1 for the same task run once: the schedulers' CSVs disagreed on which
    tasks had run.  A task no worker could run stays at 0."""
    r = _run([(1,)] * 2, [_job("j", 0.0, [((1,), 1.0)] * 3), _job("big", 0.5, [((2,), 1.0)])])
    assert _outcomes(r) == (3, 1)
    assert {t.spec.task_id: t.attempt for t in r.tasks} == {
        TaskId("j.t0"): 1, TaskId("j.t1"): 1, TaskId("j.t2"): 1, TaskId("big.t0"): 0
    }  # fmt: skip
