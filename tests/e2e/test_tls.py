"""Internal HTTP over TLS under the federation's own CA (issue 32 item 10), on a
federation made by ``megha up`` with ``tls = "on"``: every service speaks only TLS,
clients trust only that CA, and work runs as before."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from common.config import FederationConfig
from common.ids import JobId, TaskId, UserId
from common.model import TaskSpec
from federation.operator import signed_get
from security import tls
from tests.e2e.conftest import submit_with_fault
from workload.jobs import Job

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]
RUN = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def fed(make_federation: Callable[..., Federation]) -> Federation:
    return make_federation(gms=2, lms=1, nodes_per_lm=4, heartbeat_s=0.5, tls="on")


def test_services_speak_tls_under_the_federations_ca_only(fed: Federation) -> None:
    cfg, home = fed
    url = cfg.url("lm0")
    assert url.startswith("https://")
    assert signed_get(cfg, home, "lm0", "/v1/state")["lm"] == "lm0"
    with pytest.raises(urllib.error.URLError) as exc:  # the system's roots do not do
        urllib.request.urlopen(url + "/health", timeout=5, context=ssl.create_default_context())
    assert isinstance(exc.value.reason, ssl.SSLCertVerificationError)
    plain = url.replace("https://", "http://") + "/health"
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(plain, timeout=5)  # no clear text served
    trusted = tls.client_context(tls.tls_dir(home) / "ca.pem")
    with urllib.request.urlopen(url + "/health", timeout=5, context=trusted) as ok:
        assert ok.status == 200


def test_work_runs_over_tls(fed: Federation) -> None:
    cfg, home = fed
    jobs = [
        Job(JobId(f"s{RUN}.{u}"), UserId(u), 0.0,
            [TaskSpec(task_id=TaskId(f"s{RUN}.{u}.t{i}"), job_id=JobId(f"s{RUN}.{u}"),
                      user=UserId(u), demand=(1,), duration=0.05) for i in range(4)])
        for u in ("u0", "u1")
    ]  # fmt: skip

    async def nothing() -> None:
        return None

    sub = asyncio.run(submit_with_fault(cfg, home, jobs, at=0, fault=nothing, timeout_s=60))
    assert len(sub.outcomes.finished) == 8
    assert sub.outcomes.forged == 0
