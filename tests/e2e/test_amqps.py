"""AMQPS under the federation's CA (issue 32 item 10), on a private RabbitMQ node
with a TLS listener (the shared broker on 127.0.0.1:5672 is never reconfigured): the
broker certificate ``megha up`` makes is served, a service's ``amqps://`` URL trusts
the federation CA only, and messages go through."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from common.config import TLS_CA_ENV, FederationConfig
from security import tls
from testbed._sys import free_ports
from testbed.rabbit import RabbitNode, RabbitSandbox

pytestmark = [pytest.mark.e2e, pytest.mark.rabbit]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RabbitNode, int, Path]]:
    home = tmp_path_factory.mktemp("amqps-home")
    with RabbitSandbox() as box:
        n = box.node("tls")
        port = next(p for p in free_ports("127.0.0.1", 4) if p not in (n.amqp_port, n.dist_port))
        cfg = FederationConfig(name="amqps", broker_url=f"amqps://127.0.0.1:{port}/", tls="on")
        tls.make_federation_tls(cfg.validate(), home)
        d = tls.tls_dir(home)
        with (n.dir / "rabbitmq.conf").open("a") as conf:
            conf.write(
                f"listeners.ssl.default = {port}\n"
                f"ssl_options.cacertfile = {d / 'ca.pem'}\n"
                f"ssl_options.certfile = {d / 'broker.pem'}\n"
                f"ssl_options.keyfile = {d / 'broker.key'}\n"
                "ssl_options.verify = verify_none\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
                "ssl_options.versions.1 = tlsv1.3\n"
                "ssl_options.versions.2 = tlsv1.2\n"
            )
        n.start(timeout=90)
        yield n, port, home


def url_with(ca: Path | None, port: int, monkeypatch: pytest.MonkeyPatch) -> str:
    if ca is None:
        monkeypatch.delenv(TLS_CA_ENV, raising=False)
    else:
        monkeypatch.setenv(TLS_CA_ENV, str(ca))
    return tls.amqps_url(f"amqps://guest:guest@127.0.0.1:{port}/")


async def round_trip(url: str) -> bytes:
    conn = await aio_pika.connect(url, timeout=20)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(exclusive=True)
        await ch.default_exchange.publish(aio_pika.Message(b"over tls"), routing_key=q.name)
        for _ in range(50):
            got = await q.get(no_ack=True, fail=False)
            if got is not None:
                return got.body
            await asyncio.sleep(0.05)
        return b""
    finally:
        await conn.close()


def test_a_service_reaches_the_broker_over_amqps_trusting_the_federation_ca(
    node: tuple[RabbitNode, int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, port, home = node
    url = url_with(tls.tls_dir(home) / "ca.pem", port, monkeypatch)
    assert "cafile=" in url
    assert asyncio.run(round_trip(url)) == b"over tls"


def test_a_broker_certificate_of_another_ca_is_refused(
    node: tuple[RabbitNode, int, Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    _, port, _ = node
    other = tls.ensure_ca(tmp_path / "tls", "someone-else")
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        asyncio.run(round_trip(url_with(other, port, monkeypatch)))
    assert os.environ.get(TLS_CA_ENV) == str(other)
