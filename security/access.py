"""What one process of a federation holds: who it is, the keys it signs and checks
with, and how it reaches the broker.

A service builds its ``Access`` from the environment ``megha up`` gives it
(``from_env``): its own keys file (``MEGHA_KEYS_FILE``: ``security.party_keys``; never
the federation secret), the broker credentials file
(``MEGHA_BROKER_CREDENTIALS``: a broker user of its own on the federation's vhost)
and the users file (``MEGHA_USERS_FILE``, GMs only).  Operator tools (``megha
status``, ``megha bench``, tests) build theirs from the federation's directory
(``in_home``) and act as the operator.

A service given the secret file (``MEGHA_SECRET_FILE``) instead, as deployments made
before per-party keys do, derives its own keys from it and logs a warning.  Without
either, a process takes the config's ``secret`` only when
``MEGHA_INSECURE_DEV`` is set (``megha up --insecure-dev``: a warning is logged);
without broker credentials, it connects with the config's broker URL as given.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from urllib.parse import quote, urlparse

from common.config import FederationConfig
from common.errors import ConfigError
from security import outcomes, sealing, signing, tls
from security.broker_acl import CREDENTIALS_ENV, CREDENTIALS_FILENAME, BrokerCredentials
from security.files import ensure_private_dir, mounted, read_private, write_private
from security.identity import OPERATOR, Identity, Role
from security.party_keys import KEYS_FILE_ENV, PartyKeys
from security.secret import SECRET_FILE_ENV, KeySource, Secret, load_secret, secret_path
from security.tokens import TOKENS_FILENAME

log = logging.getLogger("megha.security")

INSECURE_ENV = "MEGHA_INSECURE_DEV"
USERS_FILE_ENV = "MEGHA_USERS_FILE"
TOKENS_DIRNAME = "tokens"
"""``$MEGHA_HOME/tokens/<user>``: each configured user's token, for the operator to
hand over (0600; only hashes are in the users file)."""


def tokens_dir(home: Path) -> Path:
    return home / TOKENS_DIRNAME


def load_tokens(home: Path) -> dict[str, str]:
    """The users' tokens ``megha up`` (or ``megha user add``) left for the operator."""
    d = tokens_dir(home)
    if not d.is_dir():
        return {}
    return {p.name: read_private(p).decode().strip() for p in sorted(d.iterdir()) if p.is_file()}


def save_token(home: Path, user: str, token: str) -> Path:
    path = tokens_dir(home) / user
    ensure_private_dir(path.parent)
    write_private(path, (token + "\n").encode())
    return path


def identity_of_process(cfg: FederationConfig, name: str) -> Identity:
    """The identity of a process of ``cfg`` by its name (``gm0``, ``lm1``,
    ``lm1-standby``, ``lm1-workers``)."""
    if name in cfg.gm_ids:
        return Identity(Role.GM, name)
    for suffix, role in (("-workers", Role.WORKERS), ("-standby", Role.LM), ("", Role.LM)):
        base = name[: len(name) - len(suffix)] if suffix else name
        if name.endswith(suffix) and base in cfg.lm_ids:
            return Identity(role, base)
    raise ConfigError(f"no process {name!r} in this federation", reason="unknown_process")


def parties(cfg: FederationConfig) -> list[Identity]:
    """Every service identity of ``cfg`` and the operator (users are not services)."""
    return [
        OPERATOR,
        *(Identity(Role.GM, g) for g in cfg.gm_ids),
        *(Identity(Role.LM, x) for x in cfg.lm_ids),
        *(Identity(Role.WORKERS, x) for x in cfg.lm_ids),
    ]


def service_identity(role: str, ident: str) -> Identity:
    """The identity of a service process (an LM's standby is that LM)."""
    kind = {"gm": Role.GM, "lm": Role.LM, "worker": Role.WORKERS}.get(role)
    if kind is None:
        raise ConfigError(f"unknown service role {role!r}", reason="bad_config")
    return Identity(kind, ident)


