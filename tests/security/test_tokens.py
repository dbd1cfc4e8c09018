"""Per-user tokens: hashed at rest, revocable, reloaded when the file changes; the CLI."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from common.errors import ConfigError, Unauthorized
from megha_cli.main import build_parser, main
from security.tokens import TOKEN_PREFIX, TOKENS_FILENAME, TokenStore, hash_token

T0 = 1_700_000_000.0


def reason(store: TokenStore, user: str, token: str) -> str:
    with pytest.raises(Unauthorized) as exc:
        store.verify(user, token)
    return exc.value.reason


def test_add_returns_a_random_token_stored_only_hashed(tmp_path: Path) -> None:
    store = TokenStore.in_home(tmp_path)
    token = store.add("alice", gm="gm0", share=0.5, now=T0)
    other = store.add("bob", gm="gm1", share=0.25, now=T0)
    assert token.startswith(TOKEN_PREFIX)
    assert len(token) >= 40
    assert token != other
    path = tmp_path / TOKENS_FILENAME
    raw = path.read_text()
    assert token not in raw
    assert other not in raw
    assert hash_token(token) in raw
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    rec = store.verify("alice", token)
    assert (rec.user, rec.gm, rec.share, rec.created_at, rec.revoked) == (
        "alice",
        "gm0",
        0.5,
        T0,
        False,
    )


def test_verify_refuses_with_a_reason(tmp_path: Path) -> None:
    store = TokenStore.in_home(tmp_path)
    alice = store.add("alice", gm="gm0", share=0.5, now=T0)
    bob = store.add("bob", gm="gm0", share=0.5, now=T0)
    assert reason(store, "alice", bob) == "bad_token"  # another user's token
    assert reason(store, "alice", alice[:-1]) == "bad_token"
    assert reason(store, "alice", "") == "bad_token"
    assert reason(store, "alice", "x" * 10_000) == "bad_token"
    assert reason(store, "alice", None) == "bad_token"  # type: ignore[arg-type]
    assert reason(store, "carol", alice) == "unknown_user"
    assert reason(store, "", alice) == "unknown_user"
    assert reason(store, 5, alice) == "unknown_user"  # type: ignore[arg-type]


def test_revocation_and_reissue(tmp_path: Path) -> None:
    store = TokenStore.in_home(tmp_path)
    old = store.add("alice", gm="gm0", share=0.5, now=T0)
    with pytest.raises(ConfigError) as exc:
        store.add("alice", gm="gm0", share=0.5, now=T0)
    assert exc.value.reason == "user_exists"
    rec = store.revoke("alice", now=T0 + 5)
    assert rec.revoked
    assert rec.revoked_at == T0 + 5
    assert reason(store, "alice", old) == "revoked_token"
    assert store.revoke("alice", now=T0 + 9).revoked_at == T0 + 5  # idempotent
    new = store.add("alice", gm="gm1", share=0.5, now=T0 + 10)
    assert store.verify("alice", new).gm == "gm1"
    assert reason(store, "alice", old) == "bad_token"
    with pytest.raises(ConfigError) as exc:
        store.revoke("nobody", now=T0)
    assert exc.value.reason == "unknown_user"


def test_a_running_service_sees_a_revocation_without_restart(tmp_path: Path) -> None:
    cli = TokenStore.in_home(tmp_path)
    token = cli.add("alice", gm="gm0", share=0.5, now=T0)
    service = TokenStore.in_home(tmp_path, check_every_s=1.0)
    service.refresh(T0)
    service.verify("alice", token)
    TokenStore.in_home(tmp_path).revoke("alice", now=T0 + 0.2)
    assert not service.refresh(T0 + 0.5)  # checked less than check_every_s ago
    service.verify("alice", token)
    assert service.refresh(T0 + 1.0)
    assert reason(service, "alice", token) == "revoked_token"
    assert not service.refresh(T0 + 2.0)  # unchanged since


def test_a_user_added_later_is_seen_and_a_deleted_file_empties_the_store(tmp_path: Path) -> None:
    service = TokenStore.in_home(tmp_path)
    assert service.users() == []
    token = TokenStore.in_home(tmp_path).add("bob", gm="gm0", share=0.1, now=T0)
    assert service.reload_if_changed()
    assert service.verify("bob", token).user == "bob"
    (tmp_path / TOKENS_FILENAME).unlink()
    assert service.reload_if_changed()
    assert reason(service, "bob", token) == "unknown_user"


def test_two_writers_lose_no_change(tmp_path: Path) -> None:
    a, b = TokenStore.in_home(tmp_path), TokenStore.in_home(tmp_path)
    a.add("alice", gm="gm0", share=0.25, now=T0)
    b.add("bob", gm="gm0", share=0.25, now=T0)  # b had read the file before alice existed
    a.revoke("bob", now=T0)
    assert [(r.user, r.revoked) for r in TokenStore.in_home(tmp_path).users()] == [
        ("alice", False),
        ("bob", True),
    ]


def test_shares_names_and_gms_are_checked(tmp_path: Path) -> None:
    store = TokenStore.in_home(tmp_path)
    store.add("alice", gm="gm0", share=0.75, now=T0)
    cases = [
        ({"user": "bob", "gm": "gm0", "share": 0.5}, "shares_exceed"),
        ({"user": "bob", "gm": "gm0", "share": 0.0}, "bad_user"),
        ({"user": "bob", "gm": "gm0", "share": 1.5}, "bad_user"),
        ({"user": "b.o.b", "gm": "gm0", "share": 0.1}, "bad_user"),
        ({"user": "bob", "gm": "gm 0", "share": 0.1}, "bad_user"),
        ({"user": "x" * 65, "gm": "gm0", "share": 0.1}, "bad_user"),
    ]
    for kwargs, why in cases:
        with pytest.raises(ConfigError) as exc:
            store.add(kwargs.pop("user"), now=T0, **kwargs)  # type: ignore[arg-type]
        assert exc.value.reason == why
    assert store.free_share() == pytest.approx(0.25)
    store.revoke("alice", now=T0)
    assert store.free_share() == 1.0


def test_an_exposed_or_malformed_file_is_refused(tmp_path: Path) -> None:
    TokenStore.in_home(tmp_path).add("alice", gm="gm0", share=0.5, now=T0)
    path = tmp_path / TOKENS_FILENAME
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError) as exc:
        TokenStore(path)
    assert exc.value.reason == "file_not_private"
    os.chmod(path, 0o600)
    good = json.loads(path.read_text())
    bad_docs: list[object] = [
        "not json",
        [],
        {**good, "version": 2},
        {**good, "users": [{**good["users"][0], "extra": 1}]},
        {**good, "users": [{**good["users"][0], "share": "all"}]},
        {**good, "users": [{**good["users"][0], "user": "a:b"}]},
        {**good, "users": [{**good["users"][0], "token_sha256": "short"}]},
        {**good, "users": [{**good["users"][0], "revoked_at": "yesterday"}]},
        {**good, "users": good["users"] * 2},
    ]
    for doc in bad_docs:
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        with pytest.raises(ConfigError) as exc:
            TokenStore(path)
        assert exc.value.reason == "bad_users_file"


def test_a_service_keeps_its_last_good_state_when_the_file_breaks(tmp_path: Path) -> None:
    token = TokenStore.in_home(tmp_path).add("alice", gm="gm0", share=0.5, now=T0)
    service = TokenStore.in_home(tmp_path)
    (tmp_path / TOKENS_FILENAME).write_text("{broken")
    with pytest.raises(ConfigError):
        service.refresh(T0)
    service.verify("alice", token)


# ------------------------------------------------------------------ CLI
def test_cli_add_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = ["--state-dir", str(tmp_path)]
    assert main(["user", "list", *home]) == 0
    assert "no users" in capsys.readouterr().out
    assert main(["user", "add", "alice", "--gm", "gm1", "--share", "0.5", *home]) == 0
    out = capsys.readouterr().out
    token = out.strip().splitlines()[-1]
    assert token.startswith(TOKEN_PREFIX)
    assert TokenStore.in_home(tmp_path).verify("alice", token).gm == "gm1"
    assert main(["user", "add", "bob", *home]) == 0  # default GM gm0, the rest of the shares
    assert "share 0.5" in capsys.readouterr().out
    assert main(["user", "list", *home]) == 0
    listing = capsys.readouterr().out
    assert "alice" in listing
    assert "bob" in listing
    assert token not in listing
    assert main(["user", "add", "carol", *home]) == 1  # no share left
    assert "--share" in capsys.readouterr().err
    assert main(["user", "revoke", "alice", *home]) == 0
    capsys.readouterr()
    assert main(["user", "list", *home]) == 0
    assert "revoked" in capsys.readouterr().out
    assert main(["user", "add", "bob", "--share", "0.1", *home]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["user", "revoke", "zed", *home]) == 1
    assert "no user" in capsys.readouterr().err


def test_cli_issues_tokens_to_the_users_of_the_recorded_federation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A federation's users are in its config: a token goes to one of them, with its GM
    and share from there; a stranger gets none; a live token is revoked before a new one."""
    (tmp_path / "federation.toml").write_text(
        '[federation]\ngms = 2\nusers = "alice:0.5@gm1,bob:0.25@gm0"\n'
    )
    home = ["--state-dir", str(tmp_path)]
    assert main(["user", "add", "carol", *home]) == 1
    assert "not a user of this federation" in capsys.readouterr().err
    assert main(["user", "add", "alice", *home]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]
    rec = TokenStore.in_home(tmp_path).verify("alice", token)
    assert (rec.gm, rec.share) == ("gm1", 0.5)
    kept = tmp_path / "tokens" / "alice"
    assert kept.read_text().strip() == token
    assert kept.stat().st_mode & 0o077 == 0
    assert main(["user", "add", "alice", *home]) == 0  # it has a token: nothing changes
    assert "`megha user revoke alice` first" in capsys.readouterr().out
    assert kept.read_text().strip() == token
    assert main(["user", "revoke", "alice", *home]) == 0
    assert not kept.exists()
    assert main(["user", "add", "alice", *home]) == 0
    assert TokenStore.in_home(tmp_path).get("alice") is not None


def test_cli_uses_megha_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEGHA_HOME", str(tmp_path))
    assert main(["user", "add", "alice", "--share", "0.1"]) == 0
    assert (tmp_path / TOKENS_FILENAME).exists()


@pytest.mark.parametrize("argv", [["user"], ["user", "add"], ["user", "revoke"], ["user", "list"]])
def test_every_user_command_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*argv, "--help"])
    assert exit_.value.code == 0
    assert "usage: megha user" in capsys.readouterr().out
