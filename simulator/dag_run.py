"""DAG workloads under several queue policies, side by side (Carbyne, issue 4).

Each policy runs the same jobs (fresh copies) through ``MeghaSimulation``: the same
GM and LM cores, only the GM's ``UserQueues`` differ (``global_master.policy``).
Per policy: job completion times, makespan, Jain's fairness index over 60-s windows,
leftover yielded and reused, the allocation-time figures, and a PNG of each user's
dominant share over time against its configured share.

Arrivals are **online** (each job at its arrival time) or **offline** (every job at
time 0, the paper's Fig. 4 setting).  ``versus_best`` puts each policy against the
best policy in each metric -- the paper's framing of Figures 4 and 5: DRF is the
fairness reference, SJF the JCT one, Tetris the makespan one.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from common import jobspec
from common.cluster import ClusterSpec, make_federation, parse_users, profile
from common.dag import DagJob, parse_jobs, read_json
from common.errors import ConfigError
from common.ids import GmId, UserId
from common.model import NodeSpec, UserConfig
from common.units import check_demands, profile_named
from global_master.policy import POLICIES, JobQueues, make_policy
from reporting.fairness import jain
from reporting.files import write_json
from reporting.plots import plot_shares
from reporting.tally import jct_stats, summarize_tasks
from reporting.tasks import write_records_csv
from simulator.config import SimConfig, config_from_args
from simulator.megha_sim import MeghaSimulation, SimResult, timing_of
from simulator.usage import Shares
from workload.dags import dag_stats, scale_jobs, synthetic_dag_jobs

JAIN_WINDOW_S = 60.0
Runner = Callable[[str, MeghaSimulation], SimResult]
"""Runs one policy's simulation: ``runner(policy, sim)``."""
ARRIVALS = ("offline", "online")
DAG_POLICIES = "drf,tetris,sjf,carbyne"
"""The queue policies a DAG workload is compared under unless ``--policies`` says."""
DAG_NODE_CAPACITY: dict[int, tuple[int, ...]] = {1: (100,), 2: (64_000, 16_384)}
"""Node capacity by number of resource types (1: units of 1/100 node; 2: the paper's) for
synthetic DAGs and job files whose resources are no profile's (``common.units``)."""


@dataclass(frozen=True, slots=True)
class _Grid:
    """The usage samples' grid against the 60-s windows: ``step`` windows a sample."""

    step: Fraction

    def window_of(self, i: int) -> int:
        return math.floor(i * self.step)

    def first_of(self, w: int) -> int:
        """The first sample index of window ``w``."""
        return math.ceil(w / self.step)

    def same_after(
        self, w: int, run: tuple[int, int, Shares], k: int, used: int, changes: list[int]
    ) -> tuple[int, int, int]:
        """How many windows after ``w`` are the same as it -- whole windows of the same
        run (``run``, the ``k``-th, ``used`` of its samples taken), of as many samples,
        with the same users active (windows are all of one size only when the step
        divides 60 s) -- and the run and samples taken once they are skipped."""
        if self.step.numerator != 1:
            return 0, k, used
        first, count, _ = run
        whole = self.window_of(first + count) - 1  # the run's last whole window
        nxt = bisect.bisect_right(changes, w)
        last = min(whole, changes[nxt] - 1) if nxt < len(changes) else whole
        same = max(0, last - w)
        used = self.first_of(w + 1 + same) - first
        return (same, k + 1, 0) if used == count else (same, k, used)


def _active_in(
    spans: dict[UserId, list[tuple[float, float]]], share: dict[UserId, float], t0: float, w: int
) -> list[UserId]:
    """The users with a job in the system during window ``w``."""
    lo, hi = t0 + w * JAIN_WINDOW_S, t0 + (w + 1) * JAIN_WINDOW_S
    return [u for u, sp in spans.items() if any(a < hi and e > lo for a, e in sp) and u in share]


