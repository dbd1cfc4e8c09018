"""Does the simulator predict the live federation?  (issue 12; ``bench_sim.py`` scenarios)

* ``calibrate``: one synthetic workload, live (3 GMs x 3 LMs x 120 nodes, started with
  ``federation.processes`` and replayed by ``request_generator.bench``) and simulated
  with the costs measured from the live cores: ``simulator.costs.measure`` with the
  codec (decision, validation, message, update per node), the hop from the live floor
  (an empty signed request's round trip), and each service's fixed cost per message
  fitted to the CPU its live process spent (``simulator.costs.fit_service``).  Reports
  allocation p50 / p99 live and simulated and their ratio.
* ``predict``: a new live run (another load and seed) against the simulator charging
  the costs a calibration measured -- nothing fitted to the run it predicts.
* ``fig8``: simulated allocation time vs workers at fixed GMs / LMs (paper Fig. 8).
* ``fig9``: simulated allocation time vs number of GMs at fixed workers (paper Fig. 9).

The sweeps charge the calibrated costs (``--costs`` a calibration JSON; without it,
the cores' costs alone), the decision cost re-measured at each partition size.
Each writes JSON, CSV and a PNG under ``--out``.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.cluster import make_federation, profile
from common.config import FederationConfig
from common.ids import GmId
from common.metrics import percentiles
from common.model import UserConfig
from simulator.config import SimConfig
from simulator.costs import CoreCosts, fit_service, measure
from simulator.megha_sim import MeghaSimulation, SimResult
from workload.jobs import Job
from workload.synthetic import WorkloadSpec, synthetic_jobs

LIVE_GMS, LIVE_LMS, LIVE_NODES = 3, 3, 120
CLK_TCK = os.sysconf("SC_CLK_TCK")
IDLE_S = 5.0
"""Seconds the live federation idles before the replay, to measure its idle CPU."""


# ------------------------------------------------------------------ live side
def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its children (gunicorn's worker)."""
    total = 0.0
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == pid:
                pids.append(int(entry.name))
    for p in pids:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def live_config(base_port: int, name: str) -> FederationConfig:
    return replace(
        FederationConfig(),
        name=name,
        gms=LIVE_GMS,
        lms=LIVE_LMS,
        nodes_per_lm=LIVE_NODES // LIVE_LMS,
        base_port=base_port,
        constraints=False,
    ).validate()


def live_workload(args: Any) -> dict[str, Any]:
    """``args.jobs`` jobs of 4 tasks of 0.5 s at ``args.load`` of the live federation
    (120 one-slot nodes, mean task 0.5 s: 240 tasks/s of capacity)."""
    return {
        "jobs": args.jobs,
        "tasks_per_job": 4,
        "mean_duration": 0.5,
        "job_rate": args.load * LIVE_NODES / 0.5 / 4,
        "seed": args.seed,
    }


def run_live(cfg: FederationConfig, home: Path, wl: dict[str, Any], out: Path) -> dict[str, Any]:
    """Start the federation, replay the workload, stop it; the bench summary plus the
    CPU seconds each GM and LM process spent during the replay."""
    from federation.processes import start_federation, stop_federation
    from federation.provision import purge
    from request_generator.bench import BenchOptions, bench

    started = start_federation(cfg, home, quiet=True)
    try:
        procs = {spec.name: pid for spec, pid in started if spec.role in ("gm", "lm")}
        # what each process spends idle (heartbeats, state updates): not the workload's
        idle0 = {n: _cpu_s(p) for n, p in procs.items()}
        time.sleep(IDLE_S)
        before = {n: _cpu_s(p) for n, p in procs.items()}
        idle = {n: (before[n] - idle0[n]) / IDLE_S for n in procs}
        t0 = time.monotonic()
        opts = BenchOptions(
            jobs=wl["jobs"],
            tasks_per_job=wl["tasks_per_job"],
            mean_duration=wl["mean_duration"],
            job_rate=wl["job_rate"],
            seed=wl["seed"],
            out=str(out / "live"),
            progress=False,
            floor_samples=300,
            timeout_s=180.0,
        )
        summary = bench(cfg, opts, home)
        span = time.monotonic() - t0
        cpu = {n: max(0.0, _cpu_s(p) - before[n] - idle[n] * span) for n, p in procs.items()}
    finally:
        stop_federation(home)
        purge(cfg, home)
    summary["cpu_s"] = cpu
    return summary


