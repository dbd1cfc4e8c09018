"""``megha`` ended by SIGTERM (``timeout``, ``kill``, a container's stop) runs its
``with`` blocks and ``finally`` clauses, as an interrupt does: a simulation killed by
``timeout`` left its scratch directory (``/tmp/megha-sort-*``) behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

CHILD = """
import os, signal, sys
from megha_cli.main import exit_on_sigterm
from workload.spill import sorted_spilled
if sys.argv[1] == "handled":
    exit_on_sigterm()
it = sorted_spilled(range(10, 0, -1), key=lambda x: x, chunk=3)
print(next(it), flush=True)  # the runs are spilled: the scratch directory exists
os.kill(os.getpid(), signal.SIGTERM)
print("not reached", flush=True)
"""


def run(mode: str, tmp: Path) -> tuple[int, str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env={"TMPDIR": str(tmp), "PATH": "/usr/bin:/bin",
                                                  "PYTHONPATH": str(Path.cwd())},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, sorted(p.name for p in tmp.iterdir())


def test_a_terminated_command_leaves_no_scratch_files(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    (tmp_path / "handled").mkdir()
    code, out, left = run("bare", tmp_path / "bare")
    assert (code, out) == (-signal.SIGTERM, "1\n")
    assert len(left) == 1  # what it did before
    assert left[0].startswith("megha-sort-")
    code, out, left = run("handled", tmp_path / "handled")
    assert (code, out, left) == (128 + signal.SIGTERM, "1\n", [])
