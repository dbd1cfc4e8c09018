"""The workload flags of ``megha simulate`` and ``megha bench``: one source at a time,
every number checked where it is parsed.

``--trace x --jobs y`` replayed the job file and dropped the trace without a word
(``--workload synthetic --trace x`` dropped it too); ``megha bench --rate 0`` ended in
a ZeroDivisionError traceback, and ``--job-rate nan`` / ``--mean-duration nan``
made jobs no GM could decode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError
from megha_cli import live
from megha_cli.main import build_parser, main


def _files(tmp_path: Path) -> tuple[str, str]:
    trace = tmp_path / "t.tr"
    trace.write_text("0 1 1 1\n")
    jobs = tmp_path / "j.json"
    stage = '{"id": 0, "count": 1, "demand": [1], "duration": 1}'
    job = f'{{"id": "a", "user": "u0", "arrival": 0, "stages": [{stage}]}}'
    jobs.write_text(f'{{"format": "megha-dag/1", "resources": ["cpu"], "jobs": [{job}]}}')
    return str(trace), str(jobs)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--trace", "T", "--jobs", "J"], "give --trace or --jobs, not both"),
        (["--workload", "synthetic", "--trace", "T"], "--trace is a trace workload"),
        (["--workload", "dag", "--trace", "T"], "--trace is a trace workload"),
        (["--workload", "trace", "--jobs", "J"], "--jobs is a dag workload"),
        (["--workload", "synthetic", "--jobs", "J"], "--jobs is a dag workload"),
    ],
)
def test_simulate_refuses_a_source_it_would_drop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    trace, jobs = _files(tmp_path)
    argv = [{"T": trace, "J": jobs}.get(a, a) for a in extra]
    out = tmp_path / "out"
    small = [
        "--workers",
        "4",
        "--lms",
        "2",
        "--gms",
        "1",
        "--users",
        "u0:1@gm0",
        "--jobs-count",
        "1",
        "--tasks-per-job",
        "1",
        "--baselines",
        "",
        "--policies",
        "fifo",
    ]
    assert main(["simulate", "--quiet", *small, "--out", str(out), *argv]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith(f"megha simulate: {message}")
    assert not out.exists()


@pytest.mark.parametrize("command", ["bench", "demo"])
@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--rate", "0"),
        ("--rate", "-2"),
        ("--rate", "nan"),
        ("--job-rate", "0"),
        ("--job-rate", "nan"),
        ("--mean-duration", "-1"),
        ("--mean-duration", "nan"),
        ("--limit-jobs", "0"),
        ("--limit-jobs", "-3"),
        ("--timeout", "0"),
        ("--timeout", "inf"),
    ],
)
def test_bench_numbers_are_checked_when_parsed(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, f"{flag}={value}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be" in err
    assert value in err


def test_bench_refuses_a_trace_beside_a_job_file(tmp_path: Path) -> None:
    trace, jobs = _files(tmp_path)
    args = build_parser().parse_args(["bench", "--trace", trace, "--jobs", jobs])
    with pytest.raises(ConfigError, match="give --trace or --jobs, not both"):
        live._bench_options(args)
