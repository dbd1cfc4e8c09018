"""What a bench's summary says of the tasks that did not finish in time, and of the
federation's counters: built from a run's figures, without a federation."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from common.config import load_config
from common.model import new_task
from megha_cli import live
from megha_cli.live import bench_sections
from megha_cli.main import main
from megha_cli.terminal import render_plain
from reporting.live import FREE_BY_NODE, RECENT_ALLOCATIONS, write_series
from request_generator.bench import (
    BenchOptions,
    LaunchLog,
    RunTally,
    _Run,
    _run_prefix,
    build_workload,
    close_tally,
    summarize_run,
)
from request_generator.submitter import Outcomes
from workload.jobs import specs_of

pytestmark = pytest.mark.timeout(60)


def summary_of(
    tmp_path: Path,
    *,
    unfinished_users: tuple[str, ...] = (),
    states: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A run of 6 jobs x 2 tasks whose tasks of ``unfinished_users`` had no outcome by
    the timeout (the others failed, which is enough here)."""
    cfg = load_config(None)
    jobs = build_workload(cfg, BenchOptions(jobs=6, tasks_per_job=2, progress=False))
    tally = RunTally(cfg, jobs, tmp_path / "tasks.csv")
    unfinished = []
    for j in jobs:
        for s in specs_of(j):
            if s.user in unfinished_users:
                unfinished.append(((s.user, s.task_id), s, 0.0))
            tally.add(new_task(s, 0.0), 0.0)
    tally.csv.close()
    n = sum(len(j.tasks) for j in jobs)
    run = _Run(
        jobs, tally, _run_prefix(jobs), unfinished, n, 1.0, [], [], [], states or {},
        LaunchLog(cfg, Any), before or {},
    )  # fmt: skip
    sub: Any = SimpleNamespace(outcomes=Outcomes(keep=False), refused={})
    try:
        return summarize_run(cfg, BenchOptions(timeout_s=20.0, progress=False), run, sub)
    finally:
        tally.close()


def test_tasks_not_done_by_the_timeout_are_unfinished_by_user(tmp_path: Path) -> None:
    s = summary_of(tmp_path, unfinished_users=("u1", "u2"))
    assert s["unfinished_tasks"] == 8
    assert s["unfinished_by_user"] == {"u1": 4, "u2": 4}
    assert len(s["unfinished_task_ids"]) == 8
    assert all(i.startswith(("u1/", "u2/")) for i in s["unfinished_task_ids"])
    assert s["timeout_s"] == 20.0


def test_every_task_done_is_nothing_unfinished(tmp_path: Path) -> None:
    s = summary_of(tmp_path)
    assert (s["unfinished_tasks"], s["unfinished_by_user"]) == (0, {})


def test_bench_reports_unfinished_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`megha bench --timeout 20` while a GM is down: its users' tasks did not finish in
    time; the table and the hint say so (not "lost"), and the exit code is 2."""
    summary = summary_of(tmp_path, unfinished_users=("u1",))
    home = tmp_path / "home"
    home.mkdir()
    (home / "federation.toml").write_text(load_config(None).to_toml())
    (home / "pids.json").write_text('{"name": "megha", "processes": []}')
    monkeypatch.setattr(live, "broker_reachable", lambda *_: True)
    monkeypatch.setattr(live, "run_bench_shown", lambda *_: summary)
    argv = ["bench", "--state-dir", str(home), "--quiet", "--timeout", "20"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    out = capsys.readouterr().out
    table = out.split("tasks not finished")[0]
    assert "unfinished" in table
    assert "lost" not in table
    assert (
        "4 tasks not finished within --timeout 20 s (by user: u1 4); not known to be lost: "
        "they may still be queued or running (`megha status`)"
    ) in out


def gm(requeues: int, dead: int, finished: int) -> dict[str, Any]:
    return {
        "counters": {"requeues": requeues, "tasks_finished": finished, "failed": 0},
        "dead_lettered": dead,
    }


def lm(epoch: int, preemptions: int) -> dict[str, Any]:
    return {"epoch": epoch, "counters": {"preemptions": preemptions, "launches": 9}}


def test_counters_are_the_runs_not_since_each_service_started(tmp_path: Path) -> None:
    """dead_lettered 10 from an earlier run is not this run's."""
    before = {"gm0": gm(3, 10, 100), "lm0": lm(5, 1), "lm0-workers": {"counters": {}}}
    after = {"gm0": gm(5, 10, 160), "lm0": lm(5, 4), "lm0-workers": {"counters": {}}}
    s = summary_of(tmp_path, states=after, before=before)
    c = s["counters"]
    assert (c["requeues"], c["dead_lettered"], c["preemptions"]) == (2, 0, 3)
    assert s["counters_notes"] == []
    assert s["counters_are"].startswith("this run's")


