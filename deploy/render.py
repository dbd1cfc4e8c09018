"""Deployment files from the process plan: docker compose and Kubernetes.

``common.config.process_plan`` says which processes make a federation and exactly how
each starts; this module turns a federation TOML into the files that run those
processes elsewhere, so ``megha up``, compose and Kubernetes cannot drift apart:

* ``docker-compose.yml`` from ``deploy/compose/federation.toml``: containers on a
  bridge network, reached by service name, ports published (a normal Docker host);
* ``docker-compose.host.yml`` and ``deploy/compose/federation.host.toml`` from the same
  TOML, for a host where containers may only share the host's network: every container
  ``network_mode: host``, each process on its own 127.0.0.1 port, the broker on ports
  of its own (``HOST_BROKER``), beside any broker the machine runs;
* ``deploy/kubernetes/overlays/<name>/megha.yaml`` from that overlay's
  ``federation.toml``: one Deployment per GM, one StatefulSet (active + standby) per
  LM, one Deployment per LM's worker pool, their Services, disruption budgets and the
  NetworkPolicies that depend on the federation's shape.  What does not depend on it
  (RabbitMQ, default deny, DNS, the broker's policy, the bench CronJob) is in
  ``deploy/kubernetes/base``.

Nothing secret is in these files.  ``secrets CONFIG DIR`` makes a deployment's
secrets, once, in a directory of the operator's outside git (0700, files 0600), with
the same code as ``megha up`` (``federation.provision``, ``security.broker_acl``): the
federation secret, a broker user and password per party, the RabbitMQ definitions that
provision the vhost, users, permissions and topology, the users file and each user's
token.  The compose file reads them through ``DIR/compose.env``; a Kubernetes overlay
through ``DIR/kustomization.yaml`` (its ``secrets`` directory).

Run from the repository root::

    python -m deploy.render                  # rewrite every checked-in file
    python -m deploy.render --check          # exit 1 if one is stale (the tests do this)
    python -m deploy.render secrets deploy/compose/federation.toml ~/megha-secrets
    python -m deploy.render kubernetes my.toml > megha.yaml   # a federation of your own
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from common.config import (
    BROKER_ENV,
    STATE_ENV,
    TLS_DIRNAME,
    FederationConfig,
    ProcessSpec,
    load_config,
    parse_config,
    process_plan,
)
from common.errors import ConfigError
from federation.provision import broker_credentials, issue_tokens, make_secret
from security.access import USERS_FILE_ENV, load_tokens, parties, service_identity
from security.access import parties as access_parties
from security.broker_acl import (
    CREDENTIALS_ENV,
    CREDENTIALS_FILENAME,
    BrokerCredentials,
    BrokerLayout,
    definitions,
    rabbit_password_hash,
)
from security.files import MOUNTED_ENV, ensure_private_dir, read_private, write_private
from security.identity import Role
from security.party_keys import KEYS_DIRNAME, KEYS_FILE_ENV, file_name, write_party_keys
from security.secret import SECRET_FILENAME, load_secret
from security.tls import CA_CERT, make_federation_tls
from security.tokens import TOKENS_FILENAME

Manifest = dict[str, Any]

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_CONFIG = ROOT / "deploy" / "compose" / "federation.toml"
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_HOST_CONFIG = ROOT / "deploy" / "compose" / "federation.host.toml"
COMPOSE_HOST_FILE = ROOT / "docker-compose.host.yml"
OVERLAYS = ROOT / "deploy" / "kubernetes" / "overlays"

CONFIG_PATH = "/etc/megha/config/federation.toml"
"""Where every container finds the federation TOML (compose config, k8s ConfigMap)."""
SECRET_ENV = "MEGHA_SECRET_FILE"
HOME_ENV = "MEGHA_HOME"
INSTANCE_ENV = "MEGHA_INSTANCE"
RABBITMQ_IMAGE = "rabbitmq:4.1-management"
"""Kubernetes (deploy/kubernetes/base): 4.1 or later, whose Kubernetes peer discovery
needs no access to the Kubernetes API."""
COMPOSE_RABBITMQ_IMAGE = "${MEGHA_RABBITMQ_IMAGE:-megha-rabbitmq:dev}"
"""compose: built from Debian's rabbitmq-server (deploy/images/rabbitmq), so the whole
federation builds with no registry."""
AMQP_PORT = 5672
MEGHA_UID = 10001
"""The Dockerfile's ``USER``; the pods run as it."""

COMPONENT = {"gm": "gm", "lm": "lm", "worker": "workers"}
"""``app.kubernetes.io/component`` of each role of the process plan."""
BROKER_ROLES = ("gm", "lm")
"""The services that log into RabbitMQ, each party as its own user.  Worker pools never
do (they talk only to their LM), so they get no broker credentials at all."""


# ---------------------------------------------------------------- secrets
DEFINITIONS_FILENAME = "definitions.json"
COOKIE_FILENAME = "erlang.cookie"
COMPOSE_ENV_FILENAME = "compose.env"
KUSTOMIZATION_FILENAME = "kustomization.yaml"
FEDERATION_SECRET = "megha-federation"
"""The Kubernetes Secret every process mounts (each only the keys it needs)."""
OPERATOR_SECRET = "megha-operator"
"""The operator's files (every broker password, every token): the bench only."""
TLS_SECRET = "megha-tls"
"""The federation CA's certificate, and each process's and the broker's certificate and
key (never the CA's key): each pod mounts its own pair and the CA's certificate."""


def tls_files(cfg: FederationConfig) -> list[str]:
    """The files of the secrets directory's ``tls/`` a deployment of ``cfg`` mounts: the
    CA's certificate, a certificate and key per process and for the broker."""
    pairs = [f"{name}.{ext}" for name in [*cfg.process_names, "broker"] for ext in ("pem", "key")]
    return [CA_CERT, *pairs]


def party_credentials_filename(role: str, ident: str) -> str:
    """The file (and Kubernetes Secret key) holding one service's broker login only."""
    return f"broker.{role}.{ident}.json"


