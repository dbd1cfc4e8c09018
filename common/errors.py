"""Errors of the Megha federation.

Expected scheduling outcomes are *values*, never exceptions: a placement that
does not fit is a ``PlacementResult(accepted=False, reason=...)``; a request a core
cannot take is answered with ``Refused(reason, detail)``; a job a GM cannot admit
becomes a ``JobRefused`` effect.  Exceptions are for broken input and broken
protocol, and only the service boundary turns them into an HTTP status or an
AMQP reject (dead-letter with the reason).

The tree is small on purpose::

    MeghaError
    ├── InvalidInput          bad message from outside: HTTP 400/413/422, AMQP dead-letter
    │   ├── DecodeError       not msgpack, wrong tag, wrong schema version, too large
    │   └── ValidationError   well-formed but wrong: types, ranges, unknown or missing fields
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
    """A field that breaks the schema; ``path`` names it (``placements[3].spec.demand``)."""

    reason = "invalid_field"

    def __init__(self, message: str, *, reason: str | None = None, path: str = "") -> None:
        super().__init__(message, reason=reason)
        self.detail = message
        self.path = path

    def at(self, prefix: str) -> ValidationError:
        """The same error seen from the enclosing message (``prefix`` is a field or index)."""
        path = (
            prefix
            if not self.path
            else f"{prefix}{self.path}"
            if self.path[0] == "["
            else (f"{prefix}.{self.path}")
        )
        return ValidationError(self.detail, reason=self.reason, path=path)

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}" if self.path else self.detail

    def to_dict(self) -> dict[str, str]:
        return {"error": self.reason, "detail": str(self), "field": self.path}


class Unauthorized(MeghaError):
    reason = "unauthorized"


class ConfigError(MeghaError):
    reason = "bad_config"
