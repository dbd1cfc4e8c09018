"""Queue policies for a GM's user queues: FIFO, DRF, Tetris, SJF and Carbyne.

One module per idea; the GM calls the policy, the policy never calls the GM:

* ``jobs``     -- per-job state, the plan, the hooks the GM core calls (``JobQueues``);
* ``vectors``  -- resource-vector arithmetic (dominant share, fit);
* ``drf``      -- weighted DRF by progressive filling (``DrfQueues``);
* ``packing``  -- Tetris's alignment score, packing, node choice (``TetrisQueues``);
* ``sjf``      -- shortest job first by critical path (``SjfQueues``);
* ``srpt``     -- least remaining work first within each user, flat jobs too (``SrptQueues``);
* ``classes``  -- priority classes with aging over ``fifo`` and ``srpt`` (``ClassedQueues``);
* ``altruism`` -- Carbyne intra-job: forward packing for ``T_k``, reverse packing;
* ``leftover`` -- Carbyne's leftover scheduling: SRTF or packing first;
* ``carbyne``  -- Pseudocode 1: the three steps together (``CarbyneQueues``).

``make_policy`` builds a ``queues_factory`` for the simulator and the live GM.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from common.config import QUEUE_POLICIES
from common.errors import ConfigError
from common.ids import GmId, UserId
from common.model import UserConfig
from global_master.policy.carbyne import CarbyneQueues
from global_master.policy.classes import AGING_S, ClassedFifo, ClassedQueues, ClassedSrpt
from global_master.policy.drf import DrfQueues
from global_master.policy.jobs import JobQueues
from global_master.policy.packing import TetrisQueues
from global_master.policy.sjf import SjfQueues
from global_master.policy.srpt import SRPT_HALF_LIFE_S, SrptQueues
from global_master.queues import UserQueues

__all__ = [
    "AGING_S",
    "POLICIES",
    "CarbyneQueues",
    "ClassedQueues",
    "DrfQueues",
    "JobQueues",
    "QueuesFactory",
    "SjfQueues",
    "SrptQueues",
    "TetrisQueues",
    "make_policy",
]

POLICIES = QUEUE_POLICIES

QueuesFactory = Callable[[GmId, list[UserId]], UserQueues]


def make_policy(
    name: str,
    users: Sequence[UserConfig],
    *,
    p_altruism: float | dict[GmId, float] = 1.0,
    seed: int = 0,
    patience: int = 8,
    aging_s: float = AGING_S,
    srpt_half_life_s: float = SRPT_HALF_LIFE_S,
) -> QueuesFactory:
    """A ``queues_factory`` for the simulator and the live GM, by policy name.  ``fifo``
    and ``srpt`` serve jobs' priority classes, aged by ``aging_s``
    (``global_master.policy.classes``), ``srpt``'s remaining work by ``srpt_half_life_s``; the
    DAG policies ignore classes."""
    if name not in POLICIES:
        raise ConfigError(
            f"unknown queue policy {name!r} (known: {', '.join(POLICIES)})",
            reason="unknown_policy",
        )
    shares = {u.user: u.share for u in users}

    def factory(gm: GmId, mine: list[UserId]) -> UserQueues:
        mine_shares = {u: shares.get(u, 1.0) for u in mine}
        if name == "fifo":
            return ClassedFifo(mine, aging_s=aging_s, patience=patience)
        if name == "srpt":
            return ClassedSrpt(
                mine, aging_s=aging_s, patience=patience, half_life_s=srpt_half_life_s
            )
        if name in ("drf", "drf-wc"):
            return DrfQueues(mine, shares=mine_shares, work_conserving=name == "drf-wc")
        if name == "tetris":
            return TetrisQueues(mine, shares=mine_shares)
        if name == "sjf":
            return SjfQueues(mine, shares=mine_shares)
        p = p_altruism.get(gm, 1.0) if isinstance(p_altruism, dict) else p_altruism
        rng = random.Random(f"{seed}:{gm}")
        return CarbyneQueues(
            mine,
            shares=mine_shares,
            p_altruism=p,
            packing_first=name == "carbyne-pack",
            rng=rng,
        )

    return factory
