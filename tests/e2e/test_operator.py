"""An operator questions a live federation: ``megha why`` about a finished task and about
a job found on any GM (``/v1/find/{id}``), the GMs' and LMs' ``/v1/inspect`` counts after a workload, ``megha top`` printing its tables,
and the inspection endpoints refusing anyone but the operator."""

from __future__ import annotations

import asyncio
import csv
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from common.config import FederationConfig
from megha_cli.main import main
from request_generator.bench import BenchOptions, run_bench
from tests.e2e.conftest import service_state, signed_get

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]
TASKS = 24


@pytest.fixture(scope="module")
def ran(
    make_federation: Callable[..., Federation], tmp_path_factory: pytest.TempPathFactory
) -> tuple[FederationConfig, Path, list[dict[str, str]]]:
    """A small federation after a workload ran to completion; the tasks' records."""
    cfg, home = make_federation(gms=2, lms=2, nodes_per_lm=4, heartbeat_s=0.5)
    out = tmp_path_factory.mktemp("bench")
    opts = BenchOptions(
        jobs=12, tasks_per_job=2, mean_duration=0.05, job_rate=30.0, out=str(out),
        floor_samples=10, timeout_s=30.0, progress=False,
    )  # fmt: skip
    summary = asyncio.run(run_bench(cfg, opts, home))
    assert summary["tasks_finished"] == TASKS
    with (out / "tasks.csv").open() as fh:
        return cfg, home, list(csv.DictReader(fh))


def test_why_tells_a_finished_tasks_timeline(
    ran: tuple[FederationConfig, Path, list[dict[str, str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, home, tasks = ran
    t = tasks[0]
    assert main(["why", t["user"], t["task_id"], "--state-dir", str(home)]) == 0
    out = capsys.readouterr().out
    assert f"{t['user']}/{t['task_id']} (job {t['job_id']}) at {t['gm']}: finished" in out
    lines = out.splitlines()
    steps = [ln.split()[1] for ln in lines if ln.strip().startswith("+")]
    assert steps[0] == "submitted"
    assert steps[-2:] == ["started", "finished"]
    assert {"launch", "repartition"} & set(steps)
    # the same, by --user, as JSON: the GM's answer
    assert main(["why", t["task_id"], "--user", t["user"], "--json", "--state-dir", str(home)]) == 0
    assert '"state": "finished"' in capsys.readouterr().out
    assert main(["why", t["user"], "no-such-task", "--state-dir", str(home)]) == 1
    assert "knows no task 'no-such-task'" in capsys.readouterr().err


def test_why_finds_a_job_on_any_gm_and_says_when_none_knows_an_id(
    ran: tuple[FederationConfig, Path, list[dict[str, str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, home, tasks = ran
    t = tasks[0]
    assert main(["why", t["job_id"], "--json", "--state-dir", str(home)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unanswered"] == {}
    ((page),) = doc["found"]
    assert page["gm"] == t["gm"]
    mine = sorted(
        r["task_id"] for r in tasks if (r["user"], r["job_id"]) == (t["user"], t["job_id"])
    )
    assert sorted(x["task_id"] for x in page["tasks"]) == mine
    assert all(x["state"] == "finished" for x in page["tasks"])
    ats = [s["at"] for s in doc["timeline"]]
    assert ats == sorted(ats)
    assert [s["what"] for s in doc["timeline"]].count("finished") == len(mine)
    assert main(["why", t["task_id"], "--state-dir", str(home)]) == 0
    assert f"{t['user']}/{t['task_id']} (job {t['job_id']}) at {t['gm']}: finished" in (
        capsys.readouterr().out
    )
    assert main(["why", "no-such-id", "--state-dir", str(home)]) == 1
    assert capsys.readouterr().err.strip() == "megha why: no-such-id: not found on any GM"
    answer = signed_get_status(cfg, home, "gm0", "/v1/find/no-such-id")
    assert answer == (404, {"error": "not_found", "gm": "gm0", "id": "no-such-id",
                            "detail": "gm0 knows no task or job 'no-such-id' (now or lately)"})  # fmt: skip


def signed_get_status(
    cfg: FederationConfig, home: Path, name: str, path: str
) -> tuple[int, dict[str, object]]:
    """``GET path`` signed as the operator: the status and JSON body, a refusal too."""
    try:
        return 200, signed_get(cfg, home, name, path)
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def test_inspect_counts_match_the_workload(
    ran: tuple[FederationConfig, Path, list[dict[str, str]]],
) -> None:
    cfg, home, _ = ran
    gms = [signed_get(cfg, home, g, "/v1/inspect") for g in cfg.gm_ids]
    assert sum(p["recently_ended"]["finished"] for p in gms) == TASKS
    assert all(p["recently_ended"]["failed"] == 0 for p in gms)
    for p in gms:
        assert p["ready"]
        assert p["totals"] == {"queued": 0, "waiting": 0, "in_flight": 0, "running": 0}
        (user,) = p["users"]
        assert p["users"][user]["share"] == pytest.approx(0.5)
    for lm in cfg.lm_ids:
        page = signed_get(cfg, home, lm, "/v1/inspect")
        assert page["nodes"] == page["nodes_alive"] == page["nodes_free"] == 4
        assert page["running_tasks"] == 0
        members = [q["members"] for q in page["partitions"].values()]
        assert sorted(members) == ["0011", "1100"]  # each node in exactly one partition
        assert (
            page["repartitions_total"] == service_state(cfg, home, lm)["counters"]["repartitions"]
        )


def test_top_prints_its_tables_once(
    ran: tuple[FederationConfig, Path, list[dict[str, str]]], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, home, _ = ran
    assert main(["top", "--iterations", "1", "--state-dir", str(home)]) == 0
    out = capsys.readouterr().out
    assert out.count("megha top:") == 1
    for line in ("GMs", "LMs", "broker queues"):
        assert f"\n{line}\n" in out
    for name in (*cfg.gm_ids, *cfg.lm_ids):
        assert f"  {name} " in out
    assert "gm0 2/2  gm1 2/2" in out  # every node of each partition free after the run


def test_inspection_is_for_the_operator_only(
    ran: tuple[FederationConfig, Path, list[dict[str, str]]],
) -> None:
    cfg, _, tasks = ran
    for url in (
        cfg.url("gm0") + "/v1/inspect",
        cfg.url("gm0") + f"/v1/tasks/{tasks[0]['user']}/{tasks[0]['task_id']}",
        cfg.url("gm0") + f"/v1/find/{tasks[0]['job_id']}",
        cfg.url("lm0") + "/v1/inspect",
    ):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == 401
        err.value.close()
