"""Faults a chaos run injects into a live service from outside (``megha chaos``).

Off unless the service's environment names a directory (``MEGHA_FAULTS_DIR``, which
only ``megha chaos`` and tests set): then ``strike(name)`` raises ``InjectedFault``
while the file ``<dir>/<party>/<name>`` holds a count above 0, one less each time (a
plain ``RuntimeError``: what a bug in a consumer raises, not a refusal), and
``die_on(name, value)`` kills the process while that file holds ``value``.
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


def strike(name: str) -> None:
    """Raise ``InjectedFault`` if a fault ``name`` is armed for this process."""
    if _dir is None:
        return
    path = _dir / name
    try:
        left = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return
    if left <= 0:
        return
    path.write_text(str(left - 1))
    raise InjectedFault(f"injected by megha chaos: {name} ({left - 1} more)")


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
        os.kill(os.getpid(), signal.SIGKILL)


def inject(directory: Path, party: str, name: str, count: int) -> Path:
    """Arm ``count`` strikes of fault ``name`` in ``party`` (the chaos side)."""
    path = directory / party / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(count))
    return path
