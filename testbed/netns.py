"""Named hosts on one Linux bridge: network namespaces, veth pairs, latency, partitions.

``Testbed(["gm0", "lm0", "w0"])`` makes one network namespace per host, each with a
veth pair into one bridge, and addresses from a /24 of ``10.200.0.0/16`` that no other
live run holds. Guarantees:

* **Layout.** The bridge lives in the root namespace with the subnet's ``.1``
  (``gateway``), so processes in the root namespace (a test, ``megha bench``, a broker
  listening on ``gateway``) reach every host and every host reaches them; hosts get
  ``.2``, ``.3``, ... in the order given, ``lo`` up, ``eth0`` on the bridge. A dedicated
  switch namespace would need one more veth and a route for the root namespace to reach
  the hosts; the root namespace keeps that path short and needs no route. Hosts have no
  default route: they reach only the subnet. MAC addresses, bridge forwarding entries
  and neighbour (ARP) entries are static, IPv6 is off on every link: no broadcast, no
  flooding, nothing on the wire but what the processes send.
* **Names.** Everything a run creates is named ``RUN-...`` where ``RUN`` is ``prefix``
  plus the subnet's third octet in hex (``mtb3f``): namespaces ``RUN-HOST``, the bridge
  ``RUN-br``, bridge-side veths ``RUN-vI``, delay taps ``RUN-dI``. A run holds an
  ``flock`` on ``/run/megha-testbed/netNN.lock`` while it lives; ``sweep`` removes the
  leftovers of runs whose lock is free (their owner died, even by ``kill -9``), and
  ``start`` sweeps before it claims a subnet. ``teardown`` (or leaving the ``with``
  block, also on an exception or Ctrl-C) kills every process in the hosts, removes
  every link and namespace, and releases the lock.
* **Latency.** ``set_latency(host, delay_ms, jitter_ms, loss_pct)`` applies to every
  packet the host *sends* (its egress), so a round trip between hosts A and B gains
  ``delay(A) + delay(B)``, and one between a host and the root namespace gains the
  host's delay. With the ``netem`` backend this is ``tc netem`` on the host's ``eth0``;
  with the ``tap`` backend (the only one on kernels without ``sch_netem``, such as this
  one) the host's frames are redirected by ``tc`` into a tap device and held by a
  userspace daemon (``testbed/delayd.py``) before they go on; see that module for what
  it guarantees. ``backend="auto"`` takes netem where the kernel has it.
* **Partitions.** ``partition(host)`` sets the host's bridge port (and its delay tap)
  to the ``disabled`` STP state: every frame to or from the host is dropped silently,
  links stay up, nothing is told; ``heal(host)`` sets it back to ``forwarding``.
  Connections survive a short partition (TCP retransmits) as on a real network.

Needs root, ``ip``, ``bridge`` and ``tc`` (iproute2).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import select
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from testbed._sys import (
    LOCK_DIR,
    MARKER,
    OwnerLock,
    TestbedError,
    kill_pids,
    marked_pids,
    run,
)

POOL = ipaddress.IPv4Network("10.200.0.0/16")
PREFIX = "mtb"
NETNS_DIR = Path("/run/netns")
HERE = Path(__file__).resolve().parent
DELAYD = HERE / "delayd.py"
PROBE = HERE / "probe.py"
PROBE_PORT = 40007
Backend = Literal["auto", "netem", "tap"]
_netem: bool | None = None


@dataclass(frozen=True)
class Host:
    """One host of a test-bed: its namespace, address and the root-side names of its links."""

    name: str
    index: int
    netns: str
    address: str
    mac: str
    port: str
    tap: str


@dataclass(frozen=True)
class Latency:
    """What ``set_latency`` applied to a host's egress."""

    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0


def netem_available() -> bool:
    """Whether this kernel has ``sch_netem`` (tried once, in a throwaway namespace)."""
    global _netem
    if _netem is None:
        probe = run(
            [
                "unshare",
                "--net",
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "netem",
                "delay",
                "1ms",
            ],
            check=False,
        )
        _netem = probe.returncode == 0
    return _netem


def _lock_path(third_octet: int) -> Path:
    return LOCK_DIR / f"net{third_octet:02x}.lock"


