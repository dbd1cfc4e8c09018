"""Deployment files from the process plan: docker compose and Kubernetes.

``common.config.process_plan`` says which processes make a federation and exactly how
each starts; this module turns a federation TOML into the files that run those
processes elsewhere, so ``megha up``, compose and Kubernetes cannot drift apart:

* ``docker-compose.yml`` from ``deploy/compose/federation.toml``;
* ``deploy/kubernetes/overlays/<name>/megha.yaml`` from that overlay's
  ``federation.toml``: one Deployment per GM, one StatefulSet (active + standby) per
  LM, one Deployment per LM's worker pool, their Services, disruption budgets and the
  NetworkPolicies that depend on the federation's shape.  What does not depend on it
  (RabbitMQ, default deny, DNS, the broker's policy, the bench CronJob) is in
  ``deploy/kubernetes/base``.

Run from the repository root::

    python -m deploy.render                  # rewrite every checked-in file
    python -m deploy.render --check          # exit 1 if one is stale (the tests do this)
    python -m deploy.render kubernetes my.toml > megha.yaml   # a federation of your own
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from common.config import (
    BROKER_ENV,
    FederationConfig,
    ProcessSpec,
    load_config,
    process_plan,
)
from common.errors import ConfigError

Manifest = dict[str, Any]

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_CONFIG = ROOT / "deploy" / "compose" / "federation.toml"
COMPOSE_DEFINITIONS = ROOT / "deploy" / "compose" / "rabbitmq" / "definitions.json"
COMPOSE_FILE = ROOT / "docker-compose.yml"
OVERLAYS = ROOT / "deploy" / "kubernetes" / "overlays"

CONFIG_PATH = "/etc/megha/config/federation.toml"
"""Where every container finds the federation TOML (compose config, k8s ConfigMap)."""
SECRET_ENV = "MEGHA_SECRET_FILE"
INSTANCE_ENV = "MEGHA_INSTANCE"
RABBITMQ_IMAGE = "rabbitmq:4.1-management"
"""4.1 or later: its Kubernetes peer discovery needs no access to the Kubernetes API."""
AMQP_PORT = 5672
MEGHA_UID = 10001
"""The Dockerfile's ``USER``; the pods run as it."""

COMPONENT = {"gm": "gm", "lm": "lm", "worker": "workers"}
"""``app.kubernetes.io/component`` of each role of the process plan."""
BROKER_USERS = {"gm": "megha-gm", "lm": "megha-lm", "bench": "megha-bench"}
"""Who logs into RabbitMQ, each role as its own user.  Worker pools never do (they
talk only to their LM), so they get no broker credentials at all."""


# ---------------------------------------------------------------- docker compose
def _compose_broker_urls(cfg: FederationConfig) -> dict[str, str]:
    """Each broker role's URL: the config's broker (``rabbitmq``, or another host's) with
    that role's user and password from deploy/compose's definitions."""
    users = {u["name"]: u["password"] for u in json.loads(COMPOSE_DEFINITIONS.read_text())["users"]}
    broker = urlsplit(cfg.broker_url)
    where = f"{broker.hostname}:{broker.port or AMQP_PORT}{broker.path or '/'}"
    return {role: f"amqp://{name}:{users[name]}@{where}" for role, name in BROKER_USERS.items()}


def _health_test(port: int) -> list[str]:
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=2)"
    return ["CMD", "python3", "-c", probe]


def compose(cfg: FederationConfig) -> Manifest:
    """The compose project: the broker, every process of the plan, and a bench profile."""
    urls = _compose_broker_urls(cfg)
    plan = process_plan(cfg, CONFIG_PATH)
    megha: Manifest = {
        "image": "${MEGHA_IMAGE:-megha:dev}",
        "read_only": True,
        "tmpfs": ["/tmp"],
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
        "configs": [{"source": "megha-config", "target": CONFIG_PATH}],
        "secrets": ["megha-federation"],
        "restart": "unless-stopped",
    }
    services: dict[str, Manifest] = {
        "rabbitmq": {
            "image": RABBITMQ_IMAGE,
            "hostname": "rabbitmq",
            "ports": [f"{AMQP_PORT}:{AMQP_PORT}", "127.0.0.1:15672:15672"],
            "configs": [
                {"source": "rabbitmq-conf", "target": "/etc/rabbitmq/conf.d/20-megha.conf"}
            ],
            "secrets": [
                {"source": "rabbitmq-definitions", "target": "/etc/rabbitmq/definitions.json"}
            ],
            "volumes": ["rabbitmq-data:/var/lib/rabbitmq"],
            "healthcheck": {
                "test": ["CMD", "rabbitmq-diagnostics", "-q", "check_port_connectivity"],
                "interval": "5s",
                "timeout": "10s",
                "retries": 12,
                "start_period": "20s",
            },
            "restart": "unless-stopped",
        }
    }
    for p in plan:
        env = {k: v for k, v in p.env.items() if k != BROKER_ENV}
        if p.role in BROKER_USERS:
            env[BROKER_ENV] = urls[p.role]
        env[SECRET_ENV] = "/run/secrets/megha-federation"
        depends: dict[str, Manifest] = {}
        if p.role in BROKER_USERS:
            depends["rabbitmq"] = {"condition": "service_healthy"}
        if p.role == "gm":
            depends.update({lm: {"condition": "service_healthy"} for lm in cfg.lm_ids})
        svc: Manifest = {
            **megha,
            "command": p.argv,
            "environment": env,
            "ports": [f"{p.port}:{p.port}"],
            "healthcheck": {
                "test": _health_test(p.port),
                "interval": "2s",
                "timeout": "3s",
                "retries": 30,
                "start_period": "5s",
            },
        }
        if depends:
            svc["depends_on"] = depends
        services[p.name] = svc
    services["bench"] = {
        **megha,
        "profiles": ["bench"],
        "restart": "no",
        "command": ["megha", "bench", "--config", CONFIG_PATH, "--out", "results/bench"],
        "environment": {
            BROKER_ENV: urls["bench"],
            SECRET_ENV: "/run/secrets/megha-federation",
            "MPLCONFIGDIR": "/tmp/matplotlib",  # the plots' font cache; the root is read-only
        },
        "volumes": ["./results:/app/results"],
        "depends_on": {g: {"condition": "service_healthy"} for g in cfg.gm_ids},
    }
    return {
        "name": "megha",
        "services": services,
        "configs": {
            "megha-config": {"file": "./deploy/compose/federation.toml"},
            "rabbitmq-conf": {"file": "./deploy/compose/rabbitmq/rabbitmq.conf"},
        },
        "secrets": {
            "megha-federation": {"file": "./deploy/compose/federation.secret"},
            "rabbitmq-definitions": {"file": "./deploy/compose/rabbitmq/definitions.json"},
        },
        "volumes": {"rabbitmq-data": {}},
    }


