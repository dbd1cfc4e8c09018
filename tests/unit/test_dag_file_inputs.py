"""Job files as they come: what JSON allows but a job file must not, refused by name.

Each case used to load something else than the file says (a key given twice kept
only its last value), or to end in a Python traceback (deep nesting, bytes that are
not UTF-8, an integer too large for a float), or to exhaust memory (a huge ``count``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common import dag
from common.dag import load_jobs, parse_jobs
from common.errors import ConfigError
from common.messages import MAX_JOB_TASKS, MAX_STAGES


def _stage(sid: int, parents: list[int] | None = None, count: int = 1) -> dict[str, Any]:
    return {"id": sid, "parents": parents or [], "count": count, "demand": [1], "duration": 1.0}


def _job(jid: str, stages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"id": jid, "user": "u0", "arrival": 0.0, "stages": stages or [_stage(0)]}


def _file(tmp_path: Path, text: str | bytes) -> Path:
    p = tmp_path / "jobs.json"
    if isinstance(text, str):
        text = text.encode()
    p.write_bytes(text)
    return p


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_jobs(path)
    assert err.value.reason == "bad_job_file"
    return str(err.value)


def test_a_key_given_twice_is_refused_not_silently_overwritten(tmp_path: Path) -> None:
    """``json`` keeps the last of a repeated key: the two jobs listed first were dropped."""
    first = json.dumps([_job("a"), _job("b")])
    second = json.dumps([_job("c")])
    p = _file(tmp_path, f'{{"format": "megha-dag/1", "resources": ["cpu"], '
                        f'"jobs": {first}, "jobs": {second}}}')  # fmt: skip
    msg = _refused(p)
    assert str(p) in msg
    assert "'jobs' appears twice" in msg


def test_a_stage_key_given_twice_names_the_stage(tmp_path: Path) -> None:
    stage = '{"id": 7, "count": 1, "demand": [1], "duration": 1.0, "duration": 900.0}'
    job = f'{{"id": "a", "user": "u0", "arrival": 0, "stages": [{stage}]}}'
    p = _file(tmp_path, f'{{"format": "megha-dag/1", "resources": ["cpu"], "jobs": [{job}]}}')
    msg = _refused(p)
    assert "'duration' appears twice" in msg
    assert "id 7" in msg


def test_deep_nesting_is_an_error_not_a_recursion_traceback(tmp_path: Path) -> None:
    depth = 100_000
    p = _file(tmp_path, '{"format": "megha-dag/1", "resources": ["cpu"], "jobs": '
                        + "[" * depth + "]" * depth + "}")  # fmt: skip
    assert "nested too deeply" in _refused(p)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path: Path) -> None:
    doc = json.dumps({"format": "megha-dag/1", "resources": ["cpu"], "jobs": [_job("a")]},
                     indent=1)  # fmt: skip
    p = _file(tmp_path, doc.replace('"a"', '"\xe9"').encode("latin-1"))
    line = doc.splitlines().index(next(x for x in doc.splitlines() if '"a"' in x)) + 1
    assert f"not UTF-8 text (line {line}:" in _refused(p)


def test_a_byte_order_mark_is_not_part_of_the_document(tmp_path: Path) -> None:
    """As the trace reader takes it (an editor on Windows writes one)."""
    doc = json.dumps({"format": "megha-dag/1", "resources": ["cpu"], "jobs": [_job("a")]})
    names, jobs = load_jobs(_file(tmp_path, b"\xef\xbb\xbf" + doc.encode()))
    assert names == ("cpu",)
    assert [j.job_id for j in jobs] == ["a"]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('"arrival": 1' + "0" * 400, "arrival"),  # a JSON integer past any float
        ('"arrival": 1' + "0" * 5000, ""),  # past Python's integer-string limit
    ],
    ids=["past_float", "past_int_digits"],
)
def test_an_integer_too_large_is_an_error_naming_it(tmp_path: Path, text: str, field: str) -> None:
    job = json.dumps(_job("a")).replace('"arrival": 0.0', text)
    p = _file(tmp_path, f'{{"format": "megha-dag/1", "resources": ["cpu"], "jobs": [{job}]}}')
    msg = _refused(p)
    assert field in msg


def test_a_huge_duration_integer_names_the_stage() -> None:
    job = _job("a", [{**_stage(3), "duration": 10**400}])
    with pytest.raises(ConfigError, match="job a stage 3: duration must be a finite number"):
        parse_jobs({"format": "megha-dag/1", "resources": ["cpu"], "jobs": [job]})


def _parse(*jobs: dict[str, Any]) -> None:
    parse_jobs({"format": "megha-dag/1", "resources": ["cpu"], "jobs": list(jobs)})


def test_a_count_past_the_job_limit_is_refused_before_any_task_is_made() -> None:
    """``count: 10**12`` ran out of memory building the stage's tasks."""
    with pytest.raises(ConfigError, match=f"job a stage 0: count {10**12} takes the job past"):
        _parse(_job("a", [_stage(0, count=10**12)]))


def test_the_job_limit_counts_every_stage() -> None:
    """A live GM admits at most MAX_JOB_TASKS tasks per job: a file a simulation runs
    must be one a federation runs too."""
    half = MAX_JOB_TASKS // 2 + 1
    with pytest.raises(ConfigError, match=f"job a stage 1: count {half} takes the job past"):
        _parse(_job("a", [_stage(0, count=half), _stage(1, [0], count=half)]))


def test_the_file_limit_counts_every_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """``count`` lets a file of a few hundred bytes hold any number of tasks: 10,000 jobs
    of 100,000 tasks each ran the loader out of memory.  A file holds at most
    ``MAX_FILE_TASKS`` in all (5,000,000; 10 here), refused at the stage past it."""
    monkeypatch.setattr(dag, "MAX_FILE_TASKS", 10)
    doc = {"format": "megha-dag/1", "resources": ["cpu"]}
    jobs = [_job("a", [_stage(0, count=6)]), _job("b", [_stage(0, count=4), _stage(1, [0])])]
    with pytest.raises(ConfigError, match="job b stage 1: the file's jobs hold more than 10 "):
        parse_jobs({**doc, "jobs": jobs})
    _, loaded = parse_jobs({**doc, "jobs": [jobs[0], _job("b", [_stage(0, count=4)])]})
    assert sum(len(j.tasks) for j in loaded) == 10


def test_a_job_of_exactly_the_limit_loads() -> None:
    _, (job,) = parse_jobs(
        {"format": "megha-dag/1", "resources": ["cpu"],
         "jobs": [_job("a", [_stage(0, count=MAX_JOB_TASKS)])]}
    )  # fmt: skip
    assert len(job.tasks) == MAX_JOB_TASKS


def test_too_many_stages_is_refused_naming_the_job() -> None:
    stages = [_stage(i, [i - 1] if i else []) for i in range(MAX_STAGES + 1)]
    with pytest.raises(ConfigError, match=f"job a: {MAX_STAGES + 1} stages, at most"):
        _parse(_job("a", stages))


def test_a_file_without_a_job_is_an_error() -> None:
    """It ran every policy on nothing and wrote JCTs and makespans of 0 s."""
    with pytest.raises(ConfigError, match="file: jobs must be a non-empty list"):
        _parse()
