"""Signed internal HTTP calls, the replay cache, and who may call which endpoint.

Guarantees of ``verify`` (it returns the caller's identity or raises
``Unauthorized`` with one machine-readable reason per failure):

* the caller is in the receiver's keyring (``unknown_identity``) and holds the
  key of the channel caller -> receiver: an HMAC-SHA256 over the method, the raw
  path with its query, the identity, the timestamp, the nonce and the body's
  SHA-256 (``bad_signature``); the body is the one that was signed
  (``body_digest_mismatch``);
* the request is fresh: its timestamp is at most ``max_age_s`` old and at most
  ``max_future_s`` ahead (``stale_timestamp``, ``future_timestamp``), and its
  nonce was not seen before from that caller (``replayed_nonce``);
* memory stays bounded: the replay cache keeps a nonce only while its timestamp
  is acceptable, and at most ``max_per_sender`` per caller -- when full it
  forgets the oldest and refuses anything not newer than it
  (``replay_cache_full``), so it never lets a replay through to save space.

* the request is bound to the receiver's incarnation (``check_incarnation``): a
  service's call names the process it was meant for (``X-Megha-Incarnation``, MAC-ed),
  which a restarted or standby process refuses (``wrong_incarnation``, in a signed
  answer carrying its own): the replay cache is per process, so a launch captured in
  the last 30 s was taken again after a restart or a fail-over.  The operator's calls
  (reads and pings only, by ``ACCESS_POLICY``) are not bound.

Any reason other than ``missing_credentials``, ``malformed_credentials``,
``unknown_identity`` and ``bad_signature`` implies the request was really made
by that identity (the MAC is checked first), which is what a log wants to say.

A server need not read a body to refuse a request: ``verify_headers`` checks
everything but the body's digest (the MAC covers the digest the caller claims,
not the body itself), and records nothing; ``verify_body`` then checks the
digest and only then records the nonce.  ``verify`` is the two in a row.

Keys are per channel (``Secret.channel_key(sender, receiver, "http")``): an LM's
worker pool can check the LM's calls to it, yet cannot sign as that LM to anyone.
Responses are signed too (``sign_response``), bound to the request's nonce, with the
answering process's incarnation (how a caller learns it).

``ACCESS_POLICY`` is the table of who may call what; ``authorize`` applies it.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import hmac
import itertools
import math
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from common.errors import Unauthorized, ValidationError
from security.identity import Identity, Role
from security.secret import KeySource

PURPOSE = "http"
HEADER_IDENTITY = "X-Megha-Identity"
HEADER_TIMESTAMP = "X-Megha-Timestamp"
"""Milliseconds since the epoch, decimal."""
HEADER_NONCE = "X-Megha-Nonce"
HEADER_DIGEST = "X-Megha-Content-SHA256"
HEADER_SIGNATURE = "X-Megha-Signature"
SIGNED_HEADERS = (HEADER_IDENTITY, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_DIGEST, HEADER_SIGNATURE)
HEADER_INCARNATION = "X-Megha-Incarnation"
"""On a request: the incarnation of the receiver it is meant for; on an answer: the
answering process's own.  MAC-ed with the rest; absent means none."""

DEFAULT_MAX_AGE_S = 30.0
DEFAULT_MAX_FUTURE_S = 5.0
DEFAULT_MAX_PER_SENDER = 65_536

_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MILLIS = re.compile(r"[0-9]{1,15}")
_METHOD = re.compile(r"[A-Z]{1,16}")
_INCARNATION = re.compile(r"[0-9a-f]{16,32}")

Keyring = Mapping[Identity, bytes]
"""For one receiver: each caller it accepts -> the key of the channel caller -> receiver."""


