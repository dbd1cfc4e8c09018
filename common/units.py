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
their demands are always in the federation's profile's units.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.cluster import PROFILES, ResourceProfile
from common.errors import ConfigError

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
