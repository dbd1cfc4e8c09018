"""A task's environment (issue 31 item 5): ``env`` in job files, carried in its spec,
passed to the sandboxed command only for the names the operator allows
(``task_env_allow``); a job naming another is refused at submission with the reason,
and nothing of it runs.  The same check at the front door, in the GM's admission and
(dropping, not refusing) in the worker pool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from common import taskenv
from common.config import FederationConfig, parse_config
from common.effects import RunCommand
from common.errors import ConfigError
from common.jobspec import JobDef, parse_job
from common.messages import AdmitJob, CommandExited
from security.sandbox import CommandResult, Outcome, Sandbox, SandboxPolicy
from tests.security.test_sandbox import (  # noqa: F401 - fixtures
    ENV,
    lock_dir,
    not_a_subreaper_after,
    pol,
    spawns,
    task_uids,
    work_root,
)
from tests.unit.test_frontdoor import door
from worker.runner import Runner

ALLOW = ("LANG", "MEGHA_*")


def test_names_match_whole_against_the_patterns() -> None:
    assert taskenv.refusal(("LANG=C", "MEGHA_X=1", "MEGHA_=2"), ALLOW) is None
    assert taskenv.refusal(("LD_PRELOAD=/x.so",), ALLOW) == (
        "env_not_allowed",
        "environment variable LD_PRELOAD is not allowed here (task_env_allow: LANG, MEGHA_*)",
    )
    assert taskenv.refusal(("XLANG=1",), ALLOW) is not None  # not a substring match
    assert taskenv.refusal(("LANG=C",), ()) == (
        "env_not_allowed",
        "environment variable LANG is not allowed here (task_env_allow: none)",
    )
    for bad in ("LANG", "1A=x", "A-B=x", "=x", "A=x\0y"):
        got = taskenv.refusal((bad,), ("*",))
        assert got is not None
        assert got[0] == "bad_env", bad
    assert taskenv.refusal(("A=1", "A=2"), ("*",)) == ("bad_env", "A is named twice")
    assert taskenv.allowed(("LANG=C", "PATH=/evil", "MEGHA_X=a=b", "bad"), ALLOW) == {
        "LANG": "C", "MEGHA_X": "a=b",
    }  # fmt: skip


def test_the_operator_list_is_checked() -> None:
    cfg = parse_config({"federation": {"task_env_allow": ["LANG", "MEGHA_*"]}}, env={})
    assert cfg.task_env_allow == ["LANG", "MEGHA_*"]
    assert 'task_env_allow = ["LANG", "MEGHA_*"]' in cfg.to_toml()
    for bad in (["A B"], [""], [1], "LANG"):
        with pytest.raises(ConfigError, match="task_env_allow"):
            parse_config({"federation": {"task_env_allow": bad}}, env={})
    assert FederationConfig().task_env_allow == []  # none by default


def test_job_files_carry_env_per_stage_and_task() -> None:
    job = parse_job({"format": "megha-job/1", "stages": [
        {"id": 0, "count": 2, "demand": [1], "duration": 1, "command": ["/bin/x"],
         "env": {"MEGHA_A": "1", "LANG": "C"}},
        {"id": 1, "parents": [0], "env": {"MEGHA_A": "stage"}, "tasks": [
            {"demand": [1], "duration": 1, "env": {"MEGHA_A": "task", "MEGHA_B": "b"}},
            {"demand": [1], "duration": 1}]}]})  # fmt: skip
    sub = job.submission("j", "u0", "t", 0.0)
    assert [t.env for t in sub.tasks] == [
        ("LANG=C", "MEGHA_A=1"), ("LANG=C", "MEGHA_A=1"),
        ("MEGHA_A=task", "MEGHA_B=b"), ("MEGHA_A=stage",),
    ]  # fmt: skip
    assert parse_job(job.to_doc()).submission("j", "u0", "t", 0.0) == sub  # written back
    short = JobDef.single(1, [1], 1.0, ["/bin/x"], env={"LANG": "C"})
    assert short.submission("k", "u0", "t", 0.0).tasks[0].env == ("LANG=C",)
    for env, why in (({"A": 1}, "object of strings"), ({"1A": "x"}, "not NAME=value"),
                     ({"A": "\0"}, "NUL"), ([], "object of strings"),
                     ({f"V{i}": "" for i in range(65)}, "at most 64")):  # fmt: skip
        with pytest.raises(ConfigError, match=why) as err:
            parse_job({"format": "megha-job/1", "demand": [1], "duration": 1, "env": env})
        assert err.value.reason == "bad_job_file"


def test_the_front_door_refuses_what_is_not_allowed_and_changes_nothing(
    tmp_path: Path,
) -> None:
    d, tokens, published = door(tmp_path)
    d.core.admission.limits = replace(d.core.admission.limits, env_allow=ALLOW)
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from global_master.frontdoor import add_routes

    job = {"format": "megha-job/1", "demand": [1, 1], "duration": 1, "command": ["/bin/x"]}

    async def go() -> list[tuple[int, Any]]:
        app = web.Application()
        add_routes(app, d)
        out = []
        async with TestClient(TestServer(app)) as client:
            h = {"X-Megha-User": "u0", "Authorization": f"Bearer {tokens['u0']}"}
            for env in ({"MEGHA_RUN": "7"}, {"MEGHA_RUN": "7", "LD_PRELOAD": "/x.so"}):
                body = json.dumps({**job, "env": env})
                resp = await client.post("/api/v1/jobs", data=body, headers=h)
                out.append((resp.status, await resp.json()))
        return out

    ok, refused = asyncio.run(go())
    assert ok[0] == 202
    assert refused[0] == 422
    assert refused[1]["error"] == "env_not_allowed"
    assert "LD_PRELOAD" in refused[1]["detail"]
    assert [j.tasks[0].env for j in published] == [("MEGHA_RUN=7",)]  # only the first sent


def test_the_core_refuses_a_job_sent_around_the_front_door(tmp_path: Path) -> None:
    d, _, _ = door(tmp_path)
    gm = d.core
    gm.admission.limits = replace(gm.admission.limits, env_allow=ALLOW)
    job = JobDef.single(1, [1, 1], 1.0, ["/bin/x"], env={"PATH": "/tmp/evil"})
    effects = gm.handle(AdmitJob(job=job.submission("j", "u0", "t", 1.0)), 1.0)
    refused = [e for e in effects if type(e).__name__ == "JobRefused"]
    assert [(e.reason, e.job_id) for e in refused] == [("env_not_allowed", "j")]  # type: ignore[attr-defined]
    assert not gm.queues.queues.get("u0")


class FakeSandbox:
    def __init__(self) -> None:
        self.envs: list[dict[str, str]] = []

    async def run(
        self, argv: Sequence[str], *, on_start: Callable[[], None] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:  # fmt: skip
        self.envs.append(dict(env or {}))
        return CommandResult(ok=True, reason=Outcome.OK, exit_code=0)


def test_the_pool_passes_only_what_its_list_allows() -> None:
    fed: list[object] = []

    class Driver:
        def feed(self, msg: object) -> None:
            fed.append(msg)

    box = FakeSandbox()
    runner = Runner(Driver(), box, ALLOW)  # type: ignore[arg-type]
    job = JobDef.single(1, [1], 1.0, ["/bin/x"], env={"LANG": "C", "LD_PRELOAD": "/x.so"})
    spec = job.submission("j", "u0", "t", 0.0).tasks[0]  # (admitted under a wider list)

    async def go() -> None:
        runner.run(RunCommand(spec=spec, attempt=1))
        await asyncio.sleep(0.05)

    asyncio.run(go())
    assert box.envs == [{"LANG": "C"}]
    assert isinstance(fed[-1], CommandExited)


@spawns
def test_the_sandboxed_command_sees_the_allowed_variables(request: pytest.FixtureRequest) -> None:
    box: SandboxPolicy = request.getfixturevalue("pol")  # (tests/security/test_sandbox.py's)
    env = taskenv.allowed(("MEGHA_RUN=7", "LANG=C", "LD_PRELOAD=/x.so"), ALLOW)
    res = asyncio.run(Sandbox(box).run([ENV], env=env))
    assert res.ok, res
    got = dict(line.split("=", 1) for line in res.stdout.decode().splitlines())
    assert got["MEGHA_RUN"] == "7"
    assert got["LANG"] == "C"  # over the sandbox's own C.UTF-8
    assert "LD_PRELOAD" not in got
    assert got["PATH"] == box.path  # the sandbox's own stay
