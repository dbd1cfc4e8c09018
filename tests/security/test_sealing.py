"""Sealed broker messages: forgeries dropped and counted, sequences monotone per sender."""

from __future__ import annotations

import pytest

from security.identity import Identity, gm, lm, user, workers
from security.sealing import (
    HEADER_EPOCH,
    HEADER_MAC,
    HEADER_SENDER,
    HEADER_SEQ,
    HEADER_STREAM,
    MAX_COUNTER,
    Dropped,
    DropReason,
    Opened,
    Opener,
    Sealer,
    keyring_for,
    seal,
    sealing_key,
)
from security.secret import Secret

SECRET = Secret.from_text("fedcba9876543210fedcba9876543210-test", "test")
LM0, LM1 = lm("lm0"), lm("lm1")
UPDATE = b"\x83\xa2lm\xa3lm0\xa7version\x05\xa4free\x90"
FORGED = b"\x83\xa2lm\xa3lm0\xa7version\xcf\x40\x00\x00\x00\x00\x00\x00\x00\xa4free\x90"
"""A StateUpdated-like body claiming version 2**62."""


def dropped(result: Opened | Dropped) -> DropReason:
    assert isinstance(result, Dropped), result
    return result.reason


def opener() -> Opener:
    return Opener(keyring_for(SECRET, [LM0, LM1]), "state")


def sealed(
    body: bytes = UPDATE,
    sender: Identity = LM0,
    epoch: int = 1,
    seq: int = 1,
    *,
    key: bytes | None = None,
) -> dict[str, object]:
    k = sealing_key(SECRET, sender) if key is None else key
    return dict(seal(body, sender, epoch, seq, k, stream="state"))


def test_a_sealed_message_opens_and_says_who_sent_it() -> None:
    o = opener()
    assert o.open(sealed(), UPDATE) == Opened(LM0, 1, 1)
    assert o.position(LM0) == (1, 1)
    assert o.opened == 1
    assert not o.drops


def test_a_forged_update_with_version_2_62_is_dropped() -> None:
    o = opener()
    o.open(sealed(seq=1), UPDATE)
    # forged by a user, by a worker pool, by another LM, with a made-up key, or with
    # lm0's real headers glued to the forged body: none opens, the view stays put
    keys = [
        sealing_key(SECRET, user("mallory")),
        sealing_key(SECRET, workers("lm0")),
        sealing_key(SECRET, LM1),
        b"\x00" * 32,
        sealing_key(Secret.from_text("another-federation-secret-0123456789", "x"), LM0),
    ]
    for key in keys:
        got = o.open(sealed(FORGED, epoch=2**62, seq=2**62, key=key), FORGED)
        assert isinstance(got, Dropped)
        assert got.reason is DropReason.BAD_MAC
    assert dropped(o.open(sealed(UPDATE, seq=2), FORGED)) is DropReason.BAD_MAC
    assert o.drops[DropReason.BAD_MAC] == len(keys) + 1
    assert o.position(LM0) == (1, 1)
    # the real lm0 is not locked out by the forgeries
    assert o.open(sealed(seq=2), UPDATE) == Opened(LM0, 1, 2)


def test_replays_duplicates_and_old_messages_are_dropped() -> None:
    o = opener()
    first, second = sealed(seq=1), sealed(seq=2)
    assert isinstance(o.open(second, UPDATE), Opened)
    assert dropped(o.open(first, UPDATE)) is DropReason.STALE_SEQ
    assert dropped(o.open(second, UPDATE)) is DropReason.STALE_SEQ
    assert o.drops[DropReason.STALE_SEQ] == 2


def test_a_new_epoch_restarts_the_sequence_and_fences_the_old_one() -> None:
    o = opener()
    assert isinstance(o.open(sealed(epoch=1, seq=500), UPDATE), Opened)
    assert o.open(sealed(epoch=2, seq=1), UPDATE) == Opened(LM0, 2, 1)
    assert dropped(o.open(sealed(epoch=1, seq=501), UPDATE)) is DropReason.STALE_EPOCH
    assert dropped(o.open(sealed(epoch=2, seq=1), UPDATE)) is DropReason.STALE_SEQ