def _run_of(name: str, prefix: str) -> str | None:
    """The run name (``prefix`` + two hex digits) a resource name belongs to, if any."""
    head = name.split("-", 1)[0]
    if len(head) != len(prefix) + 2 or not head.startswith(prefix):
        return None
    try:
        int(head[len(prefix) :], 16)
    except ValueError:
        return None
    return head


def _namespaces() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def _links() -> list[str]:
    """Names of the links in the root namespace."""
    out = run(["ip", "-o", "link", "show"]).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _netns_pids(netns: str) -> list[int]:
    out = run(["ip", "netns", "pids", netns], check=False).stdout
    return [int(word) for word in out.split() if word.isdigit()]


def _remove_run(run_name: str) -> list[str]:
    """Kill the processes of ``run_name`` and remove its links and namespaces."""
    removed: list[str] = []
    namespaces = [ns for ns in _namespaces() if ns.startswith(run_name + "-")]
    pids = [pid for ns in namespaces for pid in _netns_pids(ns)]
    kill_pids([*pids, *marked_pids(run_name)])
    for link in _links():
        # Deleting the root side of a veth removes its peer in the namespace too.
        if (
            link.startswith(run_name + "-")
            and run(["ip", "link", "del", link], check=False).returncode == 0
        ):
            removed.append(link)
    for ns in namespaces:
        if run(["ip", "netns", "del", ns], check=False).returncode == 0:
            removed.append(ns)
    return removed


def sweep(prefix: str = PREFIX) -> list[str]:
    """Remove what dead runs named ``prefix..`` left behind; the names removed.

    A run whose lock is held by a live process is never touched.
    """
    runs = {
        r
        for r in (
            *(_run_of(n, prefix) for n in _namespaces()),
            *(_run_of(n, prefix) for n in _links()),
        )
        if r is not None
    }
    removed: list[str] = []
    for run_name in sorted(runs):
        lock = OwnerLock(_lock_path(int(run_name[len(prefix) :], 16)))
        if not lock.try_acquire():
            continue
        try:
            removed += _remove_run(run_name)
        finally:
            lock.release()
    return removed


