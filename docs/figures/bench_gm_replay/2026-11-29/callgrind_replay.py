import sys, gc
sys.path.insert(0, sys.argv[1])
from benchmarks.bench_gm_replay import _load
from global_master.app import _make_core
n = int(sys.argv[2])
streams = [_load(p) for p in sys.argv[3:]]
# warm: one replay outside the measured part (lazy imports, caches of shapes)
for cfg, gm, stream in streams:
    core = _make_core(cfg, gm); h = core.handle
    for m, now in stream: h(m, now)
del core, h
gc.collect()
import functools
def run(acc, _):
    for rep in range(n):
        for cfg, gm, stream in streams:
            core = _make_core(cfg, gm); h = core.handle
            gc.collect()
            for m, now in stream: h(m, now)
functools.reduce(run, range(1), None)