def token_key(user: str) -> str:
    return f"token.{user}"


def party_credentials(creds: BrokerCredentials, role: str, ident: str) -> BrokerCredentials:
    """``creds`` cut down to one service's own user and password."""
    key = str(service_identity(role, ident))
    return BrokerCredentials(
        creds.scheme,
        creds.host,
        creds.port,
        creds.vhost,
        {key: creds.passwords[key]},
        {key: creds.users[key]},
    )


def secrets_kustomization(cfg: FederationConfig, directory: Path) -> Manifest:
    """The Secrets an overlay generates from ``directory`` (its ``secrets``)."""
    parties = [
        party_credentials_filename(role, ident)
        for role, ids in (("gm", cfg.gm_ids), ("lm", cfg.lm_ids))
        for ident in ids
    ]
    tokens = [f"{token_key(u)}=tokens/{u}" for u in sorted(load_tokens(directory))]
    keys = [
        f"{file_name(p)}={KEYS_DIRNAME}/{file_name(p)}"
        for p in access_parties(cfg)
        if p.role != Role.OPERATOR
    ]
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "generatorOptions": {"labels": {"app.kubernetes.io/part-of": "megha"}},
        "secretGenerator": [
            {
                "name": FEDERATION_SECRET,
                "files": [TOKENS_FILENAME, *parties, *keys],
            },
            {
                "name": OPERATOR_SECRET,
                "files": [SECRET_FILENAME, TOKENS_FILENAME, CREDENTIALS_FILENAME, *tokens],
            },
            {
                "name": TLS_SECRET,
                "files": [f"{f}={TLS_DIRNAME}/{f}" for f in tls_files(cfg)],
            },
            {"name": "rabbitmq-definitions", "files": [DEFINITIONS_FILENAME]},
            {"name": "rabbitmq-erlang-cookie", "files": [f"cookie={COOKIE_FILENAME}"]},
        ],
    }


def write_secrets(cfg: FederationConfig, directory: Path) -> list[Path]:
    """Make (or complete) the secrets of a deployment of ``cfg`` in ``directory``.

    ``directory`` is laid out as a ``$MEGHA_HOME`` (``secret``, ``broker.json``,
    ``users.json``, ``tokens/``), so ``megha user ... --state-dir DIR`` and ``megha
    bench`` work on it; besides, each GM's and LM's own broker login, the RabbitMQ
    definitions, the broker cluster's Erlang cookie, ``compose.env`` and
    ``kustomization.yaml``.  What exists is kept (secret, passwords, tokens, cookie)."""
    ensure_private_dir(directory)
    os.chmod(directory, 0o700)
    directory = directory.resolve()
    made = [make_secret(cfg, directory)]
    creds = broker_credentials(cfg, directory)
    made.append(directory / CREDENTIALS_FILENAME)
    for role, ids in (("gm", cfg.gm_ids), ("lm", cfg.lm_ids)):
        for ident in ids:
            path = directory / party_credentials_filename(role, ident)
            party_credentials(creds, role, ident).save(path)
            made.append(path)
    made.append(issue_tokens(cfg, directory))
    path = directory / DEFINITIONS_FILENAME
    doc = _keep_hashes(definitions(BrokerLayout.from_config(cfg), creds), path, creds)
    write_private(path, (json.dumps(doc, indent=2) + "\n").encode())
    made.append(path)
    cookie = directory / COOKIE_FILENAME
    if not cookie.exists():
        write_private(cookie, (secrets.token_hex(32) + "\n").encode())
    made.append(cookie)
    # each service's own keys, and the federation's CA with a certificate per process
    # and for the broker (issue 32 items 7 and 10)
    secret = load_secret(directory / SECRET_FILENAME, insecure_dev=True)
    made.extend(write_party_keys(directory, secret, cfg, parties(cfg)))
    made.extend(make_federation_tls(replace(cfg, tls="on"), directory))
    env = (
        f"MEGHA_SECRETS={directory}\nMEGHA_UID={os.getuid()}\nMEGHA_GID={os.getgid()}\n"
        f"COMPOSE_PROJECT_NAME={cfg.name}\n"
    )
    write_private(directory / COMPOSE_ENV_FILENAME, env.encode())
    text = yaml.safe_dump(secrets_kustomization(cfg, directory), sort_keys=False)
    write_private(directory / KUSTOMIZATION_FILENAME, (KUSTOMIZATION_HEADER + text).encode())
    made += [directory / COMPOSE_ENV_FILENAME, directory / KUSTOMIZATION_FILENAME]
    return made


def _keep_hashes(doc: Manifest, old: Path, creds: BrokerCredentials) -> Manifest:
    """``doc`` with the password hashes of ``old`` that still match: each hash has a fresh
    salt, and a definitions file that changes on every run would roll the broker."""
    if not old.exists():
        return doc
    previous = {u["name"]: u["password_hash"] for u in json.loads(read_private(old))["users"]}
    password = {creds.users[k]: creds.passwords[k] for k in creds.passwords}
    for user in doc["users"]:
        h = previous.get(user["name"])
        if h and rabbit_password_hash(password[user["name"]], base64.b64decode(h)[:4]) == h:
            user["password_hash"] = h
    return doc


KUSTOMIZATION_HEADER = """\
# Generated by `python -m deploy.render secrets`: the Secrets of a Kubernetes overlay,
# from the files beside this one.  Keep this directory out of git.
"""