class Refusal(StrEnum):
    """Why a signed call (or a call to an endpoint) was refused: ``Unauthorized.reason``."""

    MISSING = "missing_credentials"
    MALFORMED = "malformed_credentials"
    UNKNOWN_IDENTITY = "unknown_identity"
    BAD_SIGNATURE = "bad_signature"
    BODY_DIGEST = "body_digest_mismatch"
    STALE = "stale_timestamp"
    FUTURE = "future_timestamp"
    REPLAYED = "replayed_nonce"
    REPLAY_CACHE_FULL = "replay_cache_full"
    FORBIDDEN = "forbidden_endpoint"
    WRONG_INCARNATION = "wrong_incarnation"


# ------------------------------------------------------------------ keys
def signing_key(secret: KeySource, sender: Identity, receiver: Identity) -> bytes:
    """The key ``sender`` signs its calls to ``receiver`` with (and ``receiver`` its answers
    to ``sender`` with ``signing_key(secret, receiver, sender)``)."""
    return secret.channel_key(sender, receiver, PURPOSE)


def keyring_for(
    secret: KeySource, receiver: Identity, senders: Iterable[Identity]
) -> dict[Identity, bytes]:
    """The keyring ``receiver`` verifies calls from ``senders`` with."""
    return {s: signing_key(secret, s, receiver) for s in senders}


# ------------------------------------------------------------- signing
def new_incarnation() -> str:
    """A process's incarnation id: random, made once per process."""
    return secrets.token_hex(8)


def _canonical(
    kind: str, method: str, path: str, identity: str, millis: str, nonce: str, digest: str,
    incarnation: str,
) -> bytes:  # fmt: skip
    # Every field is newline-free (validated or hex), so the joined string is unambiguous.
    return "\n".join(
        ("megha-http-v2", kind, method, path, identity, millis, nonce, digest, incarnation)
    ).encode()


_hmac_new: Any = None
"""CPython's OpenSSL HMAC (``_hashlib``): copied from one keyed per key, the key's pads
are made once, not per MAC (None: a Python without it, ``hmac.new`` each time)."""
with contextlib.suppress(ImportError):
    from _hashlib import hmac_new as _hmac_new

_KEYED: dict[bytes, Any] = {}
"""An HMAC-SHA256 keyed with each key met, by key (a service holds a handful)."""
KEYED_MAX = 256
"""Keys ``_KEYED`` holds at most (more are keyed each time: memory stays bounded)."""


def _mac(key: bytes, message: bytes) -> str:
    keyed = _KEYED.get(key)
    if keyed is None:
        if _hmac_new is None:
            return hmac.new(key, message, hashlib.sha256).hexdigest()
        keyed = _hmac_new(key, digestmod="sha256")
        if len(_KEYED) < KEYED_MAX:
            _KEYED[key] = keyed
    mac = keyed.copy()
    mac.update(message)
    hexdigest: str = mac.hexdigest()
    return hexdigest


def _check_path(path: str) -> None:
    if not path.startswith("/") or "\r" in path or "\n" in path:
        raise ValueError(f"not a raw request path: {path[:80]!r}")


_nonces: tuple[str, Iterator[int]] | None = None


def _new_nonces() -> tuple[str, Iterator[int]]:
    """A process's nonces start anew: a random prefix and a counter."""
    global _nonces
    _nonces = (secrets.token_urlsafe(12), itertools.count())
    return _nonces


os.register_at_fork(after_in_child=_new_nonces)


def new_nonce() -> str:
    """Unique per request: a random prefix per process (made anew in a forked child)
    and a counter.  A nonce need not be secret or unpredictable (the MAC covers it),
    only never repeated; drawing 18 random bytes per request cost ~2% of a GM's CPU
    (and asking the pid each time, a system call, ~1% of a hop)."""
    prefix, counter = _nonces or _new_nonces()
    return f"{prefix}{next(counter):x}"


_INCARNATIONS_SEEN: set[str] = set()
"""Incarnations signed for before, each found well-formed then (a process signs for its
own and its peers' current ones: a handful)."""
INCARNATIONS_SEEN_MAX = 1024
"""Incarnations ``_INCARNATIONS_SEEN`` holds at most (more are matched each time)."""


