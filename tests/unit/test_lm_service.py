"""The LM service's own wake-ups (issue 35 item 1: CPU per task and idle): a pool's
report is answered as soon as the events it made are on the broker, without a linger.  No broker, no pool: the
service is built and activated with its publishes caught, and messages are fed to it as
its HTTP lane feeds them (``driver.feed``, then ``durable``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import broker_names as names
from common.config import FederationConfig, parse_config
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    LaunchRequest,
    Placement,
    RegisterWorkers,
    ReportKind,
    WorkerReport,
    WorkerReports,
)
from common.model import TaskSpec
from local_master.app import LmService
from security.access import Access
from security.identity import lm as lm_identity
from security.secret import Secret

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
LM = LmId("lm0")


def _cfg(**kw: Any) -> FederationConfig:
    """One LM of one-slot nodes (6 unless ``nodes_per_lm``), a third in each GM's
    partition (``u<i>`` is ``gm<i>``'s)."""
    return replace(parse_config({}), **{"lms": 1, "nodes_per_lm": 6, **kw}).validate()


def _service(cfg: FederationConfig, users_file: Path | None = None) -> tuple[LmService, list[str]]:
    """An LM service whose publishes are caught: the routing key of each, in order."""
    svc = LmService(cfg, LM, Access(lm_identity(LM), cfg, SECRET, users_file=users_file))
    published: list[str] = []

    async def publish(exchange: str, routing_key: str, msg: object, **_: Any) -> None:
        published.append(routing_key)

    async def next_epoch() -> int:
        return 7

    svc.broker.publish = publish  # type: ignore[method-assign]
    svc._next_epoch = next_epoch  # type: ignore[method-assign]
    svc.pool = _Pool()  # type: ignore[assignment]
    return svc, published


class _Pool:
    """A worker pool that takes every start and stop, and says nothing back."""

    async def post(self, path: str, msg: object, **_: Any) -> None:
        return None


async def _take(svc: LmService, msg: object) -> object | None:
    """``msg`` as the HTTP lane takes it: fed, then answered once it is durable."""
    answer = svc.driver.feed(msg)
    await svc.durable(msg)
    return answer


def _spec(i: int, user: str) -> TaskSpec:
    return TaskSpec(
        task_id=TaskId(f"t{i}"), job_id=JobId("j"), user=UserId(user), demand=(1,), duration=1.0
    )


async def _registered(svc: LmService) -> None:
    await svc._activate()
    nodes = tuple(NodeIndex(n) for n in range(svc.core.n_nodes))
    await _take(svc, RegisterWorkers(lm=LM, nodes=nodes, at=svc.driver.clock()))


async def _ran_and_ended(svc: LmService, round_: int, per_gm: int = 4) -> WorkerReports:
    """``per_gm`` tasks of each GM launched on its partition's nodes, and started; the
    report of all their ends, not yet taken."""
    home = svc.cfg.clusters[0].home
    ran = []
    for g in range(3):
        gm = GmId(f"gm{g}")
        nodes = [n for n, h in enumerate(home) if h == gm][:per_gm]
        placements = []
        for k, node in enumerate(nodes):
            spec = _spec(1000 * round_ + 10 * g + k, f"u{g}")
            ran.append((spec, g, node))
            placements.append(Placement(spec=spec, attempt=1, node=NodeIndex(node)))
        req = LaunchRequest(gm=gm, lm=LM, request_id=round_, placements=tuple(placements),
                            known_version=-1)  # fmt: skip
        await _take(svc, req)
    now = svc.driver.clock()

    def rep(kind: ReportKind, spec: TaskSpec, g: int, node: int) -> WorkerReport:
        return WorkerReport(kind=kind, node=NodeIndex(node), user=spec.user,
                            task_id=spec.task_id, attempt=1, gm=GmId(f"gm{g}"), at=now,
                            worker_at=now, started_at=now)  # fmt: skip

    await _take(svc, WorkerReports(lm=LM, reports=tuple(rep(ReportKind.STARTED, *r) for r in ran)))
    return WorkerReports(lm=LM, reports=tuple(rep(ReportKind.FINISHED, *r) for r in ran))


async def _turns_until(done: Callable[[], bool], most: int = 50) -> int:
    """Loop turns (no timer) until ``done()``; ``most + 1`` if it is not by then."""
    for n in range(most + 1):
        if done():
            return n
        await asyncio.sleep(0)
    return most + 1


def test_a_reports_events_leave_at_once_and_it_is_answered_without_a_timer() -> None:
    """However busy the LM's event stream is, a pool's report is answered within a few
    loop turns of its taking, its events to each GM published by then: the pool sends
    nothing more before that answer, so lingering could gather nothing (it cost a timer
    wake-up per GM, and held the ends, and their slots, from the GMs)."""
    svc, published = _service(_cfg(nodes_per_lm=60))  # room: a linger would not be cut
    keys = sorted(names.gm_event_key(GmId(f"gm{g}"), LM) for g in range(3))

    async def run() -> list[int]:
        turns = []
        async with svc.sup:
            await _registered(svc)
            # a busy stream: ends of three GMs, four each every ten milliseconds or so,
            # for about a second (a Batcher with a linger takes these GMs as busy once
            # it has seen them for half a second, and lingers)
            for r in range(80):
                ended = await _ran_and_ended(svc, r)
                before = len(published)
                svc.driver.feed(ended)
                answer = asyncio.ensure_future(svc.durable(ended))
                turns.append(await _turns_until(answer.done))
                await answer
                assert sorted(k for k in published[before:] if k in keys) == keys
                await asyncio.sleep(0.01)
        return turns

    turns = asyncio.run(run())
    assert max(turns) <= 10, turns
