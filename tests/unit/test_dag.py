"""DAG jobs: the job-file format, the strict loader, dependency release, the generator."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.dag import DagJob, DagProgress, load_jobs, make_job, parse_jobs, write_jobs
from common.errors import ConfigError
from common.ids import GmId, UserId
from common.model import UserConfig
from global_master.queues import UserQueues
from workload.dags import dag_stats, synthetic_dag_jobs


def _doc(**job: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": "j1",
        "user": "alice",
        "arrival": 0.0,
        "stages": [
            {"id": 0, "count": 2, "demand": [4], "duration": 1.0},
            {"id": 1, "tasks": [{"demand": [21], "duration": 1.0}]},
            {"id": 2, "parents": [0, 1], "count": 1, "demand": [10], "duration": 0.1},
        ],
    }
    base.update(job)
    return {"format": "megha-dag/1", "resources": ["units"], "jobs": [base]}


def test_parse_builds_stages_and_task_ids() -> None:
    names, jobs = parse_jobs(_doc())
    assert names == ("units",)
    (job,) = jobs
    assert [s.stage_id for s in job.stages][-1] == 2
    assert [t.task_id for t in job.tasks] == ["j1.s0.t0", "j1.s0.t1", "j1.s1.t0", "j1.s2.t0"]
    assert all(t.user == "alice" for t in job.tasks)
    assert job.critical_path() == pytest.approx(1.1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": [{"id": 0, "count": 1, "demand": [-1], "duration": 1}]}, "non-negative"),
        ({"stages": [{"id": 0, "count": 1, "demand": [1.5], "duration": 1}]}, "integers"),
        ({"stages": [{"id": 0, "count": 1, "demand": [1, 2], "duration": 1}]}, "list of 1"),
        ({"stages": [{"id": 0, "count": 1, "demand": [0], "duration": 1}]}, "some resource"),
        ({"stages": [{"id": 0, "count": 0, "demand": [1], "duration": 1}]}, "positive"),
        ({"stages": [{"id": 0, "count": 1, "demand": [1], "duration": -1}]}, "duration"),
        ({"stages": [{"id": 0, "count": 1, "demand": [1], "duration": 1, "x": 1}]}, "unknown"),
        (
            {"stages": [{"id": 0, "parents": [7], "count": 1, "demand": [1], "duration": 1}]},
            "unknown stage 7",
        ),
        (
            {
                "stages": [
                    {"id": 0, "parents": [1], "count": 1, "demand": [1], "duration": 1},
                    {"id": 1, "parents": [0], "count": 1, "demand": [1], "duration": 1},
                ]
            },
            "cycle",
        ),
        (
            {
                "stages": [
                    {"id": 0, "count": 1, "demand": [1], "duration": 1},
                    {"id": 0, "count": 1, "demand": [1], "duration": 1},
                ]
            },
            "duplicate stage",
        ),
        ({"arrival": "soon"}, "arrival"),
        ({"user": ""}, "user"),
        ({"stages": []}, "non-empty"),
    ],
)
def test_loader_refuses_bad_jobs_naming_the_job(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        parse_jobs(_doc(**change))
    assert "job j1" in str(err.value) or "job #0" in str(err.value)
    assert err.value.reason == "bad_job_file" or err.value.reason == "bad_dag"


def test_loader_refuses_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_jobs(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_jobs(tmp_path / "missing.json")
    doc = _doc()
    doc["format"] = "other"
    with pytest.raises(ConfigError, match="format"):
        parse_jobs(doc)
    doc = _doc()
    doc["jobs"].append(doc["jobs"][0])
    with pytest.raises(ConfigError, match="duplicate job id"):
        parse_jobs(doc)


def test_write_then_load_round_trips(tmp_path: Path) -> None:
    users = [UserConfig(UserId("u0"), GmId("gm0"), 1.0)]
    jobs = synthetic_dag_jobs(5, rate=1.0, users=users, node_capacity=(100,), rng=random.Random(3))
    path = tmp_path / "jobs.json"
    write_jobs(path, jobs, ["units"])
    names, back = load_jobs(path)
    assert names == ("units",)
    assert [_shape(j) for j in back] == [_shape(j) for j in jobs]
    assert json.loads(path.read_text())["format"] == "megha-dag/1"


def _shape(job: DagJob) -> list[tuple[int, tuple[int, ...], list[tuple[tuple[int, ...], float]]]]:
    return [(s.stage_id, s.parents, [(t.demand, t.duration) for t in s.tasks]) for s in job.stages]


def test_progress_releases_a_barrier_only_when_every_parent_finished() -> None:
    job = make_job(
        "j",
        "u",
        0.0,
        [(0, [((1,), 1.0)] * 2, []), (1, [((1,), 1.0)], []), (2, [((1,), 1.0)], [0, 1])],
    )
    prog = DagProgress(job)
    assert [t.task_id for t in prog.roots()] == ["j.s0.t0", "j.s0.t1", "j.s1.t0"]
    assert prog.finish(job.stages[0].tasks[0].task_id) == []
    assert prog.finish(job.stages[1].tasks[0].task_id) == []
    released = prog.finish(job.stages[0].tasks[1].task_id)
    assert [t.task_id for t in released] == ["j.s2.t0"]
    assert not prog.done
    prog.finish(released[0].task_id)
    assert prog.done


def test_plain_queues_release_stage_by_stage() -> None:
    job = make_job("j", "u", 0.0, [(0, [((1,), 1.0)], []), (1, [((1,), 1.0)] * 2, [0])])
    q = UserQueues([UserId("u")])
    q.add_job(job, 0.0)
    first = q.pop()
    assert first is not None
    assert first.task_id == "j.s0.t0"
    assert q.pop() is None
    q.on_finished(first, 5.0)
    nxt = q.pop()
    assert nxt is not None
    assert nxt.submitted_at == 5.0


def test_generator_is_seeded_and_shaped_like_the_paper() -> None:
    users = [UserConfig(UserId(f"u{i}"), GmId("gm0"), 0.5) for i in range(2)]
    a = synthetic_dag_jobs(400, rate=0.5, users=users, node_capacity=(100,), rng=random.Random(7))
    b = synthetic_dag_jobs(400, rate=0.5, users=users, node_capacity=(100,), rng=random.Random(7))
    assert [_shape(j) for j in a] == [_shape(j) for j in b]
    stats = dag_stats(a)
    assert 6 <= stats["stages_p50"] <= 8
    assert stats["stages_p95"] >= 18
    assert stats["barriers_p50"] >= 2
    assert 4 <= stats["critical_path_p50"] <= 6
    arrivals = [j.arrival for j in a]
    assert arrivals == sorted(arrivals)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_task_of_a_generated_job_is_eventually_released(seed: int) -> None:
    users = [UserConfig(UserId("u"), GmId("gm0"), 1.0)]
    (job,) = synthetic_dag_jobs(
        1, rate=1.0, users=users, node_capacity=(100,), rng=random.Random(seed)
    )
    prog = DagProgress(job)
    seen = {t.task_id for t in prog.roots()}
    frontier = list(prog.roots())
    while frontier:
        t = frontier.pop()
        for r in prog.finish(t.task_id):
            assert r.task_id not in seen
            seen.add(r.task_id)
            frontier.append(r)
    assert seen == {t.task_id for t in job.tasks}
    assert prog.done


def test_a_dag_travels_as_flat_tasks_plus_a_stage_layout() -> None:
    from common.dag import from_layout, stage_layout

    _, (job,) = parse_jobs(_doc())
    layout = stage_layout(job)
    back = from_layout(job.job_id, job.user, job.arrival, job.tasks, layout)
    assert _shape(back) == _shape(job)
    with pytest.raises(ConfigError, match="stages hold 4 tasks"):
        from_layout(job.job_id, job.user, 0.0, job.tasks[:3], layout)
    with pytest.raises(ConfigError, match="cycle"):
        from_layout(job.job_id, job.user, 0.0, job.tasks[:2], ((0, (1,), 1), (1, (0,), 1)))


def test_topological_order_is_stable_and_names_a_stage_on_a_cycle() -> None:
    from common.dag import CycleError, topological_order

    assert topological_order({0: (), 1: (0,), 2: (0, 1)}) == [0, 1, 2]
    assert topological_order({2: (1,), 1: (), 3: (2, 1)}) == [1, 2, 3]
    assert topological_order({5: (4,)}) == [5]  # a finished parent is ignored
    with pytest.raises(CycleError) as err:
        topological_order({0: (2,), 1: (0,), 2: (1,)})
    assert err.value.stage in (0, 1, 2)


def test_finish_times_are_the_critical_path_method() -> None:
    from common.dag import finish_times, levels

    parents = {0: (), 1: (), 2: (0, 1)}
    assert finish_times(parents, {0: 1.0, 1: 3.0, 2: 0.5}) == pytest.approx(
        {0: 1.0, 1: 3.0, 2: 3.5}
    )
    # from now on, with stage 1 still running until 12
    later = finish_times(parents, {0: 1.0, 1: 0.0, 2: 0.5}, start=10.0, not_before={1: 12.0})
    assert later[2] == pytest.approx(12.5)
    assert levels({0: (), 1: (0,), 2: (0, 1), 3: ()}) == {0: 0, 1: 1, 2: 2, 3: 0}
