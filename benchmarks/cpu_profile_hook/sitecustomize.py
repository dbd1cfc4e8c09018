"""CPU-clock profiles of a live federation's services (cProfile with
``time.process_time``: a process descheduled while it holds the interpreter -- what
py-spy's ``--gil`` samples show as socket writes on a loaded host -- costs nothing here).

Put this directory first on ``PYTHONPATH`` and name an output directory:

    CPROF_DIR=/tmp/prof PYTHONPATH=benchmarks/cpu_profile_hook:. \\
        python benchmarks/bench_live.py --rates 500 --seconds 8

Every gunicorn worker (GM, LM, worker pool) then profiles its main thread from the
fork on and writes ``<role>-<pid>.pstats`` every 3 s (``pstats.Stats`` reads them).
The profiler slows each service several-fold: compare shares, not times.  Not used
by any service or test.
"""

from __future__ import annotations

import os
import sys
import threading
import time

_DIR = os.environ.get("CPROF_DIR")


def _child() -> None:
    import cProfile
    import marshal

    prof = cProfile.Profile(time.process_time)
    prof.enable()
    argv = " ".join(sys.argv)
    role = "workers" if "worker.app" in argv else ("lm" if "local_master" in argv else "gm")
    path = os.path.join(_DIR or ".", f"{role}-{os.getpid()}.pstats")

    def dump() -> None:
        while True:
            time.sleep(3)
            prof.snapshot_stats()
            with open(path + ".tmp", "wb") as f:
                marshal.dump(prof.stats, f)
            os.replace(path + ".tmp", path)

    threading.Thread(target=dump, daemon=True).start()


if _DIR and "gunicorn" in " ".join(sys.argv):
    os.register_at_fork(after_in_child=_child)