# ---------------------------------------------------------------- docker compose
SECRETS_VAR = (
    "${MEGHA_SECRETS:?make the secrets first: python -m deploy.render secrets "
    "deploy/compose/federation.toml DIR; then docker compose --env-file DIR/compose.env}"
)
"""The secrets directory, from ``DIR/compose.env``; compose refuses to start without it."""
COMPOSE_USER = (
    "${MEGHA_UID:?use --env-file DIR/compose.env}:${MEGHA_GID:?use --env-file DIR/compose.env}"
)
"""Containers run as the owner of the secrets: a bind mount keeps the host file's uid
and mode (0600), so the process can read it, and ``load_secret``'s single-host rule
(private, ours) holds inside the container as it does for ``megha up``."""
RUN_SECRETS = "/run/secrets"
TLS_PATH = f"{Path(CONFIG_PATH).parent}/{TLS_DIRNAME}"
"""Where a container finds its certificate, key and the federation CA (the process plan's
``--certfile``/``--keyfile`` and ``MEGHA_TLS_CA`` name them beside the config)."""
BROKER_TLS_PATH = "/etc/rabbitmq/tls"
AMQPS_PORT = 5671
RABBITMQ_TLS_CONF = "./deploy/compose/rabbitmq/tls.conf"
"""The broker's AMQPS listener (mounted when the federation's TLS is on): plain AMQP only
on the container's own loopback (its health probe), AMQPS for everyone else."""
CONTAINER_SECURITY: Manifest = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
"""Every Megha container: no privilege escalation, read-only root, no capabilities."""


def _mounts(private: Manifest) -> list[Manifest]:
    """A Megha container's mounts: the config, ``private`` (its secrets), a tmpfs."""
    return [
        {"name": "config", "mountPath": "/etc/megha/config", "readOnly": True},
        private,
        {"name": "tmp", "mountPath": "/tmp"},
    ]


HEALTH_TLS = (
    "import socket, ssl, sys\n"
    "host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]\n"
    "ctx = ssl.create_default_context(cafile=ca)\n"
    "s = ctx.wrap_socket(socket.create_connection((host, port), 2), server_hostname='localhost')\n"
    "s.sendall(b'GET /health HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n')\n"
    "sys.exit(s.recv(64).split(b' ')[1:2] != [b'200'])\n"
)
"""The probe of a service that serves HTTPS: bash cannot speak TLS, so a bare interpreter
(``-I -S``: the standard library only) asks, trusting the federation CA only."""


def _health_test(port: int, tls: bool = False) -> list[str]:
    """``GET /health`` answered 200, asked by bash over ``/dev/tcp``: a probe runs every
    interval in every container for as long as it runs, and a Python interpreter per
    probe cost ~15x the CPU (3.3 s against 0.7 s of wall time for 5 ``docker exec``s at a
    load average of 21 here).  Over TLS (``tls``) it must be Python (``HEALTH_TLS``)."""
    if tls:
        ca = f"{TLS_PATH}/{CA_CERT}"
        return ["CMD", "python3", "-I", "-S", "-c", HEALTH_TLS, "127.0.0.1", str(port), ca]
    ask = (
        f"exec 3<>/dev/tcp/127.0.0.1/{port}"
        ' && printf "GET /health HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n\\r\\n" >&3'
        " && read -r status <&3"
        ' && [[ $$status == "HTTP/"*" 200 "* ]]'
    )
    return ["CMD", "bash", "-c", ask]


def _compose_secrets(cfg: FederationConfig) -> dict[str, Manifest]:
    """The compose secrets: files of the secrets directory."""
    out = {
        "megha-secret": {"file": f"{SECRETS_VAR}/{SECRET_FILENAME}"},
        "megha-users": {"file": f"{SECRETS_VAR}/{TOKENS_FILENAME}"},
        "rabbitmq-definitions": {"file": f"{SECRETS_VAR}/{DEFINITIONS_FILENAME}"},
    }
    for role, ids in (("gm", cfg.gm_ids), ("lm", cfg.lm_ids)):
        for ident in ids:
            name = party_credentials_filename(role, ident)
            out[f"broker-{role}-{ident}"] = {"file": f"{SECRETS_VAR}/{name}"}
    for party in parties(cfg):
        if party.role != Role.OPERATOR:
            out[f"keys-{party.role.value}-{party.name}"] = {
                "file": f"{SECRETS_VAR}/{KEYS_DIRNAME}/{file_name(party)}"
            }
    if cfg.tls_on:  # the CA's certificate, and each process's and the broker's own pair
        tls = f"{SECRETS_VAR}/{TLS_DIRNAME}"
        out["tls-ca"] = {"file": f"{tls}/{CA_CERT}"}
        for name in [*cfg.process_names, "broker"]:
            out[f"tls-{name}-cert"] = {"file": f"{tls}/{name}.pem"}
            out[f"tls-{name}-key"] = {"file": f"{tls}/{name}.key"}
    return out


def _tls_mounts(name: str, directory: str) -> list[Manifest]:
    """Process (or broker) ``name``'s certificate and key, and the CA's certificate, in
    ``directory`` (never the CA's key: it stays with the operator)."""
    return [
        {"source": "tls-ca", "target": f"{directory}/{CA_CERT}"},
        {"source": f"tls-{name}-cert", "target": f"{directory}/{name}.pem"},
        {"source": f"tls-{name}-key", "target": f"{directory}/{name}.key"},
    ]


def _keys_secret(p: ProcessSpec) -> str:
    """The compose secret of process ``p``'s own keys file."""
    me = service_identity(p.role, p.ident)
    return f"keys-{me.role.value}-{me.name}"


NETWORKS = ("bridge", "host")
"""The compose files' network modes: ``docker-compose.yml`` and ``docker-compose.host.yml``."""
HOST_BROKER = {"amqp": 5673, "epmd": 4370, "dist": 25673}
"""The host-network broker's ports, on 127.0.0.1: not 5672, 4369 and 25672, which a
broker of the machine's own may hold (Debian's rabbitmq-server does)."""
HOST_NODENAME = "megha@localhost"
"""The host-network broker's Erlang node (the machine's broker is ``rabbit@localhost``)."""
STATE_DIR = "/var/lib/megha"
"""Where each process has a named volume of its own (``NAME-state``), which outlives its
container and ``docker compose down`` (but not ``down -v``): the place for what it must
keep across a restart of the whole federation: an LM's and a pool's journal (issue 30), a
GM's job history (``global_master.history``).  The image makes it writable by any uid, as
compose runs the processes as the secrets' owner."""
RABBITMQ_CONF = "./deploy/compose/rabbitmq/rabbitmq.conf"
HEALTH_INTERVAL = "3s"
"""How often every container is probed, from start to end (compose 1.x knows no
``start_interval``): a service that depends on another starts up to this much after it
is healthy."""


