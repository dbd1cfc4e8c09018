"""docker-compose.yml and docker-compose.host.yml run exactly what `megha up` runs, each
for its federation TOML (scripts/compose-e2e brings the host one up for real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from common.config import BROKER_ENV, load_config, process_plan

ROOT = Path(__file__).resolve().parents[2]
FILES = {  # each compose file and the federation TOML it mounts
    "docker-compose.yml": ROOT / "deploy" / "compose" / "federation.toml",
    "docker-compose.host.yml": ROOT / "deploy" / "compose" / "federation.host.toml",
}
IN_CONTAINER = "/etc/megha/config/federation.toml"

each_file = pytest.mark.parametrize("name", sorted(FILES))


def services(name: str) -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((ROOT / name).read_text())
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


@each_file
def test_compose_services_match_the_process_plan(name: str) -> None:
    svcs = services(name)
    cfg = load_config(FILES[name])
    config = f"./{FILES[name].relative_to(ROOT)}"
    plan = process_plan(cfg, IN_CONTAINER)
    assert {p.name for p in plan} | {"rabbitmq", "bench"} == set(svcs)
    for p in plan:
        svc = svcs[p.name]
        assert svc["command"] == p.argv, p.name
        env = svc["environment"]
        for key, value in p.env.items():
            if key != BROKER_ENV or p.role != "worker":  # a worker pool never uses it
                assert env[key] == value, (p.name, key)
        # Every process gets its own keys, never the secret; GMs and LMs their own broker
        # login and the users file (security.access.Access.from_env reads these).
        assert env["MEGHA_KEYS_FILE"] == "/run/secrets/megha-keys"
        assert "MEGHA_SECRET_FILE" not in env
        assert ("MEGHA_BROKER_CREDENTIALS" in env) == (p.role in ("gm", "lm")), p.name
        assert ("MEGHA_USERS_FILE" in env) == (p.role in ("gm", "lm")), p.name
        assert "MEGHA_INSECURE_DEV" not in env
        if p.role != "worker":
            assert env["MEGHA_BROKER_CREDENTIALS"] == "/run/secrets/megha-broker"
            assert {"source": f"broker-{p.role}-{p.ident}", "target": "megha-broker"} in svc[
                "secrets"
            ]
        # Others reach it by its address: the service name on a bridge, 127.0.0.1 on the
        # host's network, on the port it binds.
        host, port = cfg.address(p.name)
        assert host == (p.name if "host" not in name else "127.0.0.1")
        assert f"{cfg.listen}:{port}" in p.argv
        assert f"{config}:{IN_CONTAINER}:ro" in svc["volumes"]
        test = svc["healthcheck"]["test"]
        probe = " ".join(test)
        if cfg.tls_on:  # asked over TLS, trusting the federation CA (HEALTH_TLS)
            assert test[-3:] == ["127.0.0.1", str(port), "/etc/megha/config/tls/ca.pem"]
        else:
            assert f"/dev/tcp/127.0.0.1/{port}" in probe
        assert "GET /health" in probe


@each_file
def test_dependencies_follow_who_talks_to_whom(name: str) -> None:
    svcs = services(name)
    cfg = load_config(FILES[name])
    for p in process_plan(cfg, IN_CONTAINER):
        depends = svcs[p.name].get("depends_on", {})
        if p.role == "worker":
            assert depends == {}  # a worker pool needs no broker; it waits for its LM itself
            assert BROKER_ENV not in svcs[p.name]["environment"]
        else:
            assert depends["rabbitmq"] == {"condition": "service_healthy"}
        if p.role == "gm":
            assert set(cfg.lm_ids) <= set(depends)


@each_file
def test_broker_has_a_healthcheck_and_bench_is_a_profile(name: str) -> None:
    svcs = services(name)
    port = urlsplit(load_config(FILES[name]).broker_url).port
    assert f"exec 3<>/dev/tcp/127.0.0.1/{port}" in svcs["rabbitmq"]["healthcheck"]["test"]
    bench = svcs["bench"]
    assert bench["profiles"] == ["bench"]
    assert bench["command"][:2] == ["megha", "bench"]
    assert IN_CONTAINER in bench["command"]


def test_dockerfile_installs_every_package() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for pkg in ("common", "global_master", "local_master", "worker", "runtime", "security",
                "request_generator", "megha_cli", "config"):  # fmt: skip
        assert f"COPY {pkg} ./{pkg}" in text
