"""The simulator's settings: network delay, the cores' processing costs, heartbeats,
batching, the overload policy, usage sampling.

A module of its own so that the simulator (``simulator.megha_sim``) and its cost model
(``simulator.costs``), which both read it, import it rather than each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.overload import OverloadPolicy


@dataclass
class SimConfig:
    """Delays and processing costs (seconds).

    Processing costs default to the per-operation CPU time of the real cores, as
    measured by ``python benchmarks/bench_core.py`` on our 2-core machines (means,
    rounded up: decision 7.1 us, validation 10.3 us, update 0.48 us/node, task event
    1.2 us at the GM, worker report 2.9 us at the LM); they are constants so that the
    same seed gives the same result on any machine.
    """

    network_delay_s: float = 0.0005
    gm_decision_s: float = 7.5e-6
    gm_message_s: float = 1.5e-6
    update_node_s: float = 0.5e-6
    lm_validation_s: float = 10.5e-6
    lm_message_s: float = 3e-6
    update_period_s: float = 10.0
    batch: int = 1
    """Decisions a GM makes before sending (launches to one LM share a request)."""
    max_retries: int = 3
    patience: int = 8
    gm_service_s: float = 0.0
    """Fixed busy time of a GM service per message it receives (its framework,
    signing, sealing, event loop); 0: the core alone.  ``simulator.costs.fit_service``
    fits it to a live run."""
    lm_service_s: float = 0.0
    """The same at an LM."""
    hop_samples_s: tuple[float, ...] = ()
    """One-way hop times measured live; each hop draws one (seeded) instead of
    ``network_delay_s``."""
    lm_update_node_s: float = 0.0
    """Busy time of an LM per node of a state update it publishes (encoding)."""
    overload: OverloadPolicy = field(default_factory=OverloadPolicy)
    """The waiting index, preemption grace and rate limit, repartition batching (issue
    11); the paper's GM by default, ``megha simulate`` uses ``OVERLOAD_DEFAULTS``."""
    sample_usage_every_s: float | None = None
    """Record each user's dominant share of the federation this often (Carbyne reports)."""


def config_from_args(args: Any, **extra: Any) -> SimConfig:
    """The simulator's settings from ``megha simulate``'s options (``--network-delay``,
    ``--update-period``, the measured costs, ``--batch``), plus ``extra``."""
    return SimConfig(
        network_delay_s=args.network_delay,
        update_period_s=args.update_period,
        gm_decision_s=args.gm_decision_cost,
        lm_validation_s=args.lm_validation_cost,
        batch=args.batch,
        **extra,
    )
