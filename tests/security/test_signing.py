"""Signed internal HTTP: each refusal with its own reason, the bounded replay cache, the policy."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import pytest
from multidict import CIMultiDict

from common.errors import Unauthorized
from security.identity import OPERATOR, Identity, gm, lm, user, workers
from security.secret import Secret
from security.signing import (
    ACCESS_POLICY,
    HEADER_DIGEST,
    HEADER_IDENTITY,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    SIGNED_HEADERS,
    Refusal,
    ReplayCache,
    authorize,
    callers_of,
    is_public,
    keyring_for,
    may_call,
    sign,
    sign_response,
    signing_key,
    verify,
    verify_body,
    verify_headers,
    verify_response,
)

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
LM0 = lm("lm0")
GM0 = gm("gm0")
NOW = 1_700_000_000.0
BODY = b"\x82\xa4kind\xa6launch"
PARTIES = [
    OPERATOR,
    gm("gm0"),
    gm("gm1"),
    lm("lm0"),
    lm("lm1"),
    workers("lm0"),
    workers("lm1"),
    user("alice"),
]


def keyring() -> dict[Identity, bytes]:
    return keyring_for(SECRET, LM0, callers_of(LM0, PARTIES))


def signed(
    *,
    who: Identity = GM0,
    method: str = "POST",
    path: str = "/v1/launch",
    body: bytes = BODY,
    now: float = NOW,
    nonce: str | None = None,
) -> dict[str, str]:
    return sign(method, path, body, who, signing_key(SECRET, who, LM0), now, nonce)


def refusal(
    headers: dict[str, str],
    *,
    method: str = "POST",
    path: str = "/v1/launch",
    body: bytes = BODY,
    now: float = NOW,
    cache: ReplayCache | None = None,
) -> str:
    with pytest.raises(Unauthorized) as exc:
        verify(
            headers,
            method,
            path,
            body,
            keyring(),
            now,
            cache if cache is not None else ReplayCache(),
        )
    return exc.value.reason


def test_a_signed_request_verifies_once() -> None:
    cache = ReplayCache()
    h = signed()
    assert verify(h, "POST", "/v1/launch", BODY, keyring(), NOW + 1, cache) == GM0
    assert refusal(h, now=NOW + 2, cache=cache) == Refusal.REPLAYED


def test_headers_are_checked_without_the_body_and_use_no_nonce() -> None:
    cache = ReplayCache()
    h = signed()
    claim = verify_headers(h, "POST", "/v1/launch", keyring(), NOW, cache)
    assert verify_headers(h, "POST", "/v1/launch", keyring(), NOW, cache) == claim
    assert cache.entries == 0
    with pytest.raises(Unauthorized) as exc:  # another body: its nonce is not used up
        verify_body(claim, b"another body", NOW, cache)
    assert exc.value.reason == Refusal.BODY_DIGEST
    assert cache.entries == 0
    assert verify_body(claim, BODY, NOW, cache) == GM0
    with pytest.raises(Unauthorized) as exc:  # now it is
        verify_headers(h, "POST", "/v1/launch", keyring(), NOW, cache)
    assert exc.value.reason == Refusal.REPLAYED


@pytest.mark.parametrize(
    ("headers", "now", "reason"),
    [
        ({}, NOW, Refusal.MISSING),
        ({**signed(), HEADER_NONCE: "short"}, NOW, Refusal.MALFORMED),
        (signed(who=gm("evil")), NOW, Refusal.UNKNOWN_IDENTITY),
        ({**signed(), HEADER_SIGNATURE: "0" * 64}, NOW, Refusal.BAD_SIGNATURE),
        ({**signed(), HEADER_DIGEST: "1" * 64}, NOW, Refusal.BAD_SIGNATURE),
        (signed(), NOW + 31, Refusal.STALE),
        (signed(), NOW - 6, Refusal.FUTURE),
    ],
)
def test_headers_alone_refuse_with_the_reason_verify_gives(
    headers: dict[str, str], now: float, reason: Refusal
) -> None:
    with pytest.raises(Unauthorized) as exc:
        verify_headers(headers, "POST", "/v1/launch", keyring(), now, ReplayCache())
    assert exc.value.reason == reason
    assert refusal(headers, now=now) == reason


def test_a_request_admitted_meanwhile_is_refused_after_its_body() -> None:
    cache = ReplayCache()
    h = signed()
    first = verify_headers(h, "POST", "/v1/launch", keyring(), NOW, cache)
    second = verify_headers(h, "POST", "/v1/launch", keyring(), NOW, cache)
    assert verify_body(first, BODY, NOW, cache) == GM0
    with pytest.raises(Unauthorized) as exc:
        verify_body(second, BODY, NOW, cache)
    assert exc.value.reason == Refusal.REPLAYED


def test_header_names_are_case_insensitive() -> None:
    h = {k.lower(): v for k, v in signed().items()}
    assert verify(h, "post", "/v1/launch", BODY, keyring(), NOW, ReplayCache()) == GM0


@pytest.mark.parametrize("header", SIGNED_HEADERS)
def test_each_missing_header_is_refused(header: str) -> None:
    h = signed()
    del h[header]
    assert refusal(h) == Refusal.MISSING


def test_a_duplicated_header_is_refused() -> None:
    h = CIMultiDict(signed())  # what aiohttp's request.headers is
    h.add(HEADER_NONCE.lower(), "A" * 24)
    with pytest.raises(Unauthorized) as exc:
        verify(h, "POST", "/v1/launch", BODY, keyring(), NOW, ReplayCache())
    assert exc.value.reason == Refusal.MALFORMED


@pytest.mark.parametrize(
    "change",
    ["none", "duplicate", "duplicate_other_case", "missing", "incarnation_twice", "bad_value"],
)
def test_a_multidict_and_a_mapping_of_the_same_headers_get_the_same_verdict(change: str) -> None:
    """Headers read from a multidict (asked for our names) and from any other mapping
    (read in one pass) are judged alike: accepted, or refused for the same reason."""
    pairs = list(sign("POST", "/v1/launch", BODY, GM0, signing_key(SECRET, GM0, LM0), NOW,
                      incarnation="ab" * 8).items())  # fmt: skip
    if change == "duplicate":
        pairs.append((HEADER_NONCE, "A" * 24))
    elif change == "duplicate_other_case":
        pairs.append((HEADER_DIGEST.upper(), "0" * 64))
    elif change == "missing":
        pairs = [(k, v) for k, v in pairs if k != HEADER_TIMESTAMP]
    elif change == "incarnation_twice":
        pairs.append(("x-megha-incarnation", "cd" * 8))
    elif change == "bad_value":
        pairs = [(k, "short" if k == HEADER_NONCE else v) for k, v in pairs]

    def verdict(headers: Mapping[str, str]) -> str:
        try:
            verify_headers(headers, "POST", "/v1/launch", keyring(), NOW, ReplayCache())
        except Unauthorized as exc:
            return exc.reason
        return "ok"

    expected = {"none": "ok", "duplicate": Refusal.MALFORMED, "missing": Refusal.MISSING,
                "duplicate_other_case": Refusal.MALFORMED, "bad_value": Refusal.MALFORMED,
                "incarnation_twice": Refusal.MALFORMED}[change]  # fmt: skip
    assert verdict(CIMultiDict(pairs)) == expected
    if change != "duplicate":  # (a dict keeps one of a name given twice in one case)
        assert verdict(dict(pairs)) == expected


def test_aiohttp_headers_verify() -> None:
    h = CIMultiDict((k.upper(), v) for k, v in signed().items())
    assert verify(h, "POST", "/v1/launch", BODY, keyring(), NOW, ReplayCache()) == GM0


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (HEADER_IDENTITY, "gm0"),
        (HEADER_IDENTITY, "emperor:gm0"),
        (HEADER_IDENTITY, "gm:gm0\nX-Injected: 1"),
        (HEADER_TIMESTAMP, "-5"),
        (HEADER_TIMESTAMP, "1e12"),
        (HEADER_TIMESTAMP, "9" * 30),
        (HEADER_NONCE, "short"),
        (HEADER_NONCE, "has spaces in the nonce value"),
        (HEADER_DIGEST, "ab"),
        (HEADER_SIGNATURE, "Z" * 64),
        (HEADER_SIGNATURE, ""),
    ],
)
def test_malformed_headers_are_refused(header: str, value: str) -> None:
    h = signed()
    h[header] = value
    assert refusal(h) == Refusal.MALFORMED


def test_unknown_identities_are_refused() -> None:
    # a GM not in the configuration, a user, and a worker pool on a GM-only endpoint's LM
    # that is not its own: none is in lm0's keyring
    for who in (gm("evil"), user("alice"), workers("lm1"), lm("lm1")):
        assert refusal(signed(who=who)) == Refusal.UNKNOWN_IDENTITY


def test_a_worker_key_cannot_sign_as_the_lm_or_a_gm() -> None:
    # workers:lm0 holds the key of its channel to lm0 and of lm0's channel to it
    stolen = [signing_key(SECRET, workers("lm0"), LM0), signing_key(SECRET, LM0, workers("lm0"))]
    for key in stolen:
        for claimed in (GM0, OPERATOR):
            h = sign("POST", "/v1/launch", BODY, claimed, key, NOW)
            assert refusal(h) == Refusal.BAD_SIGNATURE


def test_a_key_for_one_lm_does_not_sign_to_another() -> None:
    h = sign("POST", "/v1/launch", BODY, GM0, signing_key(SECRET, GM0, lm("lm1")), NOW)
    assert refusal(h) == Refusal.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("field", "value"),
    [("method", "PUT"), ("path", "/v1/preempt"), ("path", "/v1/launch?x=1")],
)
def test_changing_what_was_signed_breaks_the_signature(field: str, value: str) -> None:
    kwargs = {field: value}
    assert refusal(signed(), **kwargs) == Refusal.BAD_SIGNATURE  # type: ignore[arg-type]


def test_a_changed_body_is_a_digest_mismatch() -> None:
    assert refusal(signed(), body=BODY + b"\x00") == Refusal.BODY_DIGEST


def test_a_changed_digest_header_breaks_the_signature() -> None:
    h = signed()
    h[HEADER_DIGEST] = hashlib.sha256(b"other").hexdigest()
    assert refusal(h, body=b"other") == Refusal.BAD_SIGNATURE


def test_stale_and_future_timestamps_are_refused_at_the_window_edges() -> None:
    cache = ReplayCache(max_age_s=30, max_future_s=5)
    assert verify(signed(now=NOW - 30), "POST", "/v1/launch", BODY, keyring(), NOW, cache)
    assert verify(signed(now=NOW + 5), "POST", "/v1/launch", BODY, keyring(), NOW, cache)
    assert refusal(signed(now=NOW - 30.01), cache=cache) == Refusal.STALE
    assert refusal(signed(now=NOW + 5.01), cache=cache) == Refusal.FUTURE


def test_the_window_is_configurable() -> None:
    tight = ReplayCache(max_age_s=1, max_future_s=0)
    assert refusal(signed(now=NOW - 2), cache=tight) == Refusal.STALE
    assert refusal(signed(now=NOW + 0.5), cache=tight) == Refusal.FUTURE
    loose = ReplayCache(max_age_s=120)
    assert verify(signed(now=NOW - 100), "POST", "/v1/launch", BODY, keyring(), NOW, loose)


def test_a_replay_is_refused_until_the_timestamp_itself_is_stale() -> None:
    cache = ReplayCache(max_age_s=30)
    h = signed()
    verify(h, "POST", "/v1/launch", BODY, keyring(), NOW, cache)
    for later in (NOW + 1, NOW + 29.9):
        assert refusal(h, now=later, cache=cache) == Refusal.REPLAYED
    assert refusal(h, now=NOW + 31, cache=cache) == Refusal.STALE


def test_the_same_nonce_from_two_senders_is_two_requests() -> None:
    cache = ReplayCache()
    nonce = "n" * 24
    for who in (GM0, gm("gm1")):
        verify(signed(who=who, nonce=nonce), "POST", "/v1/launch", BODY, keyring(), NOW, cache)


def test_replay_cache_forgets_expired_nonces() -> None:
    cache = ReplayCache(max_age_s=10)
    for i in range(100):
        assert cache.admit("gm:gm0", f"nonce-{i:012d}", NOW + i, NOW + i) is None
    assert cache.entries <= 11


def test_replay_cache_is_bounded_and_never_admits_a_replay_when_full() -> None:
    cache = ReplayCache(max_age_s=30, max_per_sender=4)
    for i in range(4):
        assert cache.admit("gm:gm0", f"nonce-{i:012d}", NOW + i * 0.1, NOW + 1) is None
    # full: the oldest is forgotten, and nothing as old as it is admitted any more
    assert cache.admit("gm:gm0", "nonce-new-00000000", NOW + 0.5, NOW + 1) is None
    assert cache.entries == 4
    assert cache.admit("gm:gm0", "nonce-000000000000", NOW, NOW + 1) is Refusal.REPLAY_CACHE_FULL
    assert cache.admit("gm:gm0", "nonce-other-000000", NOW, NOW + 1) is Refusal.REPLAY_CACHE_FULL
    # one older than everything it holds cannot displace anything either
    assert cache.admit("gm:gm0", "nonce-old-00000000", NOW + 0.05, NOW + 1) is not None
    # remembered ones are still refused as replays
    assert cache.admit("gm:gm0", "nonce-000000000003", NOW + 0.3, NOW + 1) is Refusal.REPLAYED
    # another sender has its own budget
    assert cache.admit("gm:gm1", "nonce-000000000000", NOW, NOW + 1) is None
    for i in range(10_000):
        cache.admit("gm:gm0", f"flood-{i:012d}", NOW + 1 + i * 1e-4, NOW + 2)
    assert cache.entries <= 4 + 1


def test_replay_cache_refuses_bad_configuration() -> None:
    for kwargs in ({"max_age_s": 0}, {"max_future_s": -1}, {"max_per_sender": 0}):
        with pytest.raises(ValueError, match="need"):
            ReplayCache(**kwargs)


def test_nothing_unauthenticated_reaches_the_replay_cache() -> None:
    cache = ReplayCache()
    for i in range(50):
        h = signed(nonce=f"forged-nonce-{i:08d}")
        h[HEADER_SIGNATURE] = "0" * 64
        assert refusal(h, cache=cache) == Refusal.BAD_SIGNATURE
    assert cache.entries == 0


def test_sign_refuses_bad_input() -> None:
    key = signing_key(SECRET, GM0, LM0)
    with pytest.raises(ValueError, match="method"):
        sign("GET POST", "/x", b"", GM0, key, NOW)
    with pytest.raises(ValueError, match="path"):
        sign("POST", "v1/launch", b"", GM0, key, NOW)
    with pytest.raises(ValueError, match="path"):
        sign("POST", "/v1\r\nX: y", b"", GM0, key, NOW)
    with pytest.raises(ValueError, match="nonce"):
        sign("POST", "/x", b"", GM0, key, NOW, "tiny")


# ------------------------------------------------------------ responses
def test_signed_responses_are_bound_to_their_request() -> None:
    req = signed(nonce="request-nonce-0001")
    answer = b"\x81\xa2ok\xc3"
    key_back = signing_key(SECRET, LM0, GM0)
    h = sign_response(200, answer, req[HEADER_NONCE], LM0, key_back, NOW)
    verify_response(h, 200, answer, "request-nonce-0001", LM0, key_back, NOW + 1)

    def reason(**change: object) -> str:
        args: dict[str, object] = {
            "headers": h,
            "status": 200,
            "body": answer,
            "request_nonce": "request-nonce-0001",
            "expected": LM0,
            "key": key_back,
            "now": NOW + 1,
        }
        args.update(change)
        with pytest.raises(Unauthorized) as exc:
            verify_response(**args)  # type: ignore[arg-type]
        return exc.value.reason

    assert reason(status=409) == Refusal.BAD_SIGNATURE
    assert reason(body=b"\x81\xa2ok\xc2") == Refusal.BODY_DIGEST
    assert reason(request_nonce="request-nonce-0002") == Refusal.REPLAYED
    assert reason(expected=lm("lm1")) == Refusal.UNKNOWN_IDENTITY
    assert reason(now=NOW + 60) == Refusal.STALE
    # a response does not pass as a request with the same key, nor the reverse
    assert reason(
        headers=sign("POST", "/200", answer, LM0, key_back, NOW, "request-nonce-0001")
    ) == (Refusal.BAD_SIGNATURE)


# --------------------------------------------------------------- policy
@pytest.mark.parametrize(
    ("caller", "service", "method", "path"),
    [
        (gm("gm0"), lm("lm0"), "POST", "/v1/launch"),
        (gm("gm1"), lm("lm0"), "POST", "/v1/preempt"),
        (gm("gm0"), lm("lm1"), "POST", "/v1/snapshot"),
        (gm("gm1"), lm("lm1"), "POST", "/v1/keep-ends"),
        (workers("lm0"), lm("lm0"), "POST", "/v1/worker-report"),
        (workers("lm0"), lm("lm0"), "POST", "/v1/worker-heartbeat"),
        (workers("lm1"), lm("lm1"), "POST", "/v1/register"),
        (lm("lm0"), workers("lm0"), "POST", "/v1/start"),
        (lm("lm0"), workers("lm0"), "POST", "/v1/stop"),
        (OPERATOR, gm("gm0"), "GET", "/v1/state"),
        (OPERATOR, lm("lm0"), "GET", "/metrics"),
        (OPERATOR, workers("lm0"), "POST", "/v1/ping"),
        (OPERATOR, lm("lm0"), "GET", "/v1/state?verbose=1"),
    ],
)
def test_the_policy_allows_exactly_the_listed_calls(
    caller: Identity, service: Identity, method: str, path: str
) -> None:
    assert may_call(caller, service, method, path)
    authorize(caller, service, method, path)


@pytest.mark.parametrize(
    ("caller", "service", "method", "path"),
    [
        (workers("lm0"), lm("lm1"), "POST", "/v1/worker-report"),  # another LM's pool
        (workers("lm0"), lm("lm0"), "POST", "/v1/launch"),  # a pool launching
        (user("alice"), lm("lm0"), "POST", "/v1/keep-ends"),  # only GMs keep their jobs' ends
        (workers("lm0"), lm("lm0"), "POST", "/v1/keep-ends"),
        (lm("lm1"), workers("lm0"), "POST", "/v1/start"),  # another LM's pool
        (gm("gm0"), workers("lm0"), "POST", "/v1/start"),  # a GM straight to workers
        (user("alice"), lm("lm0"), "POST", "/v1/launch"),
        (user("alice"), gm("gm0"), "GET", "/v1/state"),
        (gm("gm0"), lm("lm0"), "GET", "/v1/state"),  # state pages are the operator's
        (gm("gm0"), lm("lm0"), "GET", "/v1/launch"),  # wrong method
        (lm("lm0"), gm("gm0"), "POST", "/v1/launch"),
        (OPERATOR, lm("lm0"), "POST", "/v1/launch"),  # the operator reads, it does not place
        (gm("gm0"), lm("lm0"), "POST", "/v1/unknown"),
    ],
)
def test_the_policy_refuses_everything_else(
    caller: Identity, service: Identity, method: str, path: str
) -> None:
    assert not may_call(caller, service, method, path)
    with pytest.raises(Unauthorized) as exc:
        authorize(caller, service, method, path)
    assert exc.value.reason == Refusal.FORBIDDEN


def test_keyrings_hold_only_the_policy_callers() -> None:
    assert callers_of(lm("lm0"), PARTIES) == sorted(
        [OPERATOR, gm("gm0"), gm("gm1"), workers("lm0")]
    )
    assert callers_of(workers("lm1"), PARTIES) == sorted([OPERATOR, lm("lm1")])
    assert callers_of(gm("gm0"), PARTIES) == [OPERATOR]
    assert all(r.paths and r.methods and r.services for r in ACCESS_POLICY)


def test_health_is_the_only_public_endpoint() -> None:
    assert is_public("GET", "/health")
    assert is_public("get", "/health?x")
    assert not is_public("POST", "/health")
    assert not is_public("GET", "/v1/state")
