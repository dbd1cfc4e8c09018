"""The Kubernetes overlays: what ``kubectl apply -k`` would apply is valid, runs the
process plan of its own ConfigMap, and lets each service talk only to what it must.

Every object of every overlay is rendered by the real kustomize and validated against
the Kubernetes API schemas of the ``kubernetes-validate`` package (strict: unknown
fields are errors), offline.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import quote, urlsplit

import kubernetes_validate
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from common.config import (
    BROKER_ENV,
    CONFIG_ENV,
    STATE_ENV,
    FederationConfig,
    ProcessSpec,
    parse_config,
    process_plan,
)
from deploy import render
from deploy.render import AMQP_PORT, AMQPS_PORT, CONFIG_PATH, INSTANCE_ENV, MEGHA_UID
from security.access import USERS_FILE_ENV, Access, load_tokens
from security.broker_acl import CREDENTIALS_ENV
from security.files import MOUNTED_ENV
from security.party_keys import KEYS_FILE_ENV, PartyKeys
from security.tokens import TokenStore
from tests.deploy.conftest import (
    KUBERNETES,
    ROOT,
    Manifest,
    by_kind,
    check_broker_login,
    check_tls_files,
    containers,
    kustomize_run,
    place,
    pod_labels,
    pod_spec,
    start_access,
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


def test_the_validator_refuses_what_the_api_server_would(dev_docs: list[Manifest]) -> None:
    gm = by_kind(dev_docs, "Deployment")["gm0"]
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
            if key == BROKER_ENV and p.role == "worker":
                assert key not in env  # a worker pool never uses the broker
                continue
            assert env[key] == {"name": key, "value": value}, (p.name, key)
        # The config file each process is told to read is the ConfigMap's, mounted.
        config = PurePosixPath(env[CONFIG_ENV]["value"])
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(config.parent)]
        (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
        # (projected: with the process's certificates in tls/ beside it)
        (source,) = [s["configMap"] for s in volume["projected"]["sources"] if "configMap" in s]
        assert source["name"].startswith("megha-config")
        assert source["name"] in by_kind(docs, "ConfigMap")  # kustomize named it, hash and all
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


def test_each_process_keeps_its_journal_on_a_claim_that_outlives_its_pods(
    docs: list[Manifest],
) -> None:
    """Issue 30: the whole federation restarting loses no task an LM took, on Kubernetes
    as with compose: each LM (active and standby share one claim, ReadWriteMany) and each
    pool (its own, ReadWriteOnce) mounts a PersistentVolumeClaim at $MEGHA_STATE_DIR; so
    does each GM (its own, ReadWriteOnce), whose job history (global_master.history) a
    restart of its pod would otherwise lose."""
    cfg = federation(docs)
    claims = by_kind(docs, "PersistentVolumeClaim")
    deployments, statefulsets = by_kind(docs, "Deployment"), by_kind(docs, "StatefulSet")
    for name, workload, mode in [
        *((lm, statefulsets[lm], "ReadWriteMany") for lm in cfg.lm_ids),
        *((f"{lm}-workers", deployments[f"{lm}-workers"], "ReadWriteOnce") for lm in cfg.lm_ids),
        *((gm, deployments[gm], "ReadWriteOnce") for gm in cfg.gm_ids),
    ]:
        assert claims[f"{name}-state"]["spec"]["accessModes"] == [mode]
        assert "volumeClaimTemplates" not in workload["spec"]  # one claim, not one per pod
        (vol,) = [v for v in pod_spec(workload)["volumes"] if "persistentVolumeClaim" in v]
        assert vol["persistentVolumeClaim"]["claimName"] == f"{name}-state"
        (c,) = pod_spec(workload)["containers"]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == vol["name"]]
        assert env_of(c)[STATE_ENV]["value"] == mount["mountPath"]
        assert not mount.get("readOnly")
    assert len(claims) == 2 * len(cfg.lm_ids) + len(cfg.gm_ids)


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
    # The vhost, users, permissions and topology: the definitions of the Secret.
    path = re.search(r"definitions.local.path = (\S+)", conf["rabbitmq.conf"])
    assert path is not None
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(Path(path[1]).parent)]
    (volume,) = [v for v in pod_spec(sts)["volumes"] if v["name"] == mount["name"]]
    assert unhashed(volume["secret"]["secretName"]) == "rabbitmq-definitions"
    assert volume["secret"]["defaultMode"] == 0o400
    secret = by_kind(docs, "Secret")[volume["secret"]["secretName"]]
    assert Path(path[1]).name in secret["data"]


# ---------------------------------------------------------------- pods
def test_every_service_is_probed_on_health_and_metrics(docs: list[Manifest]) -> None:
    for p in plan_of(docs):
        workload = next(w for w in workloads(docs) if w["metadata"]["name"] == p.name)
        (c,) = pod_spec(workload)["containers"]
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        assert c["livenessProbe"]["httpGet"]["path"] == "/metrics"
        assert c["startupProbe"]["httpGet"]["path"] == "/metrics"
        assert "--certfile" in p.argv  # it serves HTTPS only: so must its probes ask
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert c[probe]["httpGet"]["scheme"] == "HTTPS", (p.name, probe)
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
                assert spec["securityContext"]["fsGroup"] == MEGHA_UID, name
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, name
                assert env_of(c)[MOUNTED_ENV]["value"] == "1", name


def test_namespace_enforces_the_restricted_pod_security_standard(docs: list[Manifest]) -> None:
    (ns,) = by_kind(docs, "Namespace").values()
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {
        ns["metadata"]["name"]
    }


def secret_sources(volume: Manifest) -> list[tuple[str, list[Manifest], int]]:
    """The Secrets a volume shows, each with its items and its files' mode: a Secret
    volume's own, or the ``secret`` sources of a projected one."""
    if "secret" in volume:
        vol = volume["secret"]
        return [(vol["secretName"], vol.get("items", []), vol["defaultMode"])]
    projected = volume.get("projected", {})
    return [
        (src["secret"]["name"], src["secret"]["items"], projected["defaultMode"])
        for src in projected.get("sources", [])
        if "secret" in src
    ]


