"""What ``security.sealing`` and ``security.identity`` keep between calls changes no
answer: a MAC made from a key's kept HMAC state is the HMAC of the whole message, for
every key however many there are; an identity parsed before is the same party, and a
bad text is refused whatever was parsed before it."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from common.errors import ValidationError
from security import identity, sealing
from security.identity import Identity, Role


def plain_mac(key: bytes, sender: str, stream: str, epoch: int, seq: int, body: bytes) -> str:
    head = f"megha-amqp-v1\n{sender}\n{stream}\n{epoch}\n{seq}\n".encode()
    return hmac.new(key, head + body, hashlib.sha256).hexdigest()


def test_a_kept_key_makes_the_mac_of_the_whole_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sealing, "MAX_KEYED", 3)
    monkeypatch.setattr(sealing, "_KEYED", {})
    keys = [bytes([k]) * 32 for k in range(5)]
    for rnd in range(2):
        for i, key in enumerate(keys):
            body = b"body %d %d" % (rnd, i)
            got = sealing._mac(key, "lm:lm0", "events.gm0", 7, rnd * 10 + i, body)
            assert got == plain_mac(key, "lm:lm0", "events.gm0", 7, rnd * 10 + i, body)
            assert len(sealing._KEYED) <= 3


def test_a_sealed_message_opens_with_its_key_only() -> None:
    lm0 = Identity(Role.LM, "lm0")
    good, bad = b"k" * 32, b"x" * 32
    headers = sealing.seal(b"body", lm0, 1, 1, good, stream="state")
    assert isinstance(sealing.authenticate(headers, b"body", {lm0: good}, "state"), sealing.Opened)
    wrong = sealing.authenticate(headers, b"body", {lm0: bad}, "state")
    assert isinstance(wrong, sealing.Dropped)
    assert wrong.reason is sealing.DropReason.BAD_MAC


def test_an_identity_parsed_again_is_the_same_party(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "MAX_PARSED", 2)
    monkeypatch.setattr(identity, "_PARSED", {})
    for _ in range(2):
        for text in ("lm:lm0", "gm:gm1", "workers:lm2"):
            got = Identity.parse(text)
            assert str(got) == text
            assert got == Identity(Role(text.split(":")[0]), text.split(":")[1])
    assert len(identity._PARSED) == 2
    for bad in ("lm:", "lm:lm0:x", "nobody:lm0", "lm0"):
        with pytest.raises(ValidationError):
            Identity.parse(bad)
    assert Identity(Role.GM, "gm0") == Identity.parse("gm:gm0")
    assert hash(Identity(Role.GM, "gm0")) == hash(Identity.parse("gm:gm0"))
    assert repr(Identity(Role.GM, "gm0")) == "Identity(role=<Role.GM: 'gm'>, name='gm0')"