def compose_config_file(network: str) -> Path:
    """The federation TOML the compose file of ``network`` mounts into every container."""
    return COMPOSE_CONFIG if network == "bridge" else COMPOSE_HOST_CONFIG


def host_network(cfg: FederationConfig) -> FederationConfig:
    """``cfg`` for containers that share the host's network: every process binds and is
    reached on 127.0.0.1 at the port it has in ``cfg``; the broker is on its own ports."""
    addresses = {name: f"127.0.0.1:{cfg.address(name)[1]}" for name in cfg.process_names}
    return replace(
        cfg,
        host="127.0.0.1",
        listen="127.0.0.1",
        addresses=addresses,
        broker_url=f"amqp://127.0.0.1:{HOST_BROKER['amqp']}/",
        tls="auto",  # every process and the broker on one host's loopback: off there
    ).validate()


def host_network_toml(path: Path) -> str:
    """``host_network`` of the TOML at ``path`` as a TOML: that file's own keys, with the
    host network's interface, addresses and broker (a default changed in common.config
    changes neither file)."""
    table = tomllib.loads(path.read_text())["federation"]
    host = host_network(parse_config({"federation": table}, env={}))
    table.update(
        host=host.host, listen=host.listen, broker_url=host.broker_url, addresses=host.addresses,
        tls=host.tls,
    )  # fmt: skip
    lines = ["[federation]"]
    lines += [f"{k} = {_toml(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for key, sub in table.items():
        if isinstance(sub, dict):
            lines += ["", f"[federation.{key}]"]
            lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in sorted(sub.items())]
    return "\n".join(lines) + "\n"


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def _rabbitmq_service(network: str, tls: bool = False) -> Manifest:
    """The broker: Debian's RabbitMQ, importing the secrets' definitions at boot; with
    ``tls``, its AMQPS listener (``RABBITMQ_TLS_CONF``) is the one others reach."""
    port = AMQP_PORT if network == "bridge" else HOST_BROKER["amqp"]
    if tls:
        port = AMQPS_PORT
    svc: Manifest = {
        "image": COMPOSE_RABBITMQ_IMAGE,
        # as the owner of the definitions (0600); the image's data directory is
        # writable by any uid (mode 1777), so a fresh volume is too
        "user": COMPOSE_USER,
        "secrets": [{"source": "rabbitmq-definitions", "target": "/etc/rabbitmq/definitions.json"}],
        "volumes": [
            "rabbitmq-data:/var/lib/rabbitmq",
            f"{RABBITMQ_CONF}:/etc/rabbitmq/conf.d/20-megha.conf:ro",
        ],
        # Its listeners open once the boot (the definitions' import included) is done.
        # Not rabbitmq-diagnostics: each run starts an Erlang VM (~1 s of CPU, every
        # interval, for as long as the broker runs).
        "healthcheck": {
            "test": ["CMD", "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"],
            "interval": HEALTH_INTERVAL,
            "timeout": "3s",
            "retries": 60,
            "start_period": "10s",
        },
        "restart": "unless-stopped",
    }
    if tls:
        if network != "bridge":
            raise ConfigError("the broker's TLS listener is rendered for the bridge network only")
        svc["secrets"] += _tls_mounts("broker", BROKER_TLS_PATH)
        svc["volumes"].append(f"{RABBITMQ_TLS_CONF}:/etc/rabbitmq/conf.d/30-megha-tls.conf:ro")
    if network == "bridge":
        svc["hostname"] = "rabbitmq"
        svc["ports"] = [f"{port}:{port}"]
        return svc
    svc["network_mode"] = "host"
    svc["environment"] = {
        "RABBITMQ_NODENAME": HOST_NODENAME,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(HOST_BROKER["dist"]),
        "ERL_EPMD_PORT": str(HOST_BROKER["epmd"]),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    return svc


def _megha_service(cfg: FederationConfig, p: ProcessSpec, base: Manifest) -> Manifest:
    """Process ``p`` of the plan: its command, keys, broker login, health, dependencies."""
    env = {k: v for k, v in p.env.items() if p.role in BROKER_ROLES or k != BROKER_ENV}
    # its own keys, never the federation secret (security.party_keys)
    env[KEYS_FILE_ENV] = f"{RUN_SECRETS}/megha-keys"
    mounts: list[Manifest | str] = [{"source": _keys_secret(p), "target": "megha-keys"}]
    depends: dict[str, Manifest] = {}
    if p.role in BROKER_ROLES:
        env[CREDENTIALS_ENV] = f"{RUN_SECRETS}/megha-broker"
        mounts.append({"source": f"broker-{p.role}-{p.ident}", "target": "megha-broker"})
        depends["rabbitmq"] = {"condition": "service_healthy"}
    if p.role in ("gm", "lm"):  # an LM checks each launch's user against its GM
        env[USERS_FILE_ENV] = f"{RUN_SECRETS}/megha-users"
        mounts.append("megha-users")
    if p.role == "gm":
        depends.update({lm: {"condition": "service_healthy"} for lm in cfg.lm_ids})
    if cfg.tls_on:  # its certificate and key, and the CA it trusts (process_plan's paths)
        mounts += _tls_mounts(p.name, TLS_PATH)
    svc: Manifest = {**base, "command": p.argv, "environment": env, "secrets": mounts}
    svc["volumes"] = [*base["volumes"], f"{p.name}-state:{STATE_DIR}"]
    env[STATE_ENV] = STATE_DIR
    if "network_mode" not in base:
        svc["ports"] = [f"{p.port}:{p.port}"]
    svc["healthcheck"] = {
        "test": _health_test(p.port, cfg.tls_on),
        "interval": HEALTH_INTERVAL,
        "timeout": "3s",
        "retries": 30,
        "start_period": "5s",
    }
    if depends:
        svc["depends_on"] = depends
    return svc


def compose(cfg: FederationConfig, network: str = "bridge") -> Manifest:
    """The compose project: the broker, every process of the plan, and a bench profile;
    ``network`` "bridge" (service names, published ports) or "host" (``cfg`` as
    ``host_network`` made it: every container on the host's network)."""
    config_file = f"./{compose_config_file(network).relative_to(ROOT)}"
    megha: Manifest = {
        "image": "${MEGHA_IMAGE:-megha:dev}",
        "user": COMPOSE_USER,
        "read_only": True,
        "tmpfs": ["/tmp"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        # a bind mount, not a compose config: docker-compose 1.x (Debian's) ignores configs
        "volumes": [f"{config_file}:{CONFIG_PATH}:ro"],
        "restart": "unless-stopped",
    }
    if network == "host":
        megha["network_mode"] = "host"
    services: dict[str, Manifest] = {"rabbitmq": _rabbitmq_service(network, cfg.tls_on)}
    plan = process_plan(cfg, CONFIG_PATH)
    for p in plan:
        services[p.name] = _megha_service(cfg, p, megha)
    services["bench"] = {
        **megha,
        "profiles": ["bench"],
        "restart": "no",
        "command": ["megha", "bench", "--config", CONFIG_PATH, "--out", "results/bench"],
        "environment": {
            # the operator's files: its broker user, the users' tokens (read-only)
            HOME_ENV: "/run/megha-home",
            "MPLCONFIGDIR": "/tmp/matplotlib",  # the plots' font cache; the root is read-only
        },
        "volumes": [
            *megha["volumes"],
            f"{SECRETS_VAR}:/run/megha-home:ro",
            "./results:/app/results",
        ],
        "depends_on": {g: {"condition": "service_healthy"} for g in cfg.gm_ids},
    }
    volumes: dict[str, Manifest] = {"rabbitmq-data": {}}
    volumes.update({f"{p.name}-state": {} for p in plan})
    return {
        "services": services,
        "secrets": _compose_secrets(cfg),
        "volumes": volumes,
    }


COMPOSE_HEADER = """\
# Generated by `python -m deploy.render` from deploy/compose/federation.toml and
# common.config.process_plan: the same commands as `megha up`.  Edit those, not this file
# (tests/deploy checks that it is up to date and valid against the compose spec).
# Containers on a bridge network, reached by service name; docker-compose.host.yml is
# the same federation where only host networking is allowed.
# No secret is in it or in the repository: make them first, outside git.
#   python -m deploy.render secrets deploy/compose/federation.toml ~/megha-secrets
#   docker build -t megha:dev .
#   docker build -t megha-rabbitmq:dev deploy/images/rabbitmq
#   docker compose --env-file ~/megha-secrets/compose.env up -d     # broker, 3 GMs, 3 LMs, 3 pools
#   docker compose --env-file ~/megha-secrets/compose.env --profile bench run --rm bench
# deploy/README.md explains the rest (several hosts, users' tokens, the images).
"""

COMPOSE_HOST_HEADER = """\
# Generated by `python -m deploy.render` from deploy/compose/federation.toml (through
# deploy/compose/federation.host.toml) and common.config.process_plan.  Edit those, not
# this file (tests/deploy checks it).  The federation of docker-compose.yml for a host
# where containers may only share the host's network: every container network_mode:
# host, each process on its own 127.0.0.1 port, the broker on 127.0.0.1:5673 (epmd 4370,
# distribution 25673), beside any broker of the machine's own on 5672.
#   python -m deploy.render secrets deploy/compose/federation.host.toml ~/megha-secrets
#   docker build --network host -t megha:dev .
#   docker build --network host -t megha-rabbitmq:dev deploy/images/rabbitmq
#   docker compose -f docker-compose.host.yml --env-file ~/megha-secrets/compose.env up -d
#   MEGHA_HOME=~/megha-secrets megha bench --config deploy/compose/federation.host.toml
# scripts/compose-e2e does all of it on a machine with no image registry.
"""

HOST_CONFIG_HEADER = """\
# Generated by `python -m deploy.render` from deploy/compose/federation.toml (edit that,
# not this file): the same federation for docker-compose.host.yml, where every container
# shares the host's network, so each process binds and is reached on 127.0.0.1 at its
# port, and the broker listens on 127.0.0.1:5673.  `megha bench --config` this file drives
# that federation from the host.
"""


# ---------------------------------------------------------------- Kubernetes
def _labels(p: ProcessSpec) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "megha",
        "app.kubernetes.io/part-of": "megha",
        "app.kubernetes.io/component": COMPONENT[p.role],
        "megha.io/process": p.name,
    }
    if p.role != "gm":
        labels["megha.io/lm"] = p.ident
    return labels


def _selector(p: ProcessSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": "megha", "megha.io/process": p.name}


RESOURCES: dict[str, Manifest] = {
    # Measured with `megha bench` at 300 tasks/s over 2 GMs and 2 LMs of 100 nodes
    # (deploy/README.md): RSS 80-86 MB per process, GM 0.10, LM 0.12, worker pool 0.06
    # of a core.  A process is one asyncio loop: more than one core is of no use.
    "gm": {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    },
    "lm": {
        "requests": {"cpu": "150m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    },
    "worker": {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "256Mi"},
    },
}


KEYS_FILE = "keys.json"
"""A pod's own keys file in ``SECRET_DIR`` (``security.party_keys``)."""
SECRET_DIR = "/etc/megha/secret"
"""Where each pod mounts its keys of the megha-federation Secret."""
HOME_DIR = "/etc/megha/home"
"""Where the bench mounts the megha-operator Secret, laid out as a ``$MEGHA_HOME``."""
READ_ONLY = 0o400
"""``defaultMode`` of every Secret volume; with ``fsGroup`` the kubelet adds group read
(0440, group = the pod's own), which ``MEGHA_SECRET_MOUNTED`` accepts."""


def _env(p: ProcessSpec) -> list[Manifest]:
    env: list[Manifest] = [
        {"name": k, "value": v}
        for k, v in p.env.items()
        if p.role in BROKER_ROLES or k != BROKER_ENV
    ]
    env.append({"name": KEYS_FILE_ENV, "value": f"{SECRET_DIR}/{KEYS_FILE}"})
    env.append({"name": MOUNTED_ENV, "value": "1"})
    if p.role in BROKER_ROLES:
        env.append({"name": CREDENTIALS_ENV, "value": f"{SECRET_DIR}/{CREDENTIALS_FILENAME}"})
    if p.role in ("gm", "lm"):  # an LM checks each launch's user against its GM
        env.append({"name": USERS_FILE_ENV, "value": f"{SECRET_DIR}/{TOKENS_FILENAME}"})
    if p.role == "lm":
        # Active and standby run the same command; they tell themselves apart by pod name.
        env.append(
            {"name": INSTANCE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        )
    env.append({"name": STATE_ENV, "value": STATE_DIR})
    return env


STATE_STORAGE = "1Gi"
"""What each process's journal volume asks for (a journal is compacted past 8 MiB, with
one snapshot beside it)."""


def state_claim(p: ProcessSpec) -> Manifest:
    """The volume a process keeps its journal on (``runtime.journal``), which outlives its
    pods: a restart of the whole federation loses no task an LM took, and no job history
    a GM holds (``global_master.history``).  An LM's active and standby share one
    (ReadWriteMany: the standby may run on another node; it takes the journal over with
    the lead, after the former's lock); a GM's and a pool's is its own (ReadWriteOnce:
    one pod at a time, its Deployment recreates, never surges)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(f"{p.name}-state", _labels(p)),
        "spec": {
            "accessModes": ["ReadWriteMany" if p.role == "lm" else "ReadWriteOnce"],
            "resources": {"requests": {"storage": STATE_STORAGE}},
        },
    }


def _secret_items(p: ProcessSpec) -> list[Manifest]:
    """The keys of the megha-federation Secret process ``p`` sees: its own keys (never
    the federation secret), its own broker login (GMs, LMs), the users file (GMs, LMs)."""
    items = [{"key": file_name(service_identity(p.role, p.ident)), "path": KEYS_FILE}]
    if p.role in BROKER_ROLES:
        key = party_credentials_filename(p.role, p.ident)
        items.append({"key": key, "path": CREDENTIALS_FILENAME})
    if p.role in ("gm", "lm"):
        items.append({"key": TOKENS_FILENAME, "path": TOKENS_FILENAME})
    return items


def _pod_security() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": MEGHA_UID,
        "runAsGroup": MEGHA_UID,
        # Secret volumes are root's: fsGroup makes them readable by the pod's group.
        "fsGroup": MEGHA_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _probes() -> Manifest:
    """A process's startup, readiness and liveness probes, over HTTPS, which it serves
    (the kubelet does not check the certificate)."""
    http: Manifest = {"port": "http", "scheme": "HTTPS"}
    return {
        # /health answers 200 only when the process can serve (a GM consumes, an LM is
        # connected to the broker): it gates traffic.  Liveness asks only whether the
        # process answers at all (/metrics): a broker outage must not restart an LM,
        # whose memory is the truth about its workers.
        "startupProbe": {
            "httpGet": {"path": "/metrics", **http},
            "periodSeconds": 2,
            "failureThreshold": 30,
        },
        "readinessProbe": {
            "httpGet": {"path": "/health", **http},
            "periodSeconds": 2,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/metrics", **http},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
        },
    }


def _apart(p: ProcessSpec) -> Manifest:
    """Anti-affinity: an LM's standby preferably on another node than its active."""
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": _selector(p)},
                    },
                }
            ]
        }
    }