def mounted_files(workload: Manifest, secrets: dict[str, Manifest]) -> dict[str, bytes]:
    """In-container path -> content of every Secret file the workload's container sees,
    each readable by its owner only (0400; with fsGroup, its group too)."""
    spec = pod_spec(workload)
    (c,) = spec["containers"]
    volumes = {v["name"]: secret_sources(v) for v in spec["volumes"]}
    files = {}
    for m in c["volumeMounts"]:
        for name, items, mode in volumes.get(m["name"], []):
            assert m["readOnly"] is True
            data = secrets[name]["data"]
            for item in items or [{"key": k, "path": k} for k in data]:
                assert item.get("mode", mode) == 0o400, (m["name"], item["key"])
                path = f"{m['mountPath']}/{item['path']}"
                files[path] = base64.b64decode(data[item["key"]])
    return files


def test_each_process_starts_with_its_own_keys_and_broker_login(
    docs: list[Manifest], tmp_path: Path
) -> None:
    """Every GM, LM and worker pool builds its Access from its pod's environment and the
    Secret files mounted there, as the service does at start: a strong secret, its own
    broker user (GMs, LMs) that the broker's definitions have, the users file (GMs)."""
    cfg = federation(docs)
    secrets = by_kind(docs, "Secret")
    (defs_name,) = [n for n in secrets if unhashed(n) == "rabbitmq-definitions"]
    definitions = json.loads(base64.b64decode(secrets[defs_name]["data"]["definitions.json"]))
    kinds = {"gm": "Deployment", "lm": "StatefulSet", "worker": "Deployment"}
    for p in plan_of(docs):
        workload = by_kind(docs, kinds[p.role])[p.name]
        (c,) = pod_spec(workload)["containers"]
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        files = mounted_files(workload, secrets)
        wanted = {KEYS_FILE_ENV} | ({CREDENTIALS_ENV} if p.role != "worker" else set())
        wanted |= {USERS_FILE_ENV} if p.role in ("gm", "lm") else set()
        # its own certificate and key, the CA's certificate (issue 32 item 10)
        tls = check_tls_files(cfg, p.name, c["command"], env, files)
        assert len(tls) == 3, p.name
        # exactly the files the process is told about, no other party's
        assert sorted(set(files) - tls) == sorted(env[k] for k in wanted), p.name
        access = start_access(cfg, p.name, env, files, tmp_path / p.name)
        assert access.secret.warning is None
        # its own keys only, never the federation secret (issue 32 item 7)
        assert isinstance(access.secret, PartyKeys)
        assert access.secret.holder == access.me
        if p.role == "worker":
            assert access.credentials is None, p.name
            continue
        assert list(access.credentials.passwords) == [str(access.me)]  # type: ignore[union-attr]
        check_broker_login(access, definitions, cfg)
        if p.role in ("gm", "lm"):
            assert access.users_file is not None
            users = {u.user for u in TokenStore(access.users_file).users()}
            assert users == {u.user for u in cfg.user_configs}