_WRITTEN: dict[Identity, str] = {}
"""``str`` of each identity signed for (a process signs as itself, and asks a handful):
written once, not per call (``Identity.__str__`` reads its role's enum value)."""
WRITTEN_MAX = 1024
"""Identities ``_WRITTEN`` holds at most (more are written each time)."""


def _written(identity: Identity) -> str:
    who = _WRITTEN.get(identity)
    if who is None:
        who = str(identity)
        if len(_WRITTEN) < WRITTEN_MAX:
            _WRITTEN[identity] = who
    return who


def _sign(
    kind: str,
    method: str,
    path: str,
    body: bytes,
    identity: Identity,
    key: bytes,
    now: float,
    nonce: str,
    incarnation: str,
    *,
    checked: bool = False,
) -> dict[str, str]:
    if not checked and not _NONCE.fullmatch(nonce):
        raise ValueError("a nonce is 16-64 characters of [A-Za-z0-9_-]")
    if incarnation and incarnation not in _INCARNATIONS_SEEN:
        if not _INCARNATION.fullmatch(incarnation):
            raise ValueError("an incarnation is 16-32 lower hex digits")
        if len(_INCARNATIONS_SEEN) < INCARNATIONS_SEEN_MAX:
            _INCARNATIONS_SEEN.add(incarnation)
    millis = str(math.floor(now * 1000))
    digest = hashlib.sha256(body).hexdigest()
    who = _WRITTEN.get(identity) or _written(identity)
    canonical = _canonical(kind, method, path, who, millis, nonce, digest, incarnation)
    out = {
        HEADER_IDENTITY: who,
        HEADER_TIMESTAMP: millis,
        HEADER_NONCE: nonce,
        HEADER_DIGEST: digest,
        HEADER_SIGNATURE: _mac(key, canonical),
    }
    if incarnation:
        out[HEADER_INCARNATION] = incarnation
    return out


_CALLS_CHECKED: set[tuple[str, str]] = set()
"""(method, path) signed before, both found well-formed then, the method upper case (a
service calls a handful of routes): checked once each, not per call."""
CALLS_CHECKED_MAX = 256
"""Calls ``_CALLS_CHECKED`` holds at most (more are checked each time)."""


def _check_call(method: str, path: str) -> str:
    """``method`` upper case, once it and ``path`` are found well-formed."""
    upper = method.upper()
    if not _METHOD.fullmatch(upper):
        raise ValueError(f"bad HTTP method {upper!r}")
    _check_path(path)
    if upper == method and len(_CALLS_CHECKED) < CALLS_CHECKED_MAX:
        _CALLS_CHECKED.add((method, path))
    return upper


def sign(
    method: str,
    path: str,
    body: bytes,
    identity: Identity,
    key: bytes,
    now: float,
    nonce: str | None = None,
    incarnation: str = "",
) -> dict[str, str]:
    """Headers that prove ``identity`` sends this request now, to the receiver's
    incarnation ``incarnation`` (none: ``""``).

    ``path`` is the raw path with its query string, exactly as sent (aiohttp:
    ``URL.raw_path_qs`` on the client, ``request.raw_path`` on the server)."""
    if (method, path) not in _CALLS_CHECKED:
        method = _check_call(method, path)
    if nonce:
        return _sign("request", method, path, body, identity, key, now, nonce, incarnation)
    return _sign(  # a nonce of ``new_nonce`` is well-formed by construction
        "request", method, path, body, identity, key, now, new_nonce(), incarnation, checked=True
    )


def _refuse(reason: Refusal, message: str) -> Unauthorized:
    return Unauthorized(message, reason=reason.value)


_LOW = {h: h.lower() for h in (*SIGNED_HEADERS, HEADER_INCARNATION)}
"""Our headers' lower-case names, made once (not per request)."""
_SIGNED_LOW = frozenset(_LOW[h] for h in SIGNED_HEADERS)
_INCARNATION_LOW = _LOW[HEADER_INCARNATION]
_OURS = _SIGNED_LOW | {_INCARNATION_LOW}


