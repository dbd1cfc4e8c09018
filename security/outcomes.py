"""Sealed task outcomes: a user believes only its own GM's word on its tasks.

A GM seals each ``TaskOutcomes`` and ``JobRefusal`` it publishes to user ``U`` with
the key of that pair: ``HMAC(K_G, "user:" U)``, where ``K_G`` is the GM's outcome key
(``Secret.identity_key(gm, "outcome")``, in its own keys file).  The GM derives any
of its users' keys, also of users added while it runs; the user (the operator hands
it over, ``$MEGHA_HOME/outcome-keys/U``) holds only its own, so it can forge nothing
but outcomes to itself.

Guarantees of ``check``: an outcome is believed only if it is sealed under the key of
(its user, that user's GM), on the ``outcomes`` stream (the receiver also checks that
its body names that GM); anything else -- unsealed, from an LM or another GM, from the network -- is a
``Dropped`` with the reason.  Outcomes are at least once (a GM restart may say one
again), so ``check`` keeps no order: the submitter counts duplicates itself.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from security import sealing
from security.identity import Identity, Role
from security.secret import KeySource

PURPOSE = "outcome"
STREAM = "outcomes"
OUTCOME_KEYS_DIRNAME = "outcome-keys"


def outcome_key(keys: KeySource, gm: str, user: str) -> bytes:
    """The key GM ``gm`` seals ``user``'s outcomes with (and ``user`` checks them with)."""
    root = keys.identity_key(Identity(Role.GM, gm), PURPOSE)
    return hmac.new(root, f"user:{user}".encode(), hashlib.sha256).digest()


class OutcomeSealer:
    """A GM's seals on its users' outcomes: one epoch per run, one sequence."""

    def __init__(self, keys: KeySource, gm: str, epoch: int) -> None:
        self.gm = gm
        self.sender = Identity(Role.GM, gm)
        self.epoch = epoch
        self.seq = 0
        self._root = keys
        self._keys: dict[str, bytes] = {}

    def seal(self, body: bytes, user: str) -> dict[str, sealing.HeaderValue]:
        key = self._keys.get(user)
        if key is None:
            key = self._keys[user] = outcome_key(self._root, self.gm, user)
        self.seq += 1
        return sealing.seal(body, self.sender, self.epoch, self.seq, key, stream=STREAM)


def check(
    headers: Mapping[str, object] | None, body: bytes, gm: str, key: bytes
) -> sealing.Opened | sealing.Dropped:
    """Is ``body`` an outcome sealed by GM ``gm`` with its user's ``key``?  (Checked
    before the body is decoded; the receiver then checks that the body names ``gm``.)"""
    return sealing.authenticate(headers, body, {Identity(Role.GM, gm): key}, STREAM)
