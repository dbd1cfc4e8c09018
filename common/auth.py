"""Authentication of internal calls and of users' submissions.

* Internal HTTP calls (GM -> LM, LM -> workers, workers -> LM, state pages) carry
  ``Authorization: Bearer <token>``, the token an HMAC of the federation secret.
* Each user has a submission token (an HMAC of the secret and the user id).  A GM
  accepts a job from a user's queue only if the job names that queue's user and
  carries that user's token: one user cannot submit through another's queue.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

from common.errors import Unauthorized

HEADER = "Authorization"


def _mac(secret: str, what: str) -> str:
    return hmac.new(secret.encode(), what.encode(), hashlib.sha256).hexdigest()


@functools.lru_cache(maxsize=8)
def internal_token(secret: str) -> str:
    return _mac(secret, "internal")


def internal_headers(secret: str) -> dict[str, str]:
    return {HEADER: f"Bearer {internal_token(secret)}"}


def user_token(secret: str, user: str) -> str:
    return _mac(secret, f"user:{user}")


def check_internal(header: str | None, secret: str) -> None:
    """Raise ``Unauthorized`` unless ``header`` is this federation's bearer token."""
    if not header:
        raise Unauthorized("missing Authorization header", reason="missing_credentials")
    scheme, _, token = header.partition(" ")
    if scheme != "Bearer" or not hmac.compare_digest(token, internal_token(secret)):
        raise Unauthorized("invalid internal credentials", reason="bad_credentials")


def check_user(user: str, token: str, queue_user: str, secret: str) -> None:
    """A submission from ``queue_user``'s queue must be ``queue_user``'s, with its token."""
    if user != queue_user:
        raise Unauthorized(
            f"job of user {user!r} found in the queue of {queue_user!r}", reason="wrong_queue"
        )
    if not hmac.compare_digest(token, user_token(secret, user)):
        raise Unauthorized(f"bad submission token for user {user!r}", reason="bad_credentials")