# ------------------------------------------------------------- simulated side
def workload(cfg: FederationConfig, wl: dict[str, Any]) -> list[Job]:
    """The jobs ``request_generator.bench`` replays for the same options (same seed)."""
    spec = WorkloadSpec(profile=cfg.profile, constraints=cfg.constraints)
    return synthetic_jobs(
        wl["jobs"],
        rate=wl["job_rate"],
        tasks_per_job=wl["tasks_per_job"],
        mean_duration=wl["mean_duration"],
        spec=spec,
        users=cfg.user_configs,
        rng=random.Random(wl["seed"]),
    )


def sim_config(costs: CoreCosts, hop_s: float, **kw: Any) -> SimConfig:
    """A simulation charging ``costs`` (the cores with the codec) and ``hop_s`` a hop."""
    return SimConfig(
        network_delay_s=hop_s,
        gm_decision_s=costs.gm_decision_s,
        lm_validation_s=costs.lm_validation_s,
        gm_message_s=costs.gm_message_s,
        lm_message_s=costs.lm_message_s,
        update_node_s=costs.update_node_s,
        lm_update_node_s=costs.update_node_s,
        **kw,
    )


def simulate(
    clusters: Any, gms: Sequence[GmId], users: Sequence[UserConfig], jobs: list[Job], cfg: SimConfig
) -> tuple[SimResult, MeghaSimulation]:
    sim = MeghaSimulation(clusters, gms, users, cfg)
    sim.add_jobs(jobs)
    return sim.run(), sim


def hop_samples(rtt: dict[str, float], idle_p50: float, n: int = 1000) -> tuple[float, ...]:
    """``n`` one-way hop times whose quantiles follow the measured round trips'
    (p50, p90, p99, p99.9, max; the idle p50 at the bottom), halved."""
    qs = [(0.0, min(idle_p50, rtt["p50"])), (0.5, rtt["p50"]), (0.9, rtt["p90"])]
    qs += [(0.99, rtt["p99"]), (0.999, rtt["p999"]), (1.0, rtt["max"])]
    out = []
    for k in range(n):
        q = (k + 0.5) / n
        for (q0, v0), (q1, v1) in itertools.pairwise(qs):
            if q0 <= q <= q1:
                out.append((v0 + (v1 - v0) * (q - q0) / (q1 - q0)) / 2)
                break
    return tuple(out)


def _alloc(tasks: Sequence[Any]) -> dict[str, float]:
    return percentiles([t.allocation_time for t in tasks if t.started_at >= 0])


def _load(sim: MeghaSimulation, prefix: str) -> tuple[float, int]:
    load = sim.server_load()
    busy = sum(v["busy_s"] for k, v in load.items() if k.startswith(prefix))
    handled = sum(int(v["handled"]) for k, v in load.items() if k.startswith(prefix))
    return busy, handled


def _fit_services(cpu_s: dict[str, float], sim: MeghaSimulation) -> tuple[float, float]:
    """Each GM's and LM's fixed cost per message: the CPU their live processes spent
    (``cpu_s``) less the busy time the cores alone took in ``sim``, per message."""
    gm_cpu = sum(v for k, v in cpu_s.items() if k.startswith("gm"))
    # lm0 also answers the bench's floor probes: the other LMs stand for it
    others = [v for k, v in cpu_s.items() if k.startswith("lm") and k != "lm0"]
    lm_cpu = sum(others) / len(others) * LIVE_LMS
    gm_busy, gm_n = _load(sim, "gm")
    lm_busy, lm_n = _load(sim, "lm")
    return fit_service(gm_cpu, gm_busy, gm_n), fit_service(lm_cpu, lm_busy, lm_n)


