"""What a demand in a job file means: the same in ``megha simulate`` and live.

A megha-dag/1 file names its resources; its demands are in the units of the resource
profile with those names (``common.cluster.PROFILES``): ``["slots"]`` counts slots of
one per node (the ``slots`` profile: ``[1]`` is a whole node), ``["cpu_m", "mem_mb"]``
millicores and MB of the ``paper`` profile's 64-core, 16 GB nodes -- in the simulator
as in a live federation of that profile.  Any other names are the simulator's own
scale, ``SIM_UNITS`` per node and resource (``[21]`` is 21/100 of a node, as Carbyne's
examples are written): a live federation has no such units and refuses such a file
(``units_not_live``), so that a demand never means 1/100 of a node in one place and a
whole node in the other.  megha-job/1 files (``common.jobspec``) name no resources:
their demands are always in the federation's profile's units -- ``megha simulate
--profile P`` runs them on P's nodes, a live federation on its ``profile``'s -- and
``check_demands`` holds a job to them, the same check in ``megha simulate``, ``megha
submit`` and a GM's front door.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.cluster import PROFILES, ResourceProfile
from common.errors import ConfigError
from common.jobspec import JobDef

SIM_UNITS = 100
"""Per node and resource, for files whose resource names are no profile's."""


def profile_named(names: Sequence[str]) -> ResourceProfile | None:
    """The profile whose resources are ``names`` (None: the simulator's own units)."""
    return next((p for p in PROFILES.values() if tuple(p.names) == tuple(names)), None)


def sim_node_capacity(names: Sequence[str]) -> tuple[int, ...]:
    """The node a file's demands are measured against in the simulator."""
    p = profile_named(names)
    return tuple(p.node_capacity) if p is not None else (SIM_UNITS,) * len(names)


def check_live(names: Sequence[str], federation: ResourceProfile, where: str) -> None:
    """``ConfigError`` unless a file of resources ``names`` means the same on a live
    federation of profile ``federation`` as in the simulator."""
    width = len(federation.names)
    if len(names) != width:
        raise ConfigError(
            f"{where}: jobs use {len(names)} resource types ({', '.join(names)}); the "
            f"federation's profile {federation.name!r} has {width}",
            reason="wrong_resources",
        )
    if tuple(names) != tuple(federation.names):
        raise ConfigError(
            f"{where}: resources {list(names)} are the simulator's units (1/{SIM_UNITS} of "
            f"a node); this federation's profile {federation.name!r} counts "
            f"{list(federation.names)} ({list(federation.node_capacity)} per node): write "
            f"the file in those",
            reason="units_not_live",
        )


def check_demands(job: JobDef, federation: ResourceProfile, where: str) -> None:
    """``ConfigError`` unless each task of ``job`` asks for ``federation``'s resources
    (one amount per resource, ``wrong_resources``) and fits one of its nodes
    (``impossible_resources``): what a live GM would refuse the job for, said before
    it is sent or simulated."""
    width, cap = len(federation.names), tuple(federation.node_capacity)
    for s in job.stages:
        for i, t in enumerate(s.tasks):
            task = f"{where}: stage {s.stage_id} task {i}"
            if len(t.demand) != width:
                raise ConfigError(
                    f"{task}: demand {list(t.demand)} has {len(t.demand)} amounts; profile "
                    f"{federation.name!r} counts {list(federation.names)} "
                    f"({list(cap)} per node)",
                    reason="wrong_resources",
                )
            if any(d > c for d, c in zip(t.demand, cap, strict=True)):
                raise ConfigError(
                    f"{task}: demand {list(t.demand)} exceeds a node of profile "
                    f"{federation.name!r} ({list(cap)}): it would never run",
                    reason="impossible_resources",
                )
