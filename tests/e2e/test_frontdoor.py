"""The front door end to end: a user submits, follows, cancels and reads jobs from the
CLI, from Python and with plain HTTP, against real GM/LM/pool processes and RabbitMQ;
bad input is refused in one line with a meaningful exit code and changes nothing."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from client import AsyncClient, Client, FrontDoorError, JobDef
from common.config import FederationConfig
from federation.processes import kill, restart
from global_master.frontdoor import OPENAPI
from tests.e2e.conftest import service_state
from tests.sim.test_job_file_units import peak_overlap

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


@pytest.fixture(scope="module")
def fed(make_federation: Callable[..., Federation]) -> Federation:
    return make_federation(gms=2, lms=2, nodes_per_lm=4, heartbeat_s=0.5)


def megha(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "megha_cli.main", *args, "--state-dir", str(home)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def user_of(cfg: FederationConfig, gm: str) -> str:
    return next(u.user for u in cfg.user_configs if u.gm == gm)


def test_cli_submit_wait_job_jobs_and_bad_input(fed: Federation, tmp_path: Path) -> None:
    cfg, home = fed
    user = user_of(cfg, "gm0")
    jf = tmp_path / "short.json"
    jf.write_text(json.dumps({"format": "megha-job/1", "name": "short", "count": 3,
                              "demand": [1], "duration": 0.2}))  # fmt: skip
    run = megha(home, "submit", str(jf), "--user", user, "--wait", "--id", "short-1")
    assert run.returncode == 0, run.stderr
    assert "short-1 finished: finished 3" in run.stdout
    job = megha(home, "job", "short-1", "--user", user, "--json")
    doc = json.loads(job.stdout)
    assert doc["state"] == "finished"
    assert len(doc["task_list"]) == 3
    assert all(t["attempts"] >= 1 and t["state"] == "finished" for t in doc["task_list"])
    listed = json.loads(megha(home, "jobs", "--user", user, "--json").stdout)
    assert "short-1" in [j["job_id"] for j in listed]
    # bad input: one line, a meaningful exit code, nothing changed
    again = megha(home, "submit", str(jf), "--user", user, "--id", "short-1")
    assert again.returncode == 2
    assert "duplicate_job_id" in again.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "megha-job/1", "count": 2, "demand": [], "duration": 1}')
    r = megha(home, "submit", str(bad), "--user", user)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1
    assert "bad_job_file" in r.stderr
    r = megha(home, "job", "no-such-job", "--user", user)
    assert r.returncode == 3
    assert "unknown_job" in r.stderr
    other = user_of(cfg, "gm1")
    r = megha(home, "job", "short-1", "--user", other)  # another user's job: unknown to it
    assert r.returncode == 3
    assert "unknown_job" in r.stderr
    r = megha(home, "cancel", "short-1", "--user", other)
    assert r.returncode == 3
    wrong = tmp_path / "wrong-token"
    wrong.write_text("mgu_" + "A" * 43)
    r = megha(home, "jobs", "--user", user, "--token-file", str(wrong))
    assert r.returncode == 4
    assert "bad_token" in r.stderr
    after = json.loads(megha(home, "jobs", "--user", user, "--json").stdout)
    assert [j["job_id"] for j in after] == [j["job_id"] for j in listed]


def test_python_client_cancels_a_long_job(fed: Federation) -> None:
    cfg, home = fed
    user = user_of(cfg, "gm1")  # served by gm1: the client finds it from the config
    c = Client.connect(user=user, state_dir=home)
    long = c.submit(JobDef.single(12, [1], 600.0, name="long"))
    deadline = time.monotonic() + 60
    while long.status().tasks_by_state.get("running", 0) == 0:
        assert time.monotonic() < deadline, long.status()
        time.sleep(0.2)
    long.cancel()
    view = long.wait(timeout_s=60)
    assert view.state == "cancelled"
    assert {t.state for t in view.task_list} == {"cancelled"}
    assert long.cancel().state == "cancelled"  # idempotent
    quick = c.submit(JobDef.single(2, [1], 0.1, name="quick"))  # the slots came back
    assert quick.wait(timeout_s=60).state == "finished"
    with pytest.raises(FrontDoorError) as err:
        c.status("nope")
    assert err.value.reason == "unknown_job"
    assert err.value.status == 404

    async def via_asyncio() -> str:
        async with AsyncClient.connect(user=user, state_dir=home) as ac:
            h = await ac.submit(JobDef.single(1, [1], 0.1, name="async"))
            return (await h.wait(timeout_s=60)).state

    assert asyncio.run(via_asyncio()) == "finished"


def _http(method: str, url: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def test_http_answers_as_its_openapi_document_says(fed: Federation) -> None:
    """What curl sees: every answer validates against the schema /openapi.json gives."""
    cfg, home = fed
    user = user_of(cfg, "gm0")
    token = (home / "tokens" / user).read_text().strip()
    base = cfg.gm_url("gm0")
    with urllib.request.urlopen(base + "/openapi.json", timeout=10) as resp:
        doc = json.loads(resp.read())
    assert doc == json.loads(json.dumps(OPENAPI))
    auth = {"X-Megha-User": user, "Authorization": f"Bearer {token}"}

    def check(path: str, method: str, status: int, body: Any) -> None:
        spec = doc["paths"][path][method]["responses"][str(status)]
        schema = spec["content"]["application/json"]["schema"]
        jsonschema.validate(body, {**schema, "components": doc["components"]})

    job = json.dumps({"format": "megha-job/1", "count": 1, "demand": [1], "duration": 0.1})
    st, sub = _http("POST", f"{base}/api/v1/jobs", job.encode(), auth)
    check("/api/v1/jobs", "post", st, sub)
    jid = sub["job_id"]
    deadline = time.monotonic() + 30
    while True:
        st, got = _http("GET", f"{base}/api/v1/jobs/{jid}", None, auth)
        check("/api/v1/jobs/{job_id}", "get", st, got)
        if got["state"] == "finished":
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.2)
    st, lst = _http("GET", f"{base}/api/v1/jobs", None, auth)
    check("/api/v1/jobs", "get", st, lst)
    tid = got["task_list"][0]["task_id"]
    st, task = _http("GET", f"{base}/api/v1/tasks/{tid}", None, auth)
    check("/api/v1/tasks/{task_id}", "get", st, task)
    st, c = _http("POST", f"{base}/api/v1/jobs/{jid}/cancel", b"", auth)
    check("/api/v1/jobs/{job_id}/cancel", "post", st, c)
    for bad, status in (({**auth, "Authorization": "Bearer nope"}, 401),
                        ({"X-Megha-User": user}, 401)):  # fmt: skip
        st, err = _http("GET", f"{base}/api/v1/jobs", None, bad)
        assert st == status
        check("/api/v1/jobs", "get", st, err)
    other = user_of(cfg, "gm1")
    other_auth = {
        "X-Megha-User": other,
        "Authorization": "Bearer " + (home / "tokens" / other).read_text().strip(),
    }
    st, err = _http("GET", f"{base}/api/v1/jobs", None, other_auth)  # fmt: skip
    assert st == 421
    assert err["gm"] == "gm1"
    check("/api/v1/jobs", "get", st, err)


def test_a_job_file_runs_as_many_at_once_live_as_simulated(fed: Federation, tmp_path: Path) -> None:
    """Issue 31 item 5: the same megha-job/1 file on the live federation (2 LMs x 4
    nodes, the ``slots`` profile) and in ``megha simulate`` on as many nodes: ``[1]`` is
    a whole node in both, so 8 of its 16 tasks run at once in both (not 16 in one)."""
    cfg, home = fed
    user = user_of(cfg, "gm0")
    jf = tmp_path / "wide.json"
    jf.write_text(json.dumps({"format": "megha-job/1", "name": "wide", "count": 16,
                              "demand": [1], "duration": 3}))  # fmt: skip
    run = megha(home, "submit", str(jf), "--user", user, "--wait", "--id", "wide-1")
    assert run.returncode == 0, run.stdout + run.stderr
    tasks = json.loads(megha(home, "job", "wide-1", "--user", user, "--json").stdout)["task_list"]
    live = peak_overlap((t["started_at"], t["ended_at"]) for t in tasks)
    out = tmp_path / "sim"
    sim = [sys.executable, "-m", "megha_cli.main", "simulate", "--jobs", str(jf), "--workers",
           str(cfg.lms * cfg.nodes_per_lm), "--gms", "1", "--lms", str(cfg.lms), "--policies",
           "fifo", "--quiet", "--out", str(out)]  # fmt: skip
    subprocess.run(sim, check=True, capture_output=True, timeout=120)
    with (out / "tasks-fifo.csv").open() as f:
        rows = list(csv.DictReader(f))
    simulated = peak_overlap((float(r["started_at"]), float(r["finished_at"])) for r in rows)
    assert (live, simulated) == (8, 8)


def test_job_history_survives_a_gm_restart(fed: Federation, tmp_path: Path) -> None:
    """The GM's job book is journaled in its state directory: after the GM process is
    killed and started again, `megha job ID` reads the same states, attempts and exit
    codes, and `megha logs` the same output (last: it restarts gm0)."""
    cfg, home = fed
    user = user_of(cfg, "gm0")
    jf = tmp_path / "kept.json"
    jf.write_text(json.dumps({"format": "megha-job/1", "name": "kept", "count": 2,
                              "demand": [1], "duration": 0.2}))  # fmt: skip
    assert (
        megha(home, "submit", str(jf), "--user", user, "--wait", "--id", "kept-1").returncode == 0
    )
    many = tmp_path / "many.json"  # more tasks than nodes: several waves (its own, run alone)
    many.write_text(json.dumps({"format": "megha-job/1", "name": "many", "count": 12,
                                "demand": [1], "duration": 0.2}))  # fmt: skip
    assert (
        megha(home, "submit", str(many), "--user", user, "--wait", "--id", "many-1").returncode == 0
    )
    long = JobDef.single(2, [1], 600.0, name="held")
    c = Client.connect(user=user, state_dir=home)
    held = c.submit(long, "held-1")
    held.cancel()
    assert held.wait(timeout_s=60).state == "cancelled"
    before = {j: json.loads(megha(home, "job", j, "--user", user, "--json").stdout)
              for j in ("kept-1", "held-1", "many-1")}  # fmt: skip
    kill(home, "gm0")
    restart(home, cfg, "gm0")
    for j, doc in before.items():
        got = megha(home, "job", j, "--user", user, "--json")
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == doc
    listed = json.loads(megha(home, "jobs", "--user", user, "--json").stdout)
    assert {"kept-1", "held-1", "many-1"} <= {j["job_id"] for j in listed}
    page = service_state(cfg, home, "gm0")
    assert page["job_history"]["restored_jobs"] >= 3
    after = c.submit(JobDef.single(1, [1], 0.1, name="after"))  # and it goes on
    assert after.wait(timeout_s=60).state == "finished"