def calibrate(args: Any) -> dict[str, Any]:
    """Live and simulated, the same workload; their allocation p50 / p99."""
    out = Path(args.out_dir)
    home = Path(os.environ.get("MEGHA_HOME", f"/tmp/megha-{args.name}")) / "calibrate"
    cfg = replace(live_config(args.base_port, args.name), decide_batch=64)
    wl = live_workload(args)
    t0 = time.time()
    live = run_live(cfg, home, wl, out)
    live_wall = time.time() - t0
    floor = live["floor"]["lm_s"]["p50"]
    costs = measure(LIVE_NODES // (LIVE_LMS * LIVE_GMS), repeats=3, batch=300, wire=True)
    clusters = cfg.clusters
    jobs = workload(cfg, wl)
    n_tasks = sum(len(j.tasks) for j in jobs)
    base = sim_config(costs, floor / 2, update_period_s=cfg.heartbeat_s, batch=cfg.decide_batch)
    # 1. the cores alone: how much busy time and how many messages per server
    res0, sim0 = simulate(clusters, cfg.gm_ids, cfg.user_configs, workload(cfg, wl), base)
    gm_service, lm_service = _fit_services(live["cpu_s"], sim0)
    # 2. with each service's fixed cost, and hops drawn from the round trips of an
    #    empty request to an LM measured during the replay (one way: half of one)
    hops = hop_samples(live["floor"]["lm_during_run_s"], live["floor"]["lm_s"]["p50"])
    hop = floor / 2
    cal = replace(base, gm_service_s=gm_service, lm_service_s=lm_service, hop_samples_s=hops)
    res1, _ = simulate(clusters, cfg.gm_ids, cfg.user_configs, jobs, cal)
    live_a = live["allocation_time_s"]
    sim_a = _alloc(res1.tasks)
    core_a = _alloc(res0.tasks)
    report = {
        "scenario": "calibrate",
        "federation": {"gms": LIVE_GMS, "lms": LIVE_LMS, "nodes": LIVE_NODES},
        "workload": {**wl, "tasks": n_tasks},
        "live": {
            "allocation_s": live_a,
            "components_s": live["components_s"],
            "floor_lm_s": live["floor"]["lm_s"],
            "floor_lm_during_run_s": live["floor"]["lm_during_run_s"],
            "cpu_s": live["cpu_s"],
            "tasks": live["tasks"],
            "unfinished_tasks": live["unfinished_tasks"],
            "wall_s": round(live_wall, 1),
        },
        "costs": {
            **costs.as_dict(),
            "hop_s": hop,
            "hop_samples_p50_s": statistics.median(hops),
            "gm_service_s": gm_service,
            "lm_service_s": lm_service,
        },
        "simulated": {"allocation_s": sim_a, "components_s": _components(res1)},
        "simulated_cores_only": {"allocation_s": core_a},
        "ratio_sim_over_live": {
            "p50": sim_a["p50"] / live_a["p50"] if live_a["p50"] > 0 else 0.0,
            "p99": sim_a["p99"] / live_a["p99"] if live_a["p99"] > 0 else 0.0,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
    }
    _write(out, "calibrate", report, [_row("live", live_a), _row("simulated", sim_a),
                                       _row("simulated, cores only", core_a)])  # fmt: skip
    return report


def predict(args: Any) -> dict[str, Any]:
    """A new live run (``--load``, ``--seed``) against the simulator charging what
    ``--costs`` (a calibrate.json) measured: nothing fitted to this run."""
    if not args.costs:
        raise SystemExit("predict needs --costs, a calibrate.json")
    cal = json.loads(Path(args.costs).read_text())
    c = cal["costs"]
    out = Path(args.out_dir)
    home = Path(os.environ.get("MEGHA_HOME", f"/tmp/megha-{args.name}")) / "predict"
    cfg = replace(live_config(args.base_port, args.name), decide_batch=64)
    wl = live_workload(args)
    jobs = workload(cfg, wl)
    costs = CoreCosts(**{k: c[k] for k in CoreCosts.__dataclass_fields__})
    hops = hop_samples(cal["live"]["floor_lm_during_run_s"], cal["live"]["floor_lm_s"]["p50"])
    sim_cfg = sim_config(
        costs, c["hop_s"], update_period_s=cfg.heartbeat_s, batch=cfg.decide_batch,
        gm_service_s=c["gm_service_s"], lm_service_s=c["lm_service_s"], hop_samples_s=hops,
    )  # fmt: skip
    res, _ = simulate(cfg.clusters, cfg.gm_ids, cfg.user_configs, jobs, sim_cfg)
    sim_a = _alloc(res.tasks)
    live = run_live(cfg, home, wl, out / "predict")
    live_a = live["allocation_time_s"]
    report = {
        "scenario": "predict",
        "calibration": args.costs,
        "workload": {**wl, "tasks": sum(len(j.tasks) for j in jobs)},
        "live": {
            "allocation_s": live_a,
            "floor_lm_during_run_s": live["floor"]["lm_during_run_s"],
            "cpu_s": live["cpu_s"],
            "unfinished_tasks": live["unfinished_tasks"],
        },
        "predicted": {"allocation_s": sim_a},
        "ratio_sim_over_live": {
            "p50": sim_a["p50"] / live_a["p50"] if live_a["p50"] > 0 else 0.0,
            "p99": sim_a["p99"] / live_a["p99"] if live_a["p99"] > 0 else 0.0,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg": os.getloadavg()},
    }
    _write(out, "predict", report, [_row("live", live_a), _row("predicted", sim_a)])
    return report


def _components(res: SimResult) -> dict[str, float]:
    from reporting.tally import summarize_tasks

    started = [t for t in res.tasks if t.started_at >= 0]
    comps: dict[str, float] = summarize_tasks(started)["components_s"]
    return comps


def _row(label: str, a: dict[str, float]) -> dict[str, Any]:
    return {"label": label, "p50_ms": a["p50"] * 1e3, "p99_ms": a["p99"] * 1e3}


# -------------------------------------------------------------------- sweeps
def _sweep_costs(path: str | None) -> dict[str, float]:
    if not path:
        return {}
    c = json.loads(Path(path).read_text())["costs"]
    return {k: c[k] for k in ("hop_s", "gm_service_s", "lm_service_s")}


def sweep_point(
    workers: int, n_gms: int, n_lms: int, args: Any, extra: dict[str, float]
) -> dict[str, Any]:
    """One simulated federation size under the synthetic sweep workload."""
    gms = [GmId(f"gm{i}") for i in range(n_gms)]
    users = [UserConfig(u.user, u.gm, u.share) for u in _users(gms)]
    rng = random.Random(args.seed)
    clusters = make_federation(workers, gms, n_lms, profile("slots"), False, rng)
    partition = max(1, workers // (n_lms * n_gms))
    costs = measure(min(partition, 5000), repeats=1, batch=200, wire=True)
    hop = extra.get("hop_s", 0.0005)
    cfg = sim_config(
        costs, hop, update_period_s=1.0, batch=64,
        gm_service_s=extra.get("gm_service_s", 0.0), lm_service_s=extra.get("lm_service_s", 0.0),
    )  # fmt: skip
    # load: args.load of the workers' slots, tasks of mean 1 s, 10 tasks per job
    per_job, mean = 10, 1.0
    rate = args.load * workers / mean / per_job
    n_jobs = max(50, int(rate * args.sweep_seconds))
    jobs = synthetic_jobs(
        n_jobs, rate=rate, tasks_per_job=per_job, mean_duration=mean,
        spec=WorkloadSpec(constraints=False), users=users, rng=random.Random(args.seed),
    )  # fmt: skip
    t0 = time.perf_counter()
    res, sim = simulate(clusters, gms, users, jobs, cfg)
    a = _alloc(res.tasks)
    load = sim.server_load()
    span = max(res.virtual_s, 1e-9)
    return {
        "workers": workers,
        "gms": n_gms,
        "lms": n_lms,
        "tasks": len(res.tasks),
        "p50_ms": a["p50"] * 1e3,
        "p99_ms": a["p99"] * 1e3,
        "max_ms": a["max"] * 1e3,
        "gm_utilization": max(v["busy_s"] for k, v in load.items() if k.startswith("gm")) / span,
        "lm_utilization": max(v["busy_s"] for k, v in load.items() if k.startswith("lm")) / span,
        "decision_us": costs.gm_decision_s * 1e6,
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def _users(gms: Sequence[GmId]) -> list[UserConfig]:
    from common.ids import UserId

    return [UserConfig(UserId(f"u{i}"), g, 1.0 / len(gms)) for i, g in enumerate(gms)]


def fig8(args: Any) -> dict[str, Any]:
    extra = _sweep_costs(args.costs)
    rows = [sweep_point(int(w), args.gms, args.lms, args, extra) for w in args.workers.split(",")]
    report = {"scenario": "fig8", "costs": extra, "load": args.load, "rows": rows}
    _write(Path(args.out_dir), "fig8", report, rows, x="workers")
    return report


def fig9(args: Any) -> dict[str, Any]:
    extra = _sweep_costs(args.costs)
    rows = [
        sweep_point(args.fixed_workers, int(g), args.lms, args, extra)
        for g in args.gm_counts.split(",")
    ]
    report = {"scenario": "fig9", "costs": extra, "load": args.load, "rows": rows}
    _write(Path(args.out_dir), "fig9", report, rows, x="gms")
    return report


def _write(
    out: Path, name: str, report: dict[str, Any], rows: list[dict[str, Any]], x: str = ""
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(report, indent=2, default=float))
    with (out / f"{name}.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if x:
        xs = [r[x] for r in rows]
        ax.plot(xs, [r["p50_ms"] for r in rows], "o-", label="p50")
        ax.plot(xs, [r["p99_ms"] for r in rows], "s-", label="p99")
        ax.set_xlabel(x)
        ax.set_xscale("log", base=2 if x == "gms" else 10)
        ax.set_xticks(xs, [f"{v:,}" for v in xs])
        ax.set_yscale("log")
    else:
        labels = [r["label"] for r in rows]
        pos = list(range(len(rows)))
        ax.bar([p - 0.2 for p in pos], [r["p50_ms"] for r in rows], 0.4, label="p50")
        ax.bar([p + 0.2 for p in pos], [r["p99_ms"] for r in rows], 0.4, label="p99")
        ax.set_xticks(pos, labels)
    ax.set_ylabel("allocation time (ms)")
    ax.set_title(f"{name}: allocation time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)


SCENARIOS = {"calibrate": calibrate, "predict": predict, "fig8": fig8, "fig9": fig9}


def add_arguments(ap: Any) -> None:
    """The options of these scenarios on ``bench_sim.py``'s parser."""
    ap.add_argument("--out-dir", default="results/sim_fidelity")
    ap.add_argument("--base-port", type=int, default=19700)
    ap.add_argument("--name", default="fid", help="live federation name")
    ap.add_argument("--jobs", type=int, default=600, help="calibrate: jobs of 4 tasks")
    ap.add_argument("--load", type=float, default=0.5, help="fraction of the slots offered")
    ap.add_argument("--costs", default=None, help="sweeps: a calibrate.json to charge")
    ap.add_argument("--workers", default="1000,2500,5000,10000", help="fig8: workers")
    ap.add_argument("--gms", type=int, default=4, help="fig8: GMs")
    ap.add_argument("--lms", type=int, default=10, help="fig8/fig9: LMs")
    ap.add_argument("--fixed-workers", type=int, default=10000, help="fig9: workers")
    ap.add_argument("--gm-counts", default="1,2,4,8", help="fig9: GMs")
    ap.add_argument("--sweep-seconds", type=float, default=20.0, help="sweeps: arrival span")
