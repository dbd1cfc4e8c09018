"""One GM core replay under callgrind, only the replay counted.

    valgrind --tool=callgrind --toggle-collect=functools_reduce \\
        python3.11 callgrind_replay.py TREE N RECORD...

Imports, loading the records and one warm-up replay (lazy imports, shared layout
shapes) run outside ``functools.reduce``; the N measured replays, each through a
fresh core, run inside it (callgrind collects only there).
"""

from __future__ import annotations

import functools
import gc
import sys

sys.path.insert(0, sys.argv[1])

from benchmarks.bench_gm_replay import _load
from global_master.app import _make_core

N = int(sys.argv[2])
STREAMS = [_load(p) for p in sys.argv[3:]]


def replay(_acc: object = None, _i: object = None) -> None:
    for cfg, gm, stream in STREAMS:
        handle = _make_core(cfg, gm).handle
        gc.collect()
        for msg, now in stream:
            handle(msg, now)


replay()  # the warm-up, not counted
gc.collect()
functools.reduce(lambda acc, i: replay(), range(N), None)
