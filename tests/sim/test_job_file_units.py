"""A megha-job/1 file (``megha submit``'s) means the same in ``megha simulate``: its
demands in the profile's units (``common.units``), so as many of its tasks run at once
on simulated nodes as on live ones -- ``[1]`` is a whole node in ``slots`` in both, never
1/100 of one (issue 31 item 5: 55 such tasks ran at once on 40 simulated nodes).  The
live side of the same files: ``tests/e2e/test_frontdoor.py`` (concurrency on real
processes) and ``tests/unit/test_frontdoor.py`` (the same refusals)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from common.cluster import profile
from common.errors import ConfigError
from common.jobspec import parse_job
from common.units import check_demands
from megha_cli.main import main


def peak_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The most intervals ``[start, end)`` open at one time."""
    spans = list(intervals)
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = now = 0
    for _, step in edges:  # an end sorts before a start at the same time
        now += step
        peak = max(peak, now)
    return peak


def simulate(tmp_path: Path, doc: dict[str, Any], workers: int, *more: str) -> list[dict[str, str]]:
    """``megha simulate --jobs FILE`` on ``workers`` nodes; the tasks' CSV rows."""
    jf = tmp_path / "job.json"
    jf.write_text(json.dumps(doc))
    out = tmp_path / "out"
    args = ["simulate", "--jobs", str(jf), "--workers", str(workers), "--gms", "1", "--lms", "1"]
    args += ["--policies", "fifo", "--quiet", "--out", str(out), "--network-delay", "0"]
    args += ["--gm-decision-cost", "0", "--lm-validation-cost", "0", *more]
    assert main(args) == 0
    with (out / "tasks-fifo.csv").open() as f:
        return list(csv.DictReader(f))


def ran_at_once(rows: list[dict[str, str]]) -> int:
    assert all(r["state"] == "finished" for r in rows), rows
    return peak_overlap((float(r["started_at"]), float(r["finished_at"])) for r in rows)


def test_one_slot_tasks_take_whole_nodes_in_the_simulator_as_live(tmp_path: Path) -> None:
    doc = {"format": "megha-job/1", "name": "sleep", "count": 10, "demand": [1], "duration": 3}
    rows = simulate(tmp_path, doc, 4)
    assert len(rows) == 10
    assert ran_at_once(rows) == 4  # a node each (slots: capacity 1), not 10 on 4 nodes
    assert {r["task_id"] for r in rows} == {f"sleep.s0.t{i}" for i in range(10)}  # live's ids


def test_paper_profile_demands_are_millicores_and_megabytes(tmp_path: Path) -> None:
    # half a 64-core, 16 GB node each: two per node, as live under profile = "paper"
    doc = {"format": "megha-job/1", "count": 8, "demand": [32000, 4096], "duration": 2}
    rows = simulate(tmp_path, doc, 2, "--profile", "paper")
    assert ran_at_once(rows) == 4


def test_stages_of_a_job_file_run_in_order(tmp_path: Path) -> None:
    doc = {"format": "megha-job/1", "name": "mr", "stages": [
        {"id": 0, "count": 3, "demand": [1], "duration": 2},
        {"id": 1, "parents": [0], "count": 1, "demand": [1], "duration": 1}]}  # fmt: skip
    rows = {r["task_id"]: r for r in simulate(tmp_path, doc, 8)}
    maps_end = max(float(rows[f"mr.s0.t{i}"]["finished_at"]) for i in range(3))
    assert float(rows["mr.s1.t0"]["started_at"]) >= maps_end


@pytest.mark.parametrize(
    ("name", "demand", "reason"),
    [("slots", [1, 1], "wrong_resources"), ("slots", [2], "impossible_resources"),
     ("paper", [1], "wrong_resources"), ("paper", [64001, 1], "impossible_resources")],
)  # fmt: skip
def test_a_demand_not_in_the_profiles_units_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, demand: list[int], reason: str
) -> None:
    doc = {"format": "megha-job/1", "count": 1, "demand": demand, "duration": 1}
    with pytest.raises(ConfigError) as err:
        check_demands(parse_job(doc), profile(name), "job.json")
    assert err.value.reason == reason
    jf = tmp_path / "job.json"
    jf.write_text(json.dumps(doc))
    args = ["simulate", "--jobs", str(jf), "--workers", "2", "--gms", "1", "--lms", "1"]
    code = main([*args, "--profile", name, "--quiet", "--out", str(tmp_path / "out")])
    assert code == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1
    assert ("never run" if reason == "impossible_resources" else "amounts; profile") in said


def test_a_malformed_job_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jf = tmp_path / "job.json"
    jf.write_text('{"format": "megha-job/1", "count": 1, "demand": [1], "duration": 1, "count": 2}')
    code = main(["simulate", "--jobs", str(jf), "--quiet", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "appears twice" in err
