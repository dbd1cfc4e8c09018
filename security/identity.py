"""Who a party of the federation is: a role and a name, written ``role:name``.

Guarantees: every ``Identity`` has a known role and a name of 1-64 characters
from ``[A-Za-z0-9_-]`` starting with a letter or digit, so an identity can be
embedded in HTTP headers, key-derivation labels, RabbitMQ user names and topic
routing keys (no dots, colons, slashes or whitespace) without escaping.
A worker pool is named after its LM (``workers:lm0`` serves ``lm:lm0``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from common.errors import ValidationError

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}"
_NAME = re.compile(NAME_PATTERN)


class Role(StrEnum):
    """The kinds of party; the value is the prefix of ``str(identity)``."""

    OPERATOR = "operator"
    GM = "gm"
    LM = "lm"
    WORKERS = "workers"
    USER = "user"


def is_valid_name(name: str) -> bool:
    """Is ``name`` usable as the name part of an identity (and as a user or GM id)?"""
    return _NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True, order=True)
class Identity:
    """A party: ``Identity(Role.GM, "gm0")`` is written ``gm:gm0``."""

    role: Role
    name: str
    _text: str = field(init=False, repr=False, compare=False)
    """``role:name``, made once: every signed request and sealed message writes it."""

    def __post_init__(self) -> None:
        if not isinstance(self.role, Role):
            raise ValidationError(f"unknown role {self.role!r}", reason="bad_identity")
        if not isinstance(self.name, str) or not is_valid_name(self.name):
            raise ValidationError(
                f"bad identity name {self.name!r}: 1-64 of [A-Za-z0-9_-]", reason="bad_identity"
            )
        object.__setattr__(self, "_text", f"{self.role.value}:{self.name}")

    def __str__(self) -> str:
        return self._text

    @classmethod
    def parse(cls, text: str) -> Identity:
        """``"lm:lm0"`` -> ``Identity(Role.LM, "lm0")``; raise ``ValidationError`` otherwise.
        A text parsed before is answered from ``_PARSED`` (identities are immutable)."""
        known = _PARSED.get(text)
        if known is not None:
            return known
        role, sep, name = text.partition(":")
        if not sep or role not in _ROLES:
            raise ValidationError(f"bad identity {text[:80]!r}", reason="bad_identity")
        ident = cls(Role(role), name)
        if len(_PARSED) < MAX_PARSED:
            _PARSED[text] = ident
        return ident


_ROLES = frozenset(r.value for r in Role)
MAX_PARSED = 4096
"""Identities kept by the text they were parsed from: the federation's parties are far
fewer; texts past this many are parsed each time (none of them is ever dropped)."""
_PARSED: dict[str, Identity] = {}

OPERATOR = Identity(Role.OPERATOR, "admin")
"""The operator's identity (``megha status``, admin endpoints, topology)."""


def gm(name: str) -> Identity:
    return Identity(Role.GM, name)


def lm(name: str) -> Identity:
    return Identity(Role.LM, name)


def workers(lm_name: str) -> Identity:
    """The worker pool of LM ``lm_name``."""
    return Identity(Role.WORKERS, lm_name)


def user(name: str) -> Identity:
    return Identity(Role.USER, name)
