"""Gang stages under Hypothesis: random federations of 3 GMs, gangs (some with a
``min``) and single tasks arriving together, simulated on the real cores.  Checked
after every message an LM takes:

* no partial gang ever starts: no gang task is launched on its own, and a gang's
  tasks start only by a commit of at least ``need`` of them;
* a reservation never outlives its lease;
* no over-allocation with reservations held: on every node, free + held + the
  demands of the tasks running = capacity, and free is never negative.

At the end every gang ran whole (at least ``need`` tasks) or failed as a whole with
``gang_unschedulable``; nothing is stuck."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.cluster import PROFILES, default_users, make_federation
from common.ids import GmId, JobId, LmId, TaskId
from common.messages import CommitGang, LaunchRequest
from common.model import TaskKey, TaskSpec
from global_master.gang import UNSCHEDULABLE
from local_master.core import LocalMaster
from simulator.megha_sim import MeghaSimulation
from workload.jobs import Job

GMS = [GmId("gm0"), GmId("gm1"), GmId("gm2")]

job_st = st.tuples(
    st.integers(1, 60),  # tasks
    st.floats(0.0, 3.0),  # arrival
    st.booleans(),  # gang
    st.integers(0, 3),  # min: 0 = all; else count - k
    st.sampled_from([0.5, 1.0, 4.0]),  # duration
)


class Watch:
    """Wraps each LM's ``handle`` and checks the invariants after every message."""

    def __init__(self, sim: MeghaSimulation, gang_of: dict[TaskKey, JobId]) -> None:
        self.gang_of = gang_of
        self.committed: dict[JobId, int] = defaultdict(int)
        self.commit_keys: set[TaskKey] = set()
        self.rerun: int = 0
        """Launches of a committed gang's task (one that came back: preempted, lost)."""
        for lm in sim.lms.values():
            lm.handle = self._wrap(lm)  # type: ignore[method-assign]

    def _wrap(self, lm: LocalMaster) -> Any:
        inner = lm.handle

        def handle(msg: object, now: float) -> Any:
            if isinstance(msg, LaunchRequest):
                for p in msg.placements:
                    k = (p.spec.user, p.spec.task_id)
                    if k in self.gang_of:
                        assert k in self.commit_keys, "a gang task launched before its gang"
                        self.rerun += 1
            if isinstance(msg, CommitGang):
                self.committed[msg.job_id] += len(msg.tasks)
                self.commit_keys.update((t.user, t.task_id) for t in msg.tasks)
            effects = inner(msg, now)
            check(lm, now)
            return effects

        return handle


def check(lm: LocalMaster, now: float) -> None:
    res = lm.reservations
    for h in res.by_task.values():
        assert h.committed or h.lease_until > now, "a hold outlived its lease"
    for n in range(lm.n_nodes):
        if not lm.alive[n]:
            continue
        total = list(lm.free[n])
        assert min(total) >= 0, "over-allocated"
        for h in res.by_task.values():
            if h.node == n:
                total = [t + x for t, x in zip(total, h.held, strict=True)]
        for a in lm.active.values():
            if a.node == n:
                total = [t + d for t, d in zip(total, a.spec.demand, strict=True)]
        assert tuple(total) == lm.nodes.capacity[n], "resources not conserved"


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(job_st, min_size=1, max_size=14),
    nodes=st.sampled_from([30, 60, 120]),
    seed=st.integers(0, 1000),
)
def test_no_partial_gang_no_lease_overrun_no_over_allocation(
    jobs: list[tuple[int, float, bool, int, float]], nodes: int, seed: int
) -> None:
    users = default_users(GMS)
    clusters = make_federation(nodes, GMS, 3, PROFILES["slots"], True, random.Random(seed))
    sim = MeghaSimulation(clusters, GMS, users)
    made: list[Job] = []
    gang_of: dict[TaskKey, JobId] = {}
    need: dict[JobId, int] = {}
    for i, (n, at, gang, less, dur) in enumerate(jobs):
        user = users[i % len(users)].user
        jid = JobId(f"j{i}")
        specs = [
            TaskSpec(task_id=TaskId(f"j{i}.t{k}"), job_id=jid, user=user, demand=(1,),
                     duration=dur)
            for k in range(n)
        ]  # fmt: skip
        k_min = max(n - less, 1) if gang and less else 0
        made.append(Job(jid, user, at, specs, gang=gang, gang_min=k_min))
        if gang:
            need[jid] = k_min or n
            if not k_min:  # a min gang's others may run alone once it committed
                gang_of.update({(s.user, s.task_id): jid for s in specs})
    watch = Watch(sim, gang_of)
    sim.add_jobs(made)
    r = sim.run()
    assert r.stuck == 0
    started: dict[JobId, int] = defaultdict(int)
    for t in r.tasks:
        if t.first_started_at >= 0:
            started[t.job_id] += 1
    for jid, k in need.items():
        failed = [why for key, why in r.failed.items() if key[1].startswith(f"{jid}.")]
        if failed:
            assert started[jid] == 0
            assert all(why.startswith(UNSCHEDULABLE) for why in failed)
        else:
            assert started[jid] >= k
            assert watch.committed[jid] >= k
    assert all(g.gang.stats["partial_starts"] == 0 for g in sim.gms.values())
    lms: list[LmId] = list(sim.lms)
    assert all(not sim.lms[lm].reservations.by_task for lm in lms)
