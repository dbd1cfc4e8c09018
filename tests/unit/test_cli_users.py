"""``megha user add`` on a user that exists: the same GM and share (or none given) leave
it as it is and succeed; another GM or share is refused in one line naming its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from megha_cli.main import main
from security.tokens import TokenStore
from tests.unit.test_cli_errors import one_line


def add(home: Path, *argv: str) -> int:
    return main(["user", "add", *argv, "--state-dir", str(home)])


def test_adding_a_user_again_with_its_own_values_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert add(tmp_path, "alice", "--gm", "gm1", "--share", "0.3") == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    for again in (["--gm", "gm1", "--share", "0.3"], ["--share", "0.30000000000000004"], []):
        assert add(tmp_path, "alice", *again) == 0
        out = capsys.readouterr().out
        assert "exists already with GM gm1 and share 0.3: nothing changed" in out
        assert token not in out
    rec = TokenStore.in_home(tmp_path).verify("alice", token)  # still its token
    assert (rec.gm, rec.share, rec.revoked) == ("gm1", 0.3, False)


@pytest.mark.parametrize(
    ("argv", "asked"),
    [
        (["--gm", "gm0"], "not GM gm0"),
        (["--share", "0.5"], "not share 0.5"),
        (["--gm", "gm0", "--share", "0.5"], "not GM gm0, share 0.5"),
    ],
)
def test_another_gm_or_share_is_refused_naming_the_users_own(
    argv: list[str], asked: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert add(tmp_path, "alice", "--gm", "gm1", "--share", "0.3") == 0
    before = TokenStore.in_home(tmp_path).get("alice")
    capsys.readouterr()
    assert add(tmp_path, "alice", *argv) == 1
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert line.startswith("megha user add: user 'alice' exists with GM gm1 and share 0.3 (")
    assert line.endswith(asked)
    assert "megha user revoke alice" in line
    assert captured.out == ""
    assert TokenStore.in_home(tmp_path).get("alice") == before  # neither kept nor overwritten


def test_a_configured_user_is_refused_another_gm_or_share_than_its_config_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "federation.toml").write_text(
        '[federation]\ngms = 2\nusers = "alice:0.5@gm1,bob:0.25@gm0"\n'
    )
    # before its first token too: the config says what it is
    assert add(tmp_path, "alice", "--gm", "gm0") == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("megha user add: user 'alice' exists with GM gm1 and share 0.5 (")
    assert "federation's config" in line
    assert TokenStore.in_home(tmp_path).get("alice") is None
    assert add(tmp_path, "alice", "--gm", "gm1", "--share", "0.5") == 0
    capsys.readouterr()
    assert add(tmp_path, "alice", "--share", "0.25") == 1
    assert "not share 0.25" in one_line(capsys.readouterr().err)
    assert add(tmp_path, "alice", "--gm", "gm1") == 0
    assert "nothing changed" in capsys.readouterr().out


def test_a_revoked_user_gets_a_new_token_with_new_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert add(tmp_path, "alice", "--gm", "gm1", "--share", "0.3") == 0
    assert main(["user", "revoke", "alice", "--state-dir", str(tmp_path)]) == 0
    assert add(tmp_path, "alice", "--gm", "gm2", "--share", "0.4") == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    rec = TokenStore.in_home(tmp_path).verify("alice", token)
    assert (rec.gm, rec.share) == ("gm2", 0.4)