def _pod_volumes(p: ProcessSpec) -> list[Manifest]:
    """The volumes of process ``p``'s pod: the config with, in ``tls/`` beside it, its own
    certificate and key and the CA's certificate where ``process_plan`` names them (one
    projected volume: a Secret mounted inside the ConfigMap's read-only mount could not
    be), its secrets, a tmpfs, its journal's claim (``state_claim``)."""
    tls = [
        {"key": f, "path": f"{TLS_DIRNAME}/{f}", "mode": READ_ONLY}
        for f in (CA_CERT, f"{p.name}.pem", f"{p.name}.key")
    ]
    return [
        {
            "name": "config",
            "projected": {
                "defaultMode": 0o444,
                "sources": [
                    {"configMap": {"name": "megha-config"}},
                    {"secret": {"name": TLS_SECRET, "items": tls}},
                ],
            },
        },
        {
            "name": "secret",
            "secret": {
                "secretName": FEDERATION_SECRET,
                "defaultMode": READ_ONLY,
                "items": _secret_items(p),
            },
        },
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "state", "persistentVolumeClaim": {"claimName": f"{p.name}-state"}},
    ]


def _pod(p: ProcessSpec) -> Manifest:
    """The pod of process ``p``: probes, limits, a read-only root, no token, not root;
    serving HTTPS with its own certificate (``_pod_volumes``)."""
    container: Manifest = {
        "name": COMPONENT[p.role],
        "image": "megha",
        "imagePullPolicy": "IfNotPresent",
        "command": p.argv,
        "env": _env(p),
        "ports": [{"name": "http", "containerPort": p.port, "protocol": "TCP"}],
        **_probes(),
        "resources": RESOURCES[p.role],
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [
            *_mounts({"name": "secret", "mountPath": SECRET_DIR, "readOnly": True}),
            # its journal, on a claim that outlives the pod (state_claim)
            {"name": "state", "mountPath": STATE_DIR},
        ],
    }
    spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 15,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": _pod_volumes(p),
    }
    if p.role == "lm":  # keep the standby off the active's node when the cluster has another
        spec["affinity"] = _apart(p)
    return {"metadata": {"labels": _labels(p)}, "spec": spec}


