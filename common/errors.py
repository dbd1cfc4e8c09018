"""Errors of the Megha federation.

Expected scheduling outcomes are *values*, never exceptions: a placement that
does not fit is a ``PlacementResult(accepted=False, reason=...)``; a task that
must wait carries a ``WaitReason``. Exceptions are for broken input and broken
protocol, and only the service boundary turns them into an HTTP status or an
AMQP reject (dead-letter with the reason).

The tree is small on purpose::

    MeghaError
    ├── InvalidInput          bad message from outside: HTTP 400/413/422, AMQP dead-letter
    │   ├── DecodeError       not msgpack, wrong tag, wrong schema version, too large
    │   └── ValidationError   well-formed but wrong: types, negative resources, unknown ids
    ├── Unauthorized          missing or wrong credentials: HTTP 401/403
    └── ConfigError           a configuration file or flag that cannot work
"""

from __future__ import annotations


class MeghaError(Exception):
    """Root of all Megha errors; ``reason`` is a short machine-readable code."""

    reason: str = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason

    def to_dict(self) -> dict[str, str]:
        return {"error": self.reason, "detail": str(self)}


class InvalidInput(MeghaError):
    reason = "invalid_input"


class DecodeError(InvalidInput):
    reason = "malformed_body"


class ValidationError(InvalidInput):
    reason = "invalid_field"


class Unauthorized(MeghaError):
    reason = "unauthorized"


class ConfigError(MeghaError):
    reason = "bad_config"
