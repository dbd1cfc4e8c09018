"""Live federation benchmark: 3 GMs, 3 LMs, 120 nodes on this machine.

Measures allocation time (p50/p99/max) and the floor round trip in the same run,
at 50% of the federation's capacity and at increasing fixed rates until the
federation no longer keeps up; reports the highest sustained tasks/s.  Before the
steps, the floor is also taken on the idle federation one ping every 20 ms
(``floor_spaced``): what a request that comes alone pays.

    python benchmarks/bench_live.py --out results/bench_live.json

With ``--profile-rate R`` the step at R tasks/s is sampled with py-spy in every
service process (GMs, LMs, worker pools) and this client; the collapsed stacks go to
``bench_live/profile/<service>.txt`` and each role's top functions (share of samples,
self and inclusive) into the JSON under ``"profile"``.

Needs RabbitMQ on 127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig, parse_config
from common.metrics import percentiles
from federation.processes import service_pids, start_federation, stop_federation
from federation.provision import purge
from request_generator.bench import BenchOptions, bench, measure_floor
from runtime import h1
from security.access import Access
from security.identity import lm as lm_identity

NODES = 120
TOP = 12


def _start_profilers(home: Path, where: Path, seconds: float) -> list[subprocess.Popen[bytes]]:
    if shutil.which("py-spy") is None:
        raise SystemExit("--profile-rate needs py-spy (pip install py-spy)")
    where.mkdir(parents=True, exist_ok=True)
    spies = []
    for name, pid in [*service_pids(home).items(), ("bench_client", os.getpid())]:
        argv = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds) + 1),
                "--rate", "250", "--format", "raw", "--nonblocking", "--gil",
                "--output", str(where / f"{name}.txt")]  # fmt: skip
        spies.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return spies


PROJECT = ("common/", "global_master/", "local_master/", "worker/", "runtime/", "security/")
LOOP = "GunicornWebWorker.run (aiohttp/worker.py"
"""The leaf of samples spent in the event loop itself (uvloop in C: I/O).  Samples are
taken only while the process holds the GIL (``--gil``): idle waits are not counted, but
a process descheduled while it holds it (a socket write that woke its receiver) is."""


def _top_functions(where: Path) -> dict[str, Any]:
    """Per role (gm, lm, workers): the share of samples in the event loop itself, the
    functions with most samples of their own, and the project's functions by inclusive
    share (what a change in our code could save)."""
    roles: dict[str, tuple[Counter[str], Counter[str]]] = {}
    for f in sorted(where.glob("*.txt")):
        role = "workers" if f.stem.endswith("-workers") else f.stem.rstrip("0123456789")
        own, incl = roles.setdefault(role, (Counter(), Counter()))
        for line in f.read_text(errors="replace").splitlines():
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():  # a line py-spy cut short as it stopped
                continue
            frames = stack.split(";")
            own[frames[-1]] += int(n)
            for fr in set(frames):
                if fr.split(" (")[-1].startswith(PROJECT):
                    incl[fr] += int(n)
    out: dict[str, Any] = {}
    for role, (own, incl) in roles.items():
        total = sum(own.values()) or 1
        loop = sum(n for fr, n in own.items() if fr.startswith(LOOP))
        out[role] = {
            "samples": total,
            "event_loop_share": round(loop / total, 3),
            "self": [
                [fr, round(n / total, 3)]
                for fr, n in own.most_common(TOP + 1)
                if not fr.startswith(LOOP)
            ][:TOP],
            "project_inclusive": [[fr, round(n / total, 3)] for fr, n in incl.most_common(TOP)],
        }
    return out


def _cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds a process has used so far, in user mode and in the kernel (system
    calls: sockets, wake-ups); 0 once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _broker_pids() -> list[int]:
    """The RabbitMQ node's Erlang VM (beam.smp) on this machine."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "beam.smp":
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _io_of(pid: int) -> tuple[int, int, int]:
    """A process's read-class and write-class system calls so far (``/proc/PID/io``:
    sockets, files and pipes) and its context switches (voluntary and not); zeros once
    it has gone or where the kernel does not say."""
    try:
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (OSError, ValueError):
        return 0, 0, 0
    switches = sum(int(x.split()[1]) for x in status if "ctxt_switches:" in x)
    return int(io.get("syscr", 0)), int(io.get("syscw", 0)), switches


