"""Cost of the pure cores' operations on one core: the figures behind SimConfig's defaults.

Measures, on a cluster with 1,000-node partitions and the 21 constraint vectors:
  * the GM match alone (AND of the task's constraint vectors + first-fit resource scan),
  * a whole GM decision (pop, match, reserve, build the request),
  * an LM validation of one launch (check, commit, response with delta),
  * applying a state update, per node.
Writes JSON to --out (default results/bench_core.json).

    python benchmarks/bench_core.py --out results/bench_core.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from common.cluster import PROFILES, make_federation
from common.effects import ToGm, ToLm
from common.ids import GmId, JobId, TaskId, UserId
from common.messages import LaunchRequest, StateDelta, TaskEvent, WorkerReport
from common.model import Task
from global_master.core import GlobalMaster
from local_master.core import LocalMaster
from request_generator.workload import task_constraints


def _tasks(n: int, rng: random.Random, demand: tuple[int, ...]) -> list[Task]:
    return [
        Task(
            task_id=TaskId(f"b{i}"),
            job_id=JobId("b"),
            user=UserId("u0"),
            demand=demand,
            duration=1.0,
            constraints=task_constraints(rng, 0.5),
        )
        for i in range(n)
    ]


def bench(partition: int, repeats: int) -> dict[str, float]:
    rng = random.Random(1)
    gm_ids = [GmId("gm0"), GmId("gm1")]
    prof = PROFILES["paper"]
    clusters = make_federation(partition * 2, gm_ids, 1, prof, True, rng)
    from common.model import UserConfig

    users = [UserConfig(UserId("u0"), gm_ids[0], 0.5), UserConfig(UserId("u1"), gm_ids[1], 0.5)]
    c = clusters[0]
    lm = LocalMaster(c.lm, c.nodes, c.home)
    gm = GlobalMaster(gm_ids[0], [c.lm], users)
    gm.on_snapshot(lm.snapshot(gm_ids[0]), 0.0)
    view = gm.views[c.lm]
    demand = (1000, 512)

    # 1. the match alone, on an empty partition and on a full one where only the last
    #    node has room: the AND with the avail vector skips the full nodes at C speed
    masks = [task_constraints(rng, 0.5) for _ in range(1000)]

    def match_cost() -> float:
        t0 = time.perf_counter()
        n = 0
        for _ in range(repeats):
            for m in masks:
                view.first_fit(view.eligible(m, gm_ids[0], True), demand)
                n += 1
        return (time.perf_counter() - t0) / n

    match_s = match_cost()
    mine = [i for i in range(view.n) if view.home[i] == gm_ids[0]]
    full = mine[:-1]
    for i in full:
        view.reserve(i, tuple(view.free[i]))
    match_loaded_s = match_cost()
    for i in full:
        view.release(i, tuple(view.pending[i] or ()))

    # 2. whole decisions, and 3. LM validations, on the same tasks
    samples_gm: list[float] = []
    samples_lm: list[float] = []
    samples_gm_msg: list[float] = []
    samples_lm_msg: list[float] = []
    now = 0.0
    for r in range(repeats):
        tasks = _tasks(2000, random.Random(r), demand)
        for t in tasks:
            t.task_id = TaskId(f"r{r}.{t.task_id}")
        gm.submit(tasks, now)
        for _ in range(len(tasks)):
            t0 = time.perf_counter()
            effects = gm.decide(now)
            samples_gm.append(time.perf_counter() - t0)
            for eff in effects:
                if isinstance(eff, ToLm) and isinstance(eff.msg, LaunchRequest):
                    t0 = time.perf_counter()
                    out = lm.on_launch(eff.msg, now)
                    samples_lm.append(time.perf_counter() - t0)
                    for o in out:
                        msg = getattr(o, "msg", None)
                        if msg is not None and type(msg).__name__ == "LaunchResponse":
                            gm.handle(msg, now)
        # finish everything: worker reports at the LM, task events at the GM
        for tid in list(lm.active):
            a = lm.active[tid]
            rep = WorkerReport(lm=c.lm, node=a.node, task_id=tid, kind="finished", at=now)
            t0 = time.perf_counter()
            evs = lm.on_worker_report(rep, now)
            samples_lm_msg.append(time.perf_counter() - t0)
            for e in evs:
                if isinstance(e, ToGm) and isinstance(e.msg, TaskEvent):
                    t0 = time.perf_counter()
                    gm.on_task_event(e.msg, now)
                    samples_gm_msg.append(time.perf_counter() - t0)
        gm.on_snapshot(lm.snapshot(gm_ids[0]), now)

    # 4. applying a 1,000-node delta
    delta = lm.delta_since(-1)
    nodes = len(delta.nodes)
    t0 = time.perf_counter()
    for k in range(repeats * 5):
        fresh = StateDelta(
            lm=delta.lm,
            version=delta.version + k + 1,
            base_version=view.version,
            nodes=delta.nodes,
            free=delta.free,
            node_versions=tuple(v + k + 1 for v in delta.node_versions),
            usage=delta.usage,
        )
        view.apply(fresh)
    per_node = (time.perf_counter() - t0) / (repeats * 5 * nodes)
    return {
        "partition_nodes": partition,
        "match_us": match_s * 1e6,
        "match_decisions_per_s": 1.0 / match_s,
        "match_us_one_node_free": match_loaded_s * 1e6,
        "match_decisions_per_s_one_node_free": 1.0 / match_loaded_s,
        "gm_decision_us_p50": statistics.median(samples_gm) * 1e6,
        "gm_decision_us_mean": statistics.fmean(samples_gm) * 1e6,
        "lm_validation_us_p50": statistics.median(samples_lm) * 1e6,
        "lm_validation_us_mean": statistics.fmean(samples_lm) * 1e6,
        "update_apply_us_per_node": per_node * 1e6,
        "gm_task_event_us_p50": statistics.median(samples_gm_msg) * 1e6,
        "lm_worker_report_us_p50": statistics.median(samples_lm_msg) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--partition", type=int, default=1000, help="nodes per partition")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results/bench_core.json")
    args = ap.parse_args()
    figures = bench(args.partition, args.repeats)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    for k, v in figures.items():
        print(f"{k:<28} {v:,.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