def _meta(name: str, labels: dict[str, str]) -> Manifest:
    return {"name": name, "labels": labels}


def _workload(p: ProcessSpec) -> Manifest:
    if p.role == "lm":
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": _meta(p.name, _labels(p)),
            "spec": {
                "serviceName": f"{p.name}-pods",
                "replicas": 2,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": _selector(p)},
                "template": _pod(p),
            },
        }
    # Two copies of the same GM or pool must not run at once (nor share its journal):
    # Recreate, never surge.
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(p.name, _labels(p)),
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 3,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _selector(p)},
            "template": _pod(p),
        },
    }


def _services(p: ProcessSpec) -> list[Manifest]:
    port = [{"name": "http", "port": p.port, "targetPort": "http", "protocol": "TCP"}]
    out: list[Manifest] = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(p.name, _labels(p)),
            "spec": {"selector": _selector(p), "ports": port},
        }
    ]
    if p.role == "lm":
        # The StatefulSet's governing service: a DNS name for each of the two instances.
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": _meta(f"{p.name}-pods", _labels(p)),
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": _selector(p),
                    "ports": port,
                },
            }
        )
        out.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": _meta(p.name, _labels(p)),
                "spec": {"minAvailable": 1, "selector": {"matchLabels": _selector(p)}},
            }
        )
    return out