def insecure(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(INSECURE_ENV, "") not in ("", "0")


def _with_user(url: str, user: str, password: str, vhost: str) -> str:
    u = urlparse(url)
    host = f"[{u.hostname}]" if u.hostname and ":" in u.hostname else (u.hostname or "127.0.0.1")
    port = f":{u.port}" if u.port else ""
    query = f"?{u.query}" if u.query else ""
    return (
        f"{u.scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{host}{port}/"
        f"{quote(vhost, safe='')}{query}"
    )


def _own_keys(cfg: FederationConfig, me: Identity, environ: Mapping[str, str]) -> KeySource:
    """A service's keys: its keys file; else (an older deployment) its own keys derived
    from the secret file, with a warning; else, only in insecure-dev, the config's."""
    dev = insecure(environ)
    if environ.get(KEYS_FILE_ENV):
        return PartyKeys.load(Path(environ[KEYS_FILE_ENV]), me, mounted_ok=mounted(environ))
    if environ.get(SECRET_FILE_ENV):
        secret = load_secret(environ=environ, insecure_dev=dev)
        log.warning(
            "%s: given the whole federation secret (%s); keeping only its own keys. "
            "Give it its keys file instead (%s; `megha up` and `deploy.render secrets` "
            "write them)",
            me, SECRET_FILE_ENV, KEYS_FILE_ENV,
        )  # fmt: skip
    elif dev:
        secret = Secret.from_text(cfg.secret, "the config", insecure_dev=True)
    else:
        raise ConfigError(
            f"no keys: set {KEYS_FILE_ENV} (`megha up` does), or "
            f"{INSECURE_ENV}=1 to use the config's secret",
            reason="no_secret",
        )
    keys = PartyKeys.derive_from(secret, cfg, me, parties(cfg))
    return PartyKeys(keys.holder, keys.keys, keys.source, secret.warning)


@dataclass(frozen=True)
class Access:
    """One party's keys and broker login."""

    me: Identity
    cfg: FederationConfig
    secret: KeySource
    """The operator's: the federation secret; a service's: its own keys only."""
    credentials: BrokerCredentials | None = None
    """None: the config's broker URL as given (a federation without broker users)."""
    users_file: Path | None = None
    _keys: dict[tuple[Identity, Identity], bytes] = field(
        default_factory=dict, repr=False, compare=False
    )

    # -------------------------------------------------------------- making
    @classmethod
    def from_env(
        cls, cfg: FederationConfig, me: Identity, environ: Mapping[str, str] = os.environ
    ) -> Access:
        secret = _own_keys(cfg, me, environ)
        if secret.warning:
            log.warning("%s: %s", me, secret.warning)
        creds_path = environ.get(CREDENTIALS_ENV)
        creds = (
            BrokerCredentials.load(Path(creds_path), mounted_ok=mounted(environ))
            if creds_path
            else None
        )
        users = environ.get(USERS_FILE_ENV)
        return cls(me, cfg, secret, creds, Path(users) if users else None)

    @classmethod
    def in_home(
        cls,
        home: Path,
        cfg: FederationConfig,
        me: Identity = OPERATOR,
        *,
        insecure_dev: bool = False,
    ) -> Access:
        """The operator's access to the federation recorded in ``home`` (trusting its
        CA, if it has one)."""
        tls.trust_home(home)
        path = secret_path(home)
        if path.exists():
            secret = load_secret(path, insecure_dev=insecure_dev or insecure())
        else:
            secret = Secret.from_text(cfg.secret, "the config", insecure_dev=True)
        creds_file = home / CREDENTIALS_FILENAME
        creds = BrokerCredentials.load(creds_file) if creds_file.exists() else None
        return cls(me, cfg, secret, creds, home / TOKENS_FILENAME)

    # -------------------------------------------------------------- broker
    def broker_urls(self) -> list[str]:
        """Every broker node's URL, logged in as this party on the federation's vhost."""
        if self.credentials is None:
            return [tls.amqps_url(u) for u in self.cfg.broker_urls]
        creds = self.credentials
        key = str(self.me)
        if key not in creds.passwords:
            raise ConfigError(f"no broker credentials for {self.me}", reason="no_credentials")
        return [
            tls.amqps_url(_with_user(u, creds.users[key], creds.passwords[key], creds.vhost))
            for u in self.cfg.broker_urls
        ]

    @property
    def vhost(self) -> str:
        return self.credentials.vhost if self.credentials is not None else ""

    # ---------------------------------------------------------------- HTTP
    def http_key(self, sender: Identity, receiver: Identity) -> bytes:
        k = self._keys.get((sender, receiver))
        if k is None:
            k = self._keys[(sender, receiver)] = signing.signing_key(self.secret, sender, receiver)
        return k

    @cached_property
    def keyring(self) -> dict[Identity, bytes]:
        """Who may call this party, and the key each signs with."""
        callers = signing.callers_of(self.me, parties(self.cfg))
        return {c: self.http_key(c, self.me) for c in callers}

    def sign(
        self, to: Identity, method: str, path: str, body: bytes, now: float, incarnation: str = ""
    ) -> dict[str, str]:
        """Headers proving this party sends ``method path body`` to ``to`` (its
        incarnation ``incarnation``) now."""
        key = self.http_key(self.me, to)
        return signing.sign(method, path, body, self.me, key, now, incarnation=incarnation)

    # -------------------------------------------------------------- broker
    def sealer(self, epoch: int) -> sealing.Sealer:
        """An LM seals for each GM under the key of their channel (a GM holds the keys
        of the LMs' channels to itself only: it cannot seal as an LM to another GM);
        a GM seals what it returns to itself under its own key."""
        if self.me.role == Role.LM:
            keys = {g: sealing.sealing_key(self.secret, self.me, g) for g in self.gm_identities()}
            return sealing.Sealer(self.me, keys, epoch)
        return sealing.Sealer(self.me, sealing.sealing_key(self.secret, self.me), epoch)

    def opener(self, stream: str, senders: list[Identity], *, window: int = 0) -> sealing.Opener:
        """What this party opens ``senders``' messages on ``stream`` with: their MACs for
        it, under the keys of their channels to it."""
        keys = sealing.keyring_for(self.secret, senders, self.me)
        return sealing.Opener(keys, stream, window=window, receiver=self.me)

    def outcome_key(self, gm: str, user: str) -> bytes:
        """The key ``gm``'s outcomes to ``user`` are sealed with (``security.outcomes``)."""
        return outcomes.outcome_key(self.secret, gm, user)

    def lm_identities(self) -> list[Identity]:
        return [Identity(Role.LM, x) for x in self.cfg.lm_ids]

    def gm_identities(self) -> list[Identity]:
        return [Identity(Role.GM, g) for g in self.cfg.gm_ids]
