"""Private RabbitMQ nodes and clusters for fault tests; the shared broker is never touched.

``RabbitSandbox`` owns one temp dir (``/tmp/mtbrmq-XXXX``), an Erlang cookie in its own
``HOME``, a private ``epmd`` on its own port, and every node made from it. Guarantees:

* **Isolation from the shared broker** (``rabbit@localhost`` on 5672). Nodes run
  ``/usr/lib/rabbitmq/bin/rabbitmq-server`` directly as the current user (never the
  ``/usr/sbin`` wrapper, which would ``su rabbitmq`` and write the shared node's
  ``/var/log/rabbitmq/startup_log``), with ``RABBITMQ_CONF_ENV_FILE``,
  ``RABBITMQ_CONFIG_FILE``, ``RABBITMQ_ENABLED_PLUGINS_FILE``, ``RABBITMQ_MNESIA_BASE``,
  ``RABBITMQ_LOG_BASE`` and ``HOME`` (the cookie) inside the sandbox, their own
  ``RABBITMQ_NODENAME``, AMQP port, distribution port, CLI distribution port range and
  ``ERL_EPMD_PORT``. Nothing in ``/etc/rabbitmq`` or ``/var/lib/rabbitmq`` is read or
  written, and the shared epmd never sees these nodes.
* **Readiness.** ``start`` returns once the node is registered with the sandbox's epmd
  and ``rabbitmqctl await_startup`` says the broker is up, or raises ``TestbedError``
  with the tail of the node's log within ``timeout`` seconds.
* **Faults.** ``stop`` is graceful (``rabbitmqctl stop``); ``kill`` sends SIGKILL to the
  ``beam.smp`` process and waits for it to be gone; ``pause``/``resume`` send it
  SIGSTOP/SIGCONT; ``start`` again reuses the node's
  data directory, so durable queues and persistent messages survive. A
  ``RabbitCluster`` of three nodes is formed with ``join_cluster``; a stopped or killed
  member rejoins by itself when started again.
* **Cleanup.** ``close`` (or leaving the ``with`` block) kills every process the sandbox
  started and deletes its directory. Each process carries ``MEGHA_TESTBED_RUN=<dir
  name>`` and the sandbox holds an ``flock`` on ``owner.lock``; ``sweep`` removes
  sandboxes whose owner died (processes killed, directory deleted).

Test nodes let ``guest`` log in from any address (``loopback_users.guest = false``):
they listen only on loopback or a test-bed bridge address. The management plugin is
off unless ``management=True``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed._sys import (
    MARKER,
    OwnerLock,
    TestbedError,
    children,
    free_ports,
    kill_pids,
    marked_pids,
    pid_alive,
    run,
)

PREFIX = "mtbrmq"
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
SWEEP_GRACE_S = 60.0


def epmd_names(port: int, timeout: float = 1.0) -> dict[str, int]:
    """Node name -> distribution port, as the epmd on ``127.0.0.1:port`` knows them."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"\x00\x01n")  # NAMES_REQ
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    names: dict[str, int] = {}
    for line in data[4:].decode(errors="replace").splitlines():
        words = line.split()  # "name NAME at port PORT"
        if len(words) == 5 and words[0] == "name":
            names[words[1]] = int(words[4])
    return names


def sweep(prefix: str = PREFIX) -> list[str]:
    """Remove the sandboxes named ``prefix-*`` whose owner died; the paths removed."""
    removed: list[str] = []
    for path in sorted(Path(tempfile.gettempdir()).glob(f"{prefix}-*")):
        lock_file = path / "owner.lock"
        if not path.is_dir():
            continue
        if not lock_file.exists() and time.time() - path.stat().st_mtime < SWEEP_GRACE_S:
            continue  # being created right now: its owner takes the lock next
        lock = OwnerLock(lock_file)
        if not lock.try_acquire():
            continue
        try:
            kill_pids(marked_pids(path.name), grace=1.0)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
        finally:
            lock.release(unlink=False)
    return removed


