"""The front-door commands as a user meets them: ``megha submit/jobs/job/cancel/logs``
load only their own module (a call spent 5 of its 7 s importing the simulator, chaos
and the services on a loaded machine), and ``megha job`` prints its timeline in UTC
with the seconds since submission, not raw epoch floats."""

from __future__ import annotations

import argparse
import subprocess
import sys

from client.api import JobView
from megha_cli import jobs
from megha_cli.main import build_parser


def test_the_commands_listed_are_the_ones_registered() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    jobs.register(sub)
    assert set(sub.choices) == jobs.COMMANDS
    everything = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    assert set(everything.choices) >= jobs.COMMANDS  # type: ignore[arg-type]


def test_a_front_door_command_loads_neither_simulator_nor_chaos() -> None:
    code = (
        "import sys; from megha_cli.main import main\n"
        "try:\n    main(['jobs', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('simulator', 'chaos', 'request_generator', 'reporting')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_timeline_reads_as_times() -> None:
    v = JobView(job_id="j", user="u0", state="finished", tasks=1, tasks_by_state={"finished": 1},
                submitted_at=1_795_910_695.4,
                timeline=[{"at": 1_795_910_695.4, "what": "submitted"},
                          {"at": 1_795_910_725.5, "what": "finished"}])  # fmt: skip
    text = jobs._job_text(v).splitlines()
    assert text[1] == "  2026-11-29 00:04:55 UTC (+0.0 s)  submitted"
    assert text[2] == "  2026-11-29 00:05:25 UTC (+30.1 s)  finished"
