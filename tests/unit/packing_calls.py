"""Counting how a packing is made: links packed alone vs by the list scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from global_master.policy import altruism


@contextmanager
def packing_calls() -> Iterator[dict[str, int]]:
    """Counts of ``_Packing._alone`` and ``_Packing._start_ready`` calls while inside."""
    calls = {"alone": 0, "scheduler": 0}
    alone, start = altruism._Packing._alone, altruism._Packing._start_ready

    def count_alone(self: altruism._Packing, s: int) -> list[int] | None:
        calls["alone"] += 1
        return alone(self, s)

    def count_start(self: altruism._Packing) -> None:
        calls["scheduler"] += 1
        start(self)

    altruism._Packing._alone = count_alone  # type: ignore[method-assign]
    altruism._Packing._start_ready = count_start  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        altruism._Packing._alone = alone  # type: ignore[method-assign]
        altruism._Packing._start_ready = start  # type: ignore[method-assign]
