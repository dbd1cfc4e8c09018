"""``megha down --purge`` on the broker, with ``rabbitmqctl`` replaced by a record of
the commands: the vhost, the configured parties' users, and the users of parties an
older config of the same federation had -- never another federation's or a stranger's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from common.config import load_config
from federation import provision
from security.broker_acl import BrokerLayout, Rabbitmqctl, is_party_user, teardown

LAYOUT = BrokerLayout(
    federation="fed", gms=("gm0",), lms=("lm0",), users=(("u0", "gm0"), ("u1", "gm0"))
)


class FakeCtl(Rabbitmqctl):
    """A broker with ``users``; records what is run."""

    def __init__(self, users: Sequence[str]) -> None:
        super().__init__(("/bin/false",))
        self.broker_users = list(users)
        self.ran: list[list[str]] = []

    def run(self, *args: str, absent_ok: bool = False) -> str:
        self.ran.append(list(args))
        return ""

    def run_all(
        self, commands: Sequence[Sequence[str]], *, absent_ok: bool = False, parallel: int = 4
    ) -> None:
        assert absent_ok
        self.ran.extend(list(c) for c in commands)

    def json(self, *args: str) -> list[dict[str, Any]]:
        assert args[0] == "list_users"
        return [{"user": u, "tags": []} for u in self.broker_users]

    def deleted_users(self) -> set[str]:
        return {c[1] for c in self.ran if c[0] == "delete_user"}


def test_purge_also_deletes_the_users_an_older_config_left() -> None:
    ours = {LAYOUT.broker_user(i) for i in LAYOUT.identities()}
    older = ["fed.user.u_gone", "fed.gm.gm7", "fed.lm.lm9", "fed.workers.lm9"]
    others = ["guest", "other.user.u0", "fed2.gm.gm0", "fed.stranger.x", "fed.user.", "fed"]
    ctl = FakeCtl([*ours, *older, *others])
    left = teardown(LAYOUT, ctl)
    assert ctl.ran[0] == ["delete_vhost", "fed"]
    assert left == sorted(older)
    assert ctl.deleted_users() == ours | set(older)


def test_a_party_user_is_named_after_its_federation_role_and_party() -> None:
    assert is_party_user("fed", "fed.user.alice")
    assert is_party_user("fed", "fed.operator.operator")
    assert not is_party_user("fed", "fed.user.a.b")  # no party name has a dot
    assert not is_party_user("fed", "fed.admin.alice")
    assert not is_party_user("fed", "fedx.user.alice")
    assert not is_party_user("fed", "guest")


def test_down_purge_says_which_older_users_it_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None)
    (tmp_path / "broker.json").write_text("{}")  # provisioned with broker users
    layout = BrokerLayout.from_config(cfg)
    ours = [layout.broker_user(i) for i in layout.identities()]
    ctl = FakeCtl([*ours, f"{cfg.name}.user.old"])
    monkeypatch.setattr(provision, "_rabbitmqctl", lambda _: ctl)
    said = provision.purge(cfg, tmp_path)
    assert said == (
        f"deleted the broker vhost {cfg.name!r} and its users, and 1 left by older configs "
        f"({cfg.name}.user.old)"
    )
    assert f"{cfg.name}.user.old" in ctl.deleted_users()
    ctl = FakeCtl(ours)
    monkeypatch.setattr(provision, "_rabbitmqctl", lambda _: ctl)
    assert provision.purge(cfg, tmp_path) == f"deleted the broker vhost {cfg.name!r} and its users"