def _bench_container() -> Manifest:
    """The container of ``megha bench``: the operator's home mounted read-only."""
    return {
        "name": "bench",
        "image": "megha",
        "imagePullPolicy": "IfNotPresent",
        "command": ["megha", "bench", "--config", CONFIG_PATH, "--out", "/tmp/results/bench"],
        "env": [
            {"name": HOME_ENV, "value": HOME_DIR},
            {"name": MOUNTED_ENV, "value": "1"},
            {"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"},
        ],
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [
            *_mounts({"name": "home", "mountPath": HOME_DIR, "readOnly": True}),
        ],
    }


def _home_volume(cfg: FederationConfig) -> Manifest:
    """The bench's ``$MEGHA_HOME``: the megha-operator Secret (the secret, every broker
    login, the users' tokens under ``tokens/``) and the federation CA's certificate in
    ``tls/`` (which ``Access.in_home`` trusts), not the CA's key."""
    items = [
        {"key": name, "path": name}
        for name in (SECRET_FILENAME, CREDENTIALS_FILENAME, TOKENS_FILENAME)
    ] + [{"key": token_key(u.user), "path": f"tokens/{u.user}"} for u in cfg.user_configs]
    ca = [{"key": CA_CERT, "path": f"{TLS_DIRNAME}/{CA_CERT}"}]
    return {
        "name": "home",
        "projected": {
            "defaultMode": READ_ONLY,
            "sources": [
                {"secret": {"name": OPERATOR_SECRET, "items": items}},
                {"secret": {"name": TLS_SECRET, "items": ca}},
            ],
        },
    }


