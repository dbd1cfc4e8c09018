"""Faults a chaos run injects into a live service from outside (``megha chaos``).

Off unless the service's environment names a directory (``MEGHA_FAULTS_DIR``, which
only ``megha chaos`` and tests set): then ``strike(name)`` raises ``InjectedFault``
while the file ``<dir>/<party>/<name>`` holds a count above 0, one less each time (a
plain ``RuntimeError``: what a bug in a consumer raises, not a refusal), and
``die_on(name, value)`` kills the process while that file holds ``value``; ``taken``
uses one strike up and says whether there was one (the caller acts); ``value(name)``
reads the number the file holds, using nothing up (``clock_step``: seconds added to this
process's wall clock as ``runtime.clock.wall`` reads it).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

FAULTS_DIR_ENV = "MEGHA_FAULTS_DIR"

_dir: Path | None = None


class InjectedFault(RuntimeError):
    """A fault ``megha chaos`` asked for."""


def arm(party: str) -> None:
    """Look for faults of ``party`` (a service calls this once, at start)."""
    global _dir
    base = os.environ.get(FAULTS_DIR_ENV)
    _dir = Path(base) / party if base else None


def taken(name: str) -> bool:
    """Whether a strike of fault ``name`` is armed for this process (it is used up)."""
    if _dir is None:
        return False
    path = _dir / name
    try:
        left = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    if left <= 0:
        return False
    path.write_text(str(left - 1))
    return True


def value(name: str) -> float:
    """The number fault ``name``'s file holds for this process (0.0: none)."""
    if _dir is None:
        return 0.0
    try:
        return float((_dir / name).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0.0


def strike(name: str) -> None:
    """Raise ``InjectedFault`` if a fault ``name`` is armed for this process."""
    if taken(name):
        raise InjectedFault(f"injected by megha chaos: {name}")


def die() -> None:
    """This process dies at once, as the kernel's OOM killer kills it."""
    os.kill(os.getpid(), signal.SIGKILL)


def die_on(name: str, value: str) -> None:
    """Kill this process (SIGKILL, as the kernel's OOM killer does) if fault ``name`` is
    armed with ``value`` (e.g. the job id a poison job carries)."""
    if _dir is None:
        return
    try:
        armed = (_dir / name).read_text().strip()
    except OSError:
        return
    if armed == value:
        die()


def inject(directory: Path, party: str, name: str, count: int) -> Path:
    """Arm ``count`` strikes of fault ``name`` in ``party`` (the chaos side)."""
    path = directory / party / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(count))
    return path


def set_value(directory: Path, party: str, name: str, number: float) -> Path:
    """Set the number fault ``name`` holds in ``party`` (the chaos side; ``value``)."""
    path = directory / party / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(repr(float(number)))
    return path


def left(directory: Path, party: str, name: str) -> int:
    """Strikes of fault ``name`` in ``party`` not used yet (the chaos side)."""
    try:
        return int((directory / party / name).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
