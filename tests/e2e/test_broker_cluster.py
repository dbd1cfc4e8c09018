"""A federation on a three-node RabbitMQ cluster with quorum queues: the node every
process is connected to is stopped mid-run.  Each process fails over to another node
(its queues and consumers made again there); nothing is lost, nothing runs twice.

The cluster is private (``testbed.rabbit``: its own nodes, ports and epmd), never the
shared broker on 5672."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from common.metrics import duplicate_launches
from request_generator.submitter import Submitter
from request_generator.workload import WorkloadSpec, synthetic_jobs
from testbed.rabbit import RabbitCluster, RabbitSandbox
from tests.e2e.conftest import launches, service_state

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]

Federation = tuple[FederationConfig, Path]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RabbitCluster]:
    with RabbitSandbox() as box:
        members = box.cluster(3)
        members.start()
        yield members


def test_the_federation_survives_the_loss_of_a_broker_node(
    cluster: RabbitCluster, make_federation: Callable[..., Federation]
) -> None:
    cfg, home = make_federation(insecure_dev=True,
        gms=2, lms=2, nodes_per_lm=6, heartbeat_s=0.5,
        broker_url=",".join(cluster.urls), queue_type="quorum",
    )  # fmt: skip
    jobs = synthetic_jobs(
        40, rate=20.0, tasks_per_job=3, mean_duration=1.0,
        spec=WorkloadSpec(profile=cfg.profile, constraints=False), users=cfg.user_configs,
        rng=random.Random(13),
    )  # fmt: skip
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]
    done, failed = asyncio.run(_drive(cfg, home, cluster, jobs, ids))
    assert not failed, dict(list(failed.items())[:5])
    assert sorted(done) == sorted(ids), f"lost: {sorted(set(ids) - set(done))[:10]}"
    log = launches(cfg, home)
    assert duplicate_launches(log) == {"count": 0, "tasks": []}
    assert {(r["user"], r["task_id"]) for r in log if r["what"] == "end"} == set(ids)
    for lm in cfg.lm_ids:  # every LM went on, on another node
        st = service_state(cfg, home, lm)
        assert st["broker"]["reconnects"] >= 1
        assert st["broker"]["url"] != cluster.urls[0].replace("guest:guest", "guest")


async def _drive(
    cfg: FederationConfig, home: Path, cluster: RabbitCluster, jobs: list[Any], ids: list[Any]
) -> tuple[list[Any], dict[Any, str]]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    t0 = time.time()
    loop = asyncio.get_running_loop()
    try:
        for i, job in enumerate(jobs):
            await asyncio.sleep(max(0.0, t0 + job.arrival - time.time()))
            await sub.submit(job)
            if i == 20:  # every process is connected to the first node: stop it
                await loop.run_in_executor(None, cluster.nodes[0].stop)
        out = sub.outcomes
        deadline = time.time() + 90
        while time.time() < deadline and not all(out.done(i) for i in ids):
            out.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.changed.wait(), timeout=0.5)
        return [i for i in ids if out.done(i)], dict(out.failed)
    finally:
        await sub.close()
