"""Skips for the test-bed tests: they need root and iproute2 (and rabbitmq-server)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

NEEDS = ("ip", "tc", "bridge", "unshare")


def missing() -> str | None:
    """Why the test-bed can't run here, or ``None``."""
    if os.geteuid() != 0:
        return "needs root"
    gone = [tool for tool in NEEDS if shutil.which(tool) is None]
    return f"missing {', '.join(gone)} (apt-get install iproute2 util-linux)" if gone else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip ``netns`` and ``rabbit`` tests where they can't run, before any fixture."""
    reason = missing()
    no_rabbit = not Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists()
    for item in items:
        if reason and (item.get_closest_marker("netns") or item.get_closest_marker("rabbit")):
            item.add_marker(pytest.mark.skip(reason=reason))
        elif no_rabbit and item.get_closest_marker("rabbit"):
            item.add_marker(pytest.mark.skip(reason="apt-get install rabbitmq-server"))
