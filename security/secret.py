"""The federation secret and the keys derived from it.

Guarantees:

* ``megha up`` gets a fresh random secret per federation (256 bits) in
  ``$MEGHA_HOME/secret``, created atomically with mode 0600; an existing secret
  file is reused only if it is private (no group/other bits, ours, not a link).
* A default or example secret (the config's default, whatever
  ``config/federation.example.toml`` holds), an empty, short or low-variety one
  is refused with ``ConfigError(reason="weak_secret")`` -- unless the operator
  passes ``insecure_dev``, which turns the refusal into a warning text.
* Nobody signs with the secret itself.  Each use gets its own key, derived with
  HKDF-SHA256 (RFC 5869) under a label naming the purpose and the parties, so a
  key that leaks (say, a worker pool's) does not sign as anyone else: the labels
  ``http:workers:lm0>lm:lm0`` and ``amqp:lm:lm0`` give unrelated keys.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Protocol

from common.config import FederationConfig
from common.errors import ConfigError
from security.files import create_private, ensure_private_dir, mounted, read_private
from security.identity import Identity

SECRET_FILE_ENV = "MEGHA_SECRET_FILE"
"""Names the secret file for services (``megha up`` sets it in their environment)."""
SECRET_FILENAME = "secret"
SECRET_BYTES = 32
MIN_SECRET_CHARS = 32
MIN_DISTINCT_CHARS = 8
HKDF_SALT = b"megha-federation-v1"
_PURPOSE = re.compile(r"[a-z][a-z0-9-]{0,31}")
_EXAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "config" / "federation.example.toml"
_SHIPPED_SECRETS = ("megha-dev-secret-change-me", "change-me-before-sharing-this-machine")
"""Secrets this project has ever shipped, in case the files above are not installed."""


@cache
def known_weak_secrets() -> frozenset[str]:
    """Secrets anyone can read in this repository: the config default and the example's."""
    weak = set(_SHIPPED_SECRETS)
    default = next(f.default for f in fields(FederationConfig) if f.name == "secret")
    if isinstance(default, str):
        weak.add(default)
    try:
        example = tomllib.loads(_EXAMPLE_CONFIG.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return frozenset(weak)
    value = example.get("federation", {}).get("secret")
    if isinstance(value, str):
        weak.add(value)
    return frozenset(weak)


def weakness(secret: str) -> str | None:
    """Why ``secret`` must not protect a federation, or ``None`` if it may."""
    if not secret:
        return "is empty"
    if secret in known_weak_secrets():
        return "is a default or example secret published with Megha"
    if len(secret) < MIN_SECRET_CHARS:
        return f"is shorter than {MIN_SECRET_CHARS} characters"
    if len(set(secret)) < MIN_DISTINCT_CHARS:
        return f"has fewer than {MIN_DISTINCT_CHARS} distinct characters"
    return None


def check_secret(secret: str, *, insecure_dev: bool = False) -> str | None:
    """Refuse a weak secret (``ConfigError``, reason ``weak_secret``); with
    ``insecure_dev``, return a warning text for the operator instead."""
    problem = weakness(secret)
    if problem is None:
        return None
    if not insecure_dev:
        raise ConfigError(
            f"the federation secret {problem}: anyone who knows it can sign as any service. "
            "Let `megha up` create a random one, or pass --insecure-dev on a machine you "
            "alone use",
            reason="weak_secret",
        )
    return (
        f"WARNING: the federation secret {problem}; running anyway because of "
        "--insecure-dev. Anyone who knows it can forge state, launches and tokens."
    )


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF (RFC 5869) with SHA-256: extract, then expand to ``length`` bytes."""
    if not 0 < length <= 255 * 32:
        raise ValueError("HKDF-SHA256 output length must be in 1..8160")
    prk = hmac.new(salt or bytes(32), ikm, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range((length + 31) // 32):
        block = hmac.new(prk, block + info + bytes([i + 1]), hashlib.sha256).digest()
        out += block
    return out[:length]


@dataclass(frozen=True, slots=True)
class Secret:
    """A federation secret, loaded and checked; it derives every key."""

    value: bytes = field(repr=False)
    source: str
    """Where it came from (a path), for messages."""
    warning: str | None = None
    """Set when a weak secret was accepted because of ``insecure_dev``."""

    @classmethod
    def from_text(cls, text: str, source: str, *, insecure_dev: bool = False) -> Secret:
        warning = check_secret(text, insecure_dev=insecure_dev)
        return cls(text.encode(), source, warning)

    def derive(self, label: str) -> bytes:
        """A 32-byte key for ``label``; distinct labels give independent keys."""
        return hkdf_sha256(self.value, HKDF_SALT, label.encode())

    def identity_key(self, identity: Identity, purpose: str) -> bytes:
        """The key ``identity`` uses for ``purpose`` (e.g. sealing broker messages)."""
        return self.derive(identity_label(identity, purpose))

    def channel_key(self, sender: Identity, receiver: Identity, purpose: str) -> bytes:
        """The key of one direction of one pair: only these two parties hold it."""
        return self.derive(channel_label(sender, receiver, purpose))


class KeySource(Protocol):
    """What keys are taken from: the whole ``Secret`` (the operator) or one party's
    own keys (``security.party_keys.PartyKeys``: a service)."""

    @property
    def warning(self) -> str | None: ...

    def derive(self, label: str) -> bytes: ...

    def identity_key(self, identity: Identity, purpose: str) -> bytes: ...

    def channel_key(self, sender: Identity, receiver: Identity, purpose: str) -> bytes: ...


def identity_label(identity: Identity, purpose: str) -> str:
    """The derivation label of ``identity``'s own key for ``purpose``."""
    return f"{_purpose(purpose)}:{identity}"


def channel_label(sender: Identity, receiver: Identity, purpose: str) -> str:
    """The derivation label of the key of the channel ``sender`` -> ``receiver``."""
    return f"{_purpose(purpose)}:{sender}>{receiver}"


def _purpose(purpose: str) -> str:
    if not _PURPOSE.fullmatch(purpose):
        raise ValueError(f"bad key purpose {purpose!r}")
    return purpose


def secret_path(home: Path) -> Path:
    return home / SECRET_FILENAME


def create_secret_file(home: Path) -> Path:
    """Write a new random secret to ``home/secret`` (0600, atomic); refuse to replace one."""
    ensure_private_dir(home)
    path = secret_path(home)
    try:
        create_private(path, (secrets.token_hex(SECRET_BYTES) + "\n").encode())
    except FileExistsError:
        raise ConfigError(
            f"{path} exists already: a federation secret is never overwritten",
            reason="secret_exists",
        ) from None
    return path


def ensure_secret_file(home: Path, *, insecure_dev: bool = False) -> Secret:
    """``megha up``: load ``home/secret`` if present (checked), else create it."""
    path = secret_path(home)
    if not os.path.lexists(path):
        try:
            create_secret_file(home)
        except ConfigError as exc:  # a concurrent `megha up` made it first: use theirs
            if exc.reason != "secret_exists":
                raise
    return load_secret(path, insecure_dev=insecure_dev)


def load_secret(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    insecure_dev: bool = False,
) -> Secret:
    """Load the secret from ``path`` or ``$MEGHA_SECRET_FILE``; refuse an exposed or weak one
    (``$MEGHA_SECRET_MOUNTED``: an orchestrator's read-only mount is not exposed, see
    ``security.files``)."""
    if path is None:
        name = environ.get(SECRET_FILE_ENV)
        if not name:
            raise ConfigError(
                f"no secret file: set {SECRET_FILE_ENV} (`megha up` does)", reason="no_secret"
            )
        path = Path(name)
    raw = read_private(path, mounted_ok=mounted(environ))
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text", reason="weak_secret") from None
    return Secret.from_text(text, str(path), insecure_dev=insecure_dev)
