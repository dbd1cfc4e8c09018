"""Live federations for end-to-end tests: real gunicorn processes, the real RabbitMQ.

Each federation gets a unique name (its queues and exchanges are prefixed by it and
deleted afterwards) and free ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig
from common.metrics import duplicate_launches
from federation.operator import signed_get
from federation.processes import broker_reachable, restart, start_federation, stop_federation
from federation.provision import purge
from request_generator.submitter import Submitter
from security.access import Access
from tests.conftest import free_base
from workload.jobs import specs_of

Federation = tuple[FederationConfig, Path]


@pytest.fixture(scope="module")
def make_federation(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., Federation]]:
    """Start federations on demand; stop them and delete their topology at module end."""
    started: list[tuple[FederationConfig, Path, bool]] = []

    def make(
        *, insecure_dev: bool = False, purge_after: bool = True, **overrides: object
    ) -> Federation:
        """``purge_after=False``: a federation on a private broker that goes with its
        sandbox (deleting its quorum queues with a member down waits long for nothing)."""
        base = FederationConfig()
        if not broker_reachable(base.broker_url):
            pytest.fail("RabbitMQ is not reachable on 127.0.0.1:5672 (rabbitmq-server -detached)")
        cfg = replace(
            base,
            name=f"e2e-{uuid.uuid4().hex[:8]}",
            base_port=free_base(),
            **overrides,  # type: ignore[arg-type]
        ).validate()
        home = tmp_path_factory.mktemp(cfg.name)
        start_federation(cfg, home, quiet=True, insecure_dev=insecure_dev)
        started.append((cfg, home, purge_after))
        return cfg, home

    yield make
    for cfg, home, purge_after in started:
        stop_federation(home, quiet=True)
        if purge_after:
            with contextlib.suppress(Exception):  # a private broker may be gone already
                purge(cfg, home)


def private_topology(prefix: str) -> FederationConfig:
    """A federation config of its own name (``prefix``-random) on the shared broker: a
    test declares its topology there and deletes it afterwards."""
    base = FederationConfig()
    if not broker_reachable(base.broker_url):
        pytest.fail("RabbitMQ is not reachable on 127.0.0.1:5672 (rabbitmq-server -detached)")
    return replace(base, name=f"{prefix}-{uuid.uuid4().hex[:8]}").validate()


def operator(cfg: FederationConfig, home: Path) -> Access:
    """The operator's keys and broker login for the federation in ``home``."""
    return Access.in_home(home, cfg)


def service_state(cfg: FederationConfig, home: Path, name: str) -> Any:
    """A service's ``/v1/state`` page."""
    return signed_get(cfg, home, name, "/v1/state")


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """``POST body`` to ``url``: the status and, for a refusal, its reason."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as err:
        with err:
            return err.code, str(json.loads(err.read()).get("error"))


def incarnation(url: str) -> str:
    """The incarnation a service's ``/health`` names: what a service's call to it is
    bound to (``runtime.http``; 503 while it starts, with the same body)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as resp:
            return str(json.loads(resp.read())["incarnation"])
    except urllib.error.HTTPError as err:
        with err:
            return str(json.loads(err.read())["incarnation"])


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


Fault = Callable[[], Awaitable[None]]


async def listen_dead_letters(
    sub: Submitter, cfg: FederationConfig, handler: Callable[[Any], Awaitable[None]]
) -> None:
    """Hand every dead letter of the federation to ``handler`` (a private queue on the
    operator's connection ``sub``, bound to the dead-letter exchange)."""
    assert sub.broker.conn is not None
    ch = await sub.broker.conn.channel()
    q = await ch.declare_queue(exclusive=True, auto_delete=True)
    await q.bind(cfg.dead_letter_exchange, routing_key="")
    await q.consume(handler, no_ack=True)


async def submit_with_fault(
    cfg: FederationConfig,
    home: Path,
    jobs: Sequence[Any],
    *,
    at: int,
    fault: Fault,
    after: Fault | None = None,
    timeout_s: float = 60.0,
) -> Submitter:
    """Submit ``jobs`` at their arrival times as the operator, inject ``fault`` right
    after job ``at`` (then ``after``, once every job is in), and wait until every task
    has an outcome or ``timeout_s`` passes.  Returns the (closed) submitter: its
    ``outcomes`` say what became of each task."""
    ids = [(t.user, t.task_id) for j in jobs for t in specs_of(j)]
    sub = Submitter.operator(cfg, home)
    await sub.open()
    t0 = time.time()
    try:
        for i, job in enumerate(jobs):
            await asyncio.sleep(max(0.0, t0 + job.arrival - time.time()))
            await sub.submit(job)
            if i == at:
                await fault()
        if after is not None:
            await after()
        out = sub.outcomes
        deadline = time.time() + timeout_s
        while time.time() < deadline and not all(out.done(i) for i in ids):
            out.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(out.changed.wait(), timeout=0.5)
        return sub
    finally:
        await sub.close()


def kill(home: Path, name: str) -> Fault:
    """SIGKILL process ``name`` of the federation (its process group)."""

    async def do() -> None:
        os.killpg(pid_of(home, name), signal.SIGKILL)

    return do


def restarted(cfg: FederationConfig, home: Path, name: str, *, wait_s: float = 0.0) -> Fault:
    """Start process ``name`` again (after ``wait_s``), as ``megha restart`` does."""

    async def do() -> None:
        await asyncio.sleep(wait_s)
        await asyncio.get_running_loop().run_in_executor(None, restart, home, cfg, name)

    return do


def assert_all_done(sub: Submitter, ids: Sequence[Any]) -> None:
    """Every task finished: none failed, none lost."""
    out = sub.outcomes
    assert not out.failed, dict(list(out.failed.items())[:5])
    lost = sorted(set(ids) - {i for i in ids if out.done(i)})
    assert not lost, f"lost: {lost[:10]}"


def assert_each_ran_once(cfg: FederationConfig, home: Path, ids: Sequence[Any]) -> None:
    """The pools' logs: no task ran twice (two attempts at once, one started twice, or
    run to its end twice), and every task ran to its end."""
    log = launches(cfg, home)
    assert duplicate_launches(log) == {"count": 0, "tasks": []}
    assert {(r["user"], r["task_id"]) for r in log if r["what"] == "end"} == set(ids)