class Fields(dict[str, str]):
    """Header fields by their lower-case names, each name once: what a parser that
    reads each name once makes (``runtime.fastpath``'s and ``runtime.h1``'s, which give
    a head with a name twice to a multidict instead).  Its fields are looked up as they
    are, neither scanned nor lower-cased again."""

    __slots__ = ()


def _our_headers(headers: Mapping[str, str]) -> tuple[Mapping[str, str], bool]:
    """Our headers, by lower-case name, and whether the incarnation came twice (refused
    after the other fields' checks, as ``_incarnation``).  A duplicated signed header is
    refused (a proxy and this code could otherwise read different copies).  ``Fields``
    are ours already (no name twice); a multidict (aiohttp's headers) is asked for our
    names only; any other mapping is read in one pass (each name lower-cased once)."""
    if type(headers) is Fields:
        if not headers.keys() >= _SIGNED_LOW:
            missing = [h for h in SIGNED_HEADERS if _LOW[h] not in headers]
            raise _refuse(Refusal.MISSING, f"missing {', '.join(missing)}")
        return headers, False
    getall = getattr(headers, "getall", None)
    asked = None if getall is None else _asked(getall)
    found, incarnation_twice = _scan(headers) if asked is None else asked
    if len(found) - (_INCARNATION_LOW in found) < len(SIGNED_HEADERS):
        missing = [h for h in SIGNED_HEADERS if _LOW[h] not in found]
        raise _refuse(Refusal.MISSING, f"missing {', '.join(missing)}")
    return found, incarnation_twice


_SIGNED_NAMES = tuple((h, _LOW[h]) for h in SIGNED_HEADERS)


def _asked(getall: Callable[[str, tuple[()]], Sequence[str]]) -> tuple[dict[str, str], bool] | None:
    """``_our_headers`` of a multidict, by its ``getall``; None if a signed header came
    twice (refused by ``_scan``, in its words: the name as the request wrote it)."""
    found: dict[str, str] = {}
    for name, low in _SIGNED_NAMES:
        values = getall(name, ())
        if values:
            if len(values) > 1:
                return None
            found[low] = values[0]
    values = getall(HEADER_INCARNATION, ())
    if values:
        found[_INCARNATION_LOW] = values[0]
    return found, len(values) > 1


