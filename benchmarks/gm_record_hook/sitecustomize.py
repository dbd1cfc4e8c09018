"""Records what a live GM's core is given, for ``benchmarks/bench_gm_replay.py``.

Put this directory first on ``PYTHONPATH`` and name an output directory:

    GM_RECORD_DIR=/tmp/rec PYTHONPATH=benchmarks/gm_record_hook:. \\
        python benchmarks/bench_live.py --rates 1000 --seconds 8 --base-port P

Every GM's gunicorn worker then writes ``<gm>-<pid>.rec``: a pickle of the federation
config and the GM's id, then one pickle per message handed to its core, with its
time.  Replayed through a core made the same way (``global_master.app._make_core``),
the stream takes every decision the live GM took.  Not used by any service or test.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

_DIR = os.environ.get("GM_RECORD_DIR")


def _child() -> None:
    if "global_master" not in " ".join(sys.argv):
        return
    from global_master import app

    make = app._make_core

    def recording(cfg: Any, gm: Any) -> Any:
        core = make(cfg, gm)
        out = open(os.path.join(_DIR or ".", f"{gm}-{os.getpid()}.rec"), "wb")  # noqa: SIM115
        pickle.dump((cfg, gm), out)
        handle = core.handle

        def taped(msg: object, now: float) -> Any:
            pickle.dump((msg, now), out)
            out.flush()
            return handle(msg, now)

        core.handle = taped  # type: ignore[method-assign]
        return core

    app._make_core = recording


if _DIR and "gunicorn" in " ".join(sys.argv):
    os.register_at_fork(after_in_child=_child)
