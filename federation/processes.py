"""A live federation on this machine: its processes started, watched, signalled and
stopped (``megha up | down | kill | restart``, the benchmarks' and tests' own
federations).

``start_federation`` makes the secret, broker users and tokens (``federation.provision``),
starts the processes of ``common.config.process_plan`` (gunicorn-served GMs, LMs and
worker pools), waits until each answers ``/health``, and records pids, config and logs
in a state directory (``$MEGHA_HOME`` or ``./.megha``); ``stop_federation`` ends what it
recorded.  ``running_federation`` is both around a ``with`` block.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from common.config import STATE_ENV, FederationConfig, ProcessSpec, process_plan
from common.errors import ConfigError, MeghaError
from federation import provision
from federation.ports import port_free
from security.files import ensure_private_dir
from security.tls import process_client_context

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
        ctx = process_client_context()
        with urllib.request.urlopen(url + "/health", timeout=1.0, context=ctx) as resp:
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
    """Make the federation's secret, broker users and tokens (``federation.provision``),
    start every process of the plan; return (spec, pid) once all are healthy."""
    if (home / "pids.json").exists():
        recorded = json.loads((home / "pids.json").read_text())["processes"]
        if any(alive(p["pid"]) and _is_ours(p["pid"]) for p in recorded):
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
    provision.prepare(cfg, home, insecure_dev=insecure_dev)
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
                **(
                    provision.environment(home)
                    if spec.role == "dashboard"
                    else provision.service_environment(home, spec.role, spec.ident)
                ),
                STATE_ENV: str(home / "state"),
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


_PIDS_LOCK = threading.Lock()
"""Held while ``pids.json`` is read, changed and written again."""


def restart(home: Path, cfg: FederationConfig, name: str, *, timeout_s: float = 60.0) -> int:
    """Start process ``name`` again (after a crash) and wait until it is healthy."""
    spec = next(s for s in process_plan(cfg, str(home / "federation.toml")) if s.name == name)
    pid = launch(spec, home)
    with _PIDS_LOCK:  # restarts of two services at once (chaos): neither pid lost
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
            if not alive(pid):
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


def alive(pid: int) -> bool:
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
            provision.purge(cfg, home)
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
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    for pid in pids:
        child = _CHILDREN.pop(pid, None)
        if child is not None:
            child.wait(timeout=5)
    deadline = time.monotonic() + 5.0  # a killed leader's worker may still be exiting
    while any(group_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    for pid, child in list(_CHILDREN.items()):  # killed or replaced earlier: reap them
        if child.poll() is not None:
            del _CHILDREN[pid]
    path.unlink()
    if not quiet:
        print(f"stopped {len(pids)} processes")
    return len(pids)


def recorded(home: Path) -> dict[str, int]:
    """The processes ``megha up`` recorded: name -> pid."""
    path = home / "pids.json"
    if not path.exists():
        raise ConfigError(f"no federation recorded in {home} (start one with `megha up`)")
    return {p["name"]: p["pid"] for p in json.loads(path.read_text())["processes"]}


def kill(home: Path, name: str, sig: signal.Signals = signal.SIGKILL) -> int:
    """Send ``sig`` to service ``name`` (its whole process group: gunicorn and its worker)."""
    procs = recorded(home)
    if name not in procs:
        raise ConfigError(f"no service {name!r} here (services: {', '.join(procs)})")
    pid = procs[name]
    if not _is_ours(pid):
        raise ConfigError(f"{name} (pid {pid}) is not running")
    os.killpg(pid, sig)
    return pid


def kill_all(home: Path, *, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every running process of the federation at once, each process group (a
    host losing power, as far as the processes can tell); the pids it struck, once
    every process of their groups is gone (within ``wait_s``: a process dies some
    milliseconds after its SIGKILL, and a ``megha up`` that came first found the
    federation still running, or its ports still taken by a worker still exiting)."""
    struck = []
    for pid in recorded(home).values():
        if _is_ours(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
                struck.append(pid)
    deadline = time.monotonic() + wait_s
    while any(alive(p) or group_running(p) for p in struck) and time.monotonic() < deadline:
        time.sleep(0.01)
    return struck


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies aside).  A SIGKILLed
    group's leader may be gone while its gunicorn worker is still exiting, holding the
    listening socket they share: the port accepts until the last of them is gone."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


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


def restart_service(home: Path, cfg: FederationConfig, name: str) -> int:
    """Stop service ``name`` cleanly if it runs (SIGCONT first, for a stopped one; SIGKILL
    after 15 s), start it again and wait until it is healthy; returns its new pid."""
    pid = recorded(home)[name]
    if _is_ours(pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5  # its worker may outlive it a little: the port
        while group_running(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
    return restart(home, cfg, name)
