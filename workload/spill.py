"""Sorting a stream larger than memory: runs of ``chunk`` items sorted in memory and
spilled to scratch files, then merged as they are read back (an external merge sort).
Memory holds one run while spilling, then one item per run."""

from __future__ import annotations

import heapq
import pickle
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _spill(items: list[Any], path: Path) -> Path:
    with path.open("wb") as f:
        for x in items:
            pickle.dump(x, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _read_back(path: Path) -> Iterator[Any]:
    with path.open("rb") as f:
        while True:
            try:
                yield pickle.load(f)
            except EOFError:
                return


def sorted_spilled(
    items: Iterable[T], key: Callable[[T], Any], *, chunk: int = 200_000
) -> Iterator[T]:
    """``items`` sorted by ``key`` (stable within a run), holding at most ``chunk`` of
    them at a time; the scratch files live until the iterator is finished or closed."""
    run: list[T] = []
    with tempfile.TemporaryDirectory(prefix="megha-sort-") as tmp:
        runs: list[Path] = []
        for x in items:
            run.append(x)
            if len(run) >= chunk:
                run.sort(key=key)
                runs.append(_spill(run, Path(tmp) / f"run{len(runs)}"))
                run = []
        run.sort(key=key)
        if not runs:
            yield from run
            return
        runs.append(_spill(run, Path(tmp) / f"run{len(runs)}"))
        run = []
        yield from heapq.merge(*(_read_back(p) for p in runs), key=key)
