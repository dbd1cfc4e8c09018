"""``megha up | down | status | bench | demo``: a live federation on this machine.

``up`` starts the processes of ``common.config.process_plan`` (gunicorn-served GMs,
LMs and worker pools), waits until each answers ``/health``, and records pids,
config and logs in a state directory (``$MEGHA_HOME`` or ``./.megha``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from common.config import STATE_ENV, FederationConfig, ProcessSpec, load_config, process_plan
from common.errors import ConfigError, MeghaError
from megha_cli import secure
from megha_cli.arguments import positive_float, positive_int, ranged
from megha_cli.main import INTERRUPTED
from megha_cli.ports import port_free, port_number
from megha_cli.progress import Progress
from megha_cli.terminal import Section, show
from request_generator.report import output_dir
from runtime.retry import GiveUp
from security.access import Access, identity_of_process, tokens_dir
from security.files import ensure_private_dir

RABBIT_HINT = (
    "RabbitMQ is not reachable at {url}.\n"
    "Start it with `rabbitmq-server -detached` (install: `apt-get install rabbitmq-server`),\n"
    "or point MEGHA_BROKER_URL / broker_url in the config at a running broker."
)


_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""Processes this interpreter started: kept so they are reaped, not left as zombies."""


def state_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("MEGHA_HOME") or ".megha").resolve()


