"""One party's own keys: what a service holds instead of the federation secret.

``megha up`` (and ``python -m deploy.render secrets``) derives, from the federation
secret, the keys each service needs and nothing more, and writes them to
``$MEGHA_HOME/keys/<role>-<name>.json`` (0600); a service is started with
``MEGHA_KEYS_FILE`` naming its own file, never the secret.

Guarantees:

* a party holds the keys of the HTTP channels it is an end of by ``ACCESS_POLICY``
  (both directions: requests one way, signed answers the other); an LM the sealing
  keys of its channels to each GM (``amqp:lm:L>gm:G``), a GM those of every LM's
  channel to itself, its own sealing key (the tasks it returns to itself) and its
  outcome key (``security.outcomes``); a worker pool, which runs user code, holds only
  the two keys of the channel with its own LM.  No key a party holds lets it speak as
  another party to a third: a GM checks an LM's seals for itself but cannot make the
  seal another GM checks;
* asking a ``PartyKeys`` for any other key raises ``ConfigError`` (``key_not_held``):
  a leak of a pool's file signs as nobody else, and cannot make the keys of anyone
  else (HKDF is one-way);
* a keys file names its holder: a service refuses a file made for another party
  (``wrong_keys_file``).

What a key shared by two cannot give: either end can make the other's messages to
itself (a GM an LM's update to that GM, a pool its LM's call to that pool): harmless,
as the only one it could fool is itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.config import FederationConfig
from common.errors import ConfigError
from security import outcomes, sealing, signing
from security.files import ensure_private_dir, read_private, write_private
from security.identity import Identity, Role
from security.secret import Secret, channel_label, identity_label

KEYS_FILE_ENV = "MEGHA_KEYS_FILE"
"""Names a service's own keys file (``megha up`` sets it; the secret is not given)."""
KEYS_DIRNAME = "keys"
FORMAT = "megha-party-keys/1"


def http_labels(me: Identity, parties: Iterable[Identity]) -> set[str]:
    """The HTTP channel keys ``me`` needs: with every party that may call it, and every
    party it may call, both directions."""
    everyone = sorted(set(parties) | {me})
    peers = set(signing.callers_of(me, everyone))
    peers |= {p for p in everyone if me in signing.callers_of(p, everyone)}
    labels: set[str] = set()
    for p in peers:
        labels.add(channel_label(p, me, signing.PURPOSE))
        labels.add(channel_label(me, p, signing.PURPOSE))
    return labels


def labels_for(cfg: FederationConfig, me: Identity, parties: Iterable[Identity]) -> set[str]:
    """Every key label party ``me`` of ``cfg`` holds."""
    labels = http_labels(me, parties)
    gms = [Identity(Role.GM, g) for g in cfg.gm_ids]
    if me.role == Role.LM:  # its channel to each GM (no key a GM would not check)
        labels |= {channel_label(me, g, sealing.PURPOSE) for g in gms}
    if me.role == Role.GM:
        labels.add(identity_label(me, sealing.PURPOSE))  # the tasks it returns to itself
        lms = [Identity(Role.LM, x) for x in cfg.lm_ids]
        labels |= {channel_label(lm, me, sealing.PURPOSE) for lm in lms}  # to itself only
        labels.add(identity_label(me, outcomes.PURPOSE))
    return labels


@dataclass(frozen=True, slots=True)
class PartyKeys:
    """The keys one party holds, by derivation label; a ``KeySource`` like ``Secret``."""

    holder: Identity
    keys: Mapping[str, bytes] = field(repr=False)
    source: str = ""
    warning: str | None = None

    @classmethod
    def derive_from(
        cls, secret: Secret, cfg: FederationConfig, me: Identity, parties: Iterable[Identity]
    ) -> PartyKeys:
        labels = labels_for(cfg, me, parties)
        return cls(me, {lab: secret.derive(lab) for lab in sorted(labels)}, secret.source)

    def derive(self, label: str) -> bytes:
        key = self.keys.get(label)
        if key is None:
            raise ConfigError(
                f"{self.holder} holds no key {label!r} (its keys file is its own only)",
                reason="key_not_held",
            )
        return key

    def identity_key(self, identity: Identity, purpose: str) -> bytes:
        return self.derive(identity_label(identity, purpose))

    def channel_key(self, sender: Identity, receiver: Identity, purpose: str) -> bytes:
        return self.derive(channel_label(sender, receiver, purpose))

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "holder": str(self.holder),
            "keys": {k: v.hex() for k, v in sorted(self.keys.items())},
        }
        return (json.dumps(doc, indent=1) + "\n").encode()

    def save(self, path: Path) -> Path:
        ensure_private_dir(path.parent)
        write_private(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: Path, me: Identity, *, mounted_ok: bool | None = None) -> PartyKeys:
        """``path``'s keys, which must be ``me``'s (``wrong_keys_file`` otherwise)."""
        try:
            doc = json.loads(read_private(path, mounted_ok=mounted_ok))
            if doc["format"] != FORMAT:
                raise ValueError(doc["format"])
            holder = Identity.parse(str(doc["holder"]))
            keys = {str(k): bytes.fromhex(v) for k, v in doc["keys"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(f"{path} is not a keys file", reason="bad_keys_file") from None
        if holder != me:
            raise ConfigError(
                f"{path} holds the keys of {holder}, not of {me}", reason="wrong_keys_file"
            )
        return cls(holder, keys, str(path))


def file_name(identity: Identity) -> str:
    return f"{identity.role.value}-{identity.name}.json"


def keys_path(home: Path, identity: Identity) -> Path:
    return home / KEYS_DIRNAME / file_name(identity)


def write_party_keys(
    home: Path, secret: Secret, cfg: FederationConfig, parties: Iterable[Identity]
) -> list[Path]:
    """Every service party's keys file under ``home/keys`` (rewritten: the parties of
    the config may have changed)."""
    everyone = list(parties)
    return [
        PartyKeys.derive_from(secret, cfg, p, everyone).save(keys_path(home, p))
        for p in everyone
        if p.role != Role.OPERATOR
    ]