def jain_windows(
    result: SimResult, users: Sequence[UserConfig], jobs: Sequence[DagJob]
) -> dict[str, float]:
    """Jain's index of (dominant share / configured share) per 60-s window, over the
    users with a job in the system during that window, each user's share averaged over
    the window's samples.

    Sample ``i`` of the grid (the ``i``-th tick of ``every`` from the first) is in window
    ``floor(i * every / 60)``; a window's average is the exact sum of its samples,
    rounded once (``math.fsum``), over their count, and the figures' mean the exact sum
    of the windows' indices over their count.  The work is per run of the usage step
    function and per job, not per sample nor per window: a run of equal samples
    spanning many windows with the same users active makes those windows' indices
    equal, taken at once (a task of 10**9 s, or a year between two arrivals, was 10**9
    or 3 x 10**7 samples walked one by one, and the plot held them all: hours and
    gigabytes for two jobs)."""
    share = {u.user: u.share for u in users}
    spans: dict[UserId, list[tuple[float, float]]] = {}
    for j in jobs:
        end = j.arrival + result.job_completion.get(j.job_id, float("inf"))
        spans.setdefault(j.user, []).append((j.arrival, end))
    series = result.usage_samples
    if not series:
        return {"mean": 1.0, "min": 1.0, "max": 1.0}
    every = series.every
    t0 = series.runs[0].first
    grid = _Grid(Fraction(every) / Fraction(JAIN_WINDOW_S))
    window_of, first_of = grid.window_of, grid.first_of
    changes = _active_changes(spans, t0)
    runs = [(round((r.first - t0) / every), r.count, r.shares) for r in series.runs]
    idx: list[tuple[float, int]] = []  # (a window's index, how many windows have it)
    k, used = 0, 0  # the run being read, and how many of its samples are taken
    while k < len(runs):
        w = window_of(runs[k][0] + used)
        lo_i, hi_i = first_of(w), first_of(w + 1)
        chunks: list[tuple[Shares, int]] = []
        while k < len(runs) and runs[k][0] + used < hi_i:
            first, count, shares = runs[k]
            take = min(first + count, hi_i) - (first + used)
            chunks.append((shares, take))
            used += take
            if used == count:
                k, used = k + 1, 0
        n = sum(c for _, c in chunks)
        active = _active_in(spans, share, t0, w)
        same = 0
        if len(chunks) == 1 and n == hi_i - lo_i and used > 0:
            same, k, used = grid.same_after(w, runs[k], k, used, changes)
        if len(active) >= 2:
            xs = [
                math.fsum(x for sh, c in chunks for x in _times(sh.get(u, 0.0), c)) / n / share[u]
                for u in active
            ]
            idx.append((jain(xs), 1 + same))
    if not idx:
        return {"mean": 1.0, "min": 1.0, "max": 1.0}
    total = math.fsum(x for v, c in idx for x in _times(v, c))
    values = [v for v, _ in idx]
    return {"mean": total / sum(c for _, c in idx), "min": min(values), "max": max(values)}


def _times(v: float, c: int) -> list[float]:
    """Floats adding up to ``v * c`` exactly (one ``v * 2**k`` per bit of ``c``): what
    ``math.fsum`` of ``c`` copies of ``v`` sums, in at most 64 terms."""
    return [v * (1 << k) for k in range(c.bit_length()) if c >> k & 1]


def _active_changes(spans: Mapping[UserId, Sequence[tuple[float, float]]], t0: float) -> list[int]:
    """The windows around which the users active may change: each job's arrival and
    end, give or take two windows (the exact test, in floats, is ``active_in``'s)."""
    out: set[int] = set()
    for sp in spans.values():
        for a, e in sp:
            for x in (a, e):
                if math.isfinite(x):
                    c = math.floor((x - t0) / JAIN_WINDOW_S)
                    out.update(range(c - 2, c + 3))
    return sorted(out)


def with_arrivals(jobs: Sequence[DagJob], arrivals: str) -> list[DagJob]:
    """Fresh copies of ``jobs``; offline: every job arrives at time 0."""
    if arrivals not in ARRIVALS:
        raise ConfigError(
            f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}",
            reason="bad_workload",
        )
    out = copy.deepcopy(list(jobs))
    if arrivals == "offline":
        for j in out:
            j.arrival = 0.0
    return out


def versus_best(
    schedulers: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, float | None]]:
    """Each policy against the best policy in each metric: average JCT and makespan as
    a factor of the lowest (1.0 = the best), Jain's index as the gap to the highest.  A
    policy that completed no job has no average JCT (its 0 is not the best): its factor
    is None, and it is not the others' best."""
    if not schedulers:
        return {}
    jct = {
        p: s["jct_s"]["mean"] if s.get("jobs_completed", 1) else math.inf
        for p, s in schedulers.items()
    }
    span = {p: s["makespan_s"] for p, s in schedulers.items()}
    fair = {p: s["jain"]["mean"] for p, s in schedulers.items()}
    best_jct, best_span, best_fair = min(jct.values()), min(span.values()), max(fair.values())
    return {
        p: {
            "jct_vs_best": _factor(jct[p], best_jct),
            "makespan_vs_best": span[p] / best_span if best_span > 0 else 1.0,
            "jain_below_best": best_fair - fair[p],
        }
        for p in schedulers
    }