def test_senders_are_tracked_separately() -> None:
    o = opener()
    assert isinstance(o.open(sealed(sender=LM0, seq=9), UPDATE), Opened)
    assert isinstance(o.open(sealed(sender=LM1, seq=1), UPDATE), Opened)


def test_gaps_are_fine_only_order_matters() -> None:
    o = opener()
    for seq in (1, 5, 6, 100):
        assert isinstance(o.open(sealed(seq=seq), UPDATE), Opened)


def test_anything_in_the_sealed_header_breaks_the_mac() -> None:
    o = opener()
    base = sealed(seq=3)
    for name, value in ((HEADER_EPOCH, 2), (HEADER_SEQ, 4), (HEADER_SENDER, str(LM1))):
        h = dict(base)
        h[name] = value
        assert dropped(o.open(h, UPDATE)) is DropReason.BAD_MAC
    assert dropped(o.open(base, UPDATE + b"\x00")) is DropReason.BAD_MAC


def test_a_message_of_another_stream_is_dropped() -> None:
    o = opener()
    h = dict(seal(UPDATE, LM0, 1, 1, sealing_key(SECRET, LM0), stream="events.gm0"))
    assert dropped(o.open(h, UPDATE)) is DropReason.WRONG_STREAM
    h[HEADER_STREAM] = "state"  # relabelled: the MAC covers the stream
    assert dropped(o.open(h, UPDATE)) is DropReason.BAD_MAC


def test_senders_outside_the_keyring_are_unknown() -> None:
    o = opener()
    for who in (gm("gm0"), user("alice"), lm("lm9")):
        assert dropped(o.open(sealed(sender=who), UPDATE)) is DropReason.UNKNOWN_SENDER


@pytest.mark.parametrize(
    "header", [HEADER_SENDER, HEADER_STREAM, HEADER_EPOCH, HEADER_SEQ, HEADER_MAC]
)
def test_missing_headers_are_dropped(header: str) -> None:
    h = sealed()
    del h[header]
    assert dropped(opener().open(h, UPDATE)) is DropReason.MISSING


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (HEADER_EPOCH, -1),
        (HEADER_EPOCH, 2**63),
        (HEADER_SEQ, True),
        (HEADER_SEQ, 1.5),
        (HEADER_SEQ, "12a"),
        (HEADER_SEQ, "9" * 25),
        (HEADER_SENDER, 7),
        (HEADER_SENDER, "lm0"),
        (HEADER_SENDER, b"\xff\xfe"),
        (HEADER_MAC, "XYZ"),
        (HEADER_STREAM, None),
    ],
)
def test_malformed_headers_are_dropped(header: str, value: object) -> None:
    h = sealed()
    h[header] = value
    assert dropped(opener().open(h, UPDATE)) is DropReason.MALFORMED


def test_headers_decoded_as_bytes_or_strings_still_open() -> None:
    h = {k: (v.encode() if isinstance(v, str) else str(v)) for k, v in sealed().items()}
    assert isinstance(opener().open(h, UPDATE), Opened)


def test_no_headers_at_all() -> None:
    o = opener()
    assert dropped(o.open(None, UPDATE)) is DropReason.MISSING
    assert o.drops == {DropReason.MISSING: 1}


def test_sealer_numbers_messages_and_seal_refuses_bad_counters() -> None:
    s = Sealer(LM0, sealing_key(SECRET, LM0), epoch=7)
    o = opener()
    events = Opener(keyring_for(SECRET, [LM0]), "events.gm0")
    assert o.open(s.seal(UPDATE, "state"), UPDATE) == Opened(LM0, 7, 1)
    assert events.open(s.seal(b"ev", "events.gm0"), b"ev") == Opened(LM0, 7, 2)
    assert o.open(s.seal(UPDATE, "state"), UPDATE) == Opened(LM0, 7, 3)
    key = sealing_key(SECRET, LM0)
    for epoch, seq in ((-1, 0), (0, MAX_COUNTER + 1)):
        with pytest.raises(ValueError, match="must be an int"):
            seal(b"", LM0, epoch, seq, key, stream="state")
    with pytest.raises(ValueError, match="stream"):
        seal(b"", LM0, 0, 0, key, stream="State Updates")
    with pytest.raises(ValueError, match="stream"):
        Opener({}, "")
