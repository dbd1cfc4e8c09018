"""Per-user submission tokens: random, stored hashed, revocable without a restart.

Guarantees:

* a token is 256 random bits (``mgu_`` + URL-safe base64); it is shown once, by
  ``add``, and only its SHA-256 is stored -- a token is as strong as a key, so
  a fast hash suffices, and the file (``$MEGHA_HOME/users.json``) reveals no
  token even to someone who reads it;
* the file is private (0600, ours) and rewritten atomically under an exclusive
  lock, so two ``megha user`` commands at once lose no change;
* ``verify`` compares in constant time (also for an unknown user, against a
  dummy hash) and says why it refused: ``unknown_user``, ``revoked_token`` or
  ``bad_token`` (``Unauthorized``);
* a service calls ``refresh(now)`` before ``verify``: when the file has changed
  (inode, size or mtime) it is read again, so ``megha user revoke`` takes effect
  within ``check_every_s`` without a restart.  A file that turns unreadable or
  malformed keeps the last good state and is reported by ``refresh`` raising.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from common.errors import ConfigError, Unauthorized
from security.files import ensure_private_dir, read_private, write_private
from security.identity import is_valid_name

TOKENS_FILENAME = "users.json"
TOKEN_PREFIX = "mgu_"
MAX_TOKEN_CHARS = 256
FILE_FORMAT = "megha-users"
FILE_VERSION = 1
_DUMMY_HASH = hashlib.sha256(b"megha: no such user").hexdigest()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class UserRecord:
    """One user: its GM, its share, when its token was made, and whether revoked."""

    user: str
    gm: str
    share: float
    token_sha256: str
    created_at: float
    revoked: bool = False
    revoked_at: float | None = None


def _record(raw: Any, path: Path) -> UserRecord:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{path}: {why}", reason="bad_users_file")

    if not isinstance(raw, dict) or set(raw) != set(UserRecord.__dataclass_fields__):
        raise bad(f"a user entry must have exactly {sorted(UserRecord.__dataclass_fields__)}")
    rec = UserRecord(**raw)
    if not isinstance(rec.user, str) or not is_valid_name(rec.user):
        raise bad(f"bad user name {rec.user!r}")
    if not isinstance(rec.gm, str) or not is_valid_name(rec.gm):
        raise bad(f"bad GM {rec.gm!r} for {rec.user}")
    if not isinstance(rec.share, int | float) or not 0 < rec.share <= 1:
        raise bad(f"share of {rec.user} must be in (0, 1]")
    if not isinstance(rec.token_sha256, str) or len(rec.token_sha256) != 64:
        raise bad(f"bad token hash for {rec.user}")
    if not isinstance(rec.created_at, int | float) or not isinstance(rec.revoked, bool):
        raise bad(f"bad created_at or revoked for {rec.user}")
    if rec.revoked_at is not None and not isinstance(rec.revoked_at, int | float):
        raise bad(f"bad revoked_at for {rec.user}")
    return rec


class TokenStore:
    """The users of a federation and their token hashes, backed by one private file."""

    def __init__(self, path: Path, *, check_every_s: float = 1.0) -> None:
        self.path = path
        self.check_every_s = check_every_s
        self._users: dict[str, UserRecord] = {}
        self._signature: tuple[int, int, int, int] | None = None
        self._checked_at = -float("inf")
        self._load()

    @classmethod
    def in_home(cls, home: Path, **kwargs: float) -> TokenStore:
        return cls(home / TOKENS_FILENAME, **kwargs)

    # ------------------------------------------------------------ reading
    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _load(self) -> None:
        signature = self._stat()
        if signature is None:
            self._users, self._signature = {}, None
            return
        raw = read_private(self.path)
        try:
            doc = json.loads(raw)
        except ValueError:
            raise ConfigError(f"{self.path} is not JSON", reason="bad_users_file") from None
        if (
            not isinstance(doc, dict)
            or doc.get("format") != FILE_FORMAT
            or doc.get("version") != FILE_VERSION
            or not isinstance(doc.get("users"), list)
        ):
            raise ConfigError(
                f"{self.path} is not a {FILE_FORMAT} v{FILE_VERSION} file", reason="bad_users_file"
            )
        users = [_record(r, self.path) for r in doc["users"]]
        if len({u.user for u in users}) != len(users):
            raise ConfigError(f"{self.path}: a user appears twice", reason="bad_users_file")
        self._users = {u.user: u for u in users}
        self._signature = signature

    def reload_if_changed(self) -> bool:
        """Read the file again if it changed since it was read; True if it did."""
        if self._stat() == self._signature:
            return False
        self._load()
        return True

    def refresh(self, now: float) -> bool:
        """``reload_if_changed``, at most once per ``check_every_s`` of ``now``."""
        if now - self._checked_at < self.check_every_s:
            return False
        self._checked_at = now
        return self.reload_if_changed()

    def users(self) -> list[UserRecord]:
        return sorted(self._users.values(), key=lambda r: r.user)

    def get(self, user: str) -> UserRecord | None:
        return self._users.get(user)

    def verify(self, user: str, token: str) -> UserRecord:
        """The record of ``user`` if ``token`` is its current token; else ``Unauthorized``."""
        rec = self._users.get(user) if isinstance(user, str) else None
        ok_shape = isinstance(token, str) and 0 < len(token) <= MAX_TOKEN_CHARS
        presented = hash_token(token) if ok_shape else ""
        matches = hmac.compare_digest(
            presented, rec.token_sha256 if rec is not None else _DUMMY_HASH
        )
        if rec is None:
            raise Unauthorized(f"no user {str(user)[:64]!r}", reason="unknown_user")
        if rec.revoked:
            raise Unauthorized(f"the token of {user!r} was revoked", reason="revoked_token")
        if not matches:
            raise Unauthorized(f"bad token for user {user!r}", reason="bad_token")
        return rec

    # ------------------------------------------------------------ writing
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive lock across processes; the file is re-read inside it."""
        ensure_private_dir(self.path.parent)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._load()
            yield
        finally:
            os.close(fd)  # releases the lock

    def _save(self) -> None:
        doc = {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "users": [asdict(r) for r in self.users()],
        }
        write_private(self.path, (json.dumps(doc, indent=2) + "\n").encode())
        self._signature = self._stat()

    def add(self, user: str, *, gm: str, share: float, now: float) -> str:
        """Make ``user`` (or give a revoked one a new token); return the token, once."""
        if not is_valid_name(user):
            raise ConfigError(f"bad user name {user!r}: 1-64 of [A-Za-z0-9_-]", reason="bad_user")
        if not is_valid_name(gm):
            raise ConfigError(f"bad GM id {gm!r}", reason="bad_user")
        if not 0 < share <= 1:
            raise ConfigError("a share must be in (0, 1]", reason="bad_user")
        with self._locked():
            old = self._users.get(user)
            if old is not None and not old.revoked:
                raise ConfigError(
                    f"user {user!r} exists; revoke it first to issue a new token",
                    reason="user_exists",
                )
            taken = sum(r.share for r in self._users.values() if not r.revoked)
            if taken + share > 1.0 + 1e-9:
                raise ConfigError(
                    f"shares would add up to {taken + share:g} > 1 (free: {max(0.0, 1 - taken):g})",
                    reason="shares_exceed",
                )
            token = new_token()
            self._users[user] = UserRecord(user, gm, float(share), hash_token(token), now)
            self._save()
        return token

    def revoke(self, user: str, *, now: float) -> UserRecord:
        """Revoke ``user``'s token (kept, marked revoked, for the record)."""
        with self._locked():
            rec = self._users.get(user)
            if rec is None:
                raise ConfigError(f"no user {user!r}", reason="unknown_user")
            if not rec.revoked:
                rec = replace(rec, revoked=True, revoked_at=now)
                self._users[user] = rec
                self._save()
        return rec

    def free_share(self) -> float:
        """What the active users' shares leave unallocated."""
        return max(0.0, 1.0 - sum(r.share for r in self._users.values() if not r.revoked))
