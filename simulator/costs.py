"""What the real cores cost per operation: the simulator's server model, measured.

``measure`` builds one LM with a ``partition``-node partition per GM and a GM viewing
it, then times, on this machine, each operation the simulator charges for:

* ``gm_decision_s``   -- one ``Decide`` that places one task (pop, match, reserve,
  build the request);
* ``lm_validation_s`` -- one placement validated and committed by the LM;
* ``gm_message_s`` / ``lm_message_s`` -- the fixed part of handling any message
  (a task event at the GM, a worker report at the LM);
* ``update_node_s``   -- applying a state update, per node it carries.

With ``wire=True`` each operation also pays what the live services pay around the
core: decoding the message and encoding the answer with ``common.codec``.  The
figures are medians over ``repeats`` rounds of ``batch`` operations.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from msgspec.structs import replace

from common import codec
from common.cluster import PROFILES, make_federation
from common.effects import Effect, Reply, ToAllGms, ToGm, ToLm
from common.ids import GmId, JobId, LmId, TaskId, UserId
from common.messages import (
    AdmitJob,
    Decide,
    LaunchRequest,
    LaunchResponse,
    PreemptRequest,
    PreemptResponse,
    ReportKind,
    StateSnapshot,
    StateUpdated,
    SubmitJob,
    TaskEvents,
    WorkerReport,
    WorkerReports,
)
from common.model import TaskSpec, UserConfig
from global_master.core import GlobalMaster
from local_master.core import LocalMaster
from simulator.config import SimConfig
from workload.synthetic import task_constraints


@dataclass(frozen=True, slots=True)
class CoreCosts:
    """Seconds of CPU per operation, as ``SimConfig`` charges them."""

    gm_decision_s: float
    lm_validation_s: float
    gm_message_s: float
    lm_message_s: float
    update_node_s: float
    partition_nodes: int
    wire: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Core:
    """A core behind a stopwatch: ``call`` charges what its service would pay."""

    def __init__(self, core: GlobalMaster | LocalMaster, wire: bool) -> None:
        self.core = core
        self.wire = wire

    def call(self, msg: object, now: float, samples: list[float], per: int = 1) -> list[Effect]:
        """Handle ``msg``; add its cost (divided by ``per``) to ``samples``.  On the
        wire: the message arrives as bytes and every answer leaves as bytes."""
        body = codec.encode(msg) if self.wire else b""
        t0 = time.perf_counter()
        if self.wire:
            msg = codec.decode(body)
        effects = self.core.handle(msg, now)
        if self.wire:
            events = [e.msg for e in effects if isinstance(e, ToGm)]
            for e in effects:
                if isinstance(e, Reply | ToLm):
                    codec.encode(e.msg)
            if events and isinstance(self.core, LocalMaster):  # one batch per call
                codec.encode(TaskEvents(lm=self.core.lm_id, events=tuple(events)))
        samples.append((time.perf_counter() - t0) / per)
        return effects


def measure(
    partition: int = 1000, repeats: int = 3, batch: int = 500, *, wire: bool = False
) -> CoreCosts:
    """Median per-operation costs of the real cores on ``partition``-node partitions."""
    rng = random.Random(1)
    gms = [GmId("gm0"), GmId("gm1")]
    (cluster,) = make_federation(partition * len(gms), gms, 1, PROFILES["paper"], True, rng)
    users = [UserConfig(UserId("u0"), gms[0], 0.5), UserConfig(UserId("u1"), gms[1], 0.5)]
    decision: list[float] = []
    validation: list[float] = []
    gm_msg: list[float] = []
    lm_msg: list[float] = []
    per_node: list[float] = []
    for r in range(repeats):
        lm = LocalMaster(cluster.lm, cluster.nodes, cluster.home, gms=gms, report_starts=False)
        gm = GlobalMaster(gms[0], [cluster.lm], users)
        gm.handle(lm.snapshot(gms[0]), 0.0)
        specs = tuple(
            TaskSpec(
                task_id=TaskId(f"r{r}.t{i}"),
                job_id=JobId(f"r{r}"),
                user=UserId("u0"),
                demand=(1000, 512),
                duration=1.0,
                constraints=task_constraints(rng, 0.5),
            )
            for i in range(batch)
        )
        job = SubmitJob(
            job_id=JobId(f"r{r}"), user=UserId("u0"), token="", submitted_at=0.0, tasks=specs
        )
        gm.handle(AdmitJob(job=job), 0.0)
        g, m = _Core(gm, wire), _Core(lm, wire)
        requests: list[LaunchRequest] = []
        for _ in range(batch):
            out = g.call(Decide(max_tasks=1), 0.0, decision)
            requests += [
                e.msg for e in out if isinstance(e, ToLm) and isinstance(e.msg, LaunchRequest)
            ]
        for req in requests:
            for e in m.call(req, 0.0, validation, per=len(req.placements)):
                if isinstance(e, Reply):
                    gm.handle(e.msg, 0.0)
        _finish_all(g, m, requests, gms[0], gm_msg, lm_msg)
        _update_every_node(g, lm, gm, cluster.lm, per_node)
    return CoreCosts(
        gm_decision_s=statistics.median(decision),
        lm_validation_s=statistics.median(validation),
        gm_message_s=statistics.median(gm_msg),
        lm_message_s=statistics.median(lm_msg),
        update_node_s=statistics.median(per_node),
        partition_nodes=partition,
        wire=wire,
    )


def _finish_all(
    g: _Core,
    m: _Core,
    requests: Sequence[LaunchRequest],
    gm_id: GmId,
    gm_msg: list[float],
    lm_msg: list[float],
) -> None:
    """Every placed task finishes: one worker report each at the LM (timed into
    ``lm_msg``), one event each at the GM (``gm_msg``)."""
    for req in requests:
        for p in req.placements:
            report = WorkerReport(
                kind=ReportKind.FINISHED,
                node=p.node,
                user=p.spec.user,
                task_id=p.spec.task_id,
                attempt=p.attempt,
                gm=gm_id,
                at=1.0,
                worker_at=1.0,
                started_at=0.0,
            )
            for e in m.call(WorkerReports(lm=req.lm, reports=(report,)), 1.0, lm_msg):
                if isinstance(e, ToGm):
                    g.call(TaskEvents(lm=req.lm, events=(e.msg,)), 1.0, gm_msg)


def _update_every_node(
    g: _Core, lm: LocalMaster, gm: GlobalMaster, lm_id: LmId, per_node: list[float]
) -> None:
    """Five state updates that touch every node of LM ``lm_id``, timed per node."""
    delta = lm.delta_since(-1)
    view = gm.views[lm_id]
    for _ in range(5):
        version = view.version + 1
        fresh = replace(
            delta,
            version=version,
            base_version=view.version,
            node_versions=(version,) * len(delta.nodes),
        )
        g.call(StateUpdated(delta=fresh), 2.0, per_node, per=len(delta.nodes))


# ------------------------------------------------------- what the simulator charges
def gm_cost(cfg: SimConfig, msg: object) -> float:
    """Busy time of a GM handling ``msg``: the core's cost by kind, an update's by the
    nodes it carries, plus the service's fixed cost per message."""
    base = cfg.gm_service_s + cfg.gm_message_s
    if isinstance(msg, StateUpdated):
        return base + cfg.update_node_s * len(msg.delta.nodes)
    if isinstance(msg, LaunchResponse):
        retried = sum(1 for r in msg.results if not r.accepted)
        return base + cfg.update_node_s * len(msg.delta.nodes) + cfg.gm_decision_s * retried
    if isinstance(msg, PreemptResponse):
        return base + cfg.gm_decision_s * (not msg.accepted)
    if isinstance(msg, StateSnapshot):
        return base + cfg.update_node_s * len(msg.state.nodes)
    if isinstance(msg, TaskEvents):
        return cfg.gm_service_s + cfg.gm_message_s * len(msg.events)
    return base


