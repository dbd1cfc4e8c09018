"""``megha up | down | status | bench | demo | kill | restart``: a live federation on
this machine, from the command line.

The federation's lifecycle is the library ``federation`` (processes, provisioning, the
operator's reads); a bench is ``request_generator.bench``.  This module parses the
options and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig, load_config
from common.errors import ConfigError, MeghaError
from common.metrics import PERCENTILE_KEYS
from federation import provision
from federation.operator import broker_queue_depths, operator_get
from federation.processes import (
    RABBIT_HINT,
    alive,
    broker_reachable,
    kill,
    recorded,
    restart_service,
    signal_named,
    start_dashboard,
    start_federation,
    state_dir,
    stop_federation,
)
from megha_cli.arguments import (
    check_trace_files,
    port_number,
    positive_float,
    positive_int,
    published_trace_arguments,
    ranged,
)
from megha_cli.progress import Progress
from megha_cli.terminal import INTERRUPTED, Section, percentile_cells, show
from reporting.files import output_dir
from runtime.retry import GiveUp
from security.access import Access, tokens_dir

SHAPE_OPTIONS = (
    "gms", "lms", "nodes_per_lm", "base_port", "name", "profile", "users", "queue_policy",
    "p_altruism", "lm_standby", "queue_type", "broker_url",
)  # fmt: skip
"""``megha up``'s options that shape a federation (the rest say how to run it)."""


def _config_for(args: argparse.Namespace, *, fresh: bool) -> FederationConfig:
    """``--config`` (or the recorded federation's, for commands that talk to it, and for
    ``megha up`` given no shape: the federation ``megha down`` stopped comes back whole,
    its journals and queues included)."""
    home = state_dir(args.state_dir)
    overrides: dict[str, Any] = {}
    for key in SHAPE_OPTIONS:
        v = getattr(args, key, None)
        if v is not None:
            overrides[key] = v
    recorded = home / "federation.toml"
    if args.config is None and recorded.exists() and (not fresh or not overrides):
        return load_config(recorded)
    cfg = load_config(args.config)
    if args.config is None and fresh:
        overrides["secret"] = secrets.token_hex(16)
    return replace(cfg, **overrides).validate() if overrides else cfg


