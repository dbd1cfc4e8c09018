"""Live federations for end-to-end tests: real gunicorn processes, the real RabbitMQ.

Each federation gets a unique name (its queues and exchanges are prefixed by it and
deleted afterwards) and free ports.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from megha_cli.federation import (
    broker_reachable,
    signed_get,
    start_federation,
    stop_federation,
)
from megha_cli.secure import purge
from security.access import Access


def _free_base(host: str = "127.0.0.1") -> int:
    for _ in range(200):
        base = random.randrange(20000, 40000, 10)
        ports = [base + k for k in (*range(10), *range(100, 110), *range(200, 210))]
        ok = True
        for p in ports:
            with socket.socket() as s:
                if s.connect_ex((host, p)) == 0:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


Federation = tuple[FederationConfig, Path]


@pytest.fixture(scope="module")
def make_federation(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Federation]]:
    """Start federations on demand; stop them and delete their topology at module end."""
    started: list[Federation] = []

    def make(*, insecure_dev: bool = False, **overrides: object) -> Federation:
        base = FederationConfig()
        if not broker_reachable(base.broker_url):
            pytest.fail("RabbitMQ is not reachable on 127.0.0.1:5672 (rabbitmq-server -detached)")
        cfg = replace(
            base,
            name=f"e2e-{uuid.uuid4().hex[:8]}",
            base_port=_free_base(),
            **overrides,  # type: ignore[arg-type]
        ).validate()
        home = tmp_path_factory.mktemp(cfg.name)
        start_federation(cfg, home, quiet=True, insecure_dev=insecure_dev)
        started.append((cfg, home))
        return cfg, home

    yield make
    for cfg, home in started:
        stop_federation(home, quiet=True)
        with contextlib.suppress(Exception):  # a private broker may be gone already
            purge(cfg, home)


def operator(cfg: FederationConfig, home: Path) -> Access:
    """The operator's keys and broker login for the federation in ``home``."""
    return Access.in_home(home, cfg)


def service_state(cfg: FederationConfig, home: Path, name: str) -> Any:
    """A service's ``/v1/state`` page."""
    return signed_get(cfg, home, name, "/v1/state")


def pid_of(home: Path, name: str) -> int:
    """The pid ``megha up`` recorded for process ``name``."""
    procs = json.loads((home / "pids.json").read_text())["processes"]
    pid: int = next(p["pid"] for p in procs if p["name"] == name)
    return pid


def launches(cfg: FederationConfig, home: Path) -> list[dict[str, Any]]:
    """Every worker pool's log of starts, ends and stops."""
    rows: list[dict[str, Any]] = []
    for lm in cfg.lm_ids:
        rows.extend(signed_get(cfg, home, f"{lm}-workers", "/v1/launches")["launches"])
    return rows
