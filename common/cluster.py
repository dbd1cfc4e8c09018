"""The federation's clusters: resource profiles, machines, constraints, partitions, users.

The cluster model every layer shares: the simulator, the live services and the
request generator build the same clusters from the same seed.

* **Resource profiles**: ``slots`` (one slot per worker and per task, as the Sparrow
  and Megha simulators replay traces) and ``paper`` (64-core, 16 GB nodes).
* **Machine constraints** (21, after the Megha paper's reference [19]): each LM's
  cluster draws one of three cluster profiles (A, B, C); every machine meets
  constraint *c* with that profile's probability.  [19]'s own tables are not among
  our sources: the probabilities are synthetic defaults shaped as [19] describes
  (some constraints almost universal, a few rare, clusters differing).
* **Partitions**: each LM's nodes are split evenly into one partition per GM
  (the node's *home* GM).
* **Users**: ``NAME:SHARE@GM``; each user's queue is served by exactly one GM.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from common.errors import ConfigError
from common.ids import GmId, LmId, UserId
from common.model import N_CONSTRAINTS, NodeSpec, Resources, UserConfig


@dataclass(frozen=True)
class ResourceProfile:
    """Resource types, node capacity and how task demands are drawn."""

    name: str
    names: tuple[str, ...]
    node_capacity: Resources
    demand_choices: tuple[Resources, ...] = ()

    def task_demand(self, rng: random.Random) -> Resources:
        if len(self.demand_choices) == 1:
            return self.demand_choices[0]
        return rng.choice(self.demand_choices)


PROFILES: dict[str, ResourceProfile] = {
    "slots": ResourceProfile("slots", ("slots",), (1,), ((1,),)),
    # The paper's simulated nodes: 64 cores, 16 GB.  Task demands: millicores x MB.
    "paper": ResourceProfile(
        "paper",
        ("cpu_m", "mem_mb"),
        (64_000, 16_384),
        tuple((c, m) for c in (500, 1000, 2000, 4000, 8000) for m in (256, 512, 1024, 2048)),
    ),
}


def profile(name: str) -> ResourceProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"unknown resource profile {name!r} (known: {', '.join(PROFILES)})",
            reason="unknown_profile",
        ) from None


# Probability that a machine meets each constraint, per cluster profile (see module doc).
CLUSTER_PROFILES: dict[str, tuple[float, ...]] = {
    "A": (0.95, 0.9, 0.9, 0.85, 0.8, 0.75, 0.7, 0.7, 0.6, 0.6, 0.5,
          0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05),
    "B": (0.9, 0.95, 0.8, 0.9, 0.7, 0.8, 0.6, 0.75, 0.55, 0.65, 0.45,
          0.55, 0.4, 0.45, 0.3, 0.35, 0.2, 0.25, 0.1, 0.15, 0.08),
    "C": (0.98, 0.85, 0.95, 0.75, 0.85, 0.65, 0.75, 0.6, 0.7, 0.5, 0.6,
          0.4, 0.5, 0.35, 0.4, 0.25, 0.3, 0.15, 0.2, 0.05, 0.12),
}  # fmt: skip


def machine_constraints(probs: Sequence[float], rng: random.Random) -> int:
    mask = 0
    for c, p in enumerate(probs):
        if rng.random() < p:
            mask |= 1 << c
    return mask


@dataclass
class ClusterSpec:
    """One LM's cluster: its nodes and the GM whose partition each belongs to."""

    lm: LmId
    nodes: list[NodeSpec]
    home: list[GmId]
    profile: str = "A"


def make_federation(
    n_workers: int,
    gm_ids: Sequence[GmId],
    n_lms: int,
    prof: ResourceProfile,
    constraints: bool,
    rng: random.Random,
) -> list[ClusterSpec]:
    """Split ``n_workers`` evenly over ``n_lms`` clusters, each into one partition per GM."""
    if n_lms <= 0 or not gm_ids or n_workers < n_lms:
        raise ConfigError(
            f"need at least one worker per LM and one GM ({n_workers} workers, {n_lms} LMs)",
            reason="bad_federation",
        )
    clusters = []
    all_met = (1 << N_CONSTRAINTS) - 1
    for k in range(n_lms):
        size = n_workers // n_lms + (1 if k < n_workers % n_lms else 0)
        name = rng.choice(sorted(CLUSTER_PROFILES))
        probs = CLUSTER_PROFILES[name]
        nodes = [
            NodeSpec(
                prof.node_capacity, machine_constraints(probs, rng) if constraints else all_met
            )
            for _ in range(size)
        ]
        per = math.ceil(size / len(gm_ids))
        home = [gm_ids[min(i // per, len(gm_ids) - 1)] for i in range(size)]
        clusters.append(ClusterSpec(LmId(f"lm{k}"), nodes, home, name))
    return clusters


def default_users(gm_ids: Sequence[GmId]) -> list[UserConfig]:
    """One user per GM with equal shares."""
    share = 1.0 / len(gm_ids)
    return [UserConfig(UserId(f"u{i}"), g, share) for i, g in enumerate(gm_ids)]


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
"""A user's name (as ``security.identity.NAME_PATTERN``)."""


def parse_users(text: str, gm_ids: Sequence[GmId]) -> list[UserConfig]:
    """``"alice:0.1@gm0,bob:0.25@gm1"``; empty means :func:`default_users`."""
    if not text.strip():
        return default_users(gm_ids)
    users = []
    for item in text.split(","):
        try:
            name, rest = item.strip().split(":")
            share_s, gm = rest.split("@")
            share = float(share_s)
        except ValueError:
            raise ConfigError(
                f"bad user spec {item!r}: expected NAME:SHARE@GM", reason="bad_users"
            ) from None
        if not _NAME.fullmatch(name):
            raise ConfigError(
                f"bad user name {name!r}: 1-64 of [A-Za-z0-9_-], starting with a letter or "
                "digit (it names a queue, a routing key and a broker user)",
                reason="bad_users",
            )
        if gm not in gm_ids:
            raise ConfigError(f"user {name!r} maps to unknown GM {gm!r}", reason="bad_users")
        if not 0 < share <= 1:
            raise ConfigError(f"user {name!r}: share must be in (0, 1]", reason="bad_users")
        users.append(UserConfig(UserId(name), GmId(gm), share))
    if len({u.user for u in users}) != len(users):
        raise ConfigError("a user may appear once", reason="bad_users")
    if sum(u.share for u in users) > 1.0 + 1e-9:
        raise ConfigError("user shares add up to more than 1", reason="bad_users")
    return users
