"""A DAG job's parent references in all are bounded at the GM's boundary
(``global_master.intake.MAX_DAG_EDGES``): the schema bounds stages and parents per stage,
not their product, and a GM held ~36 bytes for each reference until the job ended
(live: ``tests/e2e/test_attacks.py::test_a_dag_of_more_edges_than_a_gm_holds_is_refused``)."""

from __future__ import annotations

from common.ids import JobId, TaskId, UserId
from common.messages import StageSpec, SubmitJob
from common.model import TaskSpec
from global_master.intake import MAX_DAG_EDGES, dag_edges_error


def job(parents_per_stage: list[int]) -> SubmitJob:
    n = len(parents_per_stage)
    tasks = tuple(
        TaskSpec(task_id=TaskId(f"j.t{i}"), job_id=JobId("j"), user=UserId("u0"), demand=(1,),
                 duration=1.0)
        for i in range(max(n, 1))
    )  # fmt: skip
    stages = (
        tuple(
            StageSpec(stage_id=i, parents=(0,) * k if i else (), count=1)
            for i, k in enumerate(parents_per_stage)
        )
        if n
        else None
    )
    return SubmitJob(job_id=JobId("j"), user=UserId("u0"), token="t", submitted_at=0.0,
                     tasks=tasks, stages=stages)  # fmt: skip


def test_edges_up_to_the_limit_pass_and_one_more_is_refused() -> None:
    per = MAX_DAG_EDGES // 10
    assert dag_edges_error(job([])) is None  # a flat job
    assert dag_edges_error(job([0, *[per] * 10])) is None
    refusal = dag_edges_error(job([0, *[per] * 10, 1]))
    assert refusal is not None
    reason, detail = refusal
    assert reason == "too_many_edges"
    assert str(MAX_DAG_EDGES + 1) in detail


def test_repeated_parents_count_as_the_references_they_are() -> None:
    """``(0,) * 10000``: one parent in meaning, 10,000 references to hold."""
    assert dag_edges_error(job([0, *[10_000] * 10, 1])) is not None