def _scan(headers: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """``_our_headers`` of a mapping that is not a multidict: one pass over it."""
    found: dict[str, str] = {}
    incarnation_twice = False
    for name, value in headers.items():
        low = name.lower()
        if low in found:
            if low != _INCARNATION_LOW:
                raise _refuse(Refusal.MALFORMED, f"header {name} given twice")
            incarnation_twice = True
        elif low in _OURS:
            found[low] = value
    return found, incarnation_twice


class Claim(NamedTuple):
    """What a request's signature headers claim (well-formed; proven only by the checks
    of ``verify_headers`` and ``verify_body``).  A tuple: as immutable as a frozen
    dataclass, made in a fifth of its time (two per hop)."""

    identity: Identity
    millis: str
    nonce: str
    digest: str
    signature: str
    incarnation: str = ""
    who: str = ""
    """``identity`` as the header wrote it (``str(identity)``; "": not kept)."""

    @property
    def caller(self) -> str:
        """``str(identity)``, without making it again."""
        return self.who or str(self.identity)


_new_claim = tuple.__new__
"""``Claim(...)`` without the generated ``__new__``'s Python call (every field given)."""


def _incarnation(h: Mapping[str, str], twice: bool) -> str:
    if twice:
        raise _refuse(Refusal.MALFORMED, f"header {HEADER_INCARNATION} given twice")
    value = h.get(_INCARNATION_LOW, "")
    if value and not _INCARNATION.fullmatch(value):
        raise _refuse(Refusal.MALFORMED, f"{HEADER_INCARNATION} must be 16-32 lower hex digits")
    return value


_PARSED: dict[str, Identity] = {}
"""Identities parsed from headers, by their text (a service hears from a handful)."""
PARSED_MAX = 1024
"""Identities ``_PARSED`` holds at most (more are parsed each time: memory stays bounded
whatever names unproven callers send)."""


def _identity(text: str) -> Identity:
    """The identity written ``text`` (``str`` of it gives ``text`` back)."""
    identity = _PARSED.get(text)
    if identity is None:
        try:
            identity = Identity.parse(text)
        except ValidationError as exc:
            raise _refuse(Refusal.MALFORMED, f"bad {HEADER_IDENTITY}: {exc}") from None
        if len(_PARSED) < PARSED_MAX:
            _PARSED[text] = identity
    return identity


_IDENTITY_LOW = _LOW[HEADER_IDENTITY]
_TIMESTAMP_LOW = _LOW[HEADER_TIMESTAMP]
_NONCE_LOW = _LOW[HEADER_NONCE]
_DIGEST_LOW = _LOW[HEADER_DIGEST]
_SIGNATURE_LOW = _LOW[HEADER_SIGNATURE]


def _parse(headers: Mapping[str, str]) -> Claim:
    h, incarnation_twice = _our_headers(headers)
    who = h[_IDENTITY_LOW]
    identity = _PARSED.get(who) or _identity(who)
    millis = h[_TIMESTAMP_LOW]
    nonce = h[_NONCE_LOW]
    digest = h[_DIGEST_LOW]
    signature = h[_SIGNATURE_LOW]
    if not _MILLIS.fullmatch(millis):
        raise _refuse(Refusal.MALFORMED, f"{HEADER_TIMESTAMP} must be decimal milliseconds")
    if not _NONCE.fullmatch(nonce):
        raise _refuse(Refusal.MALFORMED, f"{HEADER_NONCE} must be 16-64 of [A-Za-z0-9_-]")
    if not _HEX64.fullmatch(digest) or not _HEX64.fullmatch(signature):
        raise _refuse(Refusal.MALFORMED, f"{HEADER_DIGEST} and {HEADER_SIGNATURE} are lower hex")
    incarnation = _incarnation(h, incarnation_twice)
    return _new_claim(Claim, (identity, millis, nonce, digest, signature, incarnation, who))


def _check_mac(claim: Claim, kind: str, method: str, path: str, key: bytes) -> None:
    expected = _mac(
        key,
        _canonical(
            kind, method.upper(), path, claim.caller, claim.millis, claim.nonce,
            claim.digest, claim.incarnation,
        ),
    )  # fmt: skip
    if not hmac.compare_digest(expected, claim.signature):
        raise _refuse(Refusal.BAD_SIGNATURE, f"bad signature for {claim.identity}")


def _check_digest(claim: Claim, body: bytes) -> None:
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), claim.digest):
        raise _refuse(Refusal.BODY_DIGEST, f"the body is not the one {claim.identity} signed")


def _authenticate(claim: Claim, kind: str, method: str, path: str, body: bytes, key: bytes) -> None:
    _check_mac(claim, kind, method, path, key)
    _check_digest(claim, body)


def verify_headers(
    headers: Mapping[str, str],
    method: str,
    path: str,
    keyring: Keyring,
    now: float,
    replay_cache: ReplayCache,
) -> Claim:
    """Everything ``verify`` checks without the body: the headers are there and
    well-formed, the caller is known and signed them (method, path, timestamp, nonce
    and the digest it claims), the timestamp is fresh and the nonce unseen.  Records
    nothing: ``verify_body`` must follow, with the body."""
    claim = _parse(headers)
    key = keyring.get(claim.identity)
    if key is None:
        raise _refuse(Refusal.UNKNOWN_IDENTITY, f"{claim.identity} may not call this service")
    _check_mac(claim, "request", method, path, key)
    refusal = replay_cache.check(claim.caller, claim.nonce, int(claim.millis) / 1000, now)
    if refusal is not None:
        raise _refuse(refusal, f"{refusal.value} from {claim.identity}")
    return claim