COMPOSE_HEADER = """\
# Generated by `python -m deploy.render` from deploy/compose/federation.toml and
# common.config.process_plan: the same commands as `megha up`.  Edit those, not this file
# (tests/deploy checks that it is up to date and valid against the compose spec).
#   docker build -t megha:dev .
#   docker compose up -d                                  # broker, 3 GMs, 3 LMs, 3 worker pools
#   docker compose --profile bench run --rm bench         # replay a workload into results/bench
# deploy/README.md explains the rest (several hosts, credentials, the image).
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


def _env(p: ProcessSpec) -> list[Manifest]:
    env: list[Manifest] = [{"name": k, "value": v} for k, v in p.env.items() if k != BROKER_ENV]
    if p.role in BROKER_USERS:
        ref = {"name": f"megha-broker-{p.role}", "key": "url"}
        env.append({"name": BROKER_ENV, "valueFrom": {"secretKeyRef": ref}})
    env.append({"name": SECRET_ENV, "value": "/etc/megha/secret/secret"})
    if p.role == "lm":
        # Active and standby run the same command; they tell themselves apart by pod name.
        env.append(
            {"name": INSTANCE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        )
    return env


def _pod(p: ProcessSpec) -> Manifest:
    """The pod of process ``p``: probes, limits, a read-only root, no token, not root."""
    http = {"port": "http"}
    container: Manifest = {
        "name": COMPONENT[p.role],
        "image": "megha",
        "imagePullPolicy": "IfNotPresent",
        "command": p.argv,
        "env": _env(p),
        "ports": [{"name": "http", "containerPort": p.port, "protocol": "TCP"}],
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
        "resources": RESOURCES[p.role],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/megha/config", "readOnly": True},
            {"name": "secret", "mountPath": "/etc/megha/secret", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 15,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": MEGHA_UID,
            "runAsGroup": MEGHA_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": "megha-config"}},
            {"name": "secret", "secret": {"secretName": "megha-federation"}},
            {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        ],
    }
    if p.role == "lm":
        # Keep the standby off the active's node when the cluster has another.
        spec["affinity"] = {
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
    # GMs are stateless and worker pools hold no state the LM cannot rebuild, but two
    # copies of the same GM or pool must not run at once: Recreate, never surge.
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

    GM -> every LM (HTTP) and the broker; LM -> its worker pool and the broker;
    worker pool -> its LM; bench -> the broker, and the GMs' and LMs' ``/v1/state``
    and the first LM's and its pool's ``/v1/ping`` (the floor it measures).
    """
    by_name = {p.name: p for p in plan}
    gm_ports = [by_name[g].port for g in cfg.gm_ids]
    lm_ports = [by_name[lm].port for lm in cfg.lm_ids]
    to_broker: Manifest = {"to": [_component("rabbitmq")], "ports": _ports(AMQP_PORT)}
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
    """Refuse a config whose processes could not find each other in a namespace."""
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


def kubernetes(cfg: FederationConfig) -> list[Manifest]:
    """The federation-shaped manifests of one overlay (see the module docstring)."""
    check_kubernetes(cfg)
    plan = process_plan(cfg, CONFIG_PATH)
    docs: list[Manifest] = []
    for p in plan:
        docs.append(_workload(p))
        docs.extend(_services(p))
    docs.extend(network_policies(cfg, plan))
    return docs


KUBERNETES_HEADER = """\
# Generated by `python -m deploy.render` from federation.toml beside this file and
# common.config.process_plan: one workload, Service and NetworkPolicy per process.
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
    out = {COMPOSE_FILE: dump([compose(load_config(COMPOSE_CONFIG))], COMPOSE_HEADER)}
    for toml in sorted(OVERLAYS.glob("*/federation.toml")):
        out[toml.with_name("megha.yaml")] = dump(kubernetes(load_config(toml)), KUBERNETES_HEADER)
    return out


def stale() -> list[Path]:
    """The generated files that differ from what ``python -m deploy.render`` writes."""
    return [
        path for path, text in outputs().items() if not path.exists() or path.read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.render", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated file is stale")
    sub = parser.add_subparsers(dest="target")
    k8s = sub.add_parser("kubernetes", help="print the manifests of a federation TOML")
    k8s.add_argument("config")
    args = parser.parse_args(argv)
    try:
        if args.target == "kubernetes":
            sys.stdout.write(dump(kubernetes(load_config(args.config)), KUBERNETES_HEADER))
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
