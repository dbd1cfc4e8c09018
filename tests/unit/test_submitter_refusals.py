"""The request generator's reading of a ``JobRefusal`` notice: the refused job's
waiting tasks fail with the reason, and nothing else does (not a later job of the same
id, not another user's)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from common.ids import GmId, JobId, TaskId, UserId
from common.messages import JobRefusal
from common.model import TaskSpec
from request_generator.submitter import Outcomes, Submitter


def specs(job: str, user: str = "u0", n: int = 2, first: int = 0) -> list[TaskSpec]:
    return [
        TaskSpec(task_id=TaskId(f"{job}.t{first + i}"), job_id=JobId(job), user=UserId(user),
                 demand=(1,), duration=1.0)
        for i in range(n)
    ]  # fmt: skip


def notice(job: str, at: float, user: str = "u0") -> JobRefusal:
    return JobRefusal(gm=GmId("gm0"), user=UserId(user), job_id=JobId(job), submitted_at=at,
                      reason="user_task_limit", detail="")  # fmt: skip


def client() -> Any:
    """What ``Submitter._job_refused`` reads and writes of a submitter."""
    return SimpleNamespace(outcomes=Outcomes(keep=True), refused={})


def test_the_refused_job_s_waiting_tasks_fail_with_the_reason() -> None:
    c = client()
    c.outcomes.submitted(specs("a"), 10.0)
    c.outcomes.submitted(specs("b"), 10.0)
    Submitter._job_refused(c, notice("a", 10.0))
    assert c.outcomes.failed == {
        (UserId("u0"), TaskId("a.t0")): "refused: user_task_limit",
        (UserId("u0"), TaskId("a.t1")): "refused: user_task_limit",
    }
    assert c.refused == {"a": "user_task_limit"}
    assert len(c.outcomes.outstanding) == 2  # job b's


def test_a_late_notice_leaves_a_later_job_of_the_same_id_alone() -> None:
    c = client()
    c.outcomes.submitted(specs("a", first=10), 20.0)  # "a" again, submitted later
    Submitter._job_refused(c, notice("a", 10.0))  # about the first "a"
    assert c.outcomes.failed == {}
    assert c.refused == {}


def test_another_user_s_job_of_the_same_id_is_left_alone() -> None:
    c = client()
    c.outcomes.submitted(specs("a", user="u1"), 10.0)
    Submitter._job_refused(c, notice("a", 10.0, user="u0"))
    assert c.outcomes.failed == {}