def _pids_by_role(home: Path) -> dict[str, list[int]]:
    """The processes of each role: GMs, LMs, worker pools, the broker and this client."""
    pids: defaultdict[str, list[int]] = defaultdict(list)
    for name, pid in service_pids(home).items():
        pids["workers" if name.endswith("-workers") else name.rstrip("0123456789")].append(pid)
    pids["broker"] = _broker_pids()
    pids["bench_client"] = [os.getpid()]
    return pids


def _io_by_role(home: Path) -> dict[str, tuple[int, int, int]]:
    """Read and write system calls and context switches so far, per role (as
    ``_cpu_by_role``)."""
    out = {}
    for role, ps in _pids_by_role(home).items():
        got = [_io_of(p) for p in ps]
        out[role] = (sum(g[0] for g in got), sum(g[1] for g in got), sum(g[2] for g in got))
    return out


def _syscalls_per_task(
    io0: dict[str, tuple[int, int, int]], io1: dict[str, tuple[int, int, int]], tasks: int
) -> dict[str, dict[str, float]]:
    """System calls (reads, writes: sockets, journals) and context switches per task,
    per role, between two ``_io_by_role``."""
    return {
        role: {
            what: round((c[i] - io0.get(role, (0, 0, 0))[i]) / tasks, 3)
            for i, what in enumerate(("reads", "writes", "switches"))
        }
        for role, c in io1.items()
    }


def _cpu_by_role(home: Path) -> dict[str, tuple[float, float]]:
    """CPU seconds (user, system) used so far by the GMs, LMs, worker pools, broker and
    this client."""
    out = {}
    for role, ps in _pids_by_role(home).items():
        times = [_cpu_s(p) for p in ps]
        out[role] = (sum(u for u, _ in times), sum(k for _, k in times))
    return out


def _per_task(
    traffic: dict[str, dict[str, int]], before: dict[str, dict[str, int]], tasks: int
) -> dict[str, dict[str, float]]:
    """Messages per task on each path during one step, and items per message."""
    out = {}
    for path, t in sorted(traffic.items()):
        b = before.get(path, {"messages": 0, "items": 0})
        msgs, items = t["messages"] - b["messages"], t["items"] - b["items"]
        out[path] = {
            "messages_per_task": round(msgs / max(tasks, 1), 3),
            "items_per_message": round(items / max(msgs, 1), 2),
        }
    return out