def _factor(value: float, best: float) -> float | None:
    """``value`` as a factor of ``best`` (1.0 when both are 0); None: no value."""
    if value == math.inf:
        return None
    return value / best if best > 0 else 1.0


def format_versus_best(modes: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """The paper's Figure 4/5 table in markdown: per arrival mode and policy, average
    JCT, makespan and Jain's index, each beside the factor to the best policy."""
    rows = [
        "| arrivals | policy | avg JCT (s) | vs best | makespan (s) | vs best "
        "| Jain (mean) | below best |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode, schedulers in modes.items():
        rel = versus_best(schedulers)
        for p, s in schedulers.items():
            r = rel[p]
            factor = r["jct_vs_best"]
            rows.append(
                f"| {mode} | {p} | {s['jct_s']['mean']:,.1f} | "
                f"{'-' if factor is None else f'{factor:.2f}x'} "
                f"| {s['makespan_s']:,.1f} | {r['makespan_vs_best']:.2f}x "
                f"| {s['jain']['mean']:.3f} | {r['jain_below_best']:.3f} |"
            )
    return "\n".join(rows)


def policy_figures(
    sim: MeghaSimulation, res: SimResult, users: Sequence[UserConfig], jobs: Sequence[DagJob]
) -> dict[str, Any]:
    """One policy's figures: JCTs, makespan, Jain's index, the leftover its GMs' queues
    yielded and reused, the jobs' and tasks' fate and the allocation-time figures."""
    yielded = reused = 0.0
    for gm in sim.gms.values():
        q = gm.queues
        if isinstance(q, JobQueues):
            yielded += q.counters["leftover_yielded"]
            reused += q.counters["leftover_reused"]
    return {
        "jct_s": jct_stats(res.job_completion),
        "makespan_s": res.makespan_s,
        "jain": jain_windows(res, users, jobs),
        "leftover": {"yielded_share_s": yielded, "reused_share_s": reused},
        "jobs_completed": len(res.job_completion),
        "jobs_failed": len(res.failed_jobs),
        "failed_tasks": len(res.failed),
        "stuck_tasks": res.stuck,
        "preemptions": res.counters.get("preemptions", 0),
        "wall_s": res.wall_s,
        "job_jct_s": dict(res.job_completion),
        **summarize_tasks(res.tasks),
    }


def run_policies(
    jobs: list[DagJob],
    clusters: Sequence[ClusterSpec],
    gm_ids: Sequence[GmId],
    users: Sequence[UserConfig],
    policies: Sequence[str],
    config: SimConfig,
    seed: int,
    *,
    p_altruism: float = 1.0,
    out: Path | None = None,
    runner: Runner | None = None,
) -> dict[str, Any]:
    """Run ``jobs`` once per policy; returns ``{"schedulers": {policy: figures},
    "timing": {policy: cost of the run}}``.

    With ``out``, writes ``tasks-<policy>.csv`` (one row per task, as trace runs write
    ``tasks-<scheduler>.csv``) and ``shares-<policy>.png`` there; ``runner(policy, sim)``
    runs each simulation (e.g. with a progress bar), ``sim.run()`` by default.
    """
    for p in policies:
        if p not in POLICIES:
            raise ConfigError(
                f"unknown queue policy {p!r} (known: {', '.join(POLICIES)})",
                reason="unknown_policy",
            )
    cfg = copy.copy(config)
    if cfg.sample_usage_every_s is None:
        cfg.sample_usage_every_s = 1.0
    schedulers: dict[str, Any] = {}
    timing: dict[str, dict[str, float]] = {}
    for policy in policies:
        mine = copy.deepcopy(jobs)
        sim = MeghaSimulation(
            clusters,
            gm_ids,
            users,
            cfg,
            queues_factory=make_policy(policy, users, p_altruism=p_altruism, seed=seed),
        )
        sim.add_jobs(mine)
        res = runner(policy, sim) if runner is not None else sim.run()
        timing[policy] = timing_of(res)
        figures = policy_figures(sim, res, users, mine)
        schedulers[policy] = figures
        if out is not None:
            write_records_csv(out / f"tasks-{policy}.csv", res.tasks, res.failed)
            plot_shares(
                out / f"shares-{policy}.png",
                res.usage_samples.corners(),
                users,
                f"dominant share: {policy}",
            )
    return {"schedulers": schedulers, "timing": timing}


def _clusters_for(
    args: argparse.Namespace,
    width: int,
    gm_ids: Sequence[GmId],
    workers: int,
    lms: int,
    rng: random.Random,
    names: Sequence[str] = (),
) -> list[ClusterSpec]:
    """The simulated clusters: a job file named in a profile's resources runs on that
    profile's nodes, as live (``common.units``); otherwise on nodes of 100 units."""
    named = profile_named(names) if names else None
    if named is not None:
        return make_federation(workers, gm_ids, lms, named, False, rng)
    if width == 2 and getattr(args, "profile", "") == "paper":
        return make_federation(workers, gm_ids, lms, profile("paper"), False, rng)
    cap = DAG_NODE_CAPACITY.get(width, tuple([100] * width))
    base = make_federation(workers, gm_ids, lms, profile("slots"), False, rng)
    return [ClusterSpec(c.lm, [NodeSpec(cap) for _ in c.nodes], c.home, c.profile) for c in base]


def read_job_file(
    path: str | Path, profile_name: str, users: Sequence[UserConfig]
) -> tuple[tuple[str, ...], list[DagJob]]:
    """A megha-dag/1 file's jobs, or a megha-job/1 file's one job (``megha submit``'s):
    its demands in profile ``profile_name``'s units, as a live federation of that
    profile reads them (``common.units.check_demands``), run for the first of ``users``
    from time 0, its id its name.  Returns (resource names, jobs by arrival)."""
    doc = read_json(path)
    if not (isinstance(doc, dict) and doc.get("format") == jobspec.FORMAT):
        return parse_jobs(doc)
    job = jobspec.job_of_doc(doc, path)
    fed = profile(profile_name)
    check_demands(job, fed, str(path))
    return tuple(fed.names), [job.dag_job(job.name, users[0].user)]


def run_point(
    args: argparse.Namespace, workers: int, n_gms: int, n_lms: int, out: Path, runner: Runner
) -> dict[str, Any]:
    """``megha simulate --workload dag`` at one federation size: every policy on the
    same jobs, each run by ``runner``; writes ``out/summary.json``, task CSVs and share plots,
    returns the summary (with each policy's ``timing``, as trace runs give it)."""
    gm_ids = [GmId(f"gm{i}") for i in range(n_gms)]
    users = parse_users(args.users, gm_ids)
    rng = random.Random(args.seed)
    if args.jobs:
        names, jobs = read_job_file(args.jobs, args.profile, users)
        known = {u.user for u in users}
        unknown = sorted({j.user for j in jobs} - known)
        if unknown:
            raise ConfigError(
                f"job file users {unknown} are not configured (--users NAME:SHARE@GM,...)",
                reason="unknown_user",
            )
        width = len(names)
        limit = args.limit_jobs
    else:
        names = ()
        width = 2 if args.profile == "paper" else 1
        node = profile("paper").node_capacity if width == 2 else DAG_NODE_CAPACITY[1]
        jobs = synthetic_dag_jobs(
            args.jobs_count, rate=args.rate, users=users, node_capacity=node, rng=rng
        )
        limit = None
    # a job file is scaled as a trace is (and as synthetic DAGs are)
    jobs = scale_jobs(
        jobs, time_scale=args.time_scale, duration_scale=args.duration_scale, limit_jobs=limit
    )
    arrivals: str = args.arrivals
    jobs = with_arrivals(jobs, arrivals)
    clusters = _clusters_for(args, width, gm_ids, workers, n_lms, rng, names)
    cfg = config_from_args(args, sample_usage_every_s=1.0)
    policies = [p.strip() for p in (args.policies or DAG_POLICIES).split(",") if p.strip()]
    summary = run_policies(
        jobs, clusters, gm_ids, users, policies, cfg, args.seed,
        p_altruism=args.p_altruism, out=out, runner=runner,
    )  # fmt: skip
    timing = summary.pop("timing")
    summary.update(
        {
            "workload": "dag",
            "arrivals": arrivals,
            "jobs": len(jobs),
            "tasks": sum(len(j.tasks) for j in jobs),
            "dag": dag_stats(jobs),
            "workers": workers,
            "gms": len(gm_ids),
            "lms": n_lms,
            "seed": args.seed,
        }
    )
    summary["versus_best"] = versus_best(summary["schedulers"])
    write_json(out / "summary.json", summary)
    summary["timing"] = timing
    return summary
