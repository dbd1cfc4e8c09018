"""A task's environment: the variables a user asks for, the ones the operator allows.

A job file's stage or task may name ``env`` (``{"NAME": "value"}``, ``common.jobspec``);
each task carries it as ``NAME=value`` strings (``TaskSpec.env``).  Only the names the
operator allows reach the sandboxed command: ``task_env_allow`` in the federation's
config, shell-style patterns matched against the whole name (``["LANG", "MEGHA_*"]``;
empty, the default: none).  Checked three times, by the same function:

* the front door and the GM's admission refuse a job naming any other variable
  (``env_not_allowed``; ``bad_env`` for an entry that is no ``NAME=value``), before
  anything of it runs;
* the worker pool passes only the allowed ones (``allowed``): a job admitted under a
  wider list, or sent around the GM, gets nothing more than the pool's list says.

The sandbox's own variables (``PATH``, ``HOME``, ``TMPDIR``, ``LANG``) are set first;
an allowed variable of the same name replaces it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase

from common.errors import ConfigError
from common.model import MAX_ENV as MAX_ENV
from common.schema import MAX_TEXT

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]!]+")
MAX_VALUE = MAX_TEXT
"""Characters of one ``NAME=value`` entry (the wire's ``Text``); a task names at most
``MAX_ENV`` variables."""


def entries(env: Mapping[str, str]) -> tuple[str, ...]:
    """``{"A": "1"}`` as ``("A=1",)``, in name order."""
    return tuple(f"{k}={v}" for k, v in sorted(env.items()))


def bad_entry(entry: str) -> str | None:
    """What is wrong with one ``NAME=value`` entry (None: nothing)."""
    name, eq, value = entry.partition("=")
    if not eq or not NAME.fullmatch(name):
        return (
            f"{entry[:60]!r} is not NAME=value with NAME of [A-Za-z0-9_], not starting with a digit"
        )
    if "\0" in value:
        return f"the value of {name} holds a NUL character"
    if len(entry) > MAX_VALUE:
        return f"{name}=... is {len(entry)} characters, at most {MAX_VALUE}"
    return None


def is_allowed(name: str, allow: Iterable[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in allow)


def refusal(env: Sequence[str], allow: Sequence[str]) -> tuple[str, str] | None:
    """``(reason, detail)`` if ``env`` may not be passed under ``allow`` (None: it may)."""
    seen: set[str] = set()
    for entry in env:
        why = bad_entry(entry)
        if why is not None:
            return "bad_env", why
        name = entry.partition("=")[0]
        if name in seen:
            return "bad_env", f"{name} is named twice"
        seen.add(name)
        if not is_allowed(name, allow):
            allowed = ", ".join(allow) if allow else "none"
            return "env_not_allowed", (
                f"environment variable {name} is not allowed here (task_env_allow: {allowed})"
            )
    return None


def allowed(env: Iterable[str], allow: Sequence[str]) -> dict[str, str]:
    """The variables of ``env`` that ``allow`` lets through (the others dropped)."""
    out: dict[str, str] = {}
    for entry in env:
        if bad_entry(entry) is None:
            name, _, value = entry.partition("=")
            if is_allowed(name, allow):
                out[name] = value
    return out


def check_allow(allow: object) -> tuple[str, ...]:
    """The config's ``task_env_allow``, checked: a list of name patterns."""
    if not isinstance(allow, list | tuple) or not all(
        isinstance(p, str) and PATTERN.fullmatch(p) for p in allow
    ):
        raise ConfigError(
            f'task_env_allow: a list of variable names or patterns (e.g. ["LANG", '
            f'"MEGHA_*"]), got {allow!r}',
            reason="bad_config",
        )
    return tuple(allow)
