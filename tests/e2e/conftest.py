"""Live federations for end-to-end tests: real gunicorn processes, the real RabbitMQ.

Each federation gets a unique name (its queues and exchanges are prefixed by it and
deleted afterwards) and free ports.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from common.auth import internal_headers
from common.config import FederationConfig
from megha_cli.federation import broker_reachable, start_federation, stop_federation
from runtime.broker import delete_topology


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

    def make(**overrides: object) -> Federation:
        base = FederationConfig()
        if not broker_reachable(base.broker_url):
            pytest.fail("RabbitMQ is not reachable on 127.0.0.1:5672 (rabbitmq-server -detached)")
        cfg = replace(
            base,
            name=f"e2e-{uuid.uuid4().hex[:8]}",
            base_port=_free_base(),
            secret=uuid.uuid4().hex,
            **overrides,  # type: ignore[arg-type]
        ).validate()
        home = tmp_path_factory.mktemp(cfg.name)
        start_federation(cfg, home, quiet=True)
        started.append((cfg, home))
        return cfg, home

    yield make
    for cfg, home in started:
        stop_federation(home, quiet=True)
        asyncio.run(delete_topology(cfg))


def service_state(url: str, cfg: FederationConfig) -> Any:
    """A service's ``/v1/state`` page."""
    req = urllib.request.Request(url + "/v1/state", headers=internal_headers(cfg.secret))
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def pid_of(home: Path, name: str) -> int:
    """The pid ``megha up`` recorded for process ``name``."""
    procs = json.loads((home / "pids.json").read_text())["processes"]
    pid: int = next(p["pid"] for p in procs if p["name"] == name)
    return pid


def launches(cfg: FederationConfig) -> list[dict[str, Any]]:
    """Every worker pool's log of starts, ends and stops."""
    rows: list[dict[str, Any]] = []
    for lm in cfg.lm_ids:
        req = urllib.request.Request(
            cfg.worker_url(lm) + "/v1/launches", headers=internal_headers(cfg.secret)
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            rows.extend(json.loads(resp.read())["launches"])
    return rows
