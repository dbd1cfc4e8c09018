"""``megha chaos --netns-bench``: allocation times of a federation whose every process
runs in its own network namespace, against added latency between the hosts."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from chaos.drive import progress_line
from chaos.scenarios import Scenario
from chaos.stage import stage
from common.config import FederationConfig
from request_generator.bench import BenchOptions, bench

NETNS_LATENCIES_MS = (0.0, 1.0, 5.0, 10.0)


def netns_bench(
    base: FederationConfig, root: Path, out: Path, *, jobs: int, rounds: int, progress: bool,
    latencies: tuple[float, ...] = NETNS_LATENCIES_MS,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every GM, LM and worker pool in its own namespace, the broker a private node on
    the bed's gateway; allocation times at each added latency (``d`` ms between every
    two hosts: ``d/2`` on each host's egress, so a host and the broker get ``d/2``).
    ``rounds`` passes over the latencies, in alternating order; a row holds the median
    over the rounds of each round's p50 and p99 (every round is in the JSON)."""
    sc = Scenario(name="netns", fault="none", steps=[], netns=True)
    runs: dict[float, list[dict[str, Any]]] = {d: [] for d in latencies}
    with stage(sc, base, root, insecure=True) as st:
        bed = st.bed
        assert bed is not None
        for r in range(rounds):
            for d in latencies if r % 2 == 0 else tuple(reversed(latencies)):
                for host in st.cfg.process_names:
                    if d > 0:
                        bed.set_latency(host, d / 2)
                    else:
                        bed.clear_latency(host)
                rtt = bed.tcp_rtt(st.cfg.gm_ids[0], st.cfg.lm_ids[0], count=20)
                opts = BenchOptions(
                    jobs=jobs, tasks_per_job=3, mean_duration=0.2, job_rate=20.0, seed=7 + r,
                    timeout_s=120.0, floor_samples=50,
                    out=str(out / f"netns_{d:g}ms_round{r}"), progress=False,
                )  # fmt: skip
                progress_line(f"netns bench: round {r + 1}/{rounds}, +{d:g} ms", progress)
                s = bench(st.cfg, opts, st.home)
                runs[d].append({
                    "gm_lm_rtt_ms_p50": sorted(rtt)[len(rtt) // 2],
                    "allocation_p50_ms": s["allocation_time_s"]["p50"] * 1e3,
                    "allocation_p99_ms": s["allocation_time_s"]["p99"] * 1e3,
                    "communication_p50_ms": s["components_s"]["communication"]["p50"] * 1e3,
                    "tasks": s["tasks"], "lost": s["lost_tasks"],
                    "duplicate_launches": s["duplicate_launches"],
                    "load_average": os.getloadavg()[0],
                })  # fmt: skip
    return [_median_row(d, rs) for d, rs in runs.items()]


def _median_row(d: float, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(k: str) -> float:
        return round(float(statistics.median(float(x[k]) for x in rounds)), 2)

    return {
        "added_ms": d,
        **{k: med(k) for k in ("gm_lm_rtt_ms_p50", "allocation_p50_ms", "allocation_p99_ms",
                               "communication_p50_ms", "load_average")},
        "tasks": sum(x["tasks"] for x in rounds),
        "lost": sum(x["lost"] for x in rounds),
        "duplicate_launches": sum(x["duplicate_launches"] for x in rounds),
        "rounds": rounds,
    }  # fmt: skip


def netns_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| added latency (ms, every host pair) | GM-LM RTT p50 (ms) | allocation p50 (ms) "
        "| allocation p99 (ms) | communication p50 (ms) | tasks | lost | dup. launches "
        "| load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['added_ms']:g} | {r['gm_lm_rtt_ms_p50']} | {r['allocation_p50_ms']} | "
            f"{r['allocation_p99_ms']} | {r['communication_p50_ms']} | {r['tasks']} | "
            f"{r['lost']} | {r['duplicate_launches']} | {r['load_average']} |"
        )
    return "\n".join(lines)


def write_netns_bench(out: Path, rows: list[dict[str, Any]]) -> None:
    """``netns_bench.json`` (every round) and ``netns_bench.md`` (``netns_table``) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "netns_bench.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "netns_bench.md").write_text(netns_table(rows) + "\n")