class RabbitNode:
    """One private RabbitMQ node of a sandbox; made by ``RabbitSandbox.node``."""

    def __init__(
        self,
        sandbox: RabbitSandbox,
        name: str,
        *,
        listen_ip: str,
        amqp_port: int,
        dist_port: int,
        management_port: int | None,
        dist_optfile: Path | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.dist_optfile = dist_optfile
        """Erlang distribution over TLS with this ``-ssl_dist_optfile`` (None: in clear)."""
        self.name = name
        self.nodename = f"{name}@localhost"
        self.listen_ip = listen_ip
        self.amqp_port = amqp_port
        self.dist_port = dist_port
        self.management_port = management_port
        self.dir = sandbox.dir / name
        self.proc: subprocess.Popen[bytes] | None = None
        (self.dir / "log").mkdir(parents=True)
        (self.dir / "mnesia").mkdir()
        conf = [
            "loopback_users.guest = false",
            "log.file.level = info",
            "log.console = false",
        ]
        plugins = "[]."
        if management_port is not None:
            conf += [f"management.tcp.ip = {listen_ip}", f"management.tcp.port = {management_port}"]
            plugins = "[rabbitmq_management]."
        (self.dir / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        (self.dir / "enabled_plugins").write_text(plugins + "\n")

    @property
    def url(self) -> str:
        """The AMQP URL of this node, as ``guest``."""
        return f"amqp://guest:guest@{self.listen_ip}:{self.amqp_port}/"

    def env(self) -> dict[str, str]:
        """The environment this node's server and CLI commands run with."""
        env = self.sandbox.env()
        d = self.dir
        env |= {
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_NODE_IP_ADDRESS": self.listen_ip,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        if self.dist_optfile is not None:  # the server's links and the CLI's, over TLS
            tls = f"-proto_dist inet_tls -ssl_dist_optfile {self.dist_optfile}"
            env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] += f" {tls}"
            env["RABBITMQ_CTL_ERL_ARGS"] = tls
        return env

    # -- lifecycle -------------------------------------------------------------------

    def launch(self) -> None:
        """Start the server process without waiting for it (see ``wait_ready``)."""
        if self.running:
            raise TestbedError(f"{self.nodename} is already running")
        self._reap()
        with (self.dir / "server.out").open("ab") as out:
            self.proc = subprocess.Popen(
                [str(RABBIT_BIN / "rabbitmq-server")],
                env=self.env(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the broker on this node has started; raise with its log if not."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is None or self.proc.poll() is not None:
                raise TestbedError(f"{self.nodename} exited while starting:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if self.name in epmd_names(self.sandbox.epmd_port):
                    break
            if time.monotonic() > deadline:
                raise TestbedError(f"{self.nodename} did not register in {timeout:g} s")
            time.sleep(0.1)
        left = max(1.0, deadline - time.monotonic())
        try:
            self.ctl("await_startup", "--timeout", str(int(left) + 1), timeout=left + 5.0)
        except TestbedError as exc:
            raise TestbedError(f"{exc}\n{self.log_tail()}") from None

    def start(self, timeout: float = 60.0) -> None:
        """Start the node (on its existing data, if any) and wait until it serves."""
        self.launch()
        self.wait_ready(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the node gracefully; SIGKILL it if it is not gone within ``timeout``."""
        if not self.running:
            self._reap()
            return
        with contextlib.suppress(TestbedError):
            self.ctl("stop", timeout=timeout)
        self._wait_gone(timeout)

    def kill(self, timeout: float = 10.0) -> None:
        """``kill -9`` the node's ``beam.smp``, as a crash would, and wait until it is gone."""
        beam = self.beam_pid
        if beam is None:
            raise TestbedError(f"{self.nodename} has no running beam.smp to kill")
        os.kill(beam, signal.SIGKILL)
        self._wait_gone(timeout)

    def pause(self) -> None:
        """SIGSTOP the node's ``beam.smp``: it holds its connections and answers nothing."""
        self._signal_beam(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused node."""
        self._signal_beam(signal.SIGCONT)

    def _signal_beam(self, signum: signal.Signals) -> None:
        beam = self.beam_pid
        if beam is None:
            raise TestbedError(f"{self.nodename} has no running beam.smp")
        os.kill(beam, signum)

    def _wait_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.proc is not None:
            beam = self.beam_pid
            if beam is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(beam, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap()
        # epmd forgets a name once the node's connection to it closes.
        while time.monotonic() < deadline + 5.0:
            with contextlib.suppress(OSError):
                if self.name not in epmd_names(self.sandbox.epmd_port):
                    return
            time.sleep(0.05)

    def _reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            if self.proc.poll() is not None:
                self.proc = None

    @property
    def beam_pid(self) -> int | None:
        """The pid of this node's Erlang VM, if it runs."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        for pid in children(self.proc.pid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "beam.smp":
                    return pid
            except OSError:
                continue
        return None

    @property
    def running(self) -> bool:
        """Whether this node's server process (``beam.smp``) is alive."""
        beam = self.beam_pid
        return beam is not None and pid_alive(beam)

    # -- commands --------------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 30.0) -> str:
        """Run ``rabbitmqctl -n NODE ARGS`` and return its stdout.

        Over TLS links a loaded machine's CLI misses a running node now and then (exit
        69, "unable to perform an operation", while epmd and the node both answer): the
        command is tried again while the server process lives, until ``timeout``.  A
        node whose process is gone fails at once, as do other exits.  The commands
        tried again here (status, stop_app, join_cluster, start_app, listings) take a
        repeat of one that went through."""
        argv = [str(RABBIT_BIN / "rabbitmqctl"), "-n", self.nodename, *args]
        deadline = time.monotonic() + timeout
        while True:
            left = max(1.0, deadline - time.monotonic())
            try:
                return run(argv, timeout=left, env=self.env()).stdout
            except TestbedError as exc:
                unreachable = "exited 69" in str(exc) and self.dist_optfile is not None
                if not unreachable or not self.running or time.monotonic() + 1.0 > deadline:
                    raise
            time.sleep(1.0)

    def queues(self, timeout: float = 30.0) -> dict[str, int]:
        """Queue name -> ready messages on this node's vhost ``/``."""
        out = self.ctl(
            "list_queues", "name", "messages_ready", "--formatter", "json", timeout=timeout
        )
        return {q["name"]: int(q["messages_ready"]) for q in json.loads(out)}

    def queue_info(self, queue: str, timeout: float = 30.0) -> dict[str, Any]:
        """``name``, ``type``, ``messages_ready``, and for quorum queues ``leader``,
        ``members`` and ``online``, as this node reports them."""
        items = ["name", "type", "messages_ready", "leader", "members", "online"]
        out = self.ctl("list_queues", *items, "--formatter", "json", timeout=timeout)
        for info in json.loads(out):
            if info["name"] == queue:
                found: dict[str, Any] = info
                return found
        raise TestbedError(f"{self.nodename}: no queue {queue!r}")

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the node's log (and of its console output)."""
        text = []
        for path in (self.dir / "log" / f"{self.nodename}.log", self.dir / "server.out"):
            with contextlib.suppress(OSError):
                text += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(text)


class RabbitCluster:
    """Nodes joined into one RabbitMQ cluster; made by ``RabbitSandbox.cluster``."""

    def __init__(self, nodes: Sequence[RabbitNode]) -> None:
        self.nodes = list(nodes)

    def start(self, timeout: float = 90.0) -> None:
        """Start every node at once, then join each to the first with ``join_cluster``."""
        for node in self.nodes:
            node.launch()
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        seed = self.nodes[0].nodename
        for node in self.nodes[1:]:
            for step in (("stop_app",), ("join_cluster", seed), ("start_app",)):
                node.ctl(*step, timeout=max(1.0, deadline - time.monotonic()))
        self.wait_running(len(self.nodes), timeout=max(1.0, deadline - time.monotonic()))

    @property
    def urls(self) -> list[str]:
        """The AMQP URLs of the members, in order."""
        return [node.url for node in self.nodes]

    def running_nodes(self, via: RabbitNode | None = None) -> list[str]:
        """Members the cluster sees running, asked of ``via`` (default: any running member)."""
        asked = via or next((n for n in self.nodes if n.running), None)
        if asked is None:
            return []
        status = json.loads(asked.ctl("cluster_status", "--formatter", "json"))
        return sorted(status["running_nodes"])

    def leader(self, queue: str) -> RabbitNode:
        """The member holding the leader of quorum queue ``queue``."""
        asked = next((n for n in self.nodes if n.running), None)
        if asked is None:
            raise TestbedError("no member of the cluster is running")
        leader = asked.queue_info(queue).get("leader")
        for node in self.nodes:
            if node.nodename == leader:
                return node
        raise TestbedError(f"quorum queue {queue!r} has no leader among the members ({leader})")

    def wait_running(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` members are seen running."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(TestbedError, ValueError, KeyError):
                seen = self.running_nodes()
                if len(seen) == count:
                    return
            time.sleep(0.5)
        raise TestbedError(f"cluster: {len(seen)} running ({seen}), wanted {count}")

    def stop(self) -> None:
        """Stop every member, the first last (it must also start first)."""
        for node in reversed(self.nodes):
            node.stop()


class RabbitSandbox:
    """A temp dir, a cookie, a private epmd, and the private nodes made in it."""

    __test__ = False

    def __init__(self, prefix: str = PREFIX) -> None:
        self.prefix = prefix
        self.dir = Path("/nonexistent")
        self.epmd_port = 0
        self.ctl_ports = (0, 0)
        self.nodes: list[RabbitNode] = []
        self._lock: OwnerLock | None = None
        self._epmd: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RabbitSandbox:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> RabbitSandbox:
        """Make the directory, take its lock, write the cookie and start epmd."""
        if not (RABBIT_BIN / "rabbitmq-server").exists():
            raise TestbedError(
                f"{RABBIT_BIN}/rabbitmq-server missing: apt-get install rabbitmq-server"
            )
        sweep(self.prefix)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        self._lock = OwnerLock(self.dir / "owner.lock")
        if not self._lock.try_acquire():
            raise TestbedError(f"{self.dir}: could not lock a directory just made")
        try:
            home = self.dir / "home"
            home.mkdir()
            cookie = home / ".erlang.cookie"
            cookie.write_text(secrets.token_hex(20).upper())
            cookie.chmod(0o400)
            (self.dir / "rabbitmq-env.conf").write_text("# private test-bed nodes: no defaults\n")
            ports = free_ports("127.0.0.1", 1)
            self.epmd_port = ports[0]
            base = free_ports("127.0.0.1", 1, low=33000, high=60000)[0]
            self.ctl_ports = (base, base + 10)
            self._epmd = subprocess.Popen(
                ["epmd", "-address", "127.0.0.1", "-port", str(self.epmd_port)],
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            deadline = time.monotonic() + 10.0
            while True:
                with contextlib.suppress(OSError):
                    epmd_names(self.epmd_port)
                    break
                if time.monotonic() > deadline or self._epmd.poll() is not None:
                    raise TestbedError(f"private epmd on port {self.epmd_port} did not start")
                time.sleep(0.05)
        except BaseException:
            self.close()
            raise
        return self

    def env(self) -> dict[str, str]:
        """The environment shared by every node and CLI call of this sandbox."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RABBITMQ_", "ERL_")) and k != "HOME"
        }
        env |= {
            "HOME": str(self.dir / "home"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(self.ctl_ports[0]),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(self.ctl_ports[1]),
            MARKER: self.dir.name,
        }
        return env

    def node(
        self,
        name: str,
        *,
        listen_ip: str = "127.0.0.1",
        management: bool = False,
        dist_optfile: Path | None = None,
    ) -> RabbitNode:
        """A new node (not started) with free AMQP and distribution ports (its links to
        other nodes over TLS as ``dist_optfile`` says, if given)."""
        full = f"{self.dir.name.replace('_', '')}-{name}"
        if not name.replace("-", "").isalnum() or any(n.name == full for n in self.nodes):
            raise ValueError(f"node name {name!r}: letters, digits and '-', unique")
        if self._lock is None:
            raise TestbedError("open the sandbox first")
        wanted = 2 if management else 1
        # this sandbox's other nodes may not have bound their ports yet (free to a bind
        # check): none of theirs, nor epmd's, is handed out again
        taken = {n.amqp_port for n in self.nodes} | {n.dist_port for n in self.nodes}
        taken |= {n.management_port for n in self.nodes if n.management_port is not None}
        taken.add(self.epmd_port)
        while True:
            on_ip = free_ports(listen_ip, wanted)
            if taken.isdisjoint(on_ip):
                break
        while True:
            dist = free_ports("127.0.0.1", 1)[0]
            if dist not in taken and dist not in on_ip:
                break
        node = RabbitNode(
            self,
            full,
            listen_ip=listen_ip,
            amqp_port=on_ip[0],
            dist_port=dist,
            management_port=on_ip[1] if management else None,
            dist_optfile=dist_optfile,
        )
        self.nodes.append(node)
        return node

    def cluster(
        self,
        size: int = 3,
        *,
        name: str = "c",
        listen_ip: str = "127.0.0.1",
        dist_optfile: Path | None = None,
    ) -> RabbitCluster:
        """``size`` new nodes ``NAME0``, ``NAME1``, ... as one cluster (call ``start``)."""
        return RabbitCluster(
            [
                self.node(f"{name}{i}", listen_ip=listen_ip, dist_optfile=dist_optfile)
                for i in range(size)
            ]
        )

    def close(self) -> None:
        """Kill every node and the epmd, delete the directory, release the lock."""
        for node in self.nodes:
            beam = node.beam_pid
            if beam is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(beam, signal.SIGKILL)
            if node.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=5)
        if self._epmd is not None:
            self._epmd.kill()
            self._epmd.wait(timeout=5)
            self._epmd = None
        if self._lock is not None:
            kill_pids(marked_pids(self.dir.name), grace=1.0)
            shutil.rmtree(self.dir, ignore_errors=True)
            self._lock.release(unlink=False)
            self._lock = None
