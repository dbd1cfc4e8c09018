"""`megha dashboard` and `megha up --dashboard-port` on the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from megha_cli.main import build_parser, main


def test_dashboard_without_a_federation_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboard", "--state-dir", str(tmp_path), "--port", "1"]) == 1
    assert "megha up" in capsys.readouterr().out


def test_up_takes_a_dashboard_port() -> None:
    parser = build_parser()
    assert parser.parse_args(["up", "--dashboard-port", "19399"]).dashboard_port == 19399
    assert parser.parse_args(["up"]).dashboard_port is None
    args = parser.parse_args(["dashboard", "--port", "19399", "--interval", "0.5"])
    assert (args.port, args.host, args.interval) == (19399, "127.0.0.1", 0.5)
