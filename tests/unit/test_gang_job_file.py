"""A job file's gang stages: ``"gang": true`` and ``"min": k`` reach the submission's
``StageSpec``; a bad ``gang`` or ``min`` is refused naming the job and stage."""

from __future__ import annotations

from typing import Any

import pytest

from common.dag import parse_jobs
from common.errors import ConfigError
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
