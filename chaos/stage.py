"""A scenario's stage: its broker (the shared one, a private RabbitMQ node or a 3-node
cluster, ``testbed.rabbit``), its hosts (network namespaces, ``testbed.netns``) and a
fresh federation on them, all removed afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
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
from runtime.faults import FAULTS_DIR_ENV
from security.access import Access
from testbed.netns import Testbed
from testbed.rabbit import RABBIT_BIN, RabbitCluster, RabbitNode, RabbitSandbox


@dataclass
class Stage:
    """A running federation with what its faults act on."""

    cfg: FederationConfig
    home: Path
    access: Access
    node: RabbitNode | None = None
    cluster: RabbitCluster | None = None
    bed: Testbed | None = None
    insecure: bool = False
    ctl_env: dict[str, str] = field(default_factory=dict)
    """What ``megha up`` needs to start this federation again (``start_all``): the
    development mode and, for a private node, the environment that points
    ``rabbitmqctl`` at it."""

    def start_again(self) -> None:
        """Start every process of the federation again, with the state its journals and
        the broker kept (after ``kill_all`` or ``stop_all``)."""
        with _environment(self.ctl_env):
            start_federation(self.cfg, self.home, quiet=True, insecure_dev=self.insecure)

    def get(self, name: str, path: str = "/v1/state") -> Any:
        return signed_get(self.cfg, self.home, name, path)

    @property
    def faults(self) -> Path:
        """Where the federation's services look for injected faults (``runtime.faults``)."""
        return self.home / "faults"


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set (what ``megha up`` and ``rabbitmqctl`` see)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _private_ctl(node: RabbitNode) -> dict[str, str]:
    """The environment in which ``rabbitmqctl`` (the one ``megha up`` runs to provision
    the federation's broker users) speaks to the private ``node``: its name and cookie,
    and the CLI that does not switch to the shared node's user."""
    return {**node.env(), "PATH": f"{RABBIT_BIN}:{os.environ.get('PATH', '')}"}


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
        if bed is not None and "tls" not in sc.federation:
            # the bed's broker node has no TLS listener, and these scenarios run without
            # broker users already (``insecure_dev`` below): internal HTTP in clear too
            cfg = replace(cfg, tls="off")
        if bed is not None:
            spaces = {n: bed.host(n).netns for n in cfg.process_names}
            (home / NETNS_FILE).write_text(json.dumps(spaces))
        cfg = cfg.validate()
        private = box is not None
        stack.enter_context(_environment({FAULTS_DIR_ENV: str(home / "faults")}))
        # a private node's users are provisioned by rabbitmqctl pointed at that node; in a
        # test-bed the node listens on the bed's bridge, which `megha up` does not
        # provision (it runs rabbitmqctl only for a broker on this host's loopback)
        first = cluster.nodes[0] if cluster else node
        ctl = _private_ctl(first) if first is not None else {}
        with _environment(ctl):
            start_federation(cfg, home, quiet=True, insecure_dev=insecure or sc.netns)
        try:
            yield Stage(
                cfg, home, Access.in_home(home, cfg), node, cluster, bed,
                insecure=insecure or sc.netns, ctl_env=ctl,
            )  # fmt: skip
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
