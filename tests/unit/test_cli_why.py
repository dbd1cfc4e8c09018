"""``megha why TASK_OR_JOB_ID``: every GM is asked (``GET /v1/find/{id}``), what they
found is printed as one timeline in time order, and an id no GM knows is one line.
The GMs are real cores answered through ``global_master.inspect.find``; only the
signed HTTP call is replaced."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from common.ids import GmId, LmId
from federation import operator
from global_master import inspect as gm_inspect
from global_master.core import GlobalMaster
from global_master.journal import Journal
from megha_cli import ops
from megha_cli.main import main
from megha_cli.ops import find_sections, merged_timeline
from megha_cli.terminal import render_plain
from tests.conftest import Network, make_gm, make_lm, make_task
from tests.unit.test_cli_errors import one_line, record_federation

GM0, GM1, LM0 = GmId("gm0"), GmId("gm1"), LmId("lm0")


def answering(cores: dict[str, GlobalMaster | None]) -> Any:
    """``operator_get`` as the GMs' ``/v1/find/{id}`` answers it (None: a GM down)."""

    def get(cfg: object, access: object, name: str, path: str, **_: object) -> dict[str, Any]:
        core = cores.get(name)
        if core is None:
            return {"error": "<urlopen error [Errno 111] Connection refused>"}
        assert path.startswith("/v1/find/")
        ident = unquote(path.removeprefix("/v1/find/"))
        found = gm_inspect.find(core, ident)
        if found is None:
            return {"error": "not_found", "id": ident, "detail": "...", "status": 404}
        return json.loads(json.dumps(found))  # as it comes over the wire

    return get


@pytest.fixture
def two_gms() -> dict[str, GlobalMaster | None]:
    """gm0 ran job j17 (one task finished, one queued behind it); gm1 holds u1's task;
    gm2 (the default federation has three GMs) holds nothing."""
    users = [("u0", "gm0", 0.5), ("u1", "gm1", 0.5)]
    gm0, gm1 = make_gm("gm0", users=users), make_gm("gm1", users=users)
    gm0.journal, gm1.journal = Journal(), Journal()
    net = Network({GM0: gm0, GM1: gm1}, {LM0: make_lm(nodes=[(4, 4)], home=["gm0"])})
    net.start(100.0)
    first, second = make_task(4, 4, job="j17", task_id="a"), make_task(4, 4, job="j17", task_id="b")
    net.submit(GM0, [first, second], 100.0)
    net.place_and_start(GM0, 101.0, 102.0, max_tasks=2)
    net.finish(first.task_id, 103.0)
    net.run(103.0)
    net.submit(GM1, [make_task(user="u1", job="j9", task_id="lone")], 104.0)
    return {"gm0": gm0, "gm1": gm1, "gm2": make_gm("gm2", users=users)}


Why = Callable[..., int]
"""``why(*argv)``: ``megha why ARGV`` against a recorded federation; its exit code."""


@pytest.fixture
def why(
    two_gms: dict[str, GlobalMaster | None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Why:
    record_federation(tmp_path)

    def run(*argv: str, down: tuple[str, ...] = ()) -> int:
        cores = {name: None if name in down else core for name, core in two_gms.items()}
        get = answering(cores)
        monkeypatch.setattr(ops, "operator_get", get)  # `megha why USER TASK`
        monkeypatch.setattr(operator, "operator_get", get)  # a lone id, found on every GM
        return main(["why", *argv, "--state-dir", str(tmp_path)])

    return run


def test_a_job_is_one_timeline_of_its_tasks_in_time_order(
    why: Why, capsys: pytest.CaptureFixture[str]
) -> None:
    assert why("j17") == 0
    out = capsys.readouterr().out
    assert "job(s): 1, task(s): 2, on gm0" in out
    rows = [ln.split() for ln in out.split("timeline\n")[1].splitlines() if ln.startswith("  +")]
    at = [float(r[0].removesuffix("s")) for r in rows]
    assert at == sorted(at)
    assert at[0] == 0.0
    assert [r[2:4] for r in rows if r[2] == "a"][-2:] == [["a", "started"], ["a", "finished"]]
    assert ["b", "submitted"] in [r[2:4] for r in rows]
    assert {r[1] for r in rows} == {"gm0"}
    assert "- b: in u0's queue" in out  # why the unfinished one waits


def test_a_lone_task_id_of_any_user_is_its_own_story(
    why: Why, capsys: pytest.CaptureFixture[str]
) -> None:
    assert why("lone") == 0
    assert "u1/lone (job j9) at gm1: queued" in capsys.readouterr().out
    assert why("lone", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["id"], doc["unanswered"]) == ("lone", {})
    assert [p["gm"] for p in doc["found"]] == ["gm1"]
    assert [(s["gm"], s["task_id"], s["what"]) for s in doc["timeline"]] == [
        ("gm1", "lone", "submitted")
    ]


def test_an_id_no_gm_knows_is_one_line_and_exit_1(
    why: Why, capsys: pytest.CaptureFixture[str]
) -> None:
    assert why("nope") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert one_line(captured.err) == "megha why: nope: not found on any GM"
    assert why("nope", "--json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"id": "nope", "found": [], "unanswered": {}, "timeline": []}


def test_a_gm_that_does_not_answer_is_named(why: Why, capsys: pytest.CaptureFixture[str]) -> None:
    assert why("lone", down=("gm1",)) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith(
        "megha why: lone: not found on any GM that answered (no answer from gm1:"
    )
    assert why("j17", "--quiet", down=("gm1",)) == 0
    assert "GMs that did not answer (they may know more)\n  - gm1: " in capsys.readouterr().out


def test_steps_of_several_gms_interleave_by_time() -> None:
    def task(gm: str, tid: str, ats: list[float]) -> dict[str, Any]:
        return {"gm": gm, "user": "u", "task_id": tid, "job_id": "j", "state": "running",
                "timeline": [{"at": a, "what": f"s{a:g}"} for a in ats], "why": []}  # fmt: skip

    found = [
        {"gm": "gm0", "jobs": [], "tasks": [task("gm0", "x", [1.0, 4.0])], "tasks_found": 1,
         "tasks_shown": 1},
        {"gm": "gm1", "jobs": [], "tasks": [task("gm1", "y", [2.0, 3.0])], "tasks_found": 1,
         "tasks_shown": 1},
    ]  # fmt: skip
    assert [(s["gm"], s["what"]) for s in merged_timeline(found)] == [
        ("gm0", "s1"), ("gm1", "s2"), ("gm1", "s3"), ("gm0", "s4"),
    ]  # fmt: skip
    text = render_plain(find_sections("j", found))
    assert "job(s): 0, task(s): 2, on gm0, gm1" in text


def test_why_help_names_the_lone_id_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["why", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "TASK_OR_JOB_ID" in text
    assert "not found on any GM" in text
