"""The Kubernetes overlays: what ``kubectl apply -k`` would apply is valid, runs the
process plan of its own ConfigMap, and lets each service talk only to what it must.

Every object of every overlay is rendered by the real kustomize and validated against
the Kubernetes API schemas of the ``kubernetes-validate`` package (strict: unknown
fields are errors), offline.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest

from common.config import (
    BROKER_ENV,
    CONFIG_ENV,
    FederationConfig,
    ProcessSpec,
    parse_config,
    process_plan,
)
from deploy.render import AMQP_PORT, CONFIG_PATH, INSTANCE_ENV, MEGHA_UID, SECRET_ENV
from tests.deploy.conftest import (
    ROOT,
    Manifest,
    by_kind,
    containers,
    kustomize,
    pod_labels,
    pod_spec,
    workloads,
)

pytestmark = pytest.mark.deploy

K8S_VERSIONS = ("1.30.0", "1.37.0")
"""The oldest Kubernetes these manifests claim to support, and the newest schema shipped."""


def federation(docs: list[Manifest]) -> FederationConfig:
    (cm,) = [c for n, c in by_kind(docs, "ConfigMap").items() if n.startswith("megha-config")]
    return parse_config(tomllib.loads(cm["data"]["federation.toml"]), env={})


def plan_of(docs: list[Manifest]) -> list[ProcessSpec]:
    return process_plan(federation(docs), CONFIG_PATH)


def env_of(container: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in container.get("env", [])}


# ---------------------------------------------------------------- schemas
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_is_valid_for_the_kubernetes_api(docs: list[Manifest], version: str) -> None:
    assert len(docs) > 20
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


@functools.cache
def dev() -> list[Manifest]:
    """The dev overlay, rendered once: callers that change it change a deep copy."""
    return kustomize(ROOT / "deploy" / "kubernetes" / "overlays" / "dev")


def test_the_validator_refuses_what_the_api_server_would() -> None:
    gm = by_kind(dev(), "Deployment")["gm0"]
    typo = copy.deepcopy(gm)
    pod_spec(typo)["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/health"}
    wrong_type = copy.deepcopy(gm)
    wrong_type["spec"]["replicas"] = "one"
    for bad in (typo, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


# ---------------------------------------------------------------- the process plan
def test_the_configmap_parses_and_every_process_runs_as_planned(docs: list[Manifest]) -> None:
    cfg = federation(docs)
    assert cfg.queue_type == "quorum"
    assert cfg.listen == "0.0.0.0"
    services = by_kind(docs, "Service")
    kinds = {"gm": "Deployment", "lm": "StatefulSet", "worker": "Deployment"}
    for p in plan_of(docs):
        workload = by_kind(docs, kinds[p.role])[p.name]
        (c,) = pod_spec(workload)["containers"]
        assert c["command"] == p.argv, p.name
        assert f"0.0.0.0:{p.port}" in p.argv
        assert [port["containerPort"] for port in c["ports"]] == [p.port]
        env = env_of(c)
        for key, value in p.env.items():
            if key == BROKER_ENV:
                continue
            assert env[key] == {"name": key, "value": value}, (p.name, key)
        # The config file each process is told to read is the ConfigMap's, mounted.
        config = PurePosixPath(env[CONFIG_ENV]["value"])
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(config.parent)]
        (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
        assert volume["configMap"]["name"].startswith("megha-config")
        assert config.name == "federation.toml"
        # Others reach it at its address: a Service of that name, on that port.
        host, port = cfg.address(p.name)
        svc = services[host]
        assert [sp["port"] for sp in svc["spec"]["ports"]] == [port]
        assert svc["spec"]["selector"].items() <= pod_labels(workload).items()


def test_gms_are_stateless_deployments_and_each_lm_has_a_standby(docs: list[Manifest]) -> None:
    cfg = federation(docs)
    deployments, statefulsets = by_kind(docs, "Deployment"), by_kind(docs, "StatefulSet")
    for gm in cfg.gm_ids:
        assert deployments[gm]["spec"]["replicas"] == 1
        assert deployments[gm]["spec"]["strategy"]["type"] == "Recreate"  # never two gm0s
    for lm in cfg.lm_ids:
        sts = statefulsets[lm]
        assert sts["spec"]["replicas"] == 2
        (c,) = pod_spec(sts)["containers"]
        instance = env_of(c)[INSTANCE_ENV]["valueFrom"]["fieldRef"]["fieldPath"]
        assert instance == "metadata.name"
        assert by_kind(docs, "Service")[sts["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
        assert by_kind(docs, "PodDisruptionBudget")[lm]["spec"]["minAvailable"] == 1
        pool = deployments[f"{lm}-workers"]
        assert pool["spec"]["replicas"] == 1
        assert pool["spec"]["strategy"]["type"] == "Recreate"


def test_rabbitmq_is_a_three_node_cluster_formed_by_kubernetes_peer_discovery(
    docs: list[Manifest],
) -> None:
    sts = by_kind(docs, "StatefulSet")["rabbitmq"]
    assert sts["spec"]["replicas"] == 3
    (c,) = pod_spec(sts)["containers"]
    major, minor = map(int, re.findall(r":(\d+)\.(\d+)", c["image"])[0])
    assert (major, minor) >= (4, 1)  # peer discovery without Kubernetes API access
    conf = by_kind(docs, "ConfigMap")["rabbitmq-config"]["data"]
    assert "cluster_formation.peer_discovery_backend = k8s" in conf["rabbitmq.conf"]
    assert "rabbitmq_peer_discovery_k8s" in conf["enabled_plugins"]
    governing = by_kind(docs, "Service")[sts["spec"]["serviceName"]]
    assert governing["spec"]["clusterIP"] == "None"
    assert governing["spec"]["publishNotReadyAddresses"] is True
    nodename = env_of(c)["RABBITMQ_NODENAME"]["value"]
    assert nodename == f"rabbit@$(MY_POD_NAME).{governing['metadata']['name']}.$(MY_POD_NAMESPACE)"
    assert pod_spec(sts)["enableServiceLinks"] is False  # no RABBITMQ_* from Service links
    assert by_kind(docs, "PodDisruptionBudget")["rabbitmq"]["spec"]["maxUnavailable"] == 1
    # The broker users' permissions cover the federation's names and nothing else.
    assert federation(docs).name == "megha"
    assert "^(megha[.]|amq_)" in conf["setup.sh"]


# ---------------------------------------------------------------- pods
def test_every_service_is_probed_on_health_and_metrics(docs: list[Manifest]) -> None:
    for p in plan_of(docs):
        workload = next(w for w in workloads(docs) if w["metadata"]["name"] == p.name)
        (c,) = pod_spec(workload)["containers"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert c["livenessProbe"]["httpGet"]["path"] == "/metrics"
        assert c["startupProbe"]["httpGet"]["path"] == "/metrics"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            named = c[probe]["httpGet"]["port"]
            assert [port["containerPort"] for port in c["ports"] if port["name"] == named] == [
                p.port
            ]


def test_every_container_has_requests_and_limits_and_no_privileges(docs: list[Manifest]) -> None:
    for workload in workloads(docs):
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in containers(workload):
            name = f"{workload['metadata']['name']}/{c['name']}"
            for kind in ("requests", "limits"):
                assert set(c["resources"][kind]) == {"cpu", "memory"}, name
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
            if c["image"].split(":")[0].endswith("megha"):
                assert spec["securityContext"]["runAsUser"] == MEGHA_UID, name
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
                assert env_of(c)[SECRET_ENV]["value"].startswith("/etc/megha/secret/"), name


def test_namespace_enforces_the_restricted_pod_security_standard(docs: list[Manifest]) -> None:
    (ns,) = by_kind(docs, "Namespace").values()
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        ns["metadata"]["name"]
    }


def test_only_roles_that_use_the_broker_get_its_credentials(docs: list[Manifest]) -> None:
    for workload in workloads(docs):
        component = pod_labels(workload)["app.kubernetes.io/component"]
        for c in pod_spec(workload)["containers"]:
            ref = env_of(c).get(BROKER_ENV, {}).get("valueFrom", {}).get("secretKeyRef")
            if component in ("gm", "lm", "bench"):
                assert ref is not None, workload["metadata"]["name"]
                assert ref["name"].startswith(f"megha-broker-{component}")
            else:
                assert ref is None, workload["metadata"]["name"]


def test_worker_pools_never_touch_the_broker() -> None:
    """Why worker pools get no broker credentials and no route to it."""
    for path in (ROOT / "worker").glob("*.py"):
        text = path.read_text()
        assert "aio_pika" not in text, path
        assert "common.broker" not in text, path


# ---------------------------------------------------------------- secrets
def secret_refs(docs: list[Manifest]) -> set[tuple[str, str]]:
    """(Secret, key) pairs the pods read."""
    refs: set[tuple[str, str]] = set()
    for workload in workloads(docs):
        spec = pod_spec(workload)
        for c in containers(workload):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
        for v in spec.get("volumes", []):
            if "secret" in v:
                name = v["secret"]["secretName"]
                keys = {"secret"} if name.startswith("megha-federation") else {"cookie"}
                refs |= {(name, k) for k in keys}
    return refs


def unhashed(name: str) -> str:
    """A generated Secret's name without kustomize's content hash (10 characters of a
    vowel-free alphabet, so that "-federation" is never taken for one)."""
    return re.sub(r"-[2456789bcdfghkmt]{10}$", "", name)


def test_every_secret_a_pod_reads_is_generated_or_documented(
    overlay: str, docs: list[Manifest]
) -> None:
    refs = secret_refs(docs)
    assert {unhashed(n) for n, _ in refs} == {
        "megha-federation",
        "megha-broker-gm",
        "megha-broker-lm",
        "megha-broker-bench",
        "rabbitmq-admin",
        "rabbitmq-erlang-cookie",
    }
    secrets = by_kind(docs, "Secret")
    if secrets:  # the overlay generates them: each key a pod reads is there
        for name, key in refs:
            assert key in secrets[name]["data"], (name, key)
    else:  # the operator creates them: deploy/README.md says how, key by key
        readme = (ROOT / "deploy" / "README.md").read_text().replace("\\\n", " ")
        for name, key in refs:
            command = re.search(rf"kubectl -n \S+ create secret generic {name}\b[^\n]*", readme)
            assert command is not None, name
            assert f"--from-literal={key}=" in command.group(0), (name, key)


def test_dev_broker_urls_carry_their_own_users_credentials() -> None:
    docs = dev()
    cfg = federation(docs)
    for name, secret in by_kind(docs, "Secret").items():
        data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        if unhashed(name).startswith("megha-broker-"):
            user, password = data["username"], data["password"]
            assert data["url"] == f"amqp://{user}:{password}@rabbitmq:{AMQP_PORT}/"
            assert cfg.broker_url == f"amqp://rabbitmq:{AMQP_PORT}/"


# ---------------------------------------------------------------- network policies
@dataclass(frozen=True)
class Pod:
    name: str
    labels: dict[str, str]
    ports: tuple[int, ...]
    namespace: str = "here"


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def peer_matches(peer: Manifest, pod: Pod) -> bool:
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        ns_labels = {"kubernetes.io/metadata.name": pod.namespace}
        if not selects(peer["namespaceSelector"], ns_labels):
            return False
    elif pod.namespace != "here":
        return False
    return selects(peer.get("podSelector", {}), pod.labels)


def rule_allows(rule: Manifest, key: str, peer: Pod, port: int, protocol: str) -> bool:
    """One ingress or egress rule; a missing or empty ``from``/``to``/``ports`` matches all."""
    peers = rule.get(key)
    if peers and not any(peer_matches(p, peer) for p in peers):
        return False
    ports = rule.get("ports")
    if not ports:
        return True
    return any(
        p.get("protocol", "TCP") == protocol and p["port"] <= port <= p.get("endPort", p["port"])
        for p in ports
    )


def allowed(policies: list[Manifest], src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
    """Whether Kubernetes lets ``src`` open a connection to ``dst`` on ``port``."""

    def side(pod: Pod, kind: str, key: str, peer: Pod) -> bool:
        if pod.namespace != "here":
            return True  # another namespace's policies are not ours to check
        mine = [
            p["spec"]
            for p in policies
            if kind in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], pod.labels)
        ]
        if not mine:
            return True
        field = kind.lower()
        return any(
            rule_allows(r, key, peer, port, protocol) for s in mine for r in s.get(field, [])
        )

    return side(src, "Egress", "to", dst) and side(dst, "Ingress", "from", src)


def pods_of(docs: list[Manifest]) -> list[Pod]:
    pods = [
        Pod(
            w["metadata"]["name"],
            pod_labels(w),
            tuple(
                p["containerPort"] for c in pod_spec(w)["containers"] for p in c.get("ports", [])
            ),
        )
        for w in workloads(docs)
    ]
    pods.append(
        Pod(
            "user",
            {"app.kubernetes.io/part-of": "megha", "app.kubernetes.io/component": "user"},
            (),
        )
    )
    pods.append(Pod("stranger", {"app": "something-else"}, (8000, 8100, 8200, AMQP_PORT)))
    return pods


def expected_paths(docs: list[Manifest]) -> set[tuple[str, str, int]]:
    """Exactly who must talk to whom (SPEC §2, §6): nothing more."""
    cfg = federation(docs)
    port = {p.name: p.port for p in plan_of(docs)}
    paths = {("rabbitmq", "rabbitmq", p) for p in (4369, 25672)}
    for gm in cfg.gm_ids:
        paths |= {(gm, lm, port[lm]) for lm in cfg.lm_ids} | {(gm, "rabbitmq", AMQP_PORT)}
        paths.add(("megha-bench", gm, port[gm]))
    for lm in cfg.lm_ids:
        pool = f"{lm}-workers"
        paths |= {(lm, pool, port[pool]), (pool, lm, port[lm]), (lm, "rabbitmq", AMQP_PORT)}
        paths.add(("megha-bench", lm, port[lm]))
    floor = f"{cfg.lm_ids[0]}-workers"  # the pool whose /v1/ping the bench measures
    paths |= {("megha-bench", floor, port[floor]), ("megha-bench", "rabbitmq", AMQP_PORT)}
    paths.add(("user", "rabbitmq", AMQP_PORT))
    return paths


def test_each_service_talks_only_to_what_it_must(docs: list[Manifest]) -> None:
    policies = list(by_kind(docs, "NetworkPolicy").values())
    pods = pods_of(docs)
    granted = {
        (src.name, dst.name, port)
        for src in pods
        for dst in pods
        for port in dst.ports
        if allowed(policies, src, dst, port)
    }
    assert granted == expected_paths(docs)


def test_every_pod_may_ask_the_cluster_dns_and_nothing_outside(docs: list[Manifest]) -> None:
    policies = list(by_kind(docs, "NetworkPolicy").values())
    dns = Pod("kube-dns", {"k8s-app": "kube-dns"}, (53,), namespace="kube-system")
    other = Pod("kube-apiserver", {"component": "kube-apiserver"}, (443, 6443), "kube-system")
    for pod in pods_of(docs):
        assert allowed(policies, pod, dns, 53, "UDP"), pod.name
        assert allowed(policies, pod, dns, 53, "TCP"), pod.name
        assert not any(allowed(policies, pod, other, p) for p in other.ports), pod.name


def test_the_reachability_check_sees_a_hole() -> None:
    """What makes the policy test able to fail: one rule opened is one path more."""
    docs = dev()
    pods = {p.name: p for p in pods_of(docs)}
    policies = copy.deepcopy(list(by_kind(docs, "NetworkPolicy").values()))
    assert not allowed(policies, pods["lm0-workers"], pods["gm0"], 8000)
    by_name = {p["metadata"]["name"]: p for p in policies}
    by_name["megha-lm0-workers"]["spec"]["egress"].append({})
    assert not allowed(policies, pods["lm0-workers"], pods["gm0"], 8000)  # gm0 still refuses
    by_name["megha-gm"]["spec"]["ingress"].append({"ports": [{"port": 8000}]})
    assert allowed(policies, pods["lm0-workers"], pods["gm0"], 8000)


# ---------------------------------------------------------------- the broker's setup
def run_setup(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """base's RabbitMQ init script, run by sh with its paths moved under ``tmp_path``."""
    script = by_kind(dev(), "ConfigMap")["rabbitmq-config"]["data"]["setup.sh"]
    for path in ("/etc/rabbitmq/cookie", "/etc/rabbitmq/definitions", "/var/lib/rabbitmq"):
        (tmp_path / path.strip("/")).mkdir(parents=True, exist_ok=True)
        script = script.replace(path, str(tmp_path / path.strip("/")))
    (tmp_path / "etc/rabbitmq/cookie/cookie").write_text("cookie-value")
    return subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_the_broker_setup_writes_the_users_of_the_secrets(tmp_path: Path) -> None:
    docs = dev()
    secrets = {
        unhashed(n): {k: base64.b64decode(v).decode() for k, v in s["data"].items()}
        for n, s in by_kind(docs, "Secret").items()
    }
    (init,) = pod_spec(by_kind(docs, "StatefulSet")["rabbitmq"])["initContainers"]
    env = {}
    for e in init["env"]:
        ref = e["valueFrom"]["secretKeyRef"]
        env[e["name"]] = secrets[unhashed(ref["name"])][ref["key"]]
    out = run_setup(tmp_path, env)
    assert out.returncode == 0, out.stderr
    definitions = json.loads((tmp_path / "etc/rabbitmq/definitions/definitions.json").read_text())
    users = {u["name"]: u for u in definitions["users"]}
    for role in ("gm", "lm", "bench"):
        s = secrets[f"megha-broker-{role}"]
        assert users[s["username"]]["password"] == s["password"]
        assert users[s["username"]]["tags"] == []
    assert users[secrets["rabbitmq-admin"]["username"]]["tags"] == ["administrator"]
    # The same users and permissions as the compose broker's definitions.
    compose = json.loads((ROOT / "deploy/compose/rabbitmq/definitions.json").read_text())
    assert definitions["permissions"] == compose["permissions"]
    assert (tmp_path / "var/lib/rabbitmq/.erlang.cookie").read_text() == "cookie-value"
    # A password that would break the URL or the JSON is refused, loudly.
    out = run_setup(tmp_path, {**env, "GM_PASSWORD": 'pa"ss'})
    assert out.returncode == 1
    assert "URL-safe" in out.stderr