def broker_reachable(url: str, timeout: float = 2.0) -> bool:
    """Whether any node of the broker (``url``: one URL or several, comma-separated)
    accepts a TCP connection."""
    for one in (x.strip() for x in url.split(",") if x.strip()):
        u = urlparse(one)
        try:
            with socket.create_connection((u.hostname or "127.0.0.1", u.port or 5672), timeout):
                return True
        except OSError:
            continue
    return False


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _is_ours(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"gunicorn" in cmdline or b"megha_cli.dashboard" in cmdline


def start_federation(
    cfg: FederationConfig,
    home: Path,
    *,
    timeout_s: float = 90.0,
    quiet: bool = False,
    insecure_dev: bool = False,
) -> list[tuple[ProcessSpec, int]]:
    """Make the federation's secret, broker users and tokens (``megha_cli.secure``),
    start every process of the plan; return (spec, pid) once all are healthy."""
    if (home / "pids.json").exists():
        recorded = json.loads((home / "pids.json").read_text())["processes"]
        if any(_alive(p["pid"]) and _is_ours(p["pid"]) for p in recorded):
            raise ConfigError(f"a federation is already recorded in {home}: run `megha down` first")
        # none of its processes is left (the host restarted, or all were killed):
        # it comes back with what its journals and the broker kept
        (home / "pids.json").unlink()
    if not broker_reachable(cfg.broker_url):
        raise ConfigError(RABBIT_HINT.format(url=cfg.broker_url), reason="broker_unreachable")
    ensure_private_dir(home)
    (home / "logs").mkdir(exist_ok=True)
    config_path = home / "federation.toml"
    config_path.write_text(cfg.to_toml())
    plan = process_plan(cfg, str(config_path))
    busy = [p for p in plan if not port_free(urlparse(p.url).hostname or cfg.host, p.port)]
    if busy:
        raise ConfigError(
            "ports already in use: " + ", ".join(f"{p.name}:{p.port}" for p in busy),
            reason="port_in_use",
        )
    secure.prepare(cfg, home, insecure_dev=insecure_dev)
    started: list[tuple[ProcessSpec, int]] = []
    try:
        for spec in plan:
            started.append((spec, launch(spec, home)))
            _record(home, cfg, started)
        wait_healthy(started, home, timeout_s)
    except BaseException:
        stop_federation(home, quiet=True)
        raise
    if not quiet:
        print(f"federation {cfg.name!r} is up ({len(started)} processes; state in {home})")
        for s, pid in started:
            print(f"  {s.name:<14} pid {pid:<8} {s.url}")
        print(f"  broker         {cfg.broker_url}")
    return started


NETNS_FILE = "netns.json"
"""In a state directory: process name -> the network namespace it runs in (written by
``megha chaos`` for federations spread over ``testbed.netns`` hosts)."""


def launch(spec: ProcessSpec, home: Path) -> int:
    """Start one process of the plan in its own session (inside its network namespace,
    if ``netns.json`` names one); its output goes to logs/."""
    argv = [sys.executable if spec.argv[0] == "python3" else spec.argv[0], *spec.argv[1:]]
    spaces = home / NETNS_FILE
    netns = json.loads(spaces.read_text()).get(spec.name) if spaces.exists() else None
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    with (home / "logs" / f"{spec.name}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv,
            env={
                **os.environ,
                **spec.env,
                **secure.environment(home),
                STATE_ENV: str(home / "state"),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def restart(home: Path, cfg: FederationConfig, name: str, *, timeout_s: float = 60.0) -> int:
    """Start process ``name`` again (after a crash) and wait until it is healthy."""
    spec = next(s for s in process_plan(cfg, str(home / "federation.toml")) if s.name == name)
    pid = launch(spec, home)
    data = json.loads((home / "pids.json").read_text())
    for p in data["processes"]:
        if p["name"] == name:
            p["pid"] = pid
    (home / "pids.json").write_text(json.dumps(data, indent=2))
    wait_healthy([(spec, pid)], home, timeout_s)
    return pid


def wait_healthy(procs: list[tuple[ProcessSpec, int]], home: Path, timeout_s: float) -> None:
    """Poll ``/health`` until every process answers 200; fail fast if one exits."""
    deadline = time.monotonic() + timeout_s
    waiting = list(procs)
    while waiting:
        waiting = [(s, pid) for s, pid in waiting if not _health(s.url)]
        for s, pid in waiting:
            if not _alive(pid):
                raise MeghaError(
                    f"{s.name} exited during start-up; see {home / 'logs' / (s.name + '.log')}"
                )
        if not waiting:
            break
        if time.monotonic() > deadline:
            names = ", ".join(s.name for s, _ in waiting)
            raise MeghaError(f"not healthy after {timeout_s:.0f} s: {names} (logs in {home})")
        time.sleep(0.2)


def start_dashboard(cfg: FederationConfig, home: Path, port: int) -> int:
    """Serve the dashboard (``megha_cli.dashboard``) on ``port`` from a process recorded
    with the federation's, so ``megha down`` stops it."""
    if not port_free(cfg.host, port):
        raise ConfigError(f"ports already in use: dashboard:{port}", reason="port_in_use")
    url = f"http://{cfg.host}:{port}"
    argv = ["python3", "-m", "megha_cli.dashboard", "--state-dir", str(home), "--port", str(port)]
    spec = ProcessSpec("dashboard", "dashboard", "dashboard", argv, {}, port, url)
    pid = launch(spec, home)
    data = json.loads((home / "pids.json").read_text())
    data["processes"].append({"name": spec.name, "pid": pid, "url": url})
    (home / "pids.json").write_text(json.dumps(data, indent=2))
    wait_healthy([(spec, pid)], home, 30.0)
    return pid


def _record(home: Path, cfg: FederationConfig, started: list[tuple[ProcessSpec, int]]) -> None:
    data = {
        "name": cfg.name,
        "processes": [{"name": s.name, "pid": pid, "url": s.url} for s, pid in started],
    }
    (home / "pids.json").write_text(json.dumps(data, indent=2))


def service_pids(home: Path) -> dict[str, int]:
    """Each running service's gunicorn worker process (the one that runs its core), by
    name; the recorded master's pid where it has no child (yet).  For profilers and
    memory probes."""
    out: dict[str, int] = {}
    for p in json.loads((home / "pids.json").read_text())["processes"]:
        kids = Path(f"/proc/{p['pid']}/task/{p['pid']}/children")
        children = kids.read_text().split() if kids.exists() else []
        out[p["name"]] = int(children[0]) if children else int(p["pid"])
    return out


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


@contextlib.contextmanager
def running_federation(cfg: FederationConfig, *, quiet: bool = True) -> Iterator[Path]:
    """A federation of ``cfg`` for the ``with`` block, recorded in a new temporary
    directory (yielded): started, then stopped and its broker vhost, users or queues
    deleted, whatever the block did (the benchmarks' own federations)."""
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    start_federation(cfg, home, quiet=quiet)
    try:
        yield home
    finally:
        stop_federation(home, quiet=True)
        try:
            secure.purge(cfg, home)
        except (MeghaError, OSError, subprocess.SubprocessError) as exc:
            print(f"could not delete {cfg.name!r} from the broker: {exc}", file=sys.stderr)


def stop_federation(home: Path, *, timeout_s: float = 15.0, quiet: bool = False) -> int:
    """SIGTERM every recorded process (GMs first), SIGKILL what remains; returns count."""
    path = home / "pids.json"
    if not path.exists():
        if not quiet:
            print(f"no federation recorded in {home}")
        return 0
    procs = json.loads(path.read_text())["processes"]
    pids = [p["pid"] for p in reversed(procs) if _is_ours(p["pid"])]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    for pid in pids:
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            child.wait(timeout=5)
    for pid, child in list(_CHILDREN.items()):  # killed or replaced earlier: reap them
        if child.poll() is not None:
            del _CHILDREN[pid]
    path.unlink()
    if not quiet:
        print(f"stopped {len(pids)} processes")
    return len(pids)


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


def signed_get(cfg: FederationConfig, home: Path, name: str, path: str) -> Any:
    """``GET path`` on process ``name``, signed by the operator; the JSON answer."""
    who = identity_of_process(cfg, name)
    headers = Access.in_home(home, cfg).sign(who, "GET", path, b"", time.time())
    req = urllib.request.Request(cfg.url(name) + path, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def operator_get(
    cfg: FederationConfig, access: Access, name: str, path: str, timeout_s: float = 3.0
) -> dict[str, Any]:
    """``GET path`` on process ``name``, signed as the operator: the JSON answer.  A
    refusal is its JSON body with ``status`` added; an unreachable service
    ``{"error": ...}``."""
    who = identity_of_process(cfg, name)
    headers = access.sign(who, "GET", path, b"", time.time())
    req = urllib.request.Request(cfg.url(name) + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except urllib.error.HTTPError as err:
        with err:
            try:
                body = json.loads(err.read())
            except ValueError:
                body = {}
        refused: dict[str, Any] = body if isinstance(body, dict) else {}
        refused.setdefault("error", f"HTTP {err.code}")
        refused["status"] = err.code
        return refused
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"error": str(exc)}


def depth_queues(cfg: FederationConfig) -> list[str]:
    """The broker queues whose depth an operator watches: users' submissions, dead letters."""
    return [cfg.user_queue(u.user) for u in cfg.user_configs] + [cfg.dead_letter_queue]


async def queue_depths(conn: Any, names: list[str]) -> dict[str, int]:
    """Messages ready in each queue (-1: not declared yet), on an open connection."""
    depths: dict[str, int] = {}
    for name in names:
        ch = await conn.channel()
        try:
            q = await ch.declare_queue(name, passive=True)
            depths[name] = q.declaration_result.message_count or 0
        except Exception:  # not declared yet
            depths[name] = -1
        finally:
            if not ch.is_closed:
                await ch.close()
    return depths


async def _queue_depths(cfg: FederationConfig, access: Access) -> dict[str, int]:
    from runtime import broker

    conn, _ = await broker.connect_any(access.broker_urls())
    try:
        return await queue_depths(conn, depth_queues(cfg))
    finally:
        await conn.close()


# ------------------------------------------------------------------ commands
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
            print(secure.purge(cfg, home))
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
        up = "alive" if _alive(p["pid"]) else "DEAD"
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
        for name, n in asyncio.run(_queue_depths(cfg, access)).items():
            print(f"  {name}: {'absent' if n < 0 else n}")
    else:
        print(RABBIT_HINT.format(url=cfg.broker_url))
    return 0


def _bench_options(args: argparse.Namespace) -> Any:
    from request_generator.bench import BenchOptions

    if args.trace and args.jobs_file:  # the trace was dropped without a word
        raise ConfigError("give --trace or --jobs, not both", reason="two_workloads")
    return BenchOptions(
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
    from common.metrics import PERCENTILE_KEYS
    from request_generator.report import percentile_cells

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
    print(f"wrote {args.out}/summary.json, tasks.csv, allocation_cdf.png, components.png")
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
        if args.config is None:  # the federation `megha up` recorded here, as status reads it
            _recorded(home)
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
            secure.purge(cfg, home)
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
        help="order of each GM's user queues: fifo (Megha), drf, drf-wc, tetris, sjf, carbyne, "
        "carbyne-pack",
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
    p.add_argument("--out", default=out, help="directory for summary.json, tasks.csv, PNGs")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr; plain-text summary")


def _recorded(home: Path) -> dict[str, int]:
    """The processes ``megha up`` recorded: name -> pid."""
    path = home / "pids.json"
    if not path.exists():
        raise ConfigError(f"no federation recorded in {home} (start one with `megha up`)")
    return {p["name"]: p["pid"] for p in json.loads(path.read_text())["processes"]}


def kill(home: Path, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
    """Send ``sig`` to service ``name`` (its whole process group: gunicorn and its worker)."""
    procs = _recorded(home)
    if name not in procs:
        raise ConfigError(f"no service {name!r} here (services: {', '.join(procs)})")
    pid = procs[name]
    if not _is_ours(pid):
        raise ConfigError(f"{name} (pid {pid}) is not running")
    os.killpg(pid, sig)
    return pid


FAULT_SIGNALS = ("KILL", "TERM", "STOP", "CONT")
"""The signals ``megha kill`` names in its help (any other signal's name works too)."""


def signal_named(name: str) -> signal.Signals:
    """``KILL``, ``sigterm``, ``SIGSTOP``...: the signal; a ConfigError naming the choices."""
    try:
        return signal.Signals[f"SIG{name.upper().removeprefix('SIG')}"]
    except KeyError:
        raise ConfigError(
            f"no signal {name!r}: use {', '.join(FAULT_SIGNALS)} (or another signal's name, "
            "e.g. HUP, INT, USR1)",
            reason="bad_signal",
        ) from None


def cmd_kill(args: argparse.Namespace) -> int:
    try:
        sig = signal_named(args.signal)
        pid = kill(state_dir(args.state_dir), args.service, sig)
    except MeghaError as exc:
        print(f"megha kill: {exc}", file=sys.stderr)
        return 1
    print(f"sent {sig.name} to {args.service} (pid {pid})")
    return 0


def restart_service(home: Path, cfg: FederationConfig, name: str) -> int:
    """Stop service ``name`` cleanly if it runs (SIGCONT first, for a stopped one; SIGKILL
    after 15 s), start it again and wait until it is healthy; returns its new pid."""
    pid = _recorded(home)[name]
    if _is_ours(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    return restart(home, cfg, name)


def cmd_restart(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    try:
        procs = _recorded(home)
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
     "measure the floor RTT, and write summary.json, tasks.csv and PNG plots.", ("bench",)),
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
        if "demo" in extras:
            _workload(p, jobs=100, out="results/demo")
        if "service" in extras:
            p.add_argument("service", help="a process of the federation: gm0, lm1, lm1-workers")
        if "signal" in extras:
            p.add_argument("--signal", default="KILL", help="KILL (default), TERM, STOP, CONT")
        p.set_defaults(run=RUNNERS[name])
