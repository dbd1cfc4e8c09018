"""``megha bench`` refuses, before sending anything, a job no GM could decode.

Such a job was published, dead-lettered by the GM as undecodable, and the submitter
could not decode it back to fail its tasks: the bench waited out its ``--timeout``
and reported the tasks as unfinished, with no reason.  A trace line of more than
``MAX_JOB_TASKS`` tasks, or a job file's id outside the wire's id syntax, did that.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from common.config import load_config
from common.errors import ConfigError
from common.messages import MAX_JOB_TASKS
from request_generator.bench import BenchOptions, build_workload


def _opts(**kw: object) -> BenchOptions:
    return BenchOptions(progress=False, **kw)  # type: ignore[arg-type]


def test_a_trace_job_over_the_task_limit_is_refused_naming_it(tmp_path: Path) -> None:
    n = MAX_JOB_TASKS + 1
    trace = tmp_path / "big.tr"
    trace.write_text(f"0 1 1 1\n5 {n} 1 " + " ".join(["1"] * n) + "\n")
    with pytest.raises(ConfigError) as err:
        build_workload(load_config(None), _opts(trace=str(trace)))
    assert err.value.reason == "unsubmittable"
    assert re.search(r"job r[0-9a-f]+\.j1 cannot be submitted", str(err.value))
    assert "tasks" in str(err.value)


@pytest.mark.parametrize("job_id", ["j\u00f6b", "a b", "x" * 300], ids=["unicode", "blank", "long"])
def test_a_job_file_id_the_wire_cannot_carry_is_refused(tmp_path: Path, job_id: str) -> None:
    stage = {"id": 0, "count": 2, "demand": [1], "duration": 1.0}
    doc = {
        "format": "megha-dag/1",
        "resources": ["slots"],
        "jobs": [{"id": job_id, "user": "u0", "arrival": 0.0, "stages": [stage]}],
    }
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="cannot be submitted to a federation") as err:
        build_workload(load_config(None), _opts(jobs_file=str(path)))
    assert "job_id" in str(err.value)
