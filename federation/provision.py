"""What ``megha up`` makes before any process starts, and ``megha down --purge`` removes:
the federation's secret, its broker vhost and users, and its users' tokens.

* **Secret**: ``$MEGHA_HOME/secret`` (0600), random, made once per federation.  A
  config that names its own secret must name a strong one: the shipped default and
  example secrets, short or low-variety ones are refused unless ``--insecure-dev``.
* **Broker**: a vhost named after the federation, a RabbitMQ user per service and per
  user with the permissions of ``security.broker_acl`` (guest has none there), and
  the topology, declared by the operator only (``rabbitmqctl import_definitions``);
  the passwords in ``$MEGHA_HOME/broker.json`` (0600).  ``--insecure-dev`` instead
  declares the topology on the config's broker URL as given (guest on the default
  vhost: anyone who can reach the broker can read and forge), with a warning.
* **Tokens**: one per configured user, stored hashed in ``$MEGHA_HOME/users.json``;
  the token itself in ``$MEGHA_HOME/tokens/<user>`` (0600) for the operator to hand
  over (``megha user revoke`` / ``add`` replace one).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from common.config import DEFAULT_SECRET, FederationConfig
from common.errors import ConfigError
from runtime.broker import declare_topology, delete_topology
from security.access import (
    INSECURE_ENV,
    USERS_FILE_ENV,
    parties,
    save_token,
    service_identity,
    tokens_dir,
)
from security.broker_acl import (
    CREDENTIALS_ENV,
    CREDENTIALS_FILENAME,
    BrokerCredentials,
    BrokerLayout,
    Rabbitmqctl,
    make_credentials,
    provision,
    remove_party,
    teardown,
)
from security.files import ensure_private_dir, write_private
from security.identity import Identity, Role
from security.outcomes import OUTCOME_KEYS_DIRNAME, outcome_key
from security.party_keys import KEYS_FILE_ENV, keys_path, write_party_keys
from security.secret import (
    SECRET_FILE_ENV,
    check_secret,
    ensure_secret_file,
    load_secret,
    secret_path,
)
from security.tls import make_federation_tls, trust_home
from security.tokens import TOKENS_FILENAME, TokenStore

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
NO_RABBITMQCTL = (
    "megha up provisions a broker user per service and per user with rabbitmqctl, which "
    "is not usable here ({why}). Run megha up as root on the broker's host, or pass "
    "--insecure-dev to use the broker URL's own user (no isolation between users)."
)


def prepare(cfg: FederationConfig, home: Path, *, insecure_dev: bool = False) -> dict[str, str]:
    """Make the secret, the broker's users and topology, and the users' tokens; return
    the environment every process of the federation gets."""
    env = {SECRET_FILE_ENV: str(make_secret(cfg, home, insecure_dev=insecure_dev))}
    secret = load_secret(secret_path(home), insecure_dev=True)  # checked by make_secret
    write_party_keys(home, secret, cfg, parties(cfg))
    if cfg.tls_on:
        make_federation_tls(cfg, home)
        trust_home(home)
    if insecure_dev:
        env[INSECURE_ENV] = "1"
        print(
            "WARNING: --insecure-dev: the broker is used with its URL's own user; any "
            "client of the broker can read, consume and forge the federation's messages",
            file=sys.stderr,
        )
        asyncio.run(declare_topology(cfg, cfg.broker_urls[0]))
    else:
        env[CREDENTIALS_ENV] = str(_provision_broker(cfg, home))
    env[USERS_FILE_ENV] = str(issue_tokens(cfg, home))
    return env


def environment(home: Path) -> dict[str, str]:
    """The environment of the federation recorded in ``home`` (``megha restart``)."""
    env = {SECRET_FILE_ENV: str(secret_path(home)), USERS_FILE_ENV: str(home / "users.json")}
    creds = home / CREDENTIALS_FILENAME
    if creds.exists():
        env[CREDENTIALS_ENV] = str(creds)
    else:
        env[INSECURE_ENV] = "1"
    return env


def service_environment(home: Path, role: str, ident: str) -> dict[str, str]:
    """The environment of service ``role``/``ident``: its own keys file in place of the
    federation secret (which a federation made before keys files keeps giving)."""
    env = environment(home)
    path = keys_path(home, service_identity(role, ident))
    if path.exists():
        env[KEYS_FILE_ENV] = str(path)
        env[SECRET_FILE_ENV] = ""
    return env


def save_outcome_key(home: Path, user: str, gm: str) -> Path | None:
    """``home/outcome-keys/<user>``: the key ``user`` checks its GM's outcomes with, for
    the operator to hand over with its token (none without a secret file)."""
    if not secret_path(home).exists():
        return None
    secret = load_secret(secret_path(home), insecure_dev=True)
    path = home / OUTCOME_KEYS_DIRNAME / user
    ensure_private_dir(path.parent)
    write_private(path, (outcome_key(secret, gm, user).hex() + "\n").encode())
    return path


def make_secret(cfg: FederationConfig, home: Path, *, insecure_dev: bool = False) -> Path:
    """``home/secret``: the config's own if it names a strong one, else random (kept
    once made)."""
    path = secret_path(home)
    if cfg.secret != DEFAULT_SECRET:  # the config names one: it must be strong
        warning = check_secret(cfg.secret, insecure_dev=insecure_dev)
        if warning:
            print(warning, file=sys.stderr)
        write_private(path, (cfg.secret + "\n").encode())
        return path
    secret = ensure_secret_file(home, insecure_dev=insecure_dev)
    if secret.warning:
        print(secret.warning, file=sys.stderr)
    return path


def _rabbitmqctl(cfg: FederationConfig) -> Rabbitmqctl:
    hosts = {urlparse(u).hostname for u in cfg.broker_urls}
    if not hosts <= set(LOCAL_HOSTS):
        why = f"the broker is on {', '.join(sorted(h or '?' for h in hosts))}, not this host"
        raise ConfigError(NO_RABBITMQCTL.format(why=why), reason="no_broker_admin")
    if shutil.which("rabbitmqctl") is None:
        raise ConfigError(NO_RABBITMQCTL.format(why="not installed"), reason="no_broker_admin")
    return Rabbitmqctl()


def broker_credentials(cfg: FederationConfig, home: Path) -> BrokerCredentials:
    """A broker user and password for every party, saved in ``home/broker.json``; the
    parties already there keep theirs."""
    path = home / CREDENTIALS_FILENAME
    existing = BrokerCredentials.load(path) if path.exists() else None
    creds = make_credentials(BrokerLayout.from_config(cfg), cfg.broker_urls[0], existing)
    creds.save(path)
    return creds


def _provision_broker(cfg: FederationConfig, home: Path) -> Path:
    """Every party's broker login, but those of users revoked (``megha user revoke``):
    provisioning again must not give a revoked user its login back."""
    ctl = _rabbitmqctl(cfg)
    again = (home / CREDENTIALS_FILENAME).exists()
    creds = broker_credentials(cfg, home)
    layout = BrokerLayout.from_config(cfg)
    provision(layout, creds, ctl, allow_existing=again)
    for user in revoked_users(home):
        if user in dict(layout.users):
            revoke_broker_login(cfg, home, user)
    return home / CREDENTIALS_FILENAME


def revoked_users(home: Path) -> list[str]:
    """The users whose token is revoked (``users.json``: the federation's revoked list)."""
    if not (home / TOKENS_FILENAME).exists():
        return []
    return [r.user for r in TokenStore.in_home(home).users() if r.revoked]


def revoke_broker_login(cfg: FederationConfig, home: Path, user: str) -> str:
    """Delete ``user``'s broker login (the broker closes its open connections: it can
    publish, consume or bind nothing more) and forget its password, so that it gets a
    new one if it is added again.  What was done, in a few words."""
    path = home / CREDENTIALS_FILENAME
    if not path.exists():
        return "no broker login to remove (--insecure-dev: the broker URL's own user)"
    who = Identity(Role.USER, user)
    remove_party(BrokerLayout.from_config(cfg), who, _rabbitmqctl(cfg))
    creds = BrokerCredentials.load(path)
    kept = {k: v for k, v in creds.passwords.items() if k != str(who)}
    names = {k: v for k, v in creds.users.items() if k != str(who)}
    BrokerCredentials(creds.scheme, creds.host, creds.port, creds.vhost, kept, names).save(path)
    return f"deleted its broker login {creds.users.get(str(who), who)!r}; its connections closed"


def restore_broker_login(cfg: FederationConfig, home: Path, user: str) -> str:
    """``user``, issued a token again, gets a broker login again (a new password); the
    logins of users still revoked stay removed."""
    path = home / CREDENTIALS_FILENAME
    if not path.exists() or str(Identity(Role.USER, user)) in BrokerCredentials.load(path).users:
        return ""
    ctl = _rabbitmqctl(cfg)
    layout = BrokerLayout.from_config(cfg)
    provision(layout, broker_credentials(cfg, home), ctl, allow_existing=True)
    for rec in TokenStore.in_home(home).users():
        if rec.revoked and rec.user != user and rec.user in dict(layout.users):
            remove_party(layout, Identity(Role.USER, rec.user), ctl)
    return "made its broker login again (a new password)"


def issue_tokens(cfg: FederationConfig, home: Path) -> Path:
    """A token for every configured user that has none the operator can hand over.  A
    revoked user stays revoked (``megha user add`` issues it a token again): its record
    in ``users.json`` is the revoked list every GM and LM reads, also after a restart."""
    store = TokenStore.in_home(home)
    have = set(tokens_dir(home).iterdir()) if tokens_dir(home).is_dir() else set()
    now = time.time()
    configured = {u.user for u in cfg.user_configs}
    for rec in store.users():  # users no longer in the config lose their tokens
        if rec.user not in configured and not rec.revoked:
            store.revoke(rec.user, now=now)
    for u in cfg.user_configs:
        held = store.get(u.user)
        if held is not None and held.revoked:
            print(
                f"user {u.user!r} stays revoked (`megha user add {u.user}` issues a new token)",
                file=sys.stderr,
            )
            continue
        save_outcome_key(home, u.user, u.gm)
        if held is not None and tokens_dir(home) / u.user in have:
            continue
        if held is not None:
            store.revoke(u.user, now=now)  # its token is lost: a new one replaces it
        token = store.add(u.user, gm=u.gm, share=u.share, now=now)
        save_token(home, u.user, token)
    return store.path


def purge(cfg: FederationConfig, home: Path) -> str:
    """Remove what ``prepare`` made on the broker: the vhost and every broker user (or,
    without broker users, the topology on the config's broker)."""
    if (home / CREDENTIALS_FILENAME).exists():
        left = teardown(BrokerLayout.from_config(cfg), _rabbitmqctl(cfg))
        older = f", and {len(left)} left by older configs ({', '.join(left)})" if left else ""
        return f"deleted the broker vhost {cfg.name!r} and its users{older}"
    asyncio.run(delete_topology(cfg))
    return f"deleted the queues and exchanges of {cfg.name!r}"
