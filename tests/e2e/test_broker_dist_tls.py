"""The RabbitMQ nodes' own links over TLS, as Kubernetes runs them: two private nodes
with base's ``inter_node_tls.config`` (its paths moved to this test's certificates of
the federation's CA) form a cluster, and their distribution port speaks TLS only to a
peer showing a certificate of that CA.

The nodes are private (``testbed.rabbit``: their own ports and epmd), never the shared
broker on 5672."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from security.tls import CA_CERT, ensure_ca, ensure_leaf
from testbed.rabbit import RabbitCluster, RabbitSandbox

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]

BASE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base" / "rabbitmq.yaml"


def base_optfile() -> str:
    """The ``inter_node_tls.config`` of base's RabbitMQ ConfigMap."""
    docs = [d for d in yaml.safe_load_all(BASE.read_text()) if d]
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rabbitmq-config"
    ]
    text: str = cm["data"]["inter_node_tls.config"]
    return text


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    ensure_ca(d, "dist-tls")
    ensure_leaf(d, "broker", ["localhost"])
    other = d / "other"  # a broker of another federation's CA
    other.mkdir()
    ensure_ca(other, "elsewhere")
    ensure_leaf(other, "broker", ["localhost"])
    return d


@pytest.fixture(scope="module")
def cluster(certs: Path) -> Iterator[RabbitCluster]:
    text = base_optfile().replace("/etc/rabbitmq/tls/", f"{certs}/")
    assert str(certs) in text
    optfile = certs / "inter_node_tls.config"
    optfile.write_text(text)
    with RabbitSandbox() as box:
        members = box.cluster(2, name="tls", dist_optfile=optfile)
        members.start()
        yield members


def _handshake(port: int, ca: Path, cert: Path | None, key: Path | None) -> bool:
    """Whether a TLS session on the distribution port goes through (and is kept)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
            ctx.wrap_socket(raw) as tls,
        ):
            tls.settimeout(3)
            try:  # TLS 1.3: a refused client certificate shows at the first read
                tls.recv(1)
            except TimeoutError:
                return True  # nothing to read, still open: the session was taken
            return False
    except (ssl.SSLError, ConnectionError, OSError):
        return False


def test_the_nodes_cluster_over_tls_links(cluster: RabbitCluster) -> None:
    assert cluster.running_nodes() == sorted(n.nodename for n in cluster.nodes)
    for node in cluster.nodes:
        assert node.dist_optfile is not None
        assert "inet_tls" in node.env()["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]


def test_the_distribution_port_takes_only_a_peer_of_the_federations_ca(
    cluster: RabbitCluster, certs: Path
) -> None:
    port = cluster.nodes[0].dist_port
    ca = certs / CA_CERT
    assert _handshake(port, ca, certs / "broker.pem", certs / "broker.key")
    assert not _handshake(port, ca, None, None)  # no certificate: refused
    other = certs / "other"
    assert not _handshake(port, ca, other / "broker.pem", other / "broker.key")
    # and in clear, the Erlang handshake gets no answer a plain node could use
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.settimeout(5)
        raw.sendall(b"\x00\x0bn\x00\x05\x00\x07\x49\x9ca@b")  # a send_name, in clear
        try:
            answer = raw.recv(64)
        except (TimeoutError, ConnectionError):
            answer = b""
        assert not answer.startswith(b"\x00\x03sok")
