"""A federation on a three-node RabbitMQ cluster with quorum queues: the node every
process is connected to is stopped mid-run.  Each process fails over to another node
(its queues and consumers made again there); nothing is lost, nothing runs twice.

The cluster is private (``testbed.rabbit``: its own nodes, ports and epmd), never the
shared broker on 5672."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common.config import FederationConfig
from testbed.rabbit import RabbitCluster, RabbitSandbox
from tests.e2e.conftest import (
    assert_all_done,
    assert_each_ran_once,
    service_state,
    submit_with_fault,
)
from workload.synthetic import WorkloadSpec, synthetic_jobs

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
    cfg, home = make_federation(insecure_dev=True, purge_after=False,
        gms=2, lms=2, nodes_per_lm=6, heartbeat_s=0.5,
        broker_url=",".join(cluster.urls), queue_type="quorum",
    )  # fmt: skip
    jobs = synthetic_jobs(
        40, rate=20.0, tasks_per_job=3, mean_duration=1.0,
        spec=WorkloadSpec(profile=cfg.profile, constraints=False), users=cfg.user_configs,
        rng=random.Random(13),
    )  # fmt: skip
    ids = [(t.user, t.task_id) for j in jobs for t in j.tasks]

    async def stop_first_node() -> None:  # every process is connected to it
        await asyncio.get_running_loop().run_in_executor(None, cluster.nodes[0].stop)

    sub = asyncio.run(
        submit_with_fault(cfg, home, jobs, at=20, fault=stop_first_node, timeout_s=90.0)
    )
    assert_all_done(sub, ids)
    assert_each_ran_once(cfg, home, ids)
    for lm in cfg.lm_ids:  # every LM went on, on another node
        st = service_state(cfg, home, lm)
        assert st["broker"]["reconnects"] >= 1
        assert st["broker"]["url"] != cluster.urls[0].replace("guest:guest", "guest")
