"""A job file's gang stages: ``"gang": true`` and ``"min": k`` reach the submission's
``StageSpec``; a bad ``gang`` or ``min`` is refused naming the job and stage."""

from __future__ import annotations

from typing import Any

import pytest

from common.dag import parse_jobs
from common.errors import ConfigError
from common.jobspec import parse_job
from workload.jobs import to_submission


def _doc(*stages: dict[str, Any]) -> dict[str, Any]:
    job = {"id": "j1", "user": "u0", "arrival": 0.0, "stages": list(stages)}
    return {"format": "megha-dag/1", "resources": ["slots"], "jobs": [job]}


def _stage(sid: int, n: int, **more: Any) -> dict[str, Any]:
    return {"id": sid, "count": n, "demand": [1], "duration": 1.0, **more}


def test_gang_and_min_reach_the_submission() -> None:
    _, (job,) = parse_jobs(_doc(_stage(0, 4, gang=True, min=3), _stage(1, 2, parents=[0], gang=True),
                                _stage(2, 1, parents=[1])))  # fmt: skip
    stages = to_submission(job, "", 0.0).stages
    assert stages is not None
    assert [(s.gang, s.min_count) for s in stages] == [(True, 3), (True, 0), (False, 0)]


@pytest.mark.parametrize(
    ("more", "says"),
    [
        ({"gang": "yes"}, "gang must be true or false"),
        ({"gang": True, "min": 0}, "min must be an integer from 1"),
        ({"gang": True, "min": 5}, "min must be an integer from 1"),
        ({"min": 2}, "min applies to a gang stage only"),
    ],
)
def test_a_bad_gang_stage_is_refused_naming_it(more: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        parse_jobs(_doc(_stage(0, 4, **more)))
    assert "job j1 stage 0" in str(err.value)


def _job(*stages: dict[str, Any]) -> dict[str, Any]:
    return {"format": "megha-job/1", "name": "g", "stages": list(stages)}


def test_a_megha_job_file_takes_gang_stages_as_a_dag_file_does() -> None:
    """``megha submit`` and the front door read ``megha-job/1``: its stages take
    ``gang`` and ``min`` as ``megha-dag/1``'s do (they were refused as unknown keys), and
    the same file simulates with the same gangs."""
    job = parse_job(_job(_stage(0, 4, gang=True, min=3), _stage(1, 2, parents=[0], gang=True),
                         _stage(2, 1, parents=[1])))  # fmt: skip
    stages = job.submission("g", "u0", "t", 0.0).stages
    assert stages is not None
    assert [(s.gang, s.min_count) for s in stages] == [(True, 3), (True, 0), (False, 0)]
    assert [s.gang for s in job.dag_job("g", "u0").stages] == [3, 2, 0]
    assert parse_job(job.to_doc()) == job  # the round trip keeps them
    one = parse_job({"format": "megha-job/1", "count": 3, "demand": [1], "duration": 1,
                     "gang": True})  # fmt: skip
    (only,) = one.submission("h", "u0", "t", 0.0).stages or ()
    assert (only.gang, only.min_count, only.count) == (True, 0, 3)  # one stage, a gang still
    plain = parse_job({"format": "megha-job/1", "count": 3, "demand": [1], "duration": 1})
    assert plain.submission("p", "u0", "t", 0.0).stages is None


@pytest.mark.parametrize(
    ("more", "says"),
    [
        ({"gang": "yes"}, "gang must be true or false"),
        ({"gang": True, "min": 5}, "min must be an integer from 1"),
        ({"min": 2}, "min applies to a gang stage only"),
    ],
)
def test_a_bad_gang_stage_of_a_megha_job_file_is_refused(more: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_job(_job(_stage(0, 4, **more)))
    assert err.value.reason == "bad_job_file"
    assert says in str(err.value)
    assert "stage 0" in str(err.value)