def cmd_up(args: argparse.Namespace) -> int:
    try:
        cfg = _config_for(args, fresh=True)
        home = state_dir(args.state_dir)
        start_federation(cfg, home, insecure_dev=args.insecure_dev)
        if args.dashboard_port is not None:
            start_dashboard(cfg, home, args.dashboard_port)
            print(f"  dashboard      http://{cfg.host}:{args.dashboard_port}/")
        print(f"users' tokens (give each user its own): {tokens_dir(home)}/<user>")
    except MeghaError as exc:
        print(f"megha up: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    cfg = None
    if args.purge and (home / "federation.toml").exists():
        cfg = load_config(home / "federation.toml")
    if cfg is not None and not (home / "pids.json").exists():
        print(f"no process of {cfg.name!r} recorded as running in {home} (stopped already)")
    elif args.purge and cfg is None and not (home / "pids.json").exists():
        print(f"no federation recorded in {home}: nothing to stop or purge")
    else:
        stop_federation(home)
    if cfg is not None:
        try:
            print(provision.purge(cfg, home))
        except MeghaError as exc:
            print(f"megha down --purge: {exc}", file=sys.stderr)
            return 1
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    if not (home / "pids.json").exists():
        print(f"no federation recorded in {home} (start one with `megha up`)")
        return 1
    cfg = load_config(home / "federation.toml")
    access = Access.in_home(home, cfg)

    def page(name: str) -> dict[str, Any]:
        return operator_get(cfg, access, name, "/v1/state")

    procs = json.loads((home / "pids.json").read_text())["processes"]
    print(f"federation {cfg.name!r}: {cfg.gms} GMs, {cfg.lms} LMs, {cfg.nodes_per_lm} nodes each")
    for p in procs:
        up = "alive" if alive(p["pid"]) else "DEAD"
        print(f"  {p['name']:<14} pid {p['pid']:<8} {up:<6} {p['url']}")
    print("GMs:")
    for g in cfg.gm_ids:
        st = page(g)
        if "error" in st:
            print(f"  {g}: unreachable ({st['error']})")
            continue
        c = st["counters"]
        print(
            f"  {g}: queued {st['queued']} {st['queues']}  in flight {st['inflight']}  running "
            f"{st['running_tasks']}  finished {c['tasks_finished']}  failed {c['failed']}  "
            f"unacked jobs {st['jobs_unacked']}"
        )
    print("LMs:")
    for lm in cfg.lm_ids:
        names = [lm, f"{lm}-standby"] if cfg.lm_standby else [lm]
        for name in names:
            st = page(name)
            if "error" in st:
                print(f"  {name}: unreachable ({st['error']})")
                continue
            if not st.get("active", True):
                print(f"  {name}: standby")
                continue
            print(
                f"  {name}: epoch {st['epoch']}  nodes {st['nodes_alive']}/{st['nodes']} alive  "
                f"running {st['running_tasks']}  logical nodes {st['logical_nodes']}  free "
                f"{st['free_total']}/{st['capacity_total']}  version {st['version']}"
            )
    if broker_reachable(cfg.broker_url):
        print("queues (messages ready):")
        for name, n in asyncio.run(broker_queue_depths(cfg, access)).items():
            print(f"  {name}: {'absent' if n < 0 else n}")
    else:
        print(RABBIT_HINT.format(url=cfg.broker_url))
    return 0


def _bench_options(args: argparse.Namespace) -> Any:
    from request_generator.bench import BenchOptions

    if args.trace and args.jobs_file:  # the trace was dropped without a word
        raise ConfigError("give --trace or --jobs, not both", reason="two_workloads")
    fmt = getattr(args, "trace_format", "megha")
    files = tuple(getattr(args, "files", None) or ())
    check_trace_files(fmt, files, None)
    if fmt != "megha" and (args.trace or args.jobs_file):
        raise ConfigError(
            f"--trace-format {fmt} replays the trace's FILEs, not --trace or --jobs",
            reason="two_workloads",
        )
    return BenchOptions(
        trace_format=fmt,
        trace_files=files,
        trace_lookahead=getattr(args, "trace_lookahead", 86_400.0),
        trace=args.trace,
        jobs_file=args.jobs_file,
        limit_jobs=args.limit_jobs,
        jobs=args.jobs,
        tasks_per_job=args.tasks_per_job,
        mean_duration=args.mean_duration,
        job_rate=args.job_rate,
        rate=args.rate,
        time_scale=args.time_scale,
        duration_scale=args.duration_scale,
        seed=args.seed,
        timeout_s=args.timeout,
        out=args.out,
        progress=not args.quiet,
    )


def run_bench_shown(cfg: FederationConfig, args: argparse.Namespace, home: Path) -> dict[str, Any]:
    """``megha bench`` / ``demo``: the run with a progress bar (tasks done of the total,
    submitted, wall time, time left), plain lines when not on a terminal."""
    from request_generator.bench import BenchStatus, bench

    with Progress("bench", 0, quiet=args.quiet) as bar:

        def report(st: BenchStatus) -> None:
            if st.note:
                bar.note(st.note)
            else:
                bar.update(st.done, total=st.total, detail=f"submitted {st.submitted}")

        opts = replace(_bench_options(args), reporter=report, progress=False)
        return bench(cfg, opts, home)


def bench_sections(summary: dict[str, Any]) -> list[Section]:
    """A bench's summary: allocation-time percentiles and components, the tasks' fate,
    the floor, and the counters that are not zero."""
    rows = {
        "allocation": summary["allocation_time_s"],
        **summary["components_s"],
        "submission": summary["submission_s"],
    }
    alloc = Section("allocation time", ["", *PERCENTILE_KEYS], percentile_cells(rows))
    fate = Section(
        "",
        ["tasks", "finished", "failed", "unfinished", "duplicate launches", "tasks/s",
         "floor p50 idle", "floor p50 in run"],
        [[
            str(summary["tasks"]), str(summary["tasks_finished"]), str(summary["tasks_failed"]),
            str(summary["unfinished_tasks"]), str(summary["duplicate_launches"]),
            f"{summary['throughput_tasks_per_s']:.1f}", f"{summary['floor_rtt_s'] * 1e3:.3f}ms",
            f"{summary['floor']['lm_during_run_s']['p50'] * 1e3:.3f}ms",
        ]],
    )  # fmt: skip
    nonzero = [[k, str(v)] for k, v in summary["counters"].items() if v]
    if nonzero:
        counters = Section("this run's counters (not zero)", ["counter", "value"], nonzero)
    else:
        counters = Section("this run's counters: none", [], [])
    sections = [alloc, fate, counters]
    notes = summary.get("counters_notes", [])
    if notes:  # a service restarted or did not answer: its counters are not the run's
        sections.append(Section("counters: " + "; ".join(notes), [], []))
    return sections


def bench_verdict(summary: dict[str, Any], args: argparse.Namespace, *, up: bool = True) -> int:
    """Show a bench's summary and where it went; the exit code: 2 if some task did not
    finish within --timeout or was launched twice, else 0.  ``up``: the federation still
    runs (``megha bench``; ``megha demo`` has stopped its own)."""
    show(bench_sections(summary), quiet=args.quiet)
    if summary["unfinished_tasks"]:
        users = ", ".join(f"{u} {n}" for u, n in summary["unfinished_by_user"].items())
        where = (
            "they may still be queued or running (`megha status`)"
            if up
            else "they were still queued or running when the demo stopped"
        )
        print(
            f"{summary['unfinished_tasks']} tasks not finished within --timeout "
            f"{summary['timeout_s']:g} s (by user: {users}); not known to be lost: {where}"
        )
    print(f"wrote {args.out}/summary.json, tasks.csv, allocation_cdf.png, components.png, series/")
    return 0 if summary["unfinished_tasks"] == 0 and summary["duplicate_launches"] == 0 else 2


def _kept(out: Path, began: float) -> str:
    """What an interrupted bench left in ``out``: the rows of the tasks that ended."""
    csv = out / "tasks.csv"
    if csv.exists() and csv.stat().st_mtime >= began - 1:
        return f"{csv} holds the tasks that ended before; no summary.json (the run did not end)"
    return f"nothing written to {out}"


def cmd_bench(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    began = time.time()
    try:
        _bench_options(args)  # the workload's flags first: a wrong one says so at once
        if args.config is None:  # the federation `megha up` recorded here, as status reads it
            recorded(home)
        cfg = _config_for(args, fresh=False)
        if not broker_reachable(cfg.broker_url):
            raise ConfigError(RABBIT_HINT.format(url=cfg.broker_url))
        summary = run_bench_shown(cfg, args, home)
    except KeyboardInterrupt:
        print(f"megha bench: interrupted; {_kept(Path(args.out), began)}", file=sys.stderr)
        return INTERRUPTED
    except MeghaError as exc:
        print(f"megha bench: {exc}", file=sys.stderr)
        return 1
    except GiveUp as exc:  # the broker stayed unreachable, or the federation's queues went
        print(f"megha bench: {exc} (is the federation up? `megha status`)", file=sys.stderr)
        return 1
    return bench_verdict(summary, args)


def cmd_demo(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir) / "demo"
    if args.name is None:
        args.name = "megha-demo"
    if args.base_port is None:
        args.base_port = 18600
    try:
        cfg = _config_for(args, fresh=True)
        output_dir(args.out)
        if not broker_reachable(cfg.broker_url):
            raise ConfigError(RABBIT_HINT.format(url=cfg.broker_url))
        try:
            start_federation(cfg, home, insecure_dev=args.insecure_dev)
        except ConfigError as exc:
            if exc.reason != "no_broker_admin":
                raise
            # a demo on this machine only, for a minute: without broker users if need be
            print(f"megha demo: {exc}\nmegha demo: going on with --insecure-dev", file=sys.stderr)
            start_federation(cfg, home, insecure_dev=True)
    except MeghaError as exc:
        print(f"megha demo: {exc}", file=sys.stderr)
        return 1
    try:
        summary = run_bench_shown(cfg, args, home)
    finally:
        stop_federation(home)
        with contextlib.suppress(Exception):
            provision.purge(cfg, home)
    return bench_verdict(summary, args, up=False)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="federation TOML (default: built-in defaults)")
    p.add_argument("--state-dir", help="where pids, config and logs live ($MEGHA_HOME or ./.megha)")


def _shape(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gms", type=int, help="number of Global Masters")
    p.add_argument("--lms", type=int, help="number of Local Masters (clusters)")
    p.add_argument("--nodes-per-lm", type=int, help="worker nodes per LM")
    p.add_argument(
        "--base-port",
        type=int,
        help="first port (GMs base+i, LMs +100, workers +200, standbys +300)",
    )
    p.add_argument("--name", help="prefix of the federation's RabbitMQ queues and exchanges")
    p.add_argument("--profile", choices=["slots", "paper"], help="resource profile")
    p.add_argument("--users", help="NAME:SHARE@GM,... (default: one user per GM, equal shares)")
    p.add_argument(
        "--policy",
        dest="queue_policy",
        help="order of each GM's user queues: fifo (Megha), srpt (least remaining work, aged by "
        "srpt_half_life_s), drf, drf-wc, tetris, sjf, carbyne, carbyne-pack",
    )
    p.add_argument("--p-altruism", type=float, help="Carbyne's P(altruism), 0..1")
    p.add_argument(
        "--lm-standby",
        action="store_const",
        const=True,
        help="run a standby beside every LM (lmJ-standby), fenced by epochs",
    )
    p.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        help="durable queues: classic, or quorum (replicated over a RabbitMQ cluster)",
    )
    p.add_argument(
        "--broker-url",
        help="AMQP URL of the broker; a cluster's nodes comma-separated (default: "
        "$MEGHA_BROKER_URL or amqp://guest:guest@127.0.0.1:5672/)",
    )


_seconds = ranged(float, "a finite number", zero=True)


def _workload(p: argparse.ArgumentParser, *, jobs: int, out: str) -> None:
    p.add_argument("--trace", help="replay this trace (../shared/traces format)")
    p.add_argument(
        "--jobs", dest="jobs_file", help="submit the DAG jobs of this file (see README: DAG jobs)"
    )
    p.add_argument(
        "--limit-jobs",
        type=positive_int,
        help="only the first N jobs: a trace's first N lines, a job file's N earliest arrivals",
    )
    p.add_argument(
        "--jobs-count",
        dest="jobs",
        type=positive_int,
        default=jobs,
        help="synthetic jobs (without --trace; > 0)",
    )
    p.add_argument("--tasks-per-job", type=positive_int, default=3, help="(> 0)")
    p.add_argument(
        "--mean-duration", type=_seconds, default=0.2, help="synthetic task seconds (>= 0)"
    )
    p.add_argument(
        "--job-rate", type=positive_float, default=50.0, help="synthetic Poisson jobs/s (> 0)"
    )
    p.add_argument(
        "--rate", type=positive_float, help="submit at a fixed rate (jobs/s, > 0) instead"
    )
    p.add_argument(
        "--time-scale", type=positive_float, default=1.0, help="multiply arrival times (> 0)"
    )
    p.add_argument(
        "--duration-scale", type=positive_float, default=1.0, help="multiply durations (> 0)"
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds to wait for the end"
    )
    p.add_argument(
        "--out", default=out, help="directory for summary.json, tasks.csv, PNGs, series/"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr; plain-text summary")


def cmd_kill(args: argparse.Namespace) -> int:
    try:
        sig = signal_named(args.signal)
        pid = kill(state_dir(args.state_dir), args.service, sig)
    except MeghaError as exc:
        print(f"megha kill: {exc}", file=sys.stderr)
        return 1
    print(f"sent {sig.name} to {args.service} (pid {pid})")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    try:
        procs = recorded(home)
        cfg = load_config(home / "federation.toml")
        if args.service not in procs:
            raise ConfigError(f"no service {args.service!r} here (services: {', '.join(procs)})")
        new = restart_service(home, cfg, args.service)
    except MeghaError as exc:
        print(f"megha restart: {exc}", file=sys.stderr)
        return 1
    print(f"{args.service} is up again (pid {new})")
    return 0


COMMANDS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("up", "start a live federation here (GMs, LMs, worker pools under gunicorn)",
     "Make the federation's secret ($MEGHA_HOME/secret), a broker vhost with a user per "
     "service and per user (rabbitmqctl: run as root on the broker's host), a token per "
     "user ($MEGHA_HOME/tokens/); start N GMs, M LMs and their worker pools as gunicorn "
     "processes, wait until all are healthy, print where they listen. Needs RabbitMQ.",
     ("shape",)),
    ("down", "stop the federation started by `megha up`",
     "SIGTERM every recorded process (SIGKILL after a grace period); with --purge, "
     "also delete the federation's broker vhost, queues and exchanges, and its broker "
     "users, those of parties an older config had too (<federation>.<role>.<party>).",
     ("purge",)),
    ("status", "show GMs, LMs, nodes, queues and running tasks",
     "Query every GM's and LM's /v1/state and the broker's queue depths.", ()),
    ("bench", "replay a workload against the running federation; report allocation tails",
     "Submit a trace or synthetic workload into the users' queues, wait for every task, "
     "measure the floor RTT, and write summary.json, tasks.csv, PNG plots and the services' raw series (series/).", ("bench",)),
    ("demo", "up + a small workload + tail report + down, in one command",
     "Start a small federation, replay a few hundred tasks, print the allocation-time "
     "report, write it to --out, stop everything.", ("shape", "demo")),
    ("kill", "send a signal to one service (fault injection: KILL, STOP, CONT, TERM)",
     "Signal a service of the running federation (its gunicorn master and worker), e.g. "
     "`megha kill lm0` (SIGKILL) or `megha kill gm1 --signal STOP`.", ("service", "signal")),
    ("restart", "stop one service (if it runs) and start it again",
     "Stop a service of the running federation cleanly (SIGKILL after 15 s) and start it "
     "again with the same command; waits until it is healthy.", ("service",)),
)  # fmt: skip
RUNNERS = {
    "up": cmd_up, "down": cmd_down, "status": cmd_status, "bench": cmd_bench,
    "demo": cmd_demo, "kill": cmd_kill, "restart": cmd_restart,
}  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, help_, description, extras in COMMANDS:
        p = sub.add_parser(name, help=help_, description=description)
        _common(p)
        if "shape" in extras:
            _shape(p)
            p.add_argument(
                "--insecure-dev",
                action="store_true",
                help="accept a weak or example secret and use the broker URL's own user "
                "(no broker users per party): only on a machine you alone use",
            )
        if name == "up":
            p.add_argument(
                "--dashboard-port",
                type=port_number,
                help="also serve `megha dashboard` on this port (stopped by `megha down`)",
            )
        if "purge" in extras:
            p.add_argument(
                "--purge",
                action="store_true",
                help="also delete its broker vhost, queues, exchanges and broker users (those "
                "left by older configs too)",
            )
        if "bench" in extras:
            _workload(p, jobs=200, out="results/bench")
            published_trace_arguments(p)
        if "demo" in extras:
            _workload(p, jobs=100, out="results/demo")
        if "service" in extras:
            p.add_argument("service", help="a process of the federation: gm0, lm1, lm1-workers")
        if "signal" in extras:
            p.add_argument("--signal", default="KILL", help="KILL (default), TERM, STOP, CONT")
        p.set_defaults(run=RUNNERS[name])
