"""Wrong usage and interruptions on the command line: one line on stderr naming what is
wrong and what to do, a non-zero exit code, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap

import pytest

from megha_cli import federation
from megha_cli.main import INTERRUPTED, main

pytestmark = pytest.mark.timeout(60)


def test_ctrl_c_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(_: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(federation.RUNNERS, "status", interrupted)
    assert main(["status"]) == INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err.strip() == "megha status: interrupted"


def test_a_closed_pipe_ends_quietly() -> None:
    """`megha status | head -2`: the reader goes away; no BrokenPipeError traceback."""
    child = textwrap.dedent(
        """
        import sys
        from megha_cli import federation
        from megha_cli.main import main

        def chatty(_):
            for i in range(200_000):
                print(f"line {i}")
            return 0

        federation.RUNNERS["status"] = chatty
        sys.exit(main(["status"]))
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"line 0\n"
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=30) == 1
    assert err == ""
