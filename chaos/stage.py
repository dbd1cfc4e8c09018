"""A scenario's stage: its broker (the shared one, a private RabbitMQ node or a 3-node
cluster, ``testbed.rabbit``), its hosts (network namespaces, ``testbed.netns``) and a
fresh federation on them, all removed afterwards."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chaos.scenarios import Scenario
from common.config import FederationConfig
from federation.operator import signed_get
from federation.processes import (
    NETNS_FILE,
    start_federation,
    stop_federation,
)
from federation.provision import purge
from security.access import Access
from testbed.netns import Testbed
from testbed.rabbit import RabbitCluster, RabbitNode, RabbitSandbox


@dataclass
class Stage:
    """A running federation with what its faults act on."""

    cfg: FederationConfig
    home: Path
    access: Access
    node: RabbitNode | None = None
    cluster: RabbitCluster | None = None
    bed: Testbed | None = None

    def get(self, name: str, path: str = "/v1/state") -> Any:
        return signed_get(self.cfg, self.home, name, path)


@contextlib.contextmanager
def stage(sc: Scenario, base: FederationConfig, root: Path, *, insecure: bool) -> Iterator[Stage]:
    """Start the scenario's broker (if private), hosts (if netns) and federation; stop
    and remove all of it afterwards."""
    cfg = replace(base, **sc.federation)
    name = f"{base.name}-{sc.name}-{uuid.uuid4().hex[:4]}"[:64]
    cfg = replace(cfg, name=name)
    home = root / name
    with contextlib.ExitStack() as stack:
        box = stack.enter_context(RabbitSandbox()) if sc.broker != "shared" or sc.netns else None
        bed = stack.enter_context(Testbed(cfg.process_names)) if sc.netns else None
        node = cluster = None
        if box is not None and sc.broker == "cluster":
            cluster = box.cluster(3, listen_ip=bed.gateway if bed else "127.0.0.1")
            cluster.start()
            cfg = replace(cfg, broker_url=",".join(cluster.urls), queue_type="quorum")
        elif box is not None:
            node = box.node("b0", listen_ip=bed.gateway if bed else "127.0.0.1")
            node.start()
            cfg = replace(cfg, broker_url=node.url)
        home.mkdir(mode=0o700, parents=True)
        cfg = replace(cfg, addresses=compact_addresses(cfg, bed))
        if bed is not None:
            spaces = {n: bed.host(n).netns for n in cfg.process_names}
            (home / NETNS_FILE).write_text(json.dumps(spaces))
        cfg = cfg.validate()
        # private nodes have no federation users (rabbitmqctl provisions the shared node
        # only); replays publish as the LMs did, which per-party broker users forbid
        plain = box is not None or any(s.action.startswith("replay_") for s in sc.steps)
        private = box is not None
        start_federation(cfg, home, quiet=True, insecure_dev=insecure or plain)
        try:
            yield Stage(cfg, home, Access.in_home(home, cfg), node, cluster, bed)
        finally:
            stop_federation(home, quiet=True)
            if not private:
                with contextlib.suppress(Exception):
                    purge(cfg, home)


def compact_addresses(cfg: FederationConfig, bed: Testbed | None) -> dict[str, str]:
    """Every process on a port within ``base_port .. base_port+99`` (the usual layout
    spreads over 400 ports), at its own host's address in a test-bed."""
    return {
        n: f"{bed.address(n) if bed else cfg.host}:{cfg.base_port + i}"
        for i, n in enumerate(cfg.process_names)
    }
