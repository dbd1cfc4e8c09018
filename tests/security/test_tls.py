"""The federation's CA and certificates, and when TLS is on (issue 32 item 10)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web

from common.config import FederationConfig, process_plan
from common.errors import ConfigError
from runtime import h1
from security import tls

CFG = FederationConfig()


def test_tls_is_on_by_default_across_hosts_only() -> None:
    assert not CFG.validate().tls_on  # all on the loopback
    spread = replace(CFG, addresses={"lm1": "10.0.0.7:18101"}, broker_url="amqps://10.0.0.2/")
    assert spread.validate().tls_on
    assert spread.url("lm1") == "https://10.0.0.7:18101"
    assert replace(spread, tls="off").validate().url("lm1") == "http://10.0.0.7:18101"
    assert replace(CFG, tls="on").validate().url("gm0").startswith("https://")


def test_a_remote_broker_in_clear_is_refused_with_tls_on() -> None:
    with pytest.raises(ConfigError) as exc:
        replace(CFG, broker_url="amqp://rabbit.example:5672/", tls="auto").validate()
    assert exc.value.reason == "plain_broker"
    replace(CFG, broker_url="amqp://rabbit.example:5672/", tls="off").validate()
    with pytest.raises(ConfigError):
        replace(CFG, tls="yes").validate()


def test_megha_up_serves_each_process_with_its_own_certificate() -> None:
    plan = process_plan(replace(CFG, tls="on").validate(), "/h/federation.toml")
    lm0 = next(p for p in plan if p.name == "lm0")
    assert lm0.argv[lm0.argv.index("--certfile") + 1] == "/h/tls/lm0.pem"
    assert lm0.argv[lm0.argv.index("--keyfile") + 1] == "/h/tls/lm0.key"
    assert lm0.env["MEGHA_TLS_CA"] == "/h/tls/ca.pem"
    assert lm0.url.startswith("https://")
    assert "--certfile" not in process_plan(CFG.validate(), "/h/federation.toml")[0].argv


def test_certificates_are_made_once_and_private(tmp_path: Path) -> None:
    cfg = replace(CFG, tls="on").validate()
    made = tls.make_federation_tls(cfg, tmp_path)
    d = tls.tls_dir(tmp_path)
    assert {p.name for p in made} >= {"ca.pem", "gm0.pem", "lm2-workers.key", "broker.pem"}
    for key in d.glob("*.key"):
        assert key.stat().st_mode & 0o077 == 0
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    tls.make_federation_tls(cfg, tmp_path)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # kept


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _serve_and_ask(home: Path, ca: Path) -> int:
    d = tls.tls_dir(home)
    app = web.Application()
    app.router.add_get("/health", _ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(
        runner, "127.0.0.1", 0, ssl_context=tls.server_context(d / "lm0.pem", d / "lm0.key")
    )
    await site.start()
    port = runner.addresses[0][1]
    client = h1.Client(tls=tls.client_context(ca), timeout_s=5.0)
    try:
        return (await client.request("GET", f"https://127.0.0.1:{port}/health")).status
    finally:
        await client.close()
        await runner.cleanup()


def test_the_peer_client_trusts_the_federation_ca_only(tmp_path: Path) -> None:
    tls.make_federation_tls(replace(CFG, tls="on").validate(), tmp_path)
    assert asyncio.run(_serve_and_ask(tmp_path, tls.tls_dir(tmp_path) / "ca.pem")) == 200
    other = tls.ensure_ca(tmp_path / "other", "other")
    with pytest.raises(h1.BrokenHop) as exc:
        asyncio.run(_serve_and_ask(tmp_path, other))
    assert "CERTIFICATE_VERIFY_FAILED" in str(exc.value)
    assert isinstance(exc.value.__cause__, ssl.SSLCertVerificationError)
