"""Wrong usage and interruptions on the command line: one line on stderr naming what is
wrong and what to do, a non-zero exit code, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common.config import FederationConfig, load_config
from megha_cli import live
from megha_cli.main import INTERRUPTED, main
from request_generator.bench import BenchOptions, _submit_all, build_workload
from request_generator.submitter import SubmissionRefused
from runtime.broker import TopologyMissing
from runtime.retry import GiveUp
from security.access import save_token

pytestmark = pytest.mark.timeout(60)


def test_ctrl_c_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(_: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(live.RUNNERS, "status", interrupted)
    assert main(["status"]) == INTERRUPTED == 130
    err = capsys.readouterr().err
    assert err.strip() == "megha status: interrupted"


def test_a_closed_pipe_ends_quietly() -> None:
    """`megha status | head -2`: the reader goes away; no BrokenPipeError traceback."""
    child = textwrap.dedent(
        """
        import sys
        from megha_cli import live
        from megha_cli.main import main

        def chatty(_):
            for i in range(200_000):
                print(f"line {i}")
            return 0

        live.RUNNERS["status"] = chatty
        sys.exit(main(["status"]))
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        assert proc.stdout.readline() == b"line 0\n"
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=30) == 1
    assert err == ""


# ------------------------------------------------------------- no federation here
def record_federation(home: Path) -> FederationConfig:
    """A federation as `megha up` records it (nothing runs)."""
    cfg = load_config(None)
    home.mkdir(parents=True, exist_ok=True)
    (home / "federation.toml").write_text(cfg.to_toml())
    (home / "pids.json").write_text(json.dumps({"name": cfg.name, "processes": []}))
    return cfg


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("command", [["bench"], ["restart", "gm0"]])
def test_without_a_federation_says_start_one(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--state-dir", str(tmp_path)]) == 1
    line = one_line(capsys.readouterr().err)
    assert line == (
        f"megha {command[0]}: no federation recorded in {tmp_path} (start one with `megha up`)"
    )


def test_bench_broker_gone_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record_federation(tmp_path)

    def gone(*_: object) -> dict[str, object]:
        raise GiveUp("submitter: connect to the broker", 30, TopologyMissing("queue 'q' gone"))

    monkeypatch.setattr(live, "broker_reachable", lambda *_: True)
    monkeypatch.setattr(live, "run_bench_shown", gone)
    assert main(["bench", "--state-dir", str(tmp_path), "--quiet"]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("megha bench: submitter: connect to the broker: gave up")
    assert "megha status" in line


# ------------------------------------------------------------- a user without a token
def test_bench_for_a_revoked_user_says_which(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`megha user revoke u2`, then `megha bench`: the one line, before anything is sent."""
    record_federation(tmp_path)
    for user in ("u0", "u1"):
        save_token(tmp_path, user, f"token-of-{user}")
    monkeypatch.setattr(live, "broker_reachable", lambda *_: True)
    assert main(["bench", "--state-dir", str(tmp_path), "--quiet"]) == 1
    assert one_line(capsys.readouterr().err) == (
        "megha bench: no token for user 'u2' (`megha user add u2`)"
    )


@dataclass
class RefusingSubmitter:
    """Refuses every job, as a Submitter without the user's token does."""

    n_submitted: int = 0

    async def submit(self, job: object) -> float:
        await asyncio.sleep(0)
        raise SubmissionRefused("no token for user 'u2' (`megha user add u2`)")


def test_a_refused_submission_is_not_wrapped_in_a_group() -> None:
    jobs = build_workload(load_config(None), BenchOptions(jobs=5, progress=False))
    sub: Any = RefusingSubmitter()
    opts = BenchOptions(progress=False)
    with pytest.raises(SubmissionRefused, match="no token for user 'u2'"):
        asyncio.run(_submit_all(sub, jobs, opts, 10))


# ------------------------------------------------------------- --out that cannot be
@pytest.mark.parametrize("command", ["simulate", "bench", "demo"])
@pytest.mark.parametrize("kind", ["a file", "under /proc"])
def test_an_output_directory_that_cannot_be_made_is_refused_first(
    command: str,
    kind: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Before any work (a simulation, a federation started, a job sent)."""
    home = tmp_path / "home"
    record_federation(home)
    (home / "demo").mkdir()
    afile = tmp_path / "afile"
    afile.write_text("kept\n")
    out = str(afile) if kind == "a file" else "/proc/x"

    def no_work(*_: object, **__: object) -> None:
        raise AssertionError("work began")

    monkeypatch.setattr(live, "broker_reachable", lambda *_: True)
    monkeypatch.setattr(live, "start_federation", no_work)
    monkeypatch.setattr("request_generator.bench.Submitter.operator", no_work)
    monkeypatch.setattr("megha_cli.simulate.run_point", no_work)
    code = main(
        [command, "--out", out, "--quiet", *(["--state-dir", str(home)] * (command != "simulate"))]
    )
    assert code != 0
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"megha {command}: --out {out}: cannot make the directory (")
    assert line.endswith("choose another --out")
    assert afile.read_text() == "kept\n"


# ------------------------------------------------------------- dashboard ports
def test_dashboard_on_a_port_in_use_says_so_before_announcing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_federation(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["dashboard", "--state-dir", str(tmp_path), "--port", str(port)]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # no URL announced
    assert one_line(err) == (f"megha dashboard: 127.0.0.1:{port} is in use; choose another --port")


@pytest.mark.parametrize(
    "argv", [["dashboard", "--port", "99999"], ["dashboard", "--port", "0"],
             ["up", "--dashboard-port", "65536"]],
)  # fmt: skip
def test_a_port_out_of_range_is_a_usage_error(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--state-dir", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "a port is in 1..65535" in err
    assert "Traceback" not in err


# ------------------------------------------------------------- smaller ones
def test_kill_with_an_unknown_signal_names_the_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record_federation(tmp_path)
    assert main(["kill", "gm0", "--signal", "FOO", "--state-dir", str(tmp_path)]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("megha kill: no signal 'FOO': use KILL, TERM, STOP, CONT")


def test_down_purge_with_nothing_running_says_only_what_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record_federation(tmp_path)
    (tmp_path / "pids.json").unlink()  # stopped by an earlier `megha down`
    monkeypatch.setattr(live.provision, "purge", lambda *_: "deleted the broker vhost 'x'")
    assert main(["down", "--purge", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no federation recorded" not in out
    assert "stopped already" in out
    assert "deleted the broker vhost 'x'" in out


def test_down_purge_with_no_federation_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def purged(*_: object) -> str:
        raise AssertionError("purged a federation that is not recorded")

    monkeypatch.setattr(live.provision, "purge", purged)
    assert main(["down", "--purge", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.strip() == f"no federation recorded in {tmp_path}: nothing to stop or purge"


BAD_COUNTS = [("--jobs-count", "0"), ("--jobs-count", "-3"), ("--tasks-per-job", "0")]
BAD_SCALES = [("--time-scale", "0"), ("--duration-scale", "-1"), ("--time-scale", "nan")]


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [(c, f, v) for c in ("bench", "demo") for f, v in BAD_COUNTS + BAD_SCALES]
    + [("simulate", f, v) for f, v in BAD_SCALES],  # simulate takes --jobs-count 0
)
def test_counts_and_scales_are_checked_alike(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be" in err
    assert "> 0" in err


def test_a_failed_bench_shows_no_final_progress_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not `bench: 0/0 tasks (100.0%) wall 0:00` before the error (stderr is no terminal
    here: the plain progress lines)."""
    record_federation(tmp_path)
    monkeypatch.setattr(live, "broker_reachable", lambda *_: True)
    assert main(["bench", "--state-dir", str(tmp_path)]) == 1  # without a token for anyone
    assert one_line(capsys.readouterr().err).startswith("megha bench: no token for user")


# ------------------------------------------------------------- Ctrl-C in a bench
@pytest.mark.parametrize("wrote", [True, False])
def test_ctrl_c_in_a_bench_says_what_was_kept(
    wrote: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home, out = tmp_path / "home", tmp_path / "out"
    record_federation(home)

    def interrupted(*_: object) -> None:
        if wrote:  # the tasks that ended before, as RunTally wrote them
            out.mkdir()
            (out / "tasks.csv").write_text("user,task_id\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(live, "broker_reachable", lambda *_: True)
    monkeypatch.setattr(live, "run_bench_shown", interrupted)
    assert main(["bench", "--state-dir", str(home), "--out", str(out)]) == INTERRUPTED
    line = one_line(capsys.readouterr().err)
    if wrote:
        assert line == (
            f"megha bench: interrupted; {out}/tasks.csv holds the tasks that ended before; "
            "no summary.json (the run did not end)"
        )
    else:
        assert line == f"megha bench: interrupted; nothing written to {out}"
