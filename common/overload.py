"""How a GM behaves when its users want more than there is (issue 11, docs/overload.md).

One frozen record shared by the GM core, ``megha simulate`` and the federation
configuration, so the live services and the simulator run the same policy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OVERLOAD_DEFAULTS", "PRIORITY_AGING_S", "SRPT_HALF_LIFE_S", "OverloadPolicy"]

PRIORITY_AGING_S = 3600.0
"""Seconds of waiting that raise a task's priority class by one (the default of
``global_master.policy.classes``; ``priority_aging_s`` in ``megha.toml``)."""

SRPT_HALF_LIFE_S = 60.0
"""``srpt``: a waiting job's remaining work counts half per this many seconds since it
arrived (the default of ``global_master.policy.srpt``; ``srpt_half_life_s`` in
``megha.toml``, ``megha simulate --srpt-half-life``; ``inf``: plain SRPT)."""


@dataclass(frozen=True, slots=True)
class OverloadPolicy:
    """How a GM behaves when its users want more than there is (issue 11).

    Defaults keep the paper's GM and LM as they are (a task that found no room goes to
    the back of its queue, preempt at once, no limit, repartition at once, an LM refuses
    a placement whose node has no room, launches leave as soon as they are decided);
    deployments and the simulator set them from their configuration
    (``OVERLOAD_DEFAULTS``).
    """

    wait_index: bool = False
    """A task that found no room waits, indexed by what it needs, until freed resources
    could fit it, instead of going round the queue (plain FIFO queues only)."""
    preempt_grace_s: float = 0.0
    """A user preempts only after waiting this long below ``preempt_below`` of its share
    (YARN's fair-share preemption timeout); *starved* then, it preempts until it holds
    its share.  Short shortfalls are made up by completions."""
    preempt_below: float = 1.0
    """...and only while it holds less than this fraction of its share (YARN's fair-share
    preemption threshold): near its share, completions close the gap, not preemption."""
    victims_younger_than_wait: bool = False
    """The LM preempts only tasks that have run for less time than the task asking for
    room has waited: preemption never throws away more work than the wait it ends."""
    preempt_per_lm: int = 0
    """Preemption requests this GM sends to one LM per ``preempt_period_s`` (0: no limit)."""
    preempt_period_s: float = 10.0
    repartition_batching: bool = False
    """A GM keeps at most one repartition request per LM unanswered; placements on that
    LM's external partitions decided meanwhile travel together in the next request."""
    repartition_period_s: float = 0.0
    """With batching, also at most one repartition request per LM per this period."""
    launch_window: int = 0
    """A GM keeps at most this many launch requests per LM unanswered (0: no limit);
    placements on that LM decided meanwhile wait and travel together in the next
    request, sent as an answer comes back (Nagle's algorithm for launches)."""
    launch_full_batch: int = 0
    """With a launch window: held placements for one LM that number this many leave at
    once, in one request beyond the window (Nagle's full segment; at most one such
    request per LM unanswered; 0: never).  A burst does not wait a round trip for the
    previous answer, while a trickle still waits for company."""
    class_preempt_grace_s: float = 0.0
    """A task of a priority class above 0 that finds no room preempts lower classes
    after waiting this long (``global_master.priority``); completions may free room
    first."""
    reroute_at_lm: bool = False
    """An LM that finds no room on the node a placement asked for (the GM's view was
    stale: an inconsistency) places the task on the last node that fits, in that GM's
    partition first, then in another's (a repartition), instead of refusing it: the
    GM's retry, on the LM's true state and without the round trip."""


OVERLOAD_DEFAULTS = OverloadPolicy(
    wait_index=True,
    preempt_grace_s=60.0,
    preempt_below=0.5,
    victims_younger_than_wait=True,
    preempt_per_lm=2,
    preempt_period_s=10.0,
    repartition_batching=True,
    repartition_period_s=0.0,
    launch_window=1,
    launch_full_batch=8,
    reroute_at_lm=True,
)
"""What ``megha simulate`` and ``megha up`` use (see docs/overload.md for the figures)."""
