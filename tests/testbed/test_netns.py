"""testbed.netns: hosts reach each other, latency adds what it says, partitions cut, nothing is left."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed._sys import LOCK_DIR, marked_pids
from testbed.netns import Testbed, _links, _namespaces, netem_available, sweep

pytestmark = pytest.mark.netns
BACKENDS = [
    "tap",
    pytest.param(
        "netem",
        marks=pytest.mark.skipif(
            os.geteuid() != 0 or not netem_available(),
            reason="this kernel has no sch_netem (CONFIG_NET_SCH_NETEM unset)",
        ),
    ),
]


def leftovers(run_name: str) -> list[str]:
    """Namespaces, links and processes of ``run_name`` that still exist."""
    names = [n for n in (*_namespaces(), *_links()) if n.startswith(run_name + "-")]
    return names + [f"pid {pid}" for pid in marked_pids(run_name)]


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    with Testbed(["a", "b", "c"]) as bed:
        yield bed


def test_hosts_get_distinct_addresses_on_one_subnet(tb: Testbed) -> None:
    addresses = [tb.address(n) for n in ("a", "b", "c")]
    assert len(set(addresses)) == 3
    assert all(a.startswith(str(tb.subnet.network_address)[:-1]) for a in addresses)
    assert tb.gateway == str(tb.subnet.network_address + 1)
    shown = tb.run("a", ["ip", "-br", "-4", "addr", "show", "dev", "eth0"]).stdout
    assert f"{tb.address('a')}/24" in shown
    assert "UP" in tb.run("a", ["ip", "-br", "link", "show", "dev", "lo"]).stdout


def test_hosts_and_root_reach_each_other_fast_without_latency(tb: Testbed) -> None:
    assert statistics.median(tb.tcp_rtt("a", "b")) < 2.0
    assert statistics.median(tb.tcp_rtt(None, "c")) < 2.0
    # and a host reaches a server of the root namespace on the bridge address
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "--bind", tb.gateway, "40123"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert "Serving HTTP" in server.stdout.readline()
        got = tb.run(
            "b",
            [sys.executable, "-c", f"import urllib.request as u; print(u.urlopen('http://{tb.gateway}:40123/', timeout=5).status)"],
        )  # fmt: skip
        assert got.stdout.strip() == "200"
    finally:
        server.kill()
        server.communicate(timeout=5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_latency_adds_the_delay_of_each_end_to_a_round_trip(backend: str) -> None:
    """Every round trip takes at least the delays set, and the quickest takes about
    them: a busy machine (the tap backend forwards in user space) slows some samples,
    even most, but a delay added twice or not at all shows in the quickest one too."""
    with Testbed(["a", "b"], backend=backend) as bed:  # type: ignore[arg-type]
        assert bed.backend == backend
        base = bed.tcp_rtt("a", "b")
        bed.set_latency("a", 5)
        one_end = bed.tcp_rtt("a", "b")
        reverse = bed.tcp_rtt("b", "a")
        from_root = bed.tcp_rtt(None, "a")
        bed.set_latency("b", 5)
        both_ends = bed.tcp_rtt("a", "b")
        bed.clear_latency("a")
        bed.clear_latency("b")
        cleared = bed.tcp_rtt("a", "b")
    shown = {"base": base, "a+5": one_end, "reverse": reverse, "root->a": from_root,
             "both+5": both_ends, "cleared": cleared}  # fmt: skip
    print(
        backend,
        {k: f"min {min(v):.3f} median {statistics.median(v):.3f}" for k, v in shown.items()},
    )
    assert min(base) < 2.0
    for rtt in (one_end, reverse, from_root):
        assert 5.0 <= min(rtt) < 9.0
    assert 10.0 <= min(both_ends) < 15.0
    assert min(cleared) < 2.0


def test_jitter_spreads_and_loss_drops(tb: Testbed) -> None:
    tb.set_latency("a", 6, jitter_ms=3)
    try:
        samples = sorted(tb.tcp_rtt("a", "b", count=40))
        assert samples[0] >= 2.9
        # 6 +- 3 ms each way on one end; a busy machine delays a few samples more, not most
        assert samples[len(samples) // 2] < 15.0
        assert samples[-4] - samples[3] > 1.0  # p90 - p10: the delays differ
        tb.set_latency("a", 1, loss_pct=50)
        delivered = tb.udp_delivered("a", "b", 400)
        assert 120 <= delivered <= 280
        tb.set_latency("a", 1)
        assert tb.udp_delivered("a", "b", 100) == 100
    finally:
        tb.clear_latency("a")
    assert tb.latency("a") is None


BULK = textwrap.dedent(
    """
    import os, socket, sys
    data = os.urandom(2_000_000)
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
        s.settimeout(20)
        got = bytearray()
        view = memoryview(data)
        for start in range(0, len(data), 65536):
            s.sendall(view[start:start + 65536])
            while len(got) < min(len(data), start + 65536):
                got += s.recv(1 << 20)
    print(bytes(got) == data)
    """
)


def test_bulk_data_passes_a_delayed_link_intact(tb: Testbed) -> None:
    tb.set_latency("c", 2)
    try:
        server = tb.echo_server("b", 30)
        try:
            out = tb.run("c", [sys.executable, "-c", BULK, tb.address("b"), "40007"], timeout=30)
        finally:
            server.kill()
            server.communicate(timeout=5)
        assert out.stdout.strip() == "True"
    finally:
        tb.clear_latency("c")


@pytest.mark.parametrize("delayed", [False, True])
def test_a_partitioned_host_is_unreachable_until_healed(tb: Testbed, delayed: bool) -> None:
    if delayed:
        tb.set_latency("b", 3)
    try:
        tb.partition("b")
        assert tb.partitioned("b")
        assert not tb.reachable("a", "b")
        assert not tb.reachable(None, "b")
        assert not tb.reachable("b", "c")
        assert tb.reachable("a", "c")  # the others still talk
        tb.heal("b")
        assert not tb.partitioned("b")
        assert tb.reachable("a", "b")
        assert tb.reachable("b", "c")
        assert tb.reachable(None, "b")
    finally:
        tb.heal("b")
        tb.clear_latency("b")


def test_teardown_leaves_no_namespace_link_or_process() -> None:
    bed = Testbed(["x", "y"]).start()
    run_name = bed.run_name
    try:
        bed.set_latency("x", 2)  # a tap and the delay daemon exist now
        sleeper = bed.popen("y", ["sleep", "300"])
        assert len(leftovers(run_name)) >= 5  # 2 namespaces, bridge, 2 veths, tap, daemon
    finally:
        bed.teardown()
    assert leftovers(run_name) == []
    assert sleeper.poll() is not None
    assert not (LOCK_DIR / f"net{bed.subnet.network_address.packed[2]:02x}.lock").exists()
    assert (
        str(bed.subnet.network_address)[:-1]
        not in subprocess.run(
            ["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True
        ).stdout
    )


CRASH = textwrap.dedent(
    """
    import os, signal, sys
    from testbed.netns import Testbed
    bed = Testbed(["p", "q"], prefix="mtbcrash").start()
    bed.set_latency("p", 1)
    bed.popen("q", ["sleep", "300"])
    print(bed.run_name, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sweep_removes_a_crashed_run_and_spares_live_ones(tb: Testbed) -> None:
    # Output to a pipe the orphans (daemon, sleeper) do not hold, so reading it ends.
    with subprocess.Popen(
        [sys.executable, "-c", CRASH],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    ) as crashed:
        assert crashed.stdout is not None
        run_name = crashed.stdout.readline().strip()
        assert crashed.wait(timeout=60) == -signal.SIGKILL
    assert len(leftovers(run_name)) >= 5
    # Its own prefix: the default sweeps of runs starting in parallel leave it to us.
    assert run_name.startswith("mtbcrash")
    removed = sweep("mtbcrash")
    assert leftovers(run_name) == []
    assert f"{run_name}-br" in removed
    swept = sweep(tb.prefix)  # may remove other dead runs, never a live one
    assert not any(name.startswith(tb.run_name + "-") for name in swept)
    assert tb.reachable("a", "b")


def test_bad_arguments_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="distinct"):
        Testbed(["a", "a"])
    with pytest.raises(ValueError, match="letters"):
        Testbed(["a b"])
    bed = Testbed(["a"])
    with pytest.raises(ValueError, match="jitter"):
        bed.set_latency("a", 1, jitter_ms=2)
    with pytest.raises(KeyError, match="no host"):
        bed.host("zz")


def test_the_command_line_measures_and_sweeps() -> None:
    root = Path(__file__).resolve().parents[2]
    rtt = subprocess.run(
        [sys.executable, "-m", "testbed", "rtt", "--delays", "0,3", "--count", "10"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        check=True,
    )
    rows = [line.split() for line in rtt.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["0", "3"]
    # the quickest round trip of each (a loaded box slows many, not the least of them)
    assert float(rows[0][2]) < 2.0
    assert 3.0 <= float(rows[1][2]) < 7.0
    assert float(rows[1][2]) <= float(rows[1][3])  # min <= p50
    swept = subprocess.run(
        [sys.executable, "-m", "testbed", "sweep"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        check=True,
    )
    assert "Traceback" not in swept.stderr