def bench_job(cfg: FederationConfig) -> Manifest:
    """``megha bench`` as a suspended CronJob, run on demand::

        kubectl -n NAMESPACE create job --from=cronjob/megha-bench bench-1

    It acts as the operator, from its mounted ``$MEGHA_HOME`` (``_home_volume``)."""
    labels = {
        "app.kubernetes.io/name": "megha",
        "app.kubernetes.io/part-of": "megha",
        "app.kubernetes.io/component": "bench",
    }
    pod: Manifest = {
        "metadata": {"labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": _pod_security(),
            "containers": [_bench_container()],
            "volumes": [
                {"name": "config", "configMap": {"name": "megha-config"}},
                _home_volume(cfg),
                {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            ],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": _meta("megha-bench", labels),
        "spec": {
            "suspend": True,
            "schedule": "0 0 1 1 *",
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {
                "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 86400, "template": pod}
            },
        },
    }


def _peer(labels: dict[str, str]) -> Manifest:
    return {"podSelector": {"matchLabels": labels}}


def _component(name: str) -> Manifest:
    return _peer({"app.kubernetes.io/part-of": "megha", "app.kubernetes.io/component": name})


def _process(name: str) -> Manifest:
    return _peer({"app.kubernetes.io/name": "megha", "megha.io/process": name})


def _ports(*ports: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port} for port in sorted(set(ports))]


def _policy(
    name: str, selector: Manifest, ingress: list[Manifest], egress: list[Manifest]
) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "megha"}},
        "spec": {
            "podSelector": selector["podSelector"],
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def network_policies(cfg: FederationConfig, plan: list[ProcessSpec]) -> list[Manifest]:
    """Who may talk to whom, on which port, beyond base's default deny.

    GM -> every LM (HTTPS) and the broker (AMQPS); LM -> its worker pool and the
    broker; worker pool -> its LM; bench -> the broker, and the GMs' and LMs'
    ``/v1/state`` and the first LM's and its pool's ``/v1/ping`` (the floor it measures).
    """
    by_name = {p.name: p for p in plan}
    gm_ports = [by_name[g].port for g in cfg.gm_ids]
    lm_ports = [by_name[lm].port for lm in cfg.lm_ids]
    to_broker: Manifest = {"to": [_component("rabbitmq")], "ports": _ports(AMQPS_PORT)}
    floor_pool = by_name[f"{cfg.lm_ids[0]}-workers"]
    policies = [
        _policy(
            "megha-gm",
            _component("gm"),
            ingress=[{"from": [_component("bench")], "ports": _ports(*gm_ports)}],
            egress=[{"to": [_component("lm")], "ports": _ports(*lm_ports)}, to_broker],
        ),
        _policy(
            "megha-bench",
            _component("bench"),
            ingress=[],
            egress=[
                to_broker,
                {"to": [_component("gm")], "ports": _ports(*gm_ports)},
                {"to": [_component("lm")], "ports": _ports(*lm_ports)},
                {"to": [_process(floor_pool.name)], "ports": _ports(floor_pool.port)},
            ],
        ),
    ]
    for lm in cfg.lm_ids:
        me, pool = by_name[lm], by_name[f"{lm}-workers"]
        policies.append(
            _policy(
                f"megha-{lm}",
                _process(lm),
                ingress=[
                    {
                        "from": [_component("gm"), _process(pool.name), _component("bench")],
                        "ports": _ports(me.port),
                    }
                ],
                egress=[
                    {"to": [_process(pool.name)], "ports": _ports(pool.port)},
                    to_broker,
                ],
            )
        )
        sources = [_process(lm)] + ([_component("bench")] if pool is floor_pool else [])
        policies.append(
            _policy(
                f"megha-{pool.name}",
                _process(pool.name),
                ingress=[{"from": sources, "ports": _ports(pool.port)}],
                egress=[{"to": [_process(lm)], "ports": _ports(me.port)}],
            )
        )
    return policies


def check_kubernetes(cfg: FederationConfig) -> None:
    """Refuse a config whose processes could not find each other in a namespace, or could
    not reach base's broker (AMQPS only, on ``AMQPS_PORT``)."""
    if cfg.listen != "0.0.0.0":
        raise ConfigError('Kubernetes: set listen = "0.0.0.0" (pods bind all interfaces)')
    missing = []
    for name in cfg.process_names:
        host, port = cfg.address(name)
        if host != name:
            missing.append(f'"{name}" = "{name}:{port}"')
    if missing:
        raise ConfigError(
            "Kubernetes: every process is reached through the Service of its own name; "
            "add to [federation.addresses]: " + ", ".join(missing)
        )
    plain = [u for u in cfg.broker_urls if not u.startswith("amqps://")]
    plain += [u for u in cfg.broker_urls if urlsplit(u).port != AMQPS_PORT]
    if not cfg.tls_on or plain:
        raise ConfigError(
            f"Kubernetes: base's RabbitMQ listens for AMQPS only, on {AMQPS_PORT}, and the "
            f'pods mount their certificates: set tls = "on" and broker_url = '
            f'"amqps://rabbitmq:{AMQPS_PORT}/"'
        )


def kubernetes(cfg: FederationConfig) -> list[Manifest]:
    """The federation-shaped manifests of one overlay (see the module docstring)."""
    check_kubernetes(cfg)
    plan = process_plan(cfg, CONFIG_PATH)
    docs: list[Manifest] = []
    for p in plan:
        docs.append(_workload(p))
        docs.extend(_services(p))
        docs.append(state_claim(p))
    docs.append(bench_job(cfg))
    docs.extend(network_policies(cfg, plan))
    return docs


KUBERNETES_HEADER = """\
# Generated by `python -m deploy.render` from federation.toml beside this file and
# common.config.process_plan: one workload, Service and NetworkPolicy per process, and
# the bench.  The Secrets come from secrets/ (`python -m deploy.render secrets`).
# Edit federation.toml (or deploy/render.py), not this file; tests/deploy checks it.
"""


# ---------------------------------------------------------------- files
class _Dumper(yaml.SafeDumper):
    """Writes shared sub-trees out in full: no anchors or aliases in generated files."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(docs: list[Manifest], header: str) -> str:
    body = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=100)
    return header + ("---\n" if len(docs) > 1 else "") + body


def outputs() -> dict[Path, str]:
    """Every checked-in generated file and what it should contain."""
    cfg = load_config(COMPOSE_CONFIG)
    host = host_network(cfg)
    out = {
        COMPOSE_FILE: dump([compose(cfg)], COMPOSE_HEADER),
        COMPOSE_HOST_CONFIG: HOST_CONFIG_HEADER + host_network_toml(COMPOSE_CONFIG),
        COMPOSE_HOST_FILE: dump([compose(host, "host")], COMPOSE_HOST_HEADER),
    }
    for toml in sorted(OVERLAYS.glob("*/federation.toml")):
        out[toml.with_name("megha.yaml")] = dump(kubernetes(load_config(toml)), KUBERNETES_HEADER)
    return out


def stale() -> list[Path]:
    """The generated files that differ from what ``python -m deploy.render`` writes."""
    return [
        path for path, text in outputs().items() if not path.exists() or path.read_text() != text
    ]


def _outside_git(directory: Path) -> None:
    """Refuse a secrets directory git would track (inside this checkout, not ignored)."""
    where = directory.resolve()
    if not where.is_relative_to(ROOT) or not (ROOT / ".git").exists():
        return
    try:
        ignored = subprocess.run(
            ["git", "-C", str(ROOT), "check-ignore", "-q", str(where / SECRET_FILENAME)],
            capture_output=True,
            timeout=30,
            check=False,
        ).returncode
    except (OSError, subprocess.TimeoutExpired):
        return  # no git here: nothing to commit them to
    if ignored != 0:
        raise ConfigError(
            f"{directory} is inside the repository and not ignored by git: put the secrets "
            "elsewhere, or in an overlay's secrets/ directory (.gitignore)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.render", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    sub = parser.add_subparsers(dest="target")
    k8s = sub.add_parser("kubernetes", help="print the manifests of a federation TOML")
    k8s.add_argument("config")
    sec = sub.add_parser(
        "secrets",
        help="make a deployment's secrets (kept if present) in DIR, outside git",
    )
    sec.add_argument("config", help="the federation TOML the deployment runs")
    sec.add_argument("dir", help="where to write them (created 0700)")
    args = parser.parse_args(argv)
    try:
        if args.target == "kubernetes":
            sys.stdout.write(dump(kubernetes(load_config(args.config)), KUBERNETES_HEADER))
            return 0
        if args.target == "secrets":
            directory = Path(args.dir)
            _outside_git(directory)
            for path in write_secrets(load_config(args.config), directory):
                print(f"wrote {path}")
            if os.getuid() == 0:
                print(
                    "note: made as root: compose runs the containers as root; make them as "
                    "the user who runs docker compose",
                    file=sys.stderr,
                )
            return 0
        if args.check:
            old = stale()
            for path in old:
                print(f"stale: {path.relative_to(ROOT)} (run python -m deploy.render)")
            return 1 if old else 0
        for path, text in outputs().items():
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    except ConfigError as exc:
        print(f"deploy.render: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
