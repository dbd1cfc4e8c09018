"""`megha up/demo/bench/status/down` without a broker or a federation: clear messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.config import load_config
from megha_cli.main import build_parser, main

NO_BROKER = "amqp://guest:guest@127.0.0.1:1/"


@pytest.mark.parametrize("command", ["up", "demo", "bench"])
def test_unreachable_broker_says_how_to_start_it(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MEGHA_BROKER_URL", NO_BROKER)
    if command == "bench":  # a federation recorded here, its broker gone
        cfg = load_config(None)
        assert cfg.broker_url == NO_BROKER
        (tmp_path / "federation.toml").write_text(cfg.to_toml())
        (tmp_path / "pids.json").write_text(json.dumps({"name": cfg.name, "processes": []}))
    assert main([command, "--state-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "RabbitMQ is not reachable" in err
    assert "rabbitmq-server -detached" in err
    if command != "bench":
        assert not (tmp_path / "pids.json").exists()


def test_status_and_down_without_a_federation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--state-dir", str(tmp_path)]) == 1
    assert "megha up" in capsys.readouterr().out
    assert main(["down", "--state-dir", str(tmp_path)]) == 0


def test_every_federation_command_has_help() -> None:
    parser = build_parser()
    for cmd in ("up", "down", "status", "bench", "demo"):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([cmd, "--help"])
        assert exit_.value.code == 0


def test_kill_all_returns_once_its_processes_are_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGKILLed process dies a little later; ``megha up`` right after ``kill_all``
    found the federation still running (``megha chaos --random 2 --wide``)."""
    from federation import processes

    killed: list[int] = []
    checks = {11: 3, 12: 5}  # the times each still looks alive after its SIGKILL
    monkeypatch.setattr(processes, "recorded", lambda home: {"gm0": 11, "lm0": 12})
    monkeypatch.setattr(processes, "_is_ours", lambda pid: True)
    monkeypatch.setattr(processes.os, "killpg", lambda pid, sig: killed.append(pid))
    monkeypatch.setattr(processes.time, "sleep", lambda s: None)

    def alive(pid: int) -> bool:
        checks[pid] -= 1
        return checks[pid] >= 0

    monkeypatch.setattr(processes, "alive", alive)
    monkeypatch.setattr(processes, "group_running", lambda pgid: False)
    assert processes.kill_all(tmp_path) == [11, 12] == killed
    assert checks[12] == -1  # looked at until both were gone
    assert checks[11] < 0


def test_kill_all_waits_for_every_process_of_the_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's leader gone is not the group gone: its gunicorn worker, still exiting,
    holds the listening socket, and a ``megha up`` right after found every port taken
    (``megha chaos --random 11 --wide``, draw 10)."""
    from federation import processes

    lingering = {11: 2, 12: 4}  # checks during which a worker of the group still runs
    monkeypatch.setattr(processes, "recorded", lambda home: {"gm0": 11, "lm0": 12})
    monkeypatch.setattr(processes, "_is_ours", lambda pid: True)
    monkeypatch.setattr(processes.os, "killpg", lambda pid, sig: None)
    monkeypatch.setattr(processes.time, "sleep", lambda s: None)
    monkeypatch.setattr(processes, "alive", lambda pid: False)  # the leaders died at once

    def group_running(pgid: int) -> bool:
        lingering[pgid] -= 1
        return lingering[pgid] >= 0

    monkeypatch.setattr(processes, "group_running", group_running)
    assert processes.kill_all(tmp_path) == [11, 12]
    assert lingering[12] < 0  # looked at until every group was gone
    assert lingering[11] < 0


def test_group_running_sees_a_member_outliving_its_leader() -> None:
    """The leader of a session exits, the child it forked runs on in its group:
    ``alive`` says the leader is gone, ``group_running`` that the group is not."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from federation import processes

    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nos._exit(0)"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    leader.wait(timeout=30)
    try:
        assert processes.group_running(leader.pid)
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes.group_running(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not processes.group_running(leader.pid)
