"""Three GMs reserving at once for gangs that cannot run together (each needs 70% of
the federation): none deadlocks or livelocks; each gang runs whole in turn, none in
part, and no hold is left."""

from __future__ import annotations

import itertools
import random

from common.cluster import PROFILES, default_users, make_federation
from common.ids import GmId, JobId, TaskId
from common.model import TaskSpec
from simulator.megha_sim import MeghaSimulation
from workload.jobs import Job

GMS = [GmId("gm0"), GmId("gm1"), GmId("gm2")]


def test_three_gms_contending_for_the_same_room_run_their_gangs_in_turn() -> None:
    users = default_users(GMS)
    clusters = make_federation(90, GMS, 3, PROFILES["slots"], False, random.Random(2))
    sim = MeghaSimulation(clusters, GMS, users)
    jobs = []
    for i, u in enumerate(users):
        jid = JobId(f"big{i}")
        specs = [TaskSpec(task_id=TaskId(f"{jid}.{k}"), job_id=jid, user=u.user, demand=(1,),
                          duration=2.0) for k in range(63)]  # fmt: skip
        jobs.append(Job(jid, u.user, 0.0, specs, gang=True))
    sim.add_jobs(jobs)
    r = sim.run()
    assert r.stuck == 0
    assert not r.failed
    spans = []
    for job in jobs:
        starts = [t.first_started_at for t in r.tasks if t.job_id == job.job_id]
        assert len(starts) == 63
        assert max(starts) - min(starts) < 0.01  # one commit: together
        spans.append((min(starts), max(starts) + 2.0))
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.01  # in turn: never two at once (they do not fit)
    assert all(g.gang.stats["partial_starts"] == 0 for g in sim.gms.values())
    assert all(not lm.reservations.by_task for lm in sim.lms.values())
