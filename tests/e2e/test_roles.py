"""Roles no wider than their role, on a federation made by ``megha up`` (issue 32 item
7): no service process is given the federation secret, an LM refuses a GM's launch for
another GM's user, and users' outcomes come sealed by their own GM."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from common import codec
from common.config import FederationConfig
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import LaunchRequest, LaunchResponse, Placement
from common.model import TaskSpec
from security.access import Access, identity_of_process
from security.identity import gm, lm
from security.party_keys import KEYS_FILE_ENV, keys_path
from security.secret import SECRET_FILE_ENV
from tests.e2e.conftest import incarnation, submit_with_fault
from workload.jobs import Job

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]
RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def fed(make_federation: Callable[..., Federation]) -> Federation:
    """Two GMs (u0 on gm0, u1 on gm1), one LM."""
    return make_federation(gms=2, lms=1, nodes_per_lm=4, heartbeat_s=0.5)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").partition("=")[::2] for e in raw if e)


def test_no_service_is_given_the_federation_secret(fed: Federation) -> None:
    cfg, home = fed
    procs = json.loads((home / "pids.json").read_text())["processes"]
    assert procs
    for p in procs:
        env = environ_of(p["pid"])
        assert not env.get(SECRET_FILE_ENV), p["name"]
        me = identity_of_process(cfg, p["name"])
        assert env[KEYS_FILE_ENV] == str(keys_path(home, me)), p["name"]
    pool = json.loads(keys_path(home, identity_of_process(cfg, "lm0-workers")).read_text())
    assert all("workers:lm0" in label for label in pool["keys"])


def test_a_gm_cannot_launch_another_gms_users_task(fed: Federation) -> None:
    cfg, home = fed
    me = Access.in_home(home, cfg, gm("gm0"))
    spec = TaskSpec(task_id=TaskId(f"x{RUN}.t0"), job_id=JobId(f"x{RUN}"), user=UserId("u1"),
                    demand=(1,), duration=0.05)  # fmt: skip
    req = LaunchRequest(gm=GmId("gm0"), lm=LmId("lm0"), request_id=1, known_version=-1,
                        placements=(Placement(spec=spec, attempt=9, node=NodeIndex(0)),))  # fmt: skip
    body, path = codec.encode(req), "/v1/launch"
    url = cfg.lm_url("lm0")
    headers = me.sign(lm("lm0"), "POST", path, body, time.time(), incarnation(url))
    http = urllib.request.Request(url + path, data=body, headers=headers)
    with urllib.request.urlopen(http, timeout=10) as resp:
        answer = codec.decode(resp.read(), expect=(LaunchResponse,))
    assert [(r.accepted, r.reason) for r in answer.results] == [(False, "foreign_user")]


def test_outcomes_come_sealed_by_the_users_own_gm(fed: Federation) -> None:
    cfg, home = fed
    jobs = [
        Job(JobId(f"r{RUN}.{u}"), UserId(u), 0.0,
            [TaskSpec(task_id=TaskId(f"r{RUN}.{u}.t{i}"), job_id=JobId(f"r{RUN}.{u}"),
                      user=UserId(u), demand=(1,), duration=0.05) for i in range(3)])
        for u in ("u0", "u1")
    ]  # fmt: skip

    async def nothing() -> None:
        return None

    sub = asyncio.run(submit_with_fault(cfg, home, jobs, at=0, fault=nothing, timeout_s=60))
    out = sub.outcomes
    assert (out.forged, out.bad_events) == (0, [])
    assert len(out.finished) == 6
