"""Authenticated broker messages: LM state updates and task events.

A sender seals each message: AMQP headers carry its identity, the stream, an
epoch and a sequence number, and an HMAC-SHA256 over all of them and the body
under the sender's own key (``Secret.identity_key(sender, "amqp")``), or, for a
message to named receivers, one such HMAC per receiver, each under the key of the
channel ``sender>receiver`` (header ``x-megha-mac:<receiver>``).  An LM seals so: its
state updates go to every GM, each GM holds only the keys of the channels from the
LMs to itself, so a GM can check an LM's message but cannot make one another GM would
take (a shared sender key would let any GM forge LM updates to the others).

Guarantees of an ``Opener`` (one per receiver and stream):

* it accepts a message only if the MAC verifies under the *claimed* sender's
  key: nobody without that key -- a user, another LM, a worker pool -- can make
  a message pass as that sender's, whatever its body says (a forged
  ``StateUpdated`` with version 2**62 is dropped as ``bad_mac``);
* per sender, accepted ``(epoch, seq)`` pairs strictly increase: a replay, a
  duplicate or anything older than what it has accepted is dropped
  (``stale_epoch``, ``stale_seq``), so a recorded message cannot roll a view back.
  With a ``window`` of W, a sequence number up to W below the highest accepted (same
  epoch) is accepted too, once: a stream whose messages may be put back and come
  again behind later ones (task events) loses none, and still takes each at most once;
* a message sealed for one stream cannot be replayed on another (``wrong_stream``);
* every drop is counted by reason (``drops``); nothing raises on bad input.

What the receiver must still do: check that the decoded body names the
authenticated sender (an LM's update must be about that LM), and never requeue
a message it has opened unless it ``release``s it first (a stream with a window):
a redelivery would come back as seen, and be dropped.  A
sender must start each run with a larger epoch than any earlier run (the LM's
fencing epoch, or its start time in milliseconds) -- ``Sealer`` takes it as given.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from common.errors import ValidationError
from security.identity import Identity
from security.secret import KeySource

PURPOSE = "amqp"
HEADER_SENDER = "x-megha-sender"
HEADER_STREAM = "x-megha-stream"
HEADER_EPOCH = "x-megha-epoch"
HEADER_SEQ = "x-megha-seq"
HEADER_MAC = "x-megha-mac"
"""The MAC under the sender's own key; ``mac_header(receiver)`` names a receiver's."""
MAX_COUNTER = 2**63 - 1
"""Epochs and sequence numbers fit an AMQP signed 64-bit header value."""

_STREAM = re.compile(r"[a-z][a-z0-9._-]{0,63}")
_DECIMAL = re.compile(r"[0-9]{1,19}")
_HEX64 = re.compile(r"[0-9a-f]{64}")

HeaderValue = str | int
"""What ``seal`` puts in the headers (aio-pika sends ints as AMQP signed 64-bit)."""


class DropReason(StrEnum):
    MISSING = "missing_header"
    MALFORMED = "malformed_header"
    WRONG_STREAM = "wrong_stream"
    UNKNOWN_SENDER = "unknown_sender"
    BAD_MAC = "bad_mac"
    STALE_EPOCH = "stale_epoch"
    STALE_SEQ = "stale_seq"


def mac_header(receiver: Identity | None) -> str:
    """The header carrying the MAC for ``receiver`` (None: the sender's own key's)."""
    return HEADER_MAC if receiver is None else f"{HEADER_MAC}:{receiver}"


def sealing_key(secret: KeySource, sender: Identity, receiver: Identity | None = None) -> bytes:
    """``sender``'s own sealing key, or (``receiver`` given) the key of the channel
    ``sender>receiver``, which only those two hold."""
    if receiver is None:
        return secret.identity_key(sender, PURPOSE)
    return secret.channel_key(sender, receiver, PURPOSE)


def keyring_for(
    secret: KeySource, senders: Iterable[Identity], receiver: Identity | None = None
) -> dict[Identity, bytes]:
    """What a receiver opens messages of ``senders`` with (e.g. GM G: every LM's channel
    to G, ``receiver`` G)."""
    return {s: sealing_key(secret, s, receiver) for s in senders}


def _check_counter(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNTER:
        raise ValueError(f"{name} must be an int in 0..2**63-1, not {value!r}")


MAX_KEYED = 1024
"""Keys whose HMAC state (the key padded and hashed in) is kept (``_KEYED``); past this
many the lot is dropped and made again as needed."""
_KEYED: dict[bytes, hmac.HMAC] = {}


def _mac(key: bytes, sender: str, stream: str, epoch: int, seq: int, body: bytes) -> str:
    keyed = _KEYED.get(key)
    if keyed is None:
        if len(_KEYED) >= MAX_KEYED:
            _KEYED.clear()
        keyed = _KEYED[key] = hmac.new(key, digestmod=hashlib.sha256)
    h = keyed.copy()  # HMAC(key, head + body), without hashing the key in again
    h.update(f"megha-amqp-v1\n{sender}\n{stream}\n{epoch}\n{seq}\n".encode())
    h.update(body)
    return h.hexdigest()


def seal(
    body: bytes,
    sender: Identity,
    epoch: int,
    seq: int,
    key: bytes | Mapping[Identity, bytes],
    *,
    stream: str,
) -> dict[str, HeaderValue]:
    """The AMQP headers that authenticate ``body`` as ``sender``'s message ``(epoch, seq)``
    on ``stream`` (e.g. ``"state"`` or ``"events.gm0"``): one MAC under ``key``, or, given
    ``{receiver: channel key}``, one per receiver (``mac_header``)."""
    return _sealed(body, str(sender), epoch, seq, stream, _macs(stream, key))


def _macs(stream: str, key: bytes | Mapping[Identity, bytes]) -> tuple[tuple[str, bytes], ...]:
    """``stream`` checked, and each MAC's header and key: one under ``key``, or one per
    receiver of ``{receiver: channel key}``."""
    if not _STREAM.fullmatch(stream):
        raise ValueError(f"bad stream name {stream!r}")
    if isinstance(key, bytes):
        return ((HEADER_MAC, key),)
    if not key:
        raise ValueError("a seal for receivers needs at least one")
    return tuple((mac_header(r), k) for r, k in key.items())


def _sealed(
    body: bytes, who: str, epoch: int, seq: int, stream: str, macs: tuple[tuple[str, bytes], ...]
) -> dict[str, HeaderValue]:
    _check_counter("epoch", epoch)
    _check_counter("seq", seq)
    headers: dict[str, HeaderValue] = {
        HEADER_SENDER: who,
        HEADER_STREAM: stream,
        HEADER_EPOCH: epoch,
        HEADER_SEQ: seq,
    }
    for name, k in macs:
        headers[name] = _mac(k, who, stream, epoch, seq, body)
    return headers


MAX_PLANS = 256
"""(stream, receivers) a ``Sealer`` keeps worked out (an LM has a stream per GM and one
for its state); past this many, the others are worked out each time."""


class Sealer:
    """One sender's sealing state: its key (or its channel keys, by receiver), this run's
    epoch, the next sequence number."""

    def __init__(self, sender: Identity, key: bytes | Mapping[Identity, bytes], epoch: int) -> None:
        _check_counter("epoch", epoch)
        self.sender = sender
        self.epoch = epoch
        self._key = key if isinstance(key, bytes) else dict(key)
        self.seq = 0
        self._who = str(sender)
        self._plans: dict[
            tuple[str, tuple[Identity, ...] | None], tuple[tuple[str, bytes], ...]
        ] = {}
        """By stream and receivers: the stream checked, and each MAC's header and key
        (``seal``'s headers, worked out once: an LM seals every batch of events)."""

    def seal(
        self, body: bytes, stream: str, to: Iterable[Identity] | None = None
    ) -> dict[str, HeaderValue]:
        """Headers for the next message; every stream sees increasing numbers.  A sealer
        of channel keys seals for the receivers ``to`` (None: all it has keys for).
        The same headers as ``seal`` makes, with the stream and keys looked up once."""
        self.seq += 1
        receivers = None if to is None else tuple(to)
        macs = self._plans.get((stream, receivers))
        if macs is None:
            key = self._key
            if not isinstance(key, bytes) and receivers is not None:
                key = {r: key[r] for r in receivers}
            macs = _macs(stream, key)
            if len(self._plans) < MAX_PLANS:
                self._plans[(stream, receivers)] = macs
        return _sealed(body, self._who, self.epoch, self.seq, stream, macs)


@dataclass(frozen=True, slots=True)
class Opened:
    """A message that passed: who sent it, and its place in the sender's sequence."""

    sender: Identity
    epoch: int
    seq: int


@dataclass(frozen=True, slots=True)
class Dropped:
    reason: DropReason
    detail: str


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _counter(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNTER else None
    text = _text(value)
    if text is None or not _DECIMAL.fullmatch(text):
        return None
    n = int(text)
    return n if n <= MAX_COUNTER else None


def authenticate(
    headers: Mapping[str, object] | None,
    body: bytes,
    keyring: Mapping[Identity, bytes],
    stream: str,
    receiver: Identity | None = None,
) -> Opened | Dropped:
    """Is ``body`` sealed, for ``stream``, by a sender of ``keyring``?  No ordering: a
    message that may come again or out of order (a returned task) is judged on its
    own; ``Opener`` adds the ordering of a stream.  With ``receiver``, the MAC checked
    is the one for it (``keyring`` then holds the senders' channel keys to it)."""
    h = headers or {}
    mac_name = mac_header(receiver)
    missing = [
        n for n in (HEADER_SENDER, HEADER_STREAM, HEADER_EPOCH, HEADER_SEQ, mac_name) if n not in h
    ]
    if missing:
        return Dropped(DropReason.MISSING, f"missing {', '.join(missing)}")
    who, stream_, mac = _text(h[HEADER_SENDER]), _text(h[HEADER_STREAM]), _text(h[mac_name])
    epoch, seq = _counter(h[HEADER_EPOCH]), _counter(h[HEADER_SEQ])
    if who is None or stream_ is None or mac is None or epoch is None or seq is None:
        return Dropped(DropReason.MALFORMED, "a seal header has the wrong type or range")
    if not _HEX64.fullmatch(mac):
        return Dropped(DropReason.MALFORMED, f"{mac_name} is not 64 lower hex digits")
    try:
        sender = Identity.parse(who)
    except ValidationError:
        return Dropped(DropReason.MALFORMED, f"bad sender {who[:80]!r}")
    if stream_ != stream:
        return Dropped(DropReason.WRONG_STREAM, f"sealed for {stream_[:80]!r}, not {stream!r}")
    key = keyring.get(sender)
    if key is None:
        return Dropped(DropReason.UNKNOWN_SENDER, f"{sender} does not send on {stream}")
    if not hmac.compare_digest(mac, _mac(key, who, stream_, epoch, seq, body)):
        return Dropped(DropReason.BAD_MAC, f"not sealed by {sender}")
    return Opened(sender, epoch, seq)


class Opener:
    """Checks sealed messages of one stream for one receiver, and remembers, per
    sender, the last ``(epoch, seq)`` it accepted (and, with a ``window``, which of the
    ``window`` sequence numbers below it it accepted)."""

    def __init__(
        self,
        keyring: Mapping[Identity, bytes],
        stream: str,
        *,
        window: int = 0,
        receiver: Identity | None = None,
    ) -> None:
        if not _STREAM.fullmatch(stream):
            raise ValueError(f"bad stream name {stream!r}")
        if window < 0:
            raise ValueError("window must be >= 0")
        self.stream = stream
        self.receiver = receiver
        """Whose MAC it checks (``mac_header``); None: the sender's own key's."""
        self.window = window
        self._keys = dict(keyring)
        self._last: dict[Identity, tuple[int, int]] = {}
        self._taken: dict[Identity, set[int]] = {}
        """Per sender, the sequence numbers accepted within the window of the last."""
        self.opened = 0
        self.drops: Counter[DropReason] = Counter()

    def position(self, sender: Identity) -> tuple[int, int] | None:
        """The last ``(epoch, seq)`` accepted from ``sender``."""
        return self._last.get(sender)

    def _drop(self, reason: DropReason, detail: str) -> Dropped:
        self.drops[reason] += 1
        return Dropped(reason, detail)

    def open(self, headers: Mapping[str, object] | None, body: bytes) -> Opened | Dropped:
        """``Opened`` if the message is authentic, for this stream, and not accepted
        before nor older than the window allows (and then it counts as accepted); else
        ``Dropped`` with the reason (and counted)."""
        got = self.check(headers, body)
        if isinstance(got, Opened):
            self.commit(got)
        return got

    def check(self, headers: Mapping[str, object] | None, body: bytes) -> Opened | Dropped:
        """What ``open`` would say, accepting nothing: a receiver that checks the body
        against the seal first (an LM's events must name that LM) ``commit``s only a
        message it takes, so one it refuses moves no sender's position."""
        got = authenticate(headers, body, self._keys, self.stream, self.receiver)
        if isinstance(got, Dropped):
            self.drops[got.reason] += 1
            return got
        sender, epoch, seq = got.sender, got.epoch, got.seq
        last = self._last.get(sender)
        if last is None or epoch > last[0] or (epoch == last[0] and seq > last[1]):
            return got
        if epoch < last[0]:
            return self._drop(DropReason.STALE_EPOCH, f"{sender} epoch {epoch} < {last[0]}")
        if seq <= last[1] - self.window or seq in self._taken[sender]:
            return self._drop(DropReason.STALE_SEQ, f"{sender} ({epoch}, {seq}) <= {last}")
        return got

    def commit(self, opened: Opened) -> None:
        """``opened`` (from ``check``, with no other message opened since) is accepted."""
        sender, epoch, seq = opened.sender, opened.epoch, opened.seq
        last = self._last.get(sender)
        if last is None or epoch > last[0]:
            self._last[sender], self._taken[sender] = (epoch, seq), {seq}
        elif seq > last[1]:
            self._last[sender] = (epoch, seq)
            self._take(sender, seq)
        else:
            self._taken[sender].add(seq)
        self.opened += 1

    def _take(self, sender: Identity, seq: int) -> None:
        taken = self._taken[sender]
        taken.add(seq)
        if len(taken) > 2 * self.window + 1:  # forget what fell out of the window
            self._taken[sender] = {s for s in taken if s > seq - self.window}

    def release(self, opened: Opened) -> None:
        """``opened`` was not handled after all (it goes back to its queue): accept it
        once more when it comes again.  Only within the window (a stream without one
        drops it then, as any message not newer than the last)."""
        last = self._last.get(opened.sender)
        if last is not None and last[0] == opened.epoch and opened.seq > last[1] - self.window:
            self._taken[opened.sender].discard(opened.seq)