def verify_body(claim: Claim, body: bytes, now: float, replay_cache: ReplayCache) -> Identity:
    """The caller of a request whose headers passed ``verify_headers``, once ``body`` is
    the one it signed; only then is its nonce recorded (a request with another body
    uses none up), and freshness and replays are checked again (the body took time,
    and a copy of the request may have been admitted meanwhile)."""
    _check_digest(claim, body)
    refusal = replay_cache.admit(claim.caller, claim.nonce, int(claim.millis) / 1000, now)
    if refusal is not None:
        raise _refuse(refusal, f"{refusal.value} from {claim.identity}")
    return claim.identity


def verify(
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: bytes,
    keyring: Keyring,
    now: float,
    replay_cache: ReplayCache,
) -> Identity:
    """The identity that signed this request; ``Unauthorized`` (with a ``Refusal``
    reason) if it is not signed, not by a known caller, not fresh, or replayed."""
    claim = verify_headers(headers, method, path, keyring, now, replay_cache)
    return verify_body(claim, body, now, replay_cache)


def check_incarnation(caller: Identity, claim: Claim, mine: str) -> None:
    """Refuse a service's call meant for another incarnation than ``mine`` (or for none):
    a replay after a restart or a fail-over (``wrong_incarnation``).  The operator's
    calls are not bound (it may only read and ping)."""
    if claim.incarnation == mine or caller.role is Role.OPERATOR:
        return
    meant = claim.incarnation or "none"
    raise _refuse(
        Refusal.WRONG_INCARNATION, f"{caller}'s call is for incarnation {meant}, not {mine}"
    )


def sign_response(
    status: int, body: bytes, request_nonce: str, identity: Identity, key: bytes, now: float,
    incarnation: str = "",
) -> dict[str, str]:  # fmt: skip
    """Headers proving ``identity`` (its incarnation ``incarnation``) answered, with
    ``status`` and ``body``, the request whose nonce was ``request_nonce``; ``key`` is
    ``signing_key(secret, identity, caller)``.  A response can never pass as a request,
    nor the reverse (a distinct kind is MAC-ed)."""
    return _sign(
        "response", "RESPONSE", f"/{status}", body, identity, key, now, request_nonce, incarnation
    )


def verify_response(
    headers: Mapping[str, str],
    status: int,
    body: bytes,
    request_nonce: str,
    expected: Identity,
    key: bytes,
    now: float,
    *,
    max_age_s: float = DEFAULT_MAX_AGE_S,
) -> str:
    """Check an answer is ``expected``'s, to our request, unchanged, and recent; the
    answering process's incarnation (``""``: none given)."""
    claim = _parse(headers)
    if claim.identity != expected:
        raise _refuse(Refusal.UNKNOWN_IDENTITY, f"answer from {claim.identity}, not {expected}")
    if claim.nonce != request_nonce:
        raise _refuse(Refusal.REPLAYED, "the answer is to another request")
    _authenticate(claim, "response", "RESPONSE", f"/{status}", body, key)
    age = now - int(claim.millis) / 1000
    if age > max_age_s:
        raise _refuse(Refusal.STALE, f"answer {age:.1f} s old")
    return claim.incarnation


# -------------------------------------------------------- replay cache
@dataclass(slots=True)
class _Seen:
    nonces: dict[str, float] = field(default_factory=dict)
    heap: list[tuple[float, str]] = field(default_factory=list)
    floor: float = -math.inf
    """Nothing at or before this timestamp is accepted: a nonce of it may be forgotten."""