def test_the_bench_acts_as_the_operator_from_its_mounted_home(
    docs: list[Manifest], tmp_path: Path
) -> None:
    cfg = federation(docs)
    bench = by_kind(docs, "CronJob")["megha-bench"]
    (c,) = pod_spec(bench)["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env[MOUNTED_ENV] == "1"
    home = env["MEGHA_HOME"]
    files = mounted_files(bench, by_kind(docs, "Secret"))
    local = tmp_path / "home"
    for path, placed in place(tmp_path, files).items():
        target = local / Path(path).relative_to(home)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        Path(placed).rename(target)
    operator = Access.in_home(local, cfg)  # what megha bench signs and logs in with
    assert operator.secret.warning is None
    # the broker's AMQPS listener and the services' HTTPS, trusting the federation CA
    # only: its certificate, never its key nor any service's
    assert sorted(p for p in files if "/tls/" in p) == [f"{home}/tls/ca.pem"]
    assert not [p for p in files if p.endswith(".key")]
    url = operator.broker_urls()[0]
    assert url.startswith(f"amqps://{cfg.name}.operator.")
    assert f"cafile={quote(str(local / 'tls' / 'ca.pem'), safe='')}" in url
    tokens = load_tokens(local)
    assert set(tokens) == {u.user for u in cfg.user_configs}
    store = TokenStore.in_home(local)
    for user, token in tokens.items():
        store.verify(user, token)


def test_a_missing_secrets_directory_stops_kustomize(kubernetes_tree: Path, tmp_path: Path) -> None:
    shutil.copytree(kubernetes_tree, tmp_path / "k", ignore=shutil.ignore_patterns("secrets"))
    out = kustomize_run(tmp_path / "k" / "overlays" / "dev")
    assert out.returncode != 0
    assert "secrets" in out.stderr
    text = (tmp_path / "k" / "overlays" / "dev" / "kustomization.yaml").read_text()
    assert "python -m deploy.render secrets" in text


def test_worker_pools_never_touch_the_broker() -> None:
    """Why worker pools get no broker credentials and no route to it."""
    for path in (ROOT / "worker").glob("*.py"):
        text = path.read_text()
        assert "aio_pika" not in text, path
        assert "common.broker" not in text, path


# ---------------------------------------------------------------- secrets
def unhashed(name: str) -> str:
    """A generated Secret's name without kustomize's content hash (10 characters of a
    vowel-free alphabet, so that "-federation" is never taken for one)."""
    return re.sub(r"-[2456789bcdfghkmt]{10}$", "", name)


WHOLE_SECRETS = {"rabbitmq-erlang-cookie": "cookie", "rabbitmq-definitions": "definitions.json"}
"""Secrets mounted whole (RabbitMQ's), and their one key."""


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
            for name, items, _ in secret_sources(v):
                if items:
                    refs |= {(name, i["key"]) for i in items}
                else:  # the broker's own: one file each
                    assert not unhashed(name).startswith("megha"), name
                    refs.add((name, WHOLE_SECRETS[unhashed(name)]))
    return refs


def test_every_secret_a_pod_reads_is_generated_from_the_secrets_directory(
    docs: list[Manifest],
) -> None:
    secrets = by_kind(docs, "Secret")
    assert {unhashed(n) for n in secrets} == {
        "megha-federation",
        "megha-operator",
        "megha-tls",
        "rabbitmq-definitions",
        "rabbitmq-erlang-cookie",
    }
    refs = secret_refs(docs)
    assert {n for n, _ in refs} == set(secrets)
    for name, key in refs:
        assert key in secrets[name]["data"], (name, key)


def test_no_secret_is_in_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "deploy", "docker-compose.yml"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert tracked
    for name in tracked:
        assert Path(name).suffix not in (".secret", ".cookie"), name
        assert not name.endswith(("definitions.json", "broker.json", "users.json")), name
        text = (ROOT / name).read_text()
        assert "password" not in text.lower() or name.endswith((".py", ".md")), name
        assert "literals:" not in text, name  # no secretGenerator with values in it
    for toml in [
        *KUBERNETES.glob("overlays/*/federation.toml"),
        ROOT / "deploy/compose/federation.toml",
    ]:
        assert "secret" not in tomllib.loads(toml.read_text())["federation"], toml
    # where the secrets are made is ignored by git
    for path in ("deploy/kubernetes/overlays/dev/secrets/secret", "deploy/compose/secrets/secret"):
        ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path], check=False)
        assert ignored.returncode == 0, path


