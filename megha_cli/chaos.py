"""``megha chaos``: the fault-injection suite from the command line (the scenarios, the
driver and the results are the ``chaos`` package; docs/chaos.md)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from chaos.drive import progress_line, run_scenario
from chaos.netns_bench import netns_bench, netns_table, write_netns_bench
from chaos.results import table, verdict, write_results
from chaos.scenarios import (
    DEFAULT_SCENARIOS,
    Scenario,
    jittered,
    load_scenarios,
    random_scenarios,
)
from common.config import FederationConfig
from common.errors import ConfigError
from federation.processes import broker_reachable


def base_config(args: argparse.Namespace) -> FederationConfig:
    return FederationConfig(name=args.name, base_port=args.base_port).validate()


def cmd_chaos(args: argparse.Namespace) -> int:
    for noisy in ("aiormq", "aio_pika"):  # reconnect chatter of faults meant to happen
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        scenarios = _drawn(args) if args.random is not None else _from_file(args)
    except (ConfigError, TypeError) as exc:
        print(f"megha chaos: {exc}", file=sys.stderr)
        return 1
    if args.list:
        for sc in scenarios:
            flags = "".join(
                [" [quick]" if sc.quick else "", " [dag]" if sc.load.dag else "",
                 f" [{sc.broker} broker]" if sc.broker != "shared" else "",
                 " [netns]" if sc.netns else ""]
            )  # fmt: skip
            print(f"{sc.name:<24} {sc.fault}{flags}")
        return 0
    root = Path(args.state_dir or "/tmp/megha-chaos")
    out = Path(args.out)
    base = base_config(args)
    if args.netns_bench:
        rows = netns_bench(
            base, root, out, jobs=args.netns_jobs, rounds=args.netns_rounds, progress=not args.quiet
        )
        write_netns_bench(out, rows)
        print(netns_table(rows))
        print(f"wrote {out}/netns_bench.json, netns_bench.md")
        return 0
    try:
        chosen = scenarios if args.random is not None else _chosen(args, scenarios)
    except ConfigError as exc:
        print(f"megha chaos: {exc}", file=sys.stderr)
        return 1
    if not broker_reachable(base.broker_url):
        print(f"megha chaos: the shared broker {base.broker_url} is down", file=sys.stderr)
        return 1
    rows = []
    t0 = time.time()
    for i, sc in enumerate(chosen, 1):
        progress_line(f"[{i}/{len(chosen)}]", not args.quiet)
        rows.append(
            run_scenario(sc, base, root, insecure=args.insecure_dev, progress=not args.quiet)
        )
        write_results(out, rows, {"started": t0, "insecure_dev": args.insecure_dev})
    print(table(rows))
    print(f"wrote {out}/chaos.json, chaos.csv, chaos.md ({time.time() - t0:.0f} s)")
    return 0 if all(verdict(r) == "ok" for r in rows) else 2


def _from_file(args: argparse.Namespace) -> list[Scenario]:
    """The scenario file's scenarios (``--list``: moved by ``--jitter`` if given)."""
    if args.jitter is None and args.repeat != 1:
        raise ConfigError("--repeat draws each run anew: it needs --jitter SEED or --random SEED")
    if args.wide:
        raise ConfigError("--wide widens the faults --random draws: it needs --random SEED")
    scenarios = load_scenarios(Path(args.scenarios))
    if args.list and args.jitter is not None:
        return jittered(scenarios, args.jitter, args.repeat)
    return scenarios


def _drawn(args: argparse.Namespace) -> list[Scenario]:
    """``--random SEED``: ``--repeat`` scenarios of faults drawn at random."""
    if args.jitter is not None or args.only or args.quick:
        raise ConfigError("--random draws its own scenarios: not with --jitter, --only or --quick")
    return random_scenarios(Path(args.scenarios), args.random, args.repeat, wide=args.wide)


def _chosen(args: argparse.Namespace, scenarios: list[Scenario]) -> list[Scenario]:
    """The file's scenarios that ``--only`` and ``--quick`` name, moved by ``--jitter``."""
    chosen = [s for s in scenarios if (not args.only or s.name in args.only)
              and (not args.quick or s.quick)]  # fmt: skip
    unknown = set(args.only or ()) - {s.name for s in scenarios}
    if unknown:
        raise ConfigError(f"no such scenario: {', '.join(sorted(unknown))}")
    if not chosen:
        raise ConfigError("no scenario named by --only is in the --quick subset")
    return chosen if args.jitter is None else jittered(chosen, args.jitter, args.repeat)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chaos",
        help="fault-injection suite: a live federation per scenario, lost/duplicate checks",
        description=(
            "Run the scenarios of a chaos TOML file: each starts a federation, submits a "
            "load, injects its faults (kill -9, SIGSTOP, restarts, the whole federation "
            "killed or stopped and started again, broker node loss, network partitions "
            "and delays, duplicated and reordered deliveries) and checks that no task is "
            "lost or launched twice. Needs root for private brokers and network "
            "namespaces. Exit status 2 if a scenario fails."
        ),
    )
    p.add_argument("--scenarios", default=str(DEFAULT_SCENARIOS), help="the scenario file")
    p.add_argument("--only", action="append", metavar="NAME", help="run this scenario (repeat)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--quick", action="store_true", help="only the quick subset")
    p.add_argument("--out", default="results/chaos", help="directory for the results")
    p.add_argument("--state-dir", help="federations' homes (default /tmp/megha-chaos)")
    p.add_argument("--name", default="chaos", help="prefix of the federations' names")
    p.add_argument("--base-port", type=int, default=19500, help="the federations' first port")
    p.add_argument(
        "--insecure-dev", action="store_true",
        help="no broker users per party on the shared broker (faster set-up); private "
        "brokers always run so",
    )  # fmt: skip
    p.add_argument(
        "--netns-bench", action="store_true",
        help="instead: allocation p50/p99 with every process in its own network namespace, "
        "against 0, 1, 5, 10 ms added latency (writes netns_bench.md)",
    )  # fmt: skip
    p.add_argument("--netns-jobs", type=int, default=200, help="jobs per latency (--netns-bench)")
    p.add_argument("--netns-rounds", type=int, default=3, help="passes over the latencies")
    p.add_argument(
        "--jitter", type=int, metavar="SEED",
        help="move each scenario's faults in time (its first step at 0.25-1.75x its "
        "`at`, the gaps between steps kept) and draw its load anew, seeded by SEED",
    )  # fmt: skip
    p.add_argument(
        "--random", type=int, metavar="SEED",
        help="instead of the file's scenarios, --repeat N of faults drawn at random, seeded "
        "by SEED: one to three of the default federation's services each killed and started "
        "again, stopped and continued, or restarted cleanly, overlapping, at 0.3-4.5 s, down "
        "0.1-4 s; a quarter of them with DAG jobs",
    )  # fmt: skip
    p.add_argument(
        "--wide", action="store_true",
        help="with --random: each fault drawn from every kind, not only a service's kill, "
        "stop or restart: a host cut off or slowed (network namespaces), the private broker "
        "node stopped, killed or under a memory alarm, submissions, event batches or state "
        "updates published again, a wall clock stepped (0.5 s-1 h) and put right, every "
        "process killed or stopped at once and started again",
    )  # fmt: skip
    p.add_argument(
        "--repeat", type=_positive, default=1, metavar="N",
        help="with --jitter: every scenario N times, each with its own draw; with --random: "
        "N scenarios",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(run=cmd_chaos)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {n}")
    return n