class ReplayCache:
    """Nonces of accepted requests while their timestamps are acceptable, per sender.

    Holds the freshness window too: a request is fresh if
    ``now - max_age_s <= timestamp <= now + max_future_s``; its nonce is kept
    until its timestamp leaves the window, after which the timestamp check
    refuses a replay by itself.  Memory: at most ``max_per_sender`` nonces per
    sender, and only senders that passed the MAC check reach the cache."""

    def __init__(
        self,
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        max_future_s: float = DEFAULT_MAX_FUTURE_S,
        max_per_sender: int = DEFAULT_MAX_PER_SENDER,
    ) -> None:
        if max_age_s <= 0 or max_future_s < 0 or max_per_sender < 1:
            raise ValueError("need max_age_s > 0, max_future_s >= 0, max_per_sender >= 1")
        self.max_age_s = max_age_s
        self.max_future_s = max_future_s
        self.max_per_sender = max_per_sender
        self._senders: dict[str, _Seen] = {}

    @property
    def entries(self) -> int:
        """Nonces held now, over all senders."""
        return sum(len(s.nonces) for s in self._senders.values())

    def check(self, sender: str, nonce: str, ts: float, now: float) -> Refusal | None:
        """What ``admit`` would refuse this request for, as far as can be told without
        recording it (a full cache is ``admit``'s alone to judge); changes nothing."""
        if ts < now - self.max_age_s:
            return Refusal.STALE
        if ts > now + self.max_future_s:
            return Refusal.FUTURE
        seen = self._senders.get(sender)
        if seen is None:
            return None
        if ts <= seen.floor:
            return Refusal.REPLAY_CACHE_FULL
        if nonce in seen.nonces:
            return Refusal.REPLAYED
        return None

    def admit(self, sender: str, nonce: str, ts: float, now: float) -> Refusal | None:
        """Record ``nonce``; ``None`` if the request is fresh and new, else why not."""
        if ts < now - self.max_age_s:
            return Refusal.STALE
        if ts > now + self.max_future_s:
            return Refusal.FUTURE
        seen = self._senders.get(sender)
        if seen is None:
            seen = self._senders[sender] = _Seen()
        heap = seen.heap
        while heap and heap[0][0] < now - self.max_age_s:
            _, old = heapq.heappop(heap)
            del seen.nonces[old]
        if ts <= seen.floor:
            return Refusal.REPLAY_CACHE_FULL
        if nonce in seen.nonces:
            return Refusal.REPLAYED
        if len(seen.nonces) >= self.max_per_sender:
            if ts <= heap[0][0]:
                return Refusal.REPLAY_CACHE_FULL
            oldest, old = heapq.heappop(heap)
            del seen.nonces[old]
            seen.floor = max(seen.floor, oldest)
        seen.nonces[nonce] = ts
        heapq.heappush(heap, (ts, nonce))
        return None


# -------------------------------------------------------- access policy
ANY_SERVICE = frozenset({Role.GM, Role.LM, Role.WORKERS})
ADMIN_PATHS = frozenset({"/v1/state", "/v1/ping", "/metrics", "/v1/launches"})
GM_INSPECT_PATHS = frozenset({"/v1/inspect", "/v1/tasks/{user}/{task_id}", "/v1/find/{id}"})
"""What an operator asks a GM: its users' queues, why one task waits, and what it
knows under a task or job id."""
LM_INSPECT_PATHS = frozenset({"/v1/inspect"})
"""What an operator asks an LM: its partitions, free bits and repartitions."""


@dataclass(frozen=True, slots=True)
class Rule:
    """Callers of role ``caller`` may call ``methods`` x ``paths`` on services of a role in
    ``services``; with ``same_name``, only the service's own partner (``workers:lm0`` for
    ``lm:lm0`` and back)."""

    services: frozenset[Role]
    methods: frozenset[str]
    paths: frozenset[str]
    """Exact paths, or templates whose ``{name}`` segments match any one segment."""
    caller: Role
    same_name: bool = False

    def allows(self, route: str) -> bool:
        return route in self.paths or any("{" in p and _fits_template(p, route) for p in self.paths)


def _fits_template(template: str, route: str) -> bool:
    want, have = template.split("/"), route.split("/")
    return len(want) == len(have) and all(
        h != "" if w.startswith("{") and w.endswith("}") else w == h
        for w, h in zip(want, have, strict=True)
    )


