"""One message sequence, two drivers, the same decisions.

A small federation runs in the simulator with every call into a GM, LM or worker-pool
core recorded: the message and the time.  The same messages are then encoded, decoded
and fed, through the live services' runtime (``runtime.driver.CoreDriver.feed``, the
one entry every service uses), into fresh cores.  Every effect the live path produces —
which LM, which node, internal or repartition, accepted or refused and why, which
victim, which state delta, which timer, which outcome — must be, byte for byte, the one
the simulator's driver got.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import msgpack
import msgspec
import pytest

from common import codec
from common.cluster import PROFILES, ClusterSpec, make_federation, parse_users
from common.effects import Effect
from common.ids import GmId
from common.model import UserConfig
from global_master.core import GlobalMaster
from local_master.core import LocalMaster
from runtime.driver import CoreDriver
from runtime.supervisor import Supervisor
from simulator.config import SimConfig
from simulator.megha_sim import MeghaSimulation
from worker.core import WorkerPool
from workload.synthetic import WorkloadSpec, synthetic_jobs

GMS = [GmId("gm0"), GmId("gm1"), GmId("gm2")]


def _plain(x: Any) -> Any:
    if isinstance(x, msgspec.Struct):
        return (type(x).__name__, _plain(msgspec.to_builtins(x)))
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


def decisions(effects: list[Effect]) -> bytes:
    """Everything the effects say, as bytes (snapshotted now: the simulator shares objects)."""
    out = [(type(e).__name__, _plain({f.name: getattr(e, f.name) for f in dataclasses.fields(e)}))
           for e in effects]  # fmt: skip
    packed: bytes = msgpack.packb(out, use_bin_type=True)
    return packed


Record = tuple[str, bytes, float, bytes]


class Tap:
    """Stands in for a core inside the simulator and records every ``handle`` call."""

    def __init__(self, core: Any, name: str, log: list[Record]) -> None:
        self._core, self._name, self._log = core, name, log

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._core, attr)

    def handle(self, msg: object, now: float) -> list[Effect]:
        wire = codec.encode(msg)  # what a live service would have received
        effects: list[Effect] = self._core.handle(msg, now)
        self._log.append((self._name, wire, now, decisions(effects)))
        return effects


class Recorder:
    """A fixed clock and a record of what a live driver carries out."""

    def __init__(self) -> None:
        self.now = 0.0
        self.effects: list[Effect] = []


def live_driver(core: Any, sup: Supervisor, rec: Recorder) -> CoreDriver:
    driver = CoreDriver(core, sup, clock=lambda: rec.now)
    driver.carry_out = lambda effects: rec.effects.extend(effects)  # type: ignore[method-assign]
    return driver


def fresh_cores(clusters: list[ClusterSpec], users: list[UserConfig]) -> dict[str, Any]:
    cores: dict[str, Any] = {
        g: GlobalMaster(g, [c.lm for c in clusters], users, max_retries=3, patience=8) for g in GMS
    }
    for c in clusters:
        cores[c.lm] = LocalMaster(c.lm, c.nodes, c.home, gms=GMS, report_starts=False)
        cores[f"{c.lm}-workers"] = WorkerPool(c.lm, len(c.nodes), commands=False)
    return cores


async def _replay(log: list[Record], cores: dict[str, Any]) -> int:
    checked = 0
    async with Supervisor("replay") as sup:
        rec = Recorder()
        drivers = {name: live_driver(core, sup, rec) for name, core in cores.items()}
        for name, wire, now, expected in log:
            rec.now, rec.effects = now, []
            drivers[name].feed(codec.decode(wire))  # the live input path: bytes -> feed
            assert decisions(rec.effects) == expected, f"{name} decided differently at {now}"
            checked += 1
    return checked


@pytest.mark.parametrize(("profile", "workers"), [("paper", 6), ("slots", 24)])
def test_simulator_and_live_driver_decide_the_same(profile: str, workers: int) -> None:
    users = parse_users("q1:0.1@gm0,q2:0.25@gm1,q3:0.15@gm1,q4:0.5@gm2", GMS)
    clusters = make_federation(workers, GMS, 3, PROFILES[profile], True, random.Random(3))
    jobs = synthetic_jobs(
        60,
        rate=20.0,
        tasks_per_job=6,
        mean_duration=2.0,
        spec=WorkloadSpec(profile=profile),
        users=users,
        rng=random.Random(4),
    )
    sim = MeghaSimulation(clusters, GMS, users, SimConfig(update_period_s=0.5, batch=3))
    cores = fresh_cores(clusters, users)
    # the initial snapshots, as the simulator gave them, start the replay too
    for lm in (c.lm for c in clusters):
        for g in GMS:
            cores[g].handle(codec.decode(codec.encode(cores[lm].snapshot(g))), 0.0)
    log: list[Record] = []
    sim.gms = {g: Tap(core, g, log) for g, core in sim.gms.items()}  # type: ignore[misc]
    sim.lms = {lm: Tap(core, lm, log) for lm, core in sim.lms.items()}  # type: ignore[misc]
    sim.pools = {lm: Tap(p, f"{lm}-workers", log) for lm, p in sim.pools.items()}  # type: ignore[misc]
    sim.add_jobs(jobs)
    result = sim.run()
    kinds = {codec.decode(w).__class__.__name__ for _, w, _, _ in log}
    assert {"AdmitJob", "Decide", "LaunchRequest", "LaunchResponse", "TaskEvents", "Heartbeat",
            "StartTasks", "TaskDue", "WorkerReports"} <= kinds  # fmt: skip
    assert result.counters["repartitions"] > 0
    if profile == "slots":  # contended: the fairness path is exercised too
        assert {"PreemptRequest", "PreemptResponse", "StopTasks"} <= kinds
    assert asyncio.run(_replay(log, cores)) == len(log)