def test_render_refuses_to_write_secrets_where_git_would_track_them(tmp_path: Path) -> None:
    assert render.main(["secrets", str(KUBERNETES / "overlays/dev/federation.toml"),
                        str(ROOT / "deploy" / "oops")]) == 2  # fmt: skip
    assert not (ROOT / "deploy" / "oops").exists()


def test_rendering_secrets_again_keeps_them(tmp_path: Path) -> None:
    cfg = federation_of(KUBERNETES / "overlays/dev/federation.toml")
    render.write_secrets(cfg, tmp_path / "s")
    before = {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir() if p.is_file()}
    made = render.write_secrets(cfg, tmp_path / "s")
    after = {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir() if p.is_file()}
    kept = ("secret", "broker.json", "users.json", "erlang.cookie", "broker.gm.gm0.json")
    # the definitions too: a new salt for an unchanged password would roll the broker
    for name in (*kept, "definitions.json"):
        assert after[name] == before[name], name
    for path in made:
        assert path.stat().st_mode & 0o077 == 0, path
    assert (tmp_path / "s").stat().st_mode & 0o077 == 0


def federation_of(path: Path) -> FederationConfig:
    return parse_config(tomllib.loads(path.read_text()), env={})


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
    pods.append(
        Pod("stranger", {"app": "something-else"}, (8000, 8100, 8200, AMQP_PORT, AMQPS_PORT))
    )
    return pods


def expected_paths(docs: list[Manifest]) -> set[tuple[str, str, int]]:
    """Exactly who must talk to whom (SPEC §2, §6): nothing more."""
    cfg = federation(docs)
    port = {p.name: p.port for p in plan_of(docs)}
    paths = {("rabbitmq", "rabbitmq", p) for p in (4369, 25672)}
    for gm in cfg.gm_ids:
        paths |= {(gm, lm, port[lm]) for lm in cfg.lm_ids} | {(gm, "rabbitmq", AMQPS_PORT)}
        paths.add(("megha-bench", gm, port[gm]))
    for lm in cfg.lm_ids:
        pool = f"{lm}-workers"
        paths |= {(lm, pool, port[pool]), (pool, lm, port[lm]), (lm, "rabbitmq", AMQPS_PORT)}
        paths.add(("megha-bench", lm, port[lm]))
    floor = f"{cfg.lm_ids[0]}-workers"  # the pool whose /v1/ping the bench measures
    paths |= {("megha-bench", floor, port[floor]), ("megha-bench", "rabbitmq", AMQPS_PORT)}
    paths.add(("user", "rabbitmq", AMQPS_PORT))
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