def _ends_at_gms(services: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per point of an end's way to its GM, the task ends that passed it so far and their
    summed lag there (the end on the worker -> that point) in microseconds (kept between
    steps beside the traffic): the pool's reports leaving, the LM taking them, its events
    leaving, and the GM taking them (``gm``: the GM core's ``end_lag_s``)."""
    out = {p: {"ends": 0, "lag_us": 0} for p in END_POINTS}

    def add(point: str, ends: Any, lag_s: Any) -> None:
        out[point]["ends"] += int(ends)
        out[point]["lag_us"] += round(1e6 * float(lag_s))

    for name, page in services.items():
        if name.startswith("gm"):
            c = page.get("counters", {})
            add("gm", c.get("ends_seen", 0), c.get("end_lag_s", 0.0))
        for point, e in page.get("end_lag", {}).items():
            add(point, e["ends"], e["lag_s"])
    return out


END_POINTS = ("pool_sent", "lm_got", "lm_sent", "gm")


def _end_segments(ends: dict[str, dict[str, int]], ends0: dict[str, Any]) -> dict[str, float]:
    """A step's mean lag (ms) at each point, and each segment's share: the pool's wait
    (``pool_linger``), its hop to the LM, the LM's wait, its hop to the GM (the broker)."""
    at: dict[str, float] = {}
    for p in END_POINTS:
        e0 = ends0.get(p, {"ends": 0, "lag_us": 0})
        n = ends[p]["ends"] - e0["ends"]
        if n > 0:
            at[p] = (ends[p]["lag_us"] - e0["lag_us"]) / 1e3 / n
    out = {f"at_{p}_ms": round(v, 2) for p, v in at.items()}
    if len(at) == len(END_POINTS):
        out["pool_linger_ms"] = round(at["pool_sent"], 2)
        out["pool_to_lm_ms"] = round(at["lm_got"] - at["pool_sent"], 2)
        out["lm_linger_ms"] = round(at["lm_sent"] - at["lm_got"], 2)
        out["lm_to_gm_ms"] = round(at["gm"] - at["lm_sent"], 2)
    return out


def _gc_by_role(services: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per role, the collector's passes so far (full ones apart), their total pause and
    the longest pause of any process (``runtime.gcwatch``)."""
    out: dict[str, dict[str, float]] = {}
    for name, page in services.items():
        gens = page.get("gc", {}).get("generations")
        if not gens:
            continue
        role = "workers" if name.endswith("-workers") else name.rstrip("0123456789")
        r = out.setdefault(role, {"collections": 0, "full": 0, "pause_s": 0.0, "max_s": 0.0})
        r["collections"] += sum(g["collections"] for g in gens)
        r["full"] += gens[-1]["collections"]
        r["pause_s"] += sum(g["pause_total_s"] for g in gens)
        r["max_s"] = max(r["max_s"], max(g["pause_max_s"] for g in gens))
    return out


def _step(
    cfg: FederationConfig,
    home: Path,
    out: Path,
    label: str,
    before: dict[str, Any],
    profile: bool = False,
    **kw: Any,
) -> dict[str, Any]:
    opts = BenchOptions(out=str(out / label), progress=False, floor_samples=300, **kw)
    t = time.time()
    seconds = kw.get("jobs", 0) / max(kw.get("rate") or kw.get("job_rate") or 1.0, 1e-9)
    spies = _start_profilers(home, out / "profile", seconds) if profile else []
    cpu0, io0 = _cpu_by_role(home), _io_by_role(home)
    s = bench(cfg, opts, home)
    cpu1, io1 = _cpu_by_role(home), _io_by_role(home)
    for spy in spies:
        spy.wait(timeout=60)
    offered = s["offered_tasks_per_s"]
    n = max(s["tasks"], 1)
    ends = _ends_at_gms(s["services"])
    ends0: dict[str, Any] = before.get("gm_ends", {})
    gm0 = ends0.get("gm", {"ends": 0, "lag_us": 0})
    ended = ends["gm"]["ends"] - gm0["ends"]
    zero = (0.0, 0.0)
    used = {r: (u - cpu0.get(r, zero)[0], k - cpu0.get(r, zero)[1]) for r, (u, k) in cpu1.items()}
    row = {
        "label": label,
        "offered_tasks_per_s": round(offered, 1),
        "throughput_tasks_per_s": round(s["throughput_tasks_per_s"], 1),
        "tasks": s["tasks"],
        "unfinished_tasks": s["unfinished_tasks"],
        "failed_tasks": s["tasks_failed"],
        "allocation_s": s["allocation_time_s"],
        "components_s": s["components_s"],
        "floor_rtt_s": s["floor_rtt_s"],
        "floor": s["floor"],
        "counters": s["counters"],  # this step's (bench reports a run's own)
        "traffic": _per_task(s["traffic"], before, s["tasks"]),
        # how long a GM's view still held a slot after its task ended (mean over the step)
        "end_to_gm_s": round((ends["gm"]["lag_us"] - gm0["lag_us"]) / 1e6 / max(ended, 1), 6),
        "end_path_ms": _end_segments(ends, ends0),
        "gc_since_start": _gc_by_role(s["services"]),
        "wall_s": round(time.time() - t, 1),
        # CPU per task, whatever else the machine does: 2 cores give 2,000 CPU-ms a second
        "cpu_ms_per_task": {role: round(1e3 * (u + k) / n, 3) for role, (u, k) in used.items()},
        # of that, the share spent in the kernel (system calls: messages, wake-ups)
        "cpu_system_share": {role: round(k / max(u + k, 1e-9), 2) for role, (u, k) in used.items()},
    }
    row["cpu_ms_per_task"]["total"] = round(sum(row["cpu_ms_per_task"].values()), 3)
    row["syscalls_per_task"] = _syscalls_per_task(io0, io1, n)
    before.clear()
    before.update(s["traffic"])
    before["gm_ends"] = ends
    if profile:
        row["profile"] = _top_functions(out / "profile")
    _say(label, row, s)
    return row


def _say(label: str, row: dict[str, Any], s: dict[str, Any]) -> None:
    """A step's line: offered and placed rates, allocation p50 / p99 / max, the floor."""
    print(
        f"{label:>14}: offered {s['offered_tasks_per_s']:7.1f}/s  got "
        f"{row['throughput_tasks_per_s']:7.1f}/s  "
        f"p50 {s['allocation_time_s']['p50'] * 1e3:8.2f} ms  p99 "
        f"{s['allocation_time_s']['p99'] * 1e3:8.2f} ms  max "
        f"{s['allocation_time_s']['max'] * 1e3:8.2f} ms  floor {s['floor_rtt_s'] * 1e3:.3f} ms",
        flush=True,
    )


SPACING_S = 0.02
"""How far apart the spaced floor's pings go: about how far apart one LM's launches
come at 50% load."""


async def _spaced_floor(cfg: FederationConfig, home: Path, n: int = 150) -> dict[str, Any]:
    """The floor round trip (an empty signed POST to an LM) on the idle federation, back
    to back and one every ``SPACING_S``: a request that comes alone finds the processes
    (and the machine's vCPUs) asleep and pays their wake-up, which back-to-back pings
    never do."""
    access, lm0 = Access.in_home(home, cfg), cfg.lm_ids[0]
    url, who = cfg.lm_url(lm0), lm_identity(lm0)
    client = h1.Client(limit_per_host=1, timeout_s=30.0)
    try:
        back = await measure_floor(client, url, access, who, n)
        spaced: list[float] = []
        for _ in range(n):
            spaced += await measure_floor(client, url, access, who, 1)
            await asyncio.sleep(SPACING_S)
    finally:
        await client.close()
    return {
        "spacing_s": SPACING_S,
        "back_to_back_s": percentiles(back),
        "spaced_s": percentiles(spaced),
    }


P99_AT_RATE_S = 0.050
"""A rate counts as sustained only with allocation p99 within this (issue 8's bound)."""


def sustained(row: dict[str, Any]) -> bool:
    """Kept up: every task finished in time, throughput within 10% of the offered rate,
    p99 <= 50 ms."""
    return bool(
        row["unfinished_tasks"] == 0
        and row["throughput_tasks_per_s"] >= 0.9 * row["offered_tasks_per_s"]
        and row["allocation_s"]["p99"] <= P99_AT_RATE_S
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench_live.json")
    ap.add_argument("--base-port", type=int, default=18800)
    ap.add_argument(
        "--queue-type", default=FederationConfig.queue_type, choices=["quorum", "classic"]
    )
    ap.add_argument("--seconds", type=float, default=8.0, help="submission time per step")
    ap.add_argument(
        "--rates", default="250,500,1000,1500,2000,2500", help="tasks/s steps for the ramp"
    )
    ap.add_argument(
        "--profile-rate", type=float, help="sample every service with py-spy at this ramp step"
    )
    ap.add_argument("--no-ramp-stop", action="store_true", help="run every ramp step")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a federation config value (TOML), e.g. --set heartbeat_s=0.1; repeatable",
    )  # fmt: skip
    return ap


def _config(args: argparse.Namespace) -> tuple[FederationConfig, dict[str, Any]]:
    """The federation measured (3 GMs x 3 LMs x ``NODES``), with ``--set``'s overrides."""
    try:
        overrides = tomllib.loads("\n".join(args.set))
    except tomllib.TOMLDecodeError as exc:
        raise SystemExit(f"--set: {exc}") from exc
    cfg = replace(
        parse_config(overrides),
        name=f"bench-live-{os.getpid()}",
        gms=3,
        lms=3,
        nodes_per_lm=NODES // 3,
        base_port=args.base_port,
        queue_type=args.queue_type,
    ).validate()
    return cfg, overrides


def _steps(
    cfg: FederationConfig, home: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The spaced floor, the 50% load step, then the ramp (until a rate is not sustained,
    unless ``--no-ramp-stop``): the steps' rows and the floor."""
    where = Path(args.out).parent / "bench_live"
    rows: list[dict[str, Any]] = []
    traffic: dict[str, Any] = {}  # the counts after the previous step
    spaced = asyncio.run(_spaced_floor(cfg, home))
    # 50% load: 120 one-slot nodes, 0.5 s tasks -> capacity 240 tasks/s; offer 120/s.
    per_job = 4
    mean = 0.5
    rate = 0.5 * NODES / mean
    rows.append(
        _step(
            cfg, home, where, "load50", traffic,
            jobs=int(rate * args.seconds / per_job), tasks_per_job=per_job,
            mean_duration=mean, job_rate=rate / per_job,
        )
    )  # fmt: skip
    # Ramp: short tasks (20 ms, capacity 6,000/s) so the scheduler is the limit.
    per_job = 10
    for r in (float(x) for x in args.rates.split(",")):
        row = _step(
            cfg, home, where, f"rate{int(r)}", traffic,
            jobs=int(r * args.seconds / per_job), tasks_per_job=per_job,
            mean_duration=0.02, rate=r / per_job, timeout_s=120.0,
            profile=r == args.profile_rate,
        )  # fmt: skip
        rows.append(row)
        if not sustained(row) and not args.no_ramp_stop:
            break
    return rows, spaced


def _result(
    cfg: FederationConfig,
    overrides: dict[str, Any],
    rows: list[dict[str, Any]],
    spaced: dict[str, Any],
    load_before: tuple[float, float, float],
) -> dict[str, Any]:
    """``bench_live.json``: the federation, the machine, every step, what was sustained,
    the floors and the targets."""
    ok = [r for r in rows[1:] if sustained(r)]
    return {
        "federation": {
            "overrides": overrides,
            "gms": 3,
            "lms": 3,
            "nodes": NODES,
            "profile": cfg.profile,
            "queue_type": cfg.queue_type,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "load50": rows[0],
        "ramp": rows[1:],
        "sustained_tasks_per_s": max((r["throughput_tasks_per_s"] for r in ok), default=0.0),
        "at_highest_sustained": ok[-1] if ok else None,
        "load50_p50_in_floors": round(
            rows[0]["allocation_s"]["p50"] / max(rows[0]["floor_rtt_s"], 1e-9), 2
        ),
        "floor_spaced": spaced,
        "load50_p50_in_spaced_floors": round(
            rows[0]["allocation_s"]["p50"] / max(spaced["spaced_s"]["p50"], 1e-9), 2
        ),
        "targets": {
            "load50_p50_in_floors": 3.0,
            "load50_p99_s": 0.010,
            "tasks_per_s": 2000,
            "p99_s_at_rate": P99_AT_RATE_S,
        },
    }


def main() -> int:
    args = _parser().parse_args()
    out = Path(args.out)
    cfg, overrides = _config(args)
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))  # pids, config, service logs
    load1 = os.getloadavg()
    start_federation(cfg, home)
    try:
        rows, spaced = _steps(cfg, home, args)
    finally:
        stop_federation(home)
        purge(cfg, home)
    result = _result(cfg, overrides, rows, spaced, load1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"floor idle: back to back p50 {spaced['back_to_back_s']['p50'] * 1e3:.3f} ms, one every "
        f"{SPACING_S * 1e3:.0f} ms p50 {spaced['spaced_s']['p50'] * 1e3:.3f} ms; 50% load p50 = "
        f"{result['load50_p50_in_floors']}x the step's floor, "
        f"{result['load50_p50_in_spaced_floors']}x the spaced one"
    )
    print(f"wrote {out}; sustained {result['sustained_tasks_per_s']} tasks/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