class _Delayer:
    """The ``delayd.py`` process holding the frames of every delayed host of one run."""

    def __init__(self, run_name: str) -> None:
        env = dict(os.environ)
        env[MARKER] = run_name
        self.proc = subprocess.Popen(
            [sys.executable, str(DELAYD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )

    def command(self, line: str, timeout: float = 5.0) -> None:
        """Send one command and wait for its ``ok``."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TestbedError(f"delayd: no answer to {line!r} within {timeout:g} s")
        answer = self.proc.stdout.readline().decode().strip()
        if not answer.startswith("ok "):
            raise TestbedError(f"delayd: {line!r} -> {answer or 'exited'}")

    def close(self) -> None:
        """End the daemon (EOF on its stdin) and reap it."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=3)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Testbed:
    """Named hosts, each a network namespace on one bridge; see the module docstring."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, names: Iterable[str], *, backend: Backend = "auto", prefix: str = PREFIX):
        self.names = list(names)
        if not self.names or len(self.names) > 250:
            raise ValueError("a test-bed has 1 to 250 hosts")
        for name in self.names:
            if not name or not all(c.isalnum() or c in "-_" for c in name):
                raise ValueError(f"host name {name!r}: letters, digits, '-' and '_' only")
        if len(set(self.names)) != len(self.names):
            raise ValueError("host names must be distinct")
        if not (1 <= len(prefix) <= 8 and prefix.isalpha() and prefix.islower()):
            raise ValueError("prefix: 1 to 8 lower-case letters")
        self.prefix = prefix
        self.requested_backend: Backend = backend
        self.backend: Literal["netem", "tap"] = "tap"
        self.run_name = ""
        self.subnet = ipaddress.IPv4Network("0.0.0.0/32")
        self.gateway = ""
        self.bridge = ""
        self.hosts: dict[str, Host] = {}
        self._lock: OwnerLock | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._delayer: _Delayer | None = None
        self._latency: dict[str, Latency] = {}
        self._partitioned: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> Testbed:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def start(self) -> Testbed:
        """Claim a subnet and create the bridge and every host; undone on failure."""
        if os.geteuid() != 0:
            raise TestbedError("a test-bed needs root (network namespaces, veth, tc)")
        if self.requested_backend == "netem" and not netem_available():
            raise TestbedError(
                "tc netem is not available: this kernel has no sch_netem "
                "(CONFIG_NET_SCH_NETEM unset and no module); use backend='tap'"
            )
        self.backend = (
            "netem"
            if self.requested_backend == "netem"
            or (self.requested_backend == "auto" and netem_available())
            else "tap"
        )
        sweep(self.prefix)
        self._claim()
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def _claim(self) -> None:
        used = [
            ipaddress.IPv4Network(word, strict=False)
            for word in run(["ip", "-4", "-o", "addr", "show"]).stdout.split()
            if "/" in word and word[0].isdigit()
        ]
        octets = list(range(256))
        random.shuffle(octets)
        for octet in octets:
            subnet = ipaddress.IPv4Network(f"10.200.{octet}.0/24")
            if any(subnet.overlaps(net) for net in used):
                continue
            lock = OwnerLock(_lock_path(octet))
            if not lock.try_acquire():
                continue
            self._lock = lock
            self.run_name = f"{self.prefix}{octet:02x}"
            _remove_run(self.run_name)  # leftovers of a dead run that had this subnet
            self.subnet = subnet
            self.gateway = str(subnet.network_address + 1)
            self.bridge = f"{self.run_name}-br"
            return
        raise TestbedError("no free /24 in 10.200.0.0/16: every one is in use")

    def _mac(self, index: int) -> str:
        octet = self.subnet.network_address.packed[2]
        return f"02:6d:{octet:02x}:00:{index >> 8:02x}:{index & 0xFF:02x}"

    def _build(self) -> None:
        bridge_mac = self._mac(0xFFFF)
        for index, name in enumerate(self.names):
            self.hosts[name] = Host(
                name=name,
                index=index,
                netns=f"{self.run_name}-{name}",
                address=str(self.subnet.network_address + 2 + index),
                mac=self._mac(index),
                port=f"{self.run_name}-v{index}",
                tap=f"{self.run_name}-d{index}",
            )
        root = [
            f"link add {self.bridge} address {bridge_mac} type bridge",
            f"link set {self.bridge} addrgenmode none",
            f"addr add {self.gateway}/24 dev {self.bridge}",
            f"link set {self.bridge} up",
        ]
        for host in self.hosts.values():
            root += [
                f"netns add {host.netns}",
                f"link add {host.port} type veth peer name eth0 address {host.mac} netns {host.netns}",
                f"link set {host.port} addrgenmode none",
                f"link set {host.port} master {self.bridge}",
                f"link set {host.port} up",
                f"neigh replace {host.address} lladdr {host.mac} dev {self.bridge} nud permanent",
            ]
        run(["ip", "-batch", "-"], input_text="\n".join(root) + "\n")
        run(
            ["bridge", "-batch", "-"],
            input_text="".join(
                f"fdb replace {h.mac} dev {h.port} master static\n" for h in self.hosts.values()
            ),
        )
        for host in self.hosts.values():
            lines = [
                "link set lo up",
                "link set eth0 addrgenmode none",
                f"addr add {host.address}/24 dev eth0",
                "link set eth0 up",
                f"neigh replace {self.gateway} lladdr {bridge_mac} dev eth0 nud permanent",
            ]
            lines += [
                f"neigh replace {other.address} lladdr {other.mac} dev eth0 nud permanent"
                for other in self.hosts.values()
                if other is not host
            ]
            run(["ip", "-n", host.netns, "-batch", "-"], input_text="\n".join(lines) + "\n")

    def teardown(self) -> None:
        """Kill every process in the hosts, remove every link and namespace, free the subnet."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._procs.clear()
        if self._delayer is not None:
            self._delayer.close()
            self._delayer = None
        if self._lock is not None:
            try:
                _remove_run(self.run_name)
            finally:
                self._lock.release()
                self._lock = None
        self._latency.clear()
        self._partitioned.clear()

    # -- running things in hosts -----------------------------------------------------

    def host(self, name: str) -> Host:
        """The host called ``name``."""
        try:
            return self.hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in this test-bed ({', '.join(self.hosts)})") from None

    def address(self, name: str) -> str:
        """The IPv4 address of host ``name``."""
        return self.host(name).address

    def argv_in(self, host: str | None, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run inside ``host`` (``None``: the root namespace)."""
        if host is None:
            return list(argv)
        return ["ip", "netns", "exec", self.host(host).netns, *argv]

    def popen(
        self,
        host: str | None,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``; ``teardown`` kills it if it still runs.

        ``env`` replaces the environment as in ``subprocess.Popen`` (``None``: inherit);
        the run's marker is added either way so a sweeper can find the process.
        """
        full_env = dict(os.environ if env is None else env)
        full_env[MARKER] = self.run_name
        proc: subprocess.Popen[Any] = subprocess.Popen(
            self.argv_in(host, argv), env=full_env, **kwargs
        )
        self._procs.append(proc)
        return proc

    def run(
        self, host: str | None, argv: Sequence[str], *, timeout: float = 20.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host`` to completion within ``timeout`` seconds."""
        env = dict(os.environ)
        env[MARKER] = self.run_name
        return run(self.argv_in(host, argv), timeout=timeout, check=check, env=env)

    # -- latency and partitions ------------------------------------------------------

    def set_latency(
        self, host: str, delay_ms: float, jitter_ms: float = 0.0, loss_pct: float = 0.0
    ) -> None:
        """Delay (and jitter, and drop) every packet ``host`` sends; replaces earlier settings."""
        if delay_ms < 0 or jitter_ms < 0 or jitter_ms > delay_ms or not 0 <= loss_pct <= 100:
            raise ValueError("need 0 <= jitter_ms <= delay_ms and 0 <= loss_pct <= 100")
        h = self.host(host)
        if self.backend == "netem":
            run(
                [
                    "tc", "-n", h.netns, "qdisc", "replace", "dev", "eth0", "root", "netem",
                    "delay", f"{delay_ms}ms", f"{jitter_ms}ms", "loss", f"{loss_pct}%",
                ]
            )  # fmt: skip
        else:
            self._tap_latency(h, Latency(delay_ms, jitter_ms, loss_pct))
        self._latency[host] = Latency(delay_ms, jitter_ms, loss_pct)

    def _tap_latency(self, h: Host, latency: Latency) -> None:
        fresh = h.name not in self._latency
        if fresh:
            run(["ip", "tuntap", "add", "dev", h.tap, "mode", "tap"])
            run(["ip", "link", "set", h.tap, "addrgenmode", "none"])
            run(["ip", "link", "set", h.tap, "master", self.bridge])
            run(
                ["bridge", "link", "set", "dev", h.tap, "learning", "off", "flood", "off",
                 "mcast_flood", "off", "bcast_flood", "off"]
            )  # fmt: skip
            if h.name in self._partitioned:
                run(["bridge", "link", "set", "dev", h.tap, "state", "0"])
            run(["ip", "link", "set", h.tap, "up"])
        if self._delayer is None:
            self._delayer = _Delayer(self.run_name)
        self._delayer.command(
            f"set {h.tap} {latency.delay_ms} {latency.jitter_ms} {latency.loss_pct}"
        )
        if fresh:
            # Only now that the daemon reads the tap: redirect the host's frames into it.
            run(["tc", "qdisc", "add", "dev", h.port, "clsact"])
            run(
                ["tc", "filter", "add", "dev", h.port, "ingress", "protocol", "all", "pref", "1",
                 "u32", "match", "u32", "0", "0",
                 "action", "mirred", "egress", "redirect", "dev", h.tap]
            )  # fmt: skip

    def clear_latency(self, host: str) -> None:
        """Take away what ``set_latency`` added; frames still held are sent at once."""
        h = self.host(host)
        if host not in self._latency:
            return
        if self.backend == "netem":
            run(["tc", "-n", h.netns, "qdisc", "del", "dev", "eth0", "root"])
        else:
            run(["tc", "qdisc", "del", "dev", h.port, "clsact"])
            if self._delayer is not None:
                self._delayer.command(f"drop {h.tap}")
            run(["ip", "link", "del", h.tap])
        del self._latency[host]

    def latency(self, host: str) -> Latency | None:
        """What ``set_latency`` last applied to ``host``, if it is in force."""
        self.host(host)
        return self._latency.get(host)

    def partition(self, host: str) -> None:
        """Cut ``host`` off from every other host and the root namespace, silently."""
        self._port_state(host, 0)
        self._partitioned.add(host)

    def heal(self, host: str) -> None:
        """Undo ``partition``."""
        self._port_state(host, 3)
        self._partitioned.discard(host)

    def partitioned(self, host: str) -> bool:
        """Whether ``host`` is cut off."""
        self.host(host)
        return host in self._partitioned

    def _port_state(self, host: str, state: int) -> None:
        h = self.host(host)
        ports = [h.port]
        if self.backend == "tap" and host in self._latency:
            ports.append(h.tap)
        for port in ports:
            run(["bridge", "link", "set", "dev", port, "state", str(state)])

    # -- probes ----------------------------------------------------------------------

    def echo_server(self, dst: str, seconds: float) -> subprocess.Popen[str]:
        """A TCP echo server on ``dst``'s address, port ``PROBE_PORT``, for ``seconds``;
        returned once it listens (kill it when done)."""
        server = self.popen(
            dst,
            [sys.executable, str(PROBE), "echo", self.address(dst), str(PROBE_PORT), str(seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], 10.0)
        if not ready or server.stdout.readline().strip() != "ready":
            server.kill()
            server.wait(timeout=5)
            raise TestbedError(f"probe echo server in {dst} did not start")
        return server

    def tcp_rtt(
        self, src: str | None, dst: str, *, count: int = 20, timeout: float = 5.0
    ) -> list[float]:
        """Round-trip times in ms of ``count`` 64-byte TCP ping-pongs from ``src`` to ``dst``.

        ``src=None`` measures from the root namespace. Raises ``TestbedError`` when
        ``dst`` cannot be reached within ``timeout`` seconds.
        """
        server = self.echo_server(dst, timeout + count * 2.0 + 5.0)
        try:
            done = self.run(
                src,
                [sys.executable, str(PROBE), "rtt", self.address(dst), str(PROBE_PORT),
                 str(count), str(timeout)],
                timeout=timeout + count * 2.0 + 5.0,
                check=False,
            )  # fmt: skip
        finally:
            server.kill()
            server.wait(timeout=5)
            assert server.stdout is not None
            server.stdout.close()
        if done.returncode != 0:
            raise TestbedError(f"{src or 'root'} -> {dst}: {done.stderr.strip() or 'probe failed'}")
        samples: list[float] = json.loads(done.stdout)["rtt_ms"]
        return samples

    def reachable(self, src: str | None, dst: str, *, timeout: float = 1.0) -> bool:
        """Whether a TCP connection and one round trip from ``src`` to ``dst`` succeed."""
        try:
            self.tcp_rtt(src, dst, count=1, timeout=timeout)
        except TestbedError:
            return False
        return True

    def udp_delivered(self, src: str | None, dst: str, count: int) -> int:
        """How many of ``count`` UDP datagrams sent from ``src`` reach ``dst``."""
        port = str(PROBE_PORT + 1)
        sink = self.popen(
            dst,
            [
                sys.executable,
                str(PROBE),
                "udp-sink",
                self.address(dst),
                port,
                str(count / 100 + 10),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert sink.stdout is not None
            ready, _, _ = select.select([sink.stdout], [], [], 10.0)
            if not ready or sink.stdout.readline().strip() != "ready":
                raise TestbedError(f"probe udp sink in {dst} did not start")
            started = time.monotonic()
            self.run(
                src, [sys.executable, str(PROBE), "udp-send", self.address(dst), port, str(count)]
            )
            out, _ = sink.communicate(timeout=count / 100 + 15 - (time.monotonic() - started))
            return int(out.strip())
        finally:
            if sink.poll() is None:
                sink.kill()
            sink.wait(timeout=5)
            if sink.stdout is not None:
                sink.stdout.close()
