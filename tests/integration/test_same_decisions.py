"""One message sequence, two drivers, the same decisions.

A small federation runs in the simulator, with every call into a GM or LM core
recorded (its input encoded on the wire at that moment).  The same inputs are then
replayed, as bytes, through the live services' decoding handlers
(``global_master.app.handle_body``, ``local_master.app.handle_body``) into fresh
cores.  Every decision the live path makes — which LM, which node, internal or
repartition, accepted or refused and why, which victim, which state delta — must be
the one the simulator's driver got.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from common import codec
from common.cluster import PROFILES, make_federation, parse_users
from common.codec import TaskReport
from common.effects import Effect, Report, ToAllGms, ToGm, ToLm, ToWorker
from common.ids import GmId
from common.messages import (
    LaunchRequest,
    LaunchResponse,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StartTask,
    StateDelta,
    StateSnapshot,
    StopTask,
    TaskEvent,
)
from common.model import Task
from global_master import app as gm_app
from global_master.core import GlobalMaster
from local_master import app as lm_app
from local_master.core import LocalMaster
from request_generator.workload import WorkloadSpec, synthetic_jobs
from simulator.megha_sim import MeghaSimulation, SimConfig

GMS = [GmId("gm0"), GmId("gm1"), GmId("gm2")]


def _delta(d: StateDelta) -> tuple[Any, ...]:
    return (
        d.lm,
        d.version,
        d.base_version,
        d.nodes,
        d.free,
        d.node_versions,
        sorted(d.usage.items()),
    )


def decisions(effects: list[Effect]) -> list[tuple[Any, ...]]:
    """What was decided, without timestamps or ledgers."""
    out: list[tuple[Any, ...]] = []
    for e in effects:
        if isinstance(e, ToLm):
            m = e.msg
            if isinstance(m, LaunchRequest):
                out.append(
                    ("launch", e.lm, m.request_id, m.known_version,
                     tuple((p.task.task_id, p.node, p.repartition) for p in m.placements))
                )  # fmt: skip
            elif isinstance(m, PreemptRequest):
                out.append(("preempt", e.lm, m.request_id, m.task.task_id, m.victim))
            elif isinstance(m, SnapshotRequest):
                out.append(("snapshot_request", e.lm))
        elif isinstance(e, ToGm):
            g = e.msg
            if isinstance(g, LaunchResponse):
                out.append(("launched", e.gm, g.request_id, g.results, _delta(g.delta)))
            elif isinstance(g, PreemptResponse):
                out.append(
                    ("preempted", e.gm, g.task_id, g.accepted, g.reason, g.node, g.preempted,
                     _delta(g.delta))
                )  # fmt: skip
            elif isinstance(g, TaskEvent):
                out.append(("event", e.gm, g.kind, g.task.task_id, g.node, g.node_free))
            elif isinstance(g, StateSnapshot):
                out.append(("snapshot", e.gm, _delta(g.state)))
        elif isinstance(e, ToAllGms):
            out.append(("update", _delta(e.msg.delta)))
        elif isinstance(e, ToWorker):
            w = e.msg
            if isinstance(w, StartTask):
                out.append(("start", e.node, w.task.task_id))
            elif isinstance(w, StopTask):
                out.append(("stop", e.node, w.task_id))
        elif isinstance(e, Report):
            out.append(("failed", e.msg.task.task_id, e.msg.reason))
    return out


class Tap:
    """Stands in for a core inside the simulator and records every call into it."""

    RECORDED = frozenset(
        {
            "submit", "decide", "on_state_update", "on_task_event", "on_launch_response",
            "on_preempt_response", "on_snapshot", "on_launch", "on_preempt",
            "on_snapshot_request", "on_worker_report", "heartbeat",
        }
    )  # fmt: skip

    def __init__(self, core: Any, name: str, log: list[tuple[Any, ...]]) -> None:
        self._core, self._name, self._log = core, name, log

    def __getattr__(self, attr: str) -> Any:
        target = getattr(self._core, attr)
        if attr not in self.RECORDED:
            return target

        def call(*args: Any, **kwargs: Any) -> list[Effect]:
            wire = [codec.encode(a) if not isinstance(a, (float, int, list)) else a for a in args]
            if attr == "submit":
                wire[0] = [codec.encode(t) for t in args[0]]
            if attr == "on_worker_report":
                task = (
                    self._core.active[args[0].task_id].task
                    if args[0].task_id in self._core.active
                    else None
                )
                wire.append(None if task is None else codec.encode(task))
            effects: list[Effect] = target(*args, **kwargs)
            self._log.append((self._name, attr, wire, kwargs, decisions(effects)))
            return effects

        return call


def _replay(
    log: list[tuple[Any, ...]], gms: dict[str, GlobalMaster], lms: dict[str, LocalMaster]
) -> None:
    gm_kinds = {
        "on_state_update": "state_updated",
        "on_launch_response": "launch_response",
        "on_preempt_response": "preempt_response",
        "on_snapshot": "snapshot",
    }
    for name, attr, wire, kwargs, expected in log:
        got: list[Effect]
        if name in gms:
            core = gms[name]
            if attr == "submit":
                tasks = [codec.decode(b, expect=Task) for b in wire[0]]
                got = core.submit(tasks, wire[1])  # type: ignore[arg-type]
            elif attr == "decide":
                got = core.decide(*wire)
            elif attr == "on_task_event":
                got = gm_app.handle_body(
                    core, "task_events", codec.encode_batch([codec.decode(wire[0])]), wire[1]
                )
            else:
                got = gm_app.handle_body(core, gm_kinds[attr], wire[0], wire[1])
        else:
            lm = lms[name]
            handle: Callable[..., list[Effect]] = lm_app.handle_body
            if attr == "heartbeat":
                got = lm.heartbeat(*wire)
            elif attr == "on_launch":
                got = handle(lm, "launch", wire[0], wire[1], **kwargs)
            elif attr == "on_preempt":
                got = handle(lm, "preempt", wire[0], wire[1], **kwargs)
            elif attr == "on_snapshot_request":
                got = handle(lm, "snapshot", wire[0], wire[1])
            elif attr == "on_worker_report":
                rep = codec.decode(wire[0])
                task = codec.decode(wire[2]) if wire[2] is not None else None
                body = codec.encode_batch([TaskReport(report=rep, task=task)])  # type: ignore[arg-type]
                got = handle(lm, "worker-report", body, wire[1])
            else:
                raise AssertionError(attr)
        assert decisions(got) == expected, f"{name}.{attr} decided differently"


@pytest.mark.parametrize(("profile", "workers"), [("paper", 6), ("slots", 24)])
def test_simulator_and_live_handlers_decide_the_same(profile: str, workers: int) -> None:
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
    log: list[tuple[Any, ...]] = []
    # the initial snapshots, as the simulator gave them, start the replay too
    fresh_gms = {
        g: GlobalMaster(g, [c.lm for c in clusters], users, max_retries=3, patience=8) for g in GMS
    }
    fresh_lms = {c.lm: LocalMaster(c.lm, c.nodes, c.home) for c in clusters}
    for lm in fresh_lms.values():
        for g in GMS:
            gm_app.handle_body(fresh_gms[g], "snapshot", codec.encode(lm.snapshot(g)), 0.0)
    sim.gms = {g: Tap(core, g, log) for g, core in sim.gms.items()}  # type: ignore[misc]
    sim.lms = {lm: Tap(core, lm, log) for lm, core in sim.lms.items()}  # type: ignore[misc]
    sim.add_jobs(jobs)
    result = sim.run()
    kinds = {attr for _, attr, *_ in log}
    assert {"decide", "on_launch", "on_launch_response", "on_task_event", "heartbeat"} <= kinds
    assert result.counters["repartitions"] > 0
    if profile == "slots":  # contended: the fairness path is exercised too
        assert {"on_preempt", "on_preempt_response"} <= kinds
    _replay(log, fresh_gms, fresh_lms)  # type: ignore[arg-type]
