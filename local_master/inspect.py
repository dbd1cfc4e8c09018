"""Answers to an operator's questions about one LM (``GET /v1/inspect``): each GM's
partition of the cluster as bit-vectors, what runs, and the latest repartitions.

A pure function of a ``LocalMaster`` (read only), in the paper's vocabulary: bit i of
a partition's ``nodes`` vector is set when node i's home is that GM; bit i of its
``free`` vector when node i is alive and has some of every resource free (the same
test as a GM's ``avail`` vector, ``global_master.view``).
"""

from __future__ import annotations

from typing import Any

from local_master.core import LocalMaster
from local_master.nodes import Repartition


def bits(flags: list[bool]) -> str:
    """A bit-vector as a string, node 0 first."""
    return "".join("1" if f else "0" for f in flags)


def overview(core: LocalMaster) -> dict[str, Any]:
    """Partitions (owner GM, member and free bit-vectors), running tasks, logical nodes
    and the latest repartitions of one LM."""
    n = core.n_nodes
    free = [core.alive[i] and all(x > 0 for x in core.free[i]) for i in range(n)]
    carved_for: dict[str, int] = {}
    carved_from: dict[str, int] = {}
    for _, node, gm, _ in core.logical_nodes():
        carved_for[gm] = carved_for.get(gm, 0) + 1
        home = core.nodes.home[node]
        carved_from[home] = carved_from.get(home, 0) + 1
    partitions: dict[str, dict[str, Any]] = {}
    for gm in sorted(set(core.nodes.home) | core.gms):
        members = [h == gm for h in core.nodes.home]
        mine = [m and f for m, f in zip(members, free, strict=True)]
        partitions[gm] = {
            "nodes": sum(members),
            "free_nodes": sum(mine),
            "members": bits(members),
            "free": bits(mine),
            "logical_nodes_held": carved_for.get(gm, 0),
            "logical_nodes_lent": carved_from.get(gm, 0),
        }
    width = core.nodes.n_resources
    return {
        "lm": core.lm_id,
        "epoch": core.epoch,
        "version": core.version,
        "registered": core.registered,
        "nodes": n,
        "nodes_alive": sum(core.alive),
        "nodes_free": sum(free),
        "free_total": [sum(f[r] for f in core.free) for r in range(width)],
        "capacity_total": [sum(c[r] for c in core.nodes.capacity) for r in range(width)],
        "running_tasks": len(core.active),
        "partitions": partitions,
        "repartitions_total": core.counters.repartitions,
        "recent_repartitions": [_repartition(r) for r in reversed(core.nodes.recent_repartitions)],
    }


def _repartition(r: Repartition) -> dict[str, Any]:
    return {
        "at": r.at, "user": r.task[0], "task_id": r.task[1], "attempt": r.attempt,
        "node": r.node, "from": r.home, "to": r.gm, "demand": list(r.demand),
    }  # fmt: skip
