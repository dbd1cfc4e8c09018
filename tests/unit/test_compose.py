"""docker-compose.yml runs exactly what `megha up` runs (there is no Docker engine here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from common.config import BROKER_ENV, load_config, process_plan

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "compose" / "federation.toml"
IN_CONTAINER = "/etc/megha/config/federation.toml"


def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    result: dict[str, dict[str, Any]] = compose["services"]
    return result


def test_compose_services_match_the_process_plan() -> None:
    svcs = services()
    cfg = load_config(CONFIG)
    plan = process_plan(cfg, IN_CONTAINER)
    assert {p.name for p in plan} | {"rabbitmq", "bench"} == set(svcs)
    for p in plan:
        svc = svcs[p.name]
        assert svc["command"] == p.argv, p.name
        env = svc["environment"]
        for key, value in p.env.items():
            if key != BROKER_ENV or p.role != "worker":  # a worker pool never uses it
                assert env[key] == value, (p.name, key)
        # Every process gets the secret; GMs and LMs their own broker login; GMs the
        # users file (security.access.Access.from_env reads these).
        assert env["MEGHA_SECRET_FILE"] == "/run/secrets/megha-secret"
        assert ("MEGHA_BROKER_CREDENTIALS" in env) == (p.role in ("gm", "lm")), p.name
        assert ("MEGHA_USERS_FILE" in env) == (p.role == "gm"), p.name
        assert "MEGHA_INSECURE_DEV" not in env
        if p.role != "worker":
            assert env["MEGHA_BROKER_CREDENTIALS"] == "/run/secrets/megha-broker"
            assert {"source": f"broker-{p.role}-{p.ident}", "target": "megha-broker"} in svc[
                "secrets"
            ]
        # Others reach it by its address: the service name, on the port it binds.
        host, port = cfg.address(p.name)
        assert host == p.name
        assert f"0.0.0.0:{port}" in p.argv
        assert svc["configs"] == [{"source": "megha-config", "target": IN_CONTAINER}]
        assert f"http://127.0.0.1:{port}/health" in " ".join(svc["healthcheck"]["test"])


def test_dependencies_follow_who_talks_to_whom() -> None:
    svcs = services()
    cfg = load_config(CONFIG)
    for p in process_plan(cfg, IN_CONTAINER):
        depends = svcs[p.name].get("depends_on", {})
        if p.role == "worker":
            assert depends == {}  # a worker pool needs no broker; it waits for its LM itself
            assert BROKER_ENV not in svcs[p.name]["environment"]
        else:
            assert depends["rabbitmq"] == {"condition": "service_healthy"}
        if p.role == "gm":
            assert set(cfg.lm_ids) <= set(depends)


def test_broker_has_a_healthcheck_and_bench_is_a_profile() -> None:
    svcs = services()
    assert "rabbitmq-diagnostics" in svcs["rabbitmq"]["healthcheck"]["test"]
    bench = svcs["bench"]
    assert bench["profiles"] == ["bench"]
    assert bench["command"][:2] == ["megha", "bench"]
    assert IN_CONTAINER in bench["command"]


def test_dockerfile_installs_every_package() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for pkg in ("common", "global_master", "local_master", "worker", "runtime", "security",
                "request_generator", "megha_cli", "config"):  # fmt: skip
        assert f"COPY {pkg} ./{pkg}" in text