def test_the_reachability_check_sees_a_hole(dev_docs: list[Manifest]) -> None:
    """What makes the policy test able to fail: one rule opened is one path more."""
    docs = dev_docs
    pods = {p.name: p for p in pods_of(docs)}
    policies = copy.deepcopy(list(by_kind(docs, "NetworkPolicy").values()))
    assert not allowed(policies, pods["lm0-workers"], pods["gm0"], 8000)
    by_name = {p["metadata"]["name"]: p for p in policies}
    by_name["megha-lm0-workers"]["spec"]["egress"].append({})
    assert not allowed(policies, pods["lm0-workers"], pods["gm0"], 8000)  # gm0 still refuses
    by_name["megha-gm"]["spec"]["ingress"].append({"ports": [{"port": 8000}]})
    assert allowed(policies, pods["lm0-workers"], pods["gm0"], 8000)


# ---------------------------------------------------------------- the broker's setup
def test_the_broker_setup_installs_the_cookie_of_the_secret(
    dev_docs: list[Manifest], tmp_path: Path
) -> None:
    """base's RabbitMQ init script, run by sh with its paths moved under ``tmp_path``."""
    script = by_kind(dev_docs, "ConfigMap")["rabbitmq-config"]["data"]["setup.sh"]
    for path in ("/etc/rabbitmq/cookie", "/var/lib/rabbitmq"):
        (tmp_path / path.strip("/")).mkdir(parents=True, exist_ok=True)
        script = script.replace(path, str(tmp_path / path.strip("/")))
    (cookie_secret,) = [s for n, s in by_kind(dev_docs, "Secret").items() if "cookie" in n]
    cookie = base64.b64decode(cookie_secret["data"]["cookie"])
    (tmp_path / "etc/rabbitmq/cookie/cookie").write_bytes(cookie)
    out = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 0, out.stderr
    installed = tmp_path / "var/lib/rabbitmq/.erlang.cookie"
    assert installed.read_bytes() == cookie
    assert installed.stat().st_mode & 0o777 == 0o400
    assert len(cookie.strip()) == 64


# ---------------------------------------------------------------- TLS (issue 32 item 10)
def test_the_config_says_tls_on_and_the_services_reach_the_broker_over_amqps(
    docs: list[Manifest],
) -> None:
    cfg = federation(docs)
    assert cfg.tls == "on"
    assert cfg.tls_on
    for url in cfg.broker_urls:
        parts = urlsplit(url)
        assert (parts.scheme, parts.port) == ("amqps", AMQPS_PORT), url
        svc = by_kind(docs, "Service")[parts.hostname or ""]  # base's broker, by its Service
        ports = {sp["port"]: sp["targetPort"] for sp in svc["spec"]["ports"]}
        assert ports[AMQPS_PORT] == "amqps"
        assert AMQP_PORT not in [sp["port"] for sp in svc["spec"]["ports"]]
    for p in plan_of(docs):
        assert p.url.startswith("https://"), p.name  # how peers reach it


def test_the_broker_listens_for_amqps_only_with_its_own_certificate(
    docs: list[Manifest],
) -> None:
    """base's RabbitMQ: no plain AMQP listener; AMQPS on 5671 with the certificate made for
    the broker, which names the host the services reach it by, under the CA they trust."""
    cfg = federation(docs)
    sts = by_kind(docs, "StatefulSet")["rabbitmq"]
    (c,) = pod_spec(sts)["containers"]
    conf = dict(
        line.split(" = ", 1)
        for line in by_kind(docs, "ConfigMap")["rabbitmq-config"]["data"]["rabbitmq.conf"]
        .strip()
        .splitlines()
    )
    assert conf["listeners.tcp"] == "none"
    assert conf["listeners.ssl.default"] == str(AMQPS_PORT)
    assert [p["containerPort"] for p in c["ports"] if p["name"] == "amqps"] == [AMQPS_PORT]
    assert AMQP_PORT not in [p["containerPort"] for p in c["ports"]]
    assert c["readinessProbe"]["tcpSocket"]["port"] == "amqps"
    files = mounted_files(sts, by_kind(docs, "Secret"))
    tls = {p: data for p, data in files.items() if "/tls/" in p}
    cert, key, ca = (conf[f"ssl_options.{k}"] for k in ("certfile", "keyfile", "cacertfile"))
    assert set(tls) == {cert, key, ca}  # its own pair and the CA's certificate, no more
    leaf = x509.load_pem_x509_certificate(tls[cert])
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    for url in cfg.broker_urls:
        assert urlsplit(url).hostname in names.get_values_for_type(x509.DNSName), url
    pair = serialization.load_pem_private_key(tls[key], password=None)
    assert pair.public_key() == leaf.public_key()
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(tls[ca]))
    # the CA the services trust (MEGHA_TLS_CA) is the one that signed the broker's
    gm = by_kind(docs, "Deployment")[cfg.gm_ids[0]]
    (gm_c,) = pod_spec(gm)["containers"]
    assert (
        mounted_files(gm, by_kind(docs, "Secret"))[env_of(gm_c)["MEGHA_TLS_CA"]["value"]]
        == (tls[ca])
    )


