"""docker-compose.yml runs exactly what `megha up` runs (there is no Docker engine here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from common.config import load_config, process_plan

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "config/federation.example.toml"


def test_compose_services_match_the_process_plan() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    plan = process_plan(load_config(ROOT / CONFIG), CONFIG)
    assert {p.name for p in plan} | {"rabbitmq", "bench"} == set(services)
    for p in plan:
        svc = services[p.name]
        assert svc["command"] == p.argv, p.name
        assert svc["environment"] == p.env, p.name
        assert svc["network_mode"] == "host"  # so 127.0.0.1 means the same as for `megha up`
        assert svc["working_dir"] == "/app"
        assert svc["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
        assert f"{p.url}/health" in " ".join(svc["healthcheck"]["test"])


def test_broker_has_a_healthcheck_and_bench_is_a_profile() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert "rabbitmq-diagnostics" in services["rabbitmq"]["healthcheck"]["test"]
    bench = services["bench"]
    assert bench["profiles"] == ["bench"]
    assert bench["command"][:2] == ["megha", "bench"]
    assert CONFIG in bench["command"]


def test_dockerfile_installs_every_package() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for pkg in ("common", "global_master", "local_master", "worker", "request_generator",
                "megha_cli", "config"):  # fmt: skip
        assert f"COPY {pkg} ./{pkg}" in text
