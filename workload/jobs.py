"""A workload's jobs: a job of independent tasks (one stage) beside ``common.dag``'s
DAG jobs, their task specs, and the message that submits either.

``check_submittable`` says before anything is sent whether a live GM can decode a
job's submission; a simulation runs any job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common import codec
from common.dag import DagJob, stage_layout
from common.errors import ConfigError, InvalidInput
from common.ids import JobId, UserId
from common.messages import MAX_JOB_TASKS, StageSpec, SubmitJob
from common.model import Task, TaskSpec


@dataclass
class Job:
    """A job of independent tasks (one stage), as a trace or generator makes it."""

    job_id: JobId
    user: UserId
    arrival: float
    tasks: list[TaskSpec] = field(default_factory=list)
    gang: bool = False
    """Its tasks start all-or-nothing (one gang stage: ``global_master.gang``)."""
    gang_min: int = 0
    """With ``gang``: the fewest that may start (0: all)."""


def specs_of(job: Job | DagJob) -> list[TaskSpec]:
    """The task specs of a plain or DAG job, in submission order."""
    return [t.spec if isinstance(t, Task) else t for t in job.tasks]


def to_submission(job: Job | DagJob, token: str, submitted_at: float) -> SubmitJob:
    """The message that submits ``job`` into its user's queue."""
    stages = None
    if isinstance(job, DagJob):
        stages = tuple(
            StageSpec(stage_id=sid, parents=parents, count=n, gang=s.gang > 0,
                      min_count=s.gang if 0 < s.gang < n else 0)
            for (sid, parents, n), s in zip(stage_layout(job), job.stages, strict=True)
        )  # fmt: skip
    elif job.gang:
        stages = (StageSpec(stage_id=0, count=len(job.tasks), gang=True, min_count=job.gang_min),)
    return SubmitJob(
        job_id=job.job_id,
        user=job.user,
        token=token,
        submitted_at=submitted_at,
        tasks=tuple(specs_of(job)),
        stages=stages,
    )


def check_submittable(job: Job | DagJob, max_body: int) -> None:
    """``ConfigError`` naming the job and field unless a live GM can decode its
    submission: ids of ``[A-Za-z0-9._:@+-]``, 1..200 characters; at most
    ``MAX_JOB_TASKS`` tasks and ``MAX_STAGES`` stages (``common.messages``), in at most
    ``max_body`` bytes.  A simulation runs such a job; a GM dead-letters it,
    undecodable, and the submitter cannot read it back to fail its tasks: ``megha
    bench`` waited out its timeout and called them unfinished."""
    n = len(job.tasks)
    if n > MAX_JOB_TASKS:  # before encoding them all
        raise ConfigError(
            f"job {job.job_id} cannot be submitted to a federation: {n:,} tasks, "
            f"a job holds at most {MAX_JOB_TASKS:,}",
            reason="unsubmittable",
        )
    body = codec.encode(to_submission(job, "-", 0.0))
    try:
        codec.decode(body, expect=SubmitJob, max_size=max_body)
    except InvalidInput as exc:
        raise ConfigError(
            f"job {job.job_id} cannot be submitted to a federation: {exc}",
            reason="unsubmittable",
        ) from None