def test_the_broker_nodes_link_over_tls_with_the_mounted_certificates(
    docs: list[Manifest],
) -> None:
    """Erlang distribution over TLS for the server and its CLI calls (probes, preStop),
    with an options file of the ConfigMap that names the broker's mounted pair and the
    CA's certificate, and verifies the peer both ways (``tests/e2e/test_broker_dist_tls.py``
    clusters two nodes with it)."""
    sts = by_kind(docs, "StatefulSet")["rabbitmq"]
    (c,) = pod_spec(sts)["containers"]
    env = env_of(c)
    data = by_kind(docs, "ConfigMap")["rabbitmq-config"]["data"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/etc/rabbitmq/megha"]
    optfile = f"{mount['mountPath']}/inter_node_tls.config"
    want = f"-proto_dist inet_tls -ssl_dist_optfile {optfile}"
    assert want in " ".join(env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]["value"].split())
    assert env["RABBITMQ_CTL_ERL_ARGS"]["value"] == want
    text = data["inter_node_tls.config"]
    files = mounted_files(sts, by_kind(docs, "Secret"))
    named = set(re.findall(r'"(/etc/rabbitmq/tls/[^"]+)"', text))
    assert named == {p for p in files if "/tls/" in p}
    assert text.count("{verify, verify_peer}") == 2
    assert "{fail_if_no_peer_cert, true}" in text


def test_no_pod_holds_a_private_key_but_its_own(docs: list[Manifest]) -> None:
    """Every pod mounts one private key at most, its own (the broker's: ``broker.key``);
    the CA's key is in no Secret at all, so no pod can mount it."""
    cfg = federation(docs)
    secrets = by_kind(docs, "Secret")
    (tls_name,) = [n for n in secrets if unhashed(n) == "megha-tls"]
    assert sorted(secrets[tls_name]["data"]) == sorted(render.tls_files(cfg))
    assert "ca.key" not in render.tls_files(cfg)
    for name, secret in secrets.items():
        assert not [k for k in secret.get("data", {}) if k.endswith("ca.key")], name
    for workload in workloads(docs):
        name = workload["metadata"]["name"]
        keys = [
            PurePosixPath(p).name for p in mounted_files(workload, secrets) if p.endswith(".key")
        ]
        own = {"rabbitmq": ["broker.key"], "megha-bench": []}.get(name, [f"{name}.key"])
        assert keys == own, name


def test_no_volume_is_mounted_inside_another(docs: list[Manifest]) -> None:
    """A mount inside a ConfigMap's or Secret's (read-only) mount fails when the container
    starts (its mount point cannot be made): the certificates are in the config's own
    projected volume, in tls/ beside federation.toml, where process_plan names them."""
    for workload in workloads(docs):
        for c in containers(workload):
            paths = [PurePosixPath(m["mountPath"]) for m in c.get("volumeMounts", [])]
            for a in paths:
                inner = [b for b in paths if b != a and b.is_relative_to(a)]
                # base's RabbitMQ mounts one file of its config (subPath) into conf.d
                inner = [b for b in inner if not str(b).startswith("/etc/rabbitmq/conf.d")]
                assert not inner, (workload["metadata"]["name"], c["name"], a, inner)