def test_a_service_restarted_in_the_run_counts_since_its_restart(tmp_path: Path) -> None:
    before = {"gm0": gm(3, 10, 100), "gm1": gm(1, 0, 50), "lm0": lm(5, 7), "lm1": lm(2, 0)}
    after = {
        "gm0": gm(2, 1, 20),  # restarted: its counters began again
        "gm1": {"error": "connection refused"},
        "lm0": lm(6, 1),  # a new incarnation (its standby took over)
        "lm1": lm(2, 0),
    }
    s = summary_of(tmp_path, states=after, before=before)
    c = s["counters"]
    assert (c["requeues"], c["dead_lettered"], c["preemptions"]) == (2, 1, 1)
    assert s["counters_notes"] == [
        "gm0: restarted during the run; counted since its restart",
        "gm1: no answer at the end; not counted",
        "lm0: restarted during the run; counted since its restart",
    ]
    shown = render_plain(bench_sections(s))
    assert "this run's counters (not zero)" in shown
    assert "counters: gm0: restarted during the run; counted since its restart; gm1:" in shown


def test_a_service_that_did_not_answer_at_the_start_counts_from_its_start(
    tmp_path: Path,
) -> None:
    s = summary_of(tmp_path, states={"gm0": gm(4, 0, 9)}, before={"gm0": {"error": "timed out"}})
    assert s["counters"]["requeues"] == 4
    assert s["counters_notes"] == ["gm0: no answer at the start; counted from its start"]


def test_an_outcome_after_the_run_ended_goes_to_no_closed_file(tmp_path: Path) -> None:
    """A task done after --timeout (its GM came back), before the submitter closed: its
    outcome was written to the closed tasks.csv (a ValueError traceback per outcome)."""
    cfg = load_config(None)
    jobs = build_workload(cfg, BenchOptions(jobs=2, tasks_per_job=2, progress=False))
    tally = RunTally(cfg, jobs, tmp_path / "tasks.csv")
    out = Outcomes(keep=False, sink=tally.add)
    specs = [s for j in jobs for s in specs_of(j)]
    out.submitted(specs, 1.0)
    try:
        unfinished = close_tally(out, tally)
        assert len(unfinished) == len(specs)
        late = new_task(specs[0], 1.0)
        out.record(late, True)  # no ValueError: I/O operation on closed file
    finally:
        tally.close()
    rows = (tmp_path / "tasks.csv").read_text().splitlines()
    assert len(rows) == 1 + len(specs)


def test_raw_series_go_to_their_own_files_not_the_summary(tmp_path: Path) -> None:
    """Each GM's recent allocation times and each LM's free resources per node are data
    (for the dashboard, for a plot), not a summary: summary.json names their file and
    row count, and series/*.csv holds them, row for row."""
    recent = [[1000.0 + i, 0.001 * i] for i in range(3000)]
    states = {
        "gm0": {**gm(0, 0, 3000), "allocations": {"window_s": 60.0, "recent": recent}},
        "gm1": {"error": "timed out"},
        "lm0": {**lm(1, 0), "free": [[1, 4], [0, 2]]},
        "lm0-workers": {"counters": {}},
    }
    s = summary_of(tmp_path, states=states)
    assert s["services"]["gm0"]["allocations"] == {
        "window_s": 60.0,
        "recent": {"file": RECENT_ALLOCATIONS, "rows": 3000},
    }
    assert s["services"]["lm0"]["free"] == {"file": FREE_BY_NODE, "rows": 2}
    assert s["services"]["gm1"] == {"error": "timed out"}
    assert "recent" in states["gm0"]["allocations"]  # the pages themselves are left alone
    assert len(json.dumps(s["services"])) < 2000
    write_series(tmp_path, states)
    with (tmp_path / RECENT_ALLOCATIONS).open() as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["gm", "finished_at", "allocation_s"]
    assert [[float(x) for x in r[1:]] for r in rows[1:]] == recent
    assert {r[0] for r in rows[1:]} == {"gm0"}
    with (tmp_path / FREE_BY_NODE).open() as fh:
        assert list(csv.reader(fh)) == [
            ["lm", "node", "free_0", "free_1"], ["lm0", "0", "1", "4"], ["lm0", "1", "0", "2"],
        ]  # fmt: skip
