"""Each process holds only its own keys (issue 32 item 7): what ``megha up`` writes to
``$MEGHA_HOME/keys``, what a service loads, and what it cannot sign or open."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from common.config import FederationConfig
from common.errors import ConfigError
from federation import provision
from security import sealing, signing
from security.access import Access, parties
from security.identity import OPERATOR, gm, lm, workers
from security.party_keys import KEYS_FILE_ENV, PartyKeys, keys_path, write_party_keys
from security.secret import SECRET_FILE_ENV, Secret, channel_label, create_secret_file

CFG = FederationConfig().validate()
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")


def keys_of(who: object) -> PartyKeys:
    assert isinstance(who, type(gm("x")))
    return PartyKeys.derive_from(SECRET, CFG, who, parties(CFG))


def test_a_worker_pool_holds_only_the_channel_with_its_own_lm() -> None:
    """The root-run pool runs user code: its keys sign as nobody but itself (to its LM
    and, answering, to the operator)."""
    pool = keys_of(workers("lm0"))
    assert set(pool.keys) == {
        channel_label(workers("lm0"), lm("lm0"), "http"),
        channel_label(lm("lm0"), workers("lm0"), "http"),
        channel_label(OPERATOR, workers("lm0"), "http"),  # the operator's pings
        channel_label(workers("lm0"), OPERATOR, "http"),
    }
    for ask in (
        lambda: pool.channel_key(lm("lm0"), gm("gm0"), "http"),  # as its LM, to a GM
        lambda: pool.channel_key(gm("gm0"), lm("lm0"), "http"),  # as a GM, to its LM
        lambda: pool.identity_key(lm("lm0"), "amqp"),  # its LM's seal
        lambda: pool.channel_key(workers("lm1"), lm("lm1"), "http"),  # another pool
        lambda: pool.derive("outcome:gm:gm0"),
    ):
        with pytest.raises(ConfigError) as exc:
            ask()
        assert exc.value.reason == "key_not_held"


def test_an_lm_holds_no_gm_key_and_no_other_lms_seal() -> None:
    keys = keys_of(lm("lm0"))
    for g in ("gm0", "gm1"):  # its channel to each GM
        assert keys.channel_key(lm("lm0"), gm(g), "amqp") == SECRET.channel_key(
            lm("lm0"), gm(g), "amqp"
        )
    with pytest.raises(ConfigError):
        keys.channel_key(lm("lm1"), gm("gm0"), "amqp")
    with pytest.raises(ConfigError):
        keys.identity_key(lm("lm0"), "amqp")  # no key every GM would check
    with pytest.raises(ConfigError):
        keys.channel_key(gm("gm0"), lm("lm1"), "http")
    with pytest.raises(ConfigError):
        keys.identity_key(gm("gm0"), "outcome")  # cannot seal a user's outcome


def test_a_gms_keys_work_with_its_peers_keys() -> None:
    """Own keys only, yet every call of ``ACCESS_POLICY`` still verifies both ways."""
    g, x = Access(gm("gm0"), CFG, keys_of(gm("gm0"))), Access(lm("lm0"), CFG, keys_of(lm("lm0")))
    headers = g.sign(lm("lm0"), "POST", "/v1/launch", b"body", 100.0)
    who = signing.verify(
        headers, "POST", "/v1/launch", b"body", x.keyring, 100.0, signing.ReplayCache()
    )
    assert who == gm("gm0")
    assert x.http_key(x.me, gm("gm0")) == g.http_key(lm("lm0"), g.me)  # its signed answers
    # the GM opens lm0's sealed state, and seals its own returned tasks
    body = b"state"
    sealed = x.sealer(epoch=3).seal(body, "state")
    assert isinstance(g.opener("state", g.lm_identities()).open(sealed, body), sealing.Opened)
    # the operator's access (the whole secret) agrees with both
    op = Access(OPERATOR, CFG, SECRET)
    assert op.http_key(gm("gm0"), lm("lm0")) == g.http_key(gm("gm0"), lm("lm0"))


def test_a_gms_keys_cannot_forge_an_lms_message_to_another_gm() -> None:
    """Issue 32 item 7 (closed for the broker): a GM opens every LM's state updates and
    events, yet nothing in its keys file makes a seal another GM takes as the LM's.  It
    holds the keys of the LMs' channels to itself only; with a key every GM checked
    (each LM's own ``amqp:lm:L``, as GMs held before), gm0 forged lm0 to gm1."""
    g0, x = keys_of(gm("gm0")), Access(lm("lm0"), CFG, keys_of(lm("lm0")))
    gm1 = Access(gm("gm1"), CFG, keys_of(gm("gm1")))
    body = b"state of lm0, version 2**62"
    state = gm1.opener("state", gm1.lm_identities())
    # what lm0 seals, gm1 opens (and gm0 too, each with its own key)
    sealed = x.sealer(epoch=5).seal(body, "state")
    assert isinstance(state.open(sealed, body), sealing.Opened)
    gm0 = Access(gm("gm0"), CFG, g0).opener("state", [lm("lm0")])
    assert isinstance(gm0.open(sealed, body), sealing.Opened)
    # gm0 seals with every key of its file, for every receiver header: gm1 takes none
    for label, key in g0.keys.items():
        for forged in (
            sealing.seal(body, lm("lm0"), 6, 1, key, stream="state"),
            sealing.seal(body, lm("lm0"), 6, 1, {gm("gm1"): key}, stream="state"),
        ):
            got = state.open(forged, body)
            assert isinstance(got, sealing.Dropped), label
            assert got.reason in ("bad_mac", "missing_header"), (label, got)
    assert not any(k.startswith("amqp:lm:") and k.endswith(">gm:gm1") for k in g0.keys)
    for ask in (
        lambda: g0.channel_key(lm("lm0"), gm("gm1"), "amqp"),
        lambda: g0.identity_key(lm("lm0"), "amqp"),
    ):
        with pytest.raises(ConfigError) as exc:
            ask()
        assert exc.value.reason == "key_not_held"
    # the key every GM used to hold would have forged it
    old = sealing.seal(body, lm("lm0"), 6, 1, SECRET.identity_key(lm("lm0"), "amqp"),
                       stream="state")  # fmt: skip
    legacy = sealing.Opener(sealing.keyring_for(SECRET, [lm("lm0")]), "state")
    assert isinstance(legacy.open(old, body), sealing.Opened)


def test_a_keys_file_is_its_holders_only(tmp_path: Path) -> None:
    (path,) = [
        p for p in write_party_keys(tmp_path, SECRET, CFG, parties(CFG)) if "lm-lm0" in p.name
    ]
    assert path == keys_path(tmp_path, lm("lm0"))
    assert path.stat().st_mode & 0o077 == 0
    assert PartyKeys.load(path, lm("lm0")).keys == keys_of(lm("lm0")).keys
    with pytest.raises(ConfigError) as exc:
        PartyKeys.load(path, workers("lm0"))
    assert exc.value.reason == "wrong_keys_file"
    assert not keys_path(tmp_path, OPERATOR).exists()  # the operator keeps the secret


def test_megha_up_gives_a_service_its_keys_file_not_the_secret(tmp_path: Path) -> None:
    create_secret_file(tmp_path)
    secret = provision.load_secret(tmp_path / "secret")
    write_party_keys(tmp_path, secret, CFG, parties(CFG))
    env = provision.service_environment(tmp_path, "worker", "lm1")
    assert env[KEYS_FILE_ENV] == str(keys_path(tmp_path, workers("lm1")))
    assert env[SECRET_FILE_ENV] == ""
    access = Access.from_env(CFG, workers("lm1"), env)
    assert isinstance(access.secret, PartyKeys)
    with pytest.raises(ConfigError):
        access.sign(gm("gm0"), "POST", "/v1/launch", b"", 1.0)


def test_a_service_given_the_secret_keeps_only_its_own_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment made before keys files: warned, and still no wider than its role."""
    path = create_secret_file(tmp_path)
    with caplog.at_level(logging.WARNING):
        access = Access.from_env(CFG, workers("lm0"), {SECRET_FILE_ENV: str(path)})
    assert "whole federation secret" in caplog.text
    assert isinstance(access.secret, PartyKeys)
    with pytest.raises(ConfigError):
        access.http_key(lm("lm0"), gm("gm0"))
