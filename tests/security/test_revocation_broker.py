"""``megha user revoke`` at the broker (issue 32, item 2): the user's broker login is
deleted, its open connections closed, and it cannot log in again; ``megha user add``
gives it a login again, under a new password.  Against the shared RabbitMQ, in a vhost
and users of its own (marker ``broker_acl``), removed afterwards."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq
import pytest

from common.broker_names import submit_key
from common.config import FederationConfig
from common.errors import Unauthorized
from federation import provision
from federation.users import issue_token, revoke_user
from security.broker_acl import CREDENTIALS_FILENAME, BrokerCredentials, Rabbitmqctl, teardown
from security.broker_acl import BrokerLayout as Layout
from security.identity import user
from security.tokens import TokenStore
from tests.security.test_broker_acl import needs_broker

ADMIN_URL = "amqp://guest:guest@127.0.0.1:5672/"


@pytest.fixture
def home(tmp_path: Path) -> Iterator[tuple[FederationConfig, Path]]:
    """A federation's home, provisioned on the shared broker as ``megha up`` does."""
    cfg = FederationConfig(
        name=f"megha-revoke-{secrets.token_hex(4)}", gms=1, lms=1, nodes_per_lm=1,
        users="u0:0.5@gm0,u1:0.5@gm0", broker_url=ADMIN_URL,
    ).validate()  # fmt: skip
    (tmp_path / "federation.toml").write_text(cfg.to_toml())
    try:
        provision.prepare(cfg, tmp_path)
        yield cfg, tmp_path
    finally:
        teardown(Layout.from_config(cfg), Rabbitmqctl())


def _creds(home: Path) -> BrokerCredentials:
    return BrokerCredentials.load(home / CREDENTIALS_FILENAME)


async def _publishes(url: str, cfg: FederationConfig, name: str) -> aio_pika.abc.AbstractConnection:
    """Log in as ``name`` and publish one submission: the login works."""
    conn = await aio_pika.connect(url, timeout=5)
    await _publish(conn, cfg, name)
    return conn


async def _publish(conn: aio_pika.abc.AbstractConnection, cfg: FederationConfig, name: str) -> None:
    ch = await conn.channel(publisher_confirms=True)
    ex = await ch.get_exchange(cfg.submit_exchange, ensure=False)
    await ex.publish(aio_pika.Message(b"x"), routing_key=submit_key(name))


@needs_broker
def test_revoking_a_user_closes_its_connections_and_its_login(
    home: tuple[FederationConfig, Path],
) -> None:
    cfg, path = home
    old_url = _creds(path).url(user("u0"))

    async def run() -> None:
        conn = await _publishes(old_url, cfg, "u0")
        other = await _publishes(_creds(path).url(user("u1")), cfg, "u1")
        note = await asyncio.get_running_loop().run_in_executor(None, revoke_user, path, "u0")
        assert "deleted its broker login" in note
        await asyncio.sleep(0.5)  # the broker closes it as it deletes the user
        with pytest.raises((aiormq.exceptions.AMQPError, RuntimeError, ConnectionError)):
            await _publish(conn, cfg, "u0")  # its open connection carries nothing more
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(old_url, timeout=5)
        assert not other.is_closed  # another user of the same GM keeps its login
        await other.close()

    asyncio.run(run())
    assert str(user("u0")) not in _creds(path).passwords  # a new password if added again
    rec = TokenStore.in_home(path).get("u0")
    assert rec is not None
    assert rec.revoked


@needs_broker
def test_a_user_added_again_logs_in_with_a_new_password_only(
    home: tuple[FederationConfig, Path],
) -> None:
    cfg, path = home
    old_url = _creds(path).url(user("u0"))
    revoke_user(path, "u0")
    assert issue_token(path, "u0") is not None
    new_url = _creds(path).url(user("u0"))
    assert new_url != old_url

    async def run() -> None:
        conn = await _publishes(new_url, cfg, "u0")
        await conn.close()
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(old_url, timeout=5)

    asyncio.run(run())


@needs_broker
def test_a_revoked_user_stays_revoked_when_megha_up_provisions_again(
    home: tuple[FederationConfig, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``megha up`` after ``megha user revoke``: provisioning issued every configured user
    a token again, the revoked one included, and gave it its broker login back.  Now its
    record stays revoked (its old token and any guess refused), no token file is written,
    and it has no broker login; the other user keeps its token."""
    cfg, path = home
    old_token = (path / "tokens" / "u0").read_text().strip()
    other_token = (path / "tokens" / "u1").read_text().strip()
    revoke_user(path, "u0")
    provision.prepare(cfg, path)  # megha up again
    assert "user 'u0' stays revoked" in capsys.readouterr().err
    store = TokenStore.in_home(path)
    rec = store.get("u0")
    assert rec is not None
    assert rec.revoked
    assert not (path / "tokens" / "u0").exists()
    with pytest.raises(Unauthorized) as exc:
        store.verify("u0", old_token)
    assert exc.value.reason == "revoked_token"
    assert store.verify("u1", other_token).user == "u1"  # the others are untouched
    assert str(user("u0")) not in _creds(path).passwords
    logins = Rabbitmqctl().run("list_users")
    layout = Layout.from_config(cfg)
    assert layout.broker_user(user("u1")) in logins  # the listing holds the logins
    assert layout.broker_user(user("u0")) not in logins
    # `megha user add` is the one way back
    assert issue_token(path, "u0") is not None
    assert not TokenStore.in_home(path).get("u0").revoked  # type: ignore[union-attr]