def decision_cost(cfg: SimConfig, decisions: int) -> float:
    """Busy time of a GM making ``decisions`` placements in one turn."""
    return cfg.gm_decision_s * decisions


def lm_cost(cfg: SimConfig, msg: object) -> float:
    """Busy time of an LM handling ``msg`` (validations by placement)."""
    base = cfg.lm_service_s + cfg.lm_message_s
    if isinstance(msg, LaunchRequest):
        return base + cfg.lm_validation_s * len(msg.placements)
    if isinstance(msg, PreemptRequest):
        return base + cfg.lm_validation_s * 4
    return base


def lm_send_cost(cfg: SimConfig, effects: Sequence[Effect]) -> float:
    """Busy time of an LM encoding the state updates it publishes, by their size."""
    if cfg.lm_update_node_s <= 0:
        return 0.0
    nodes = sum(
        len(e.msg.delta.nodes)
        for e in effects
        if isinstance(e, ToAllGms) and isinstance(e.msg, StateUpdated)
    )
    return cfg.lm_update_node_s * nodes


def fit_service(live_cpu_s: float, sim_busy_s: float, sim_handled: int) -> float:
    """The fixed cost per message that makes a simulated server's busy time equal the
    CPU its live process spent on the same workload (never negative)."""
    if sim_handled <= 0:
        return 0.0
    return max(0.0, (live_cpu_s - sim_busy_s) / sim_handled)


def hop(cfg: SimConfig, rng: random.Random) -> float:
    """One hop's delay: drawn from the live samples if there are any, else constant."""
    if cfg.hop_samples_s:
        return rng.choice(cfg.hop_samples_s)
    return cfg.network_delay_s