def _rule(
    services: Iterable[Role],
    methods: str,
    paths: Iterable[str],
    caller: Role,
    *,
    same_name: bool = False,
) -> Rule:
    return Rule(
        frozenset(services), frozenset(methods.split()), frozenset(paths), caller, same_name
    )


ACCESS_POLICY: tuple[Rule, ...] = (
    # GMs ask any LM to launch, preempt, for a fresh snapshot, to keep a job's ends, to
    # stop the tasks of a cancelled job or what they placed for a user whose token was
    # revoked, and to reserve, commit and release a gang's holds.
    _rule(
        [Role.LM],
        "POST",
        [
            "/v1/launch",
            "/v1/preempt",
            "/v1/snapshot",
            "/v1/keep-ends",
            "/v1/cancel",
            "/v1/stop-user",
        ],
        Role.GM,
    ),
    _rule([Role.LM], "POST", ["/v1/reserve", "/v1/commit-gang", "/v1/release-gang"], Role.GM),
    # An LM's worker pool reports to, heartbeats and registers with its own LM only.
    _rule(
        [Role.LM],
        "POST",
        ["/v1/worker-report", "/v1/worker-heartbeat", "/v1/register"],
        Role.WORKERS,
        same_name=True,
    ),
    # An LM starts and stops tasks on its own worker pool only.
    _rule([Role.WORKERS], "POST", ["/v1/start", "/v1/stop"], Role.LM, same_name=True),
    # The operator reads state and metrics and pings every service.
    _rule(ANY_SERVICE, "GET POST", ADMIN_PATHS, Role.OPERATOR),
    # ... and inspects GMs (queues, one task's timeline, a task or job by id) and LMs
    # (partitions).
    _rule([Role.GM], "GET", GM_INSPECT_PATHS, Role.OPERATOR),
    _rule([Role.LM], "GET", LM_INSPECT_PATHS, Role.OPERATOR),
)
"""Who may call what: anything not allowed here is refused (``forbidden_endpoint``)."""

PUBLIC_ENDPOINTS = frozenset({("GET", "/health"), ("GET", "/metrics")})
"""Answered without credentials: liveness probes and Prometheus scrapes (counters and
gauges; no task, user or key)."""


def is_public(method: str, path: str) -> bool:
    return (method.upper(), path.split("?", 1)[0]) in PUBLIC_ENDPOINTS


USER_API_PREFIX = "/api/"
"""The GMs' front door (``global_master.frontdoor``): users prove themselves there by
their tokens, not by service signatures; ``/openapi.json`` documents it."""


def is_user_api(method: str, path: str) -> bool:
    """Answered to users (token-checked by the handler), not to signed services."""
    route = path.split("?", 1)[0]
    return route.startswith(USER_API_PREFIX) or (method.upper(), route) == ("GET", "/openapi.json")


def may_call(caller: Identity, service: Identity, method: str, path: str) -> bool:
    """Does ``ACCESS_POLICY`` let ``caller`` call ``method path`` on ``service``?"""
    method, route = method.upper(), path.split("?", 1)[0]
    return any(
        caller.role == r.caller
        and service.role in r.services
        and method in r.methods
        and r.allows(route)
        and (not r.same_name or caller.name == service.name)
        for r in ACCESS_POLICY
    )


def authorize(caller: Identity, service: Identity, method: str, path: str) -> None:
    """Raise ``Unauthorized`` (``forbidden_endpoint``) unless ``caller`` may call this."""
    if not may_call(caller, service, method, path):
        raise _refuse(Refusal.FORBIDDEN, f"{caller} may not {method.upper()} {path} on {service}")


def callers_of(service: Identity, parties: Iterable[Identity]) -> list[Identity]:
    """Those of ``parties`` that ``ACCESS_POLICY`` lets call ``service`` at all: the
    senders of ``service``'s keyring."""
    return sorted(
        p
        for p in parties
        if any(
            p.role == r.caller
            and service.role in r.services
            and (not r.same_name or p.name == service.name)
            for r in ACCESS_POLICY
        )
    )
