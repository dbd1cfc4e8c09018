"""The users of a federation and their tokens: issue one, revoke one.

A federation's users, their GMs and shares are in its configuration (``users``);
``federation.provision`` issues each a token at start.  Tokens live hashed in
``$MEGHA_HOME/users.json`` (``security.tokens``); the operator's copy of each is in
``$MEGHA_HOME/tokens/<user>`` (0600) to hand over.  A revoked token is useless at once
(running services re-read the file within a second), the user's broker login is
deleted (the broker closes its connections), and its GM ends its queued and running
tasks with ``user_revoked`` (``global_master.revocation``).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from common.config import load_config
from common.errors import MeghaError
from federation.provision import restore_broker_login, revoke_broker_login, save_outcome_key
from security.access import save_token, tokens_dir
from security.tokens import TokenStore


def _choose_gm(store: TokenStore, gms: list[str] | None, asked: str | None) -> str:
    if gms is None:
        return asked or "gm0"
    if asked is not None:
        if asked not in gms:
            raise MeghaError(
                f"no GM {asked!r} in this federation ({', '.join(gms)})", reason="unknown_gm"
            )
        return asked
    load = dict.fromkeys(gms, 0)
    for r in store.users():
        if not r.revoked and r.gm in load:
            load[r.gm] += 1
    return min(gms, key=lambda g: (load[g], gms.index(g)))


SHARE_TOLERANCE = 1e-9
"""Shares closer than this are the same share (``0.1 + 0.2`` is ``0.3``)."""


def _differs(
    name: str, has: tuple[str, float], asked: tuple[str | None, float | None], where: str
) -> MeghaError | None:
    """The refusal of ``megha user add`` asking ``name`` for another GM or share than
    the ones it ``has`` (from ``where``); None if what is asked is what it has."""
    gm, share = asked
    if (gm is None or gm == has[0]) and (share is None or abs(share - has[1]) <= SHARE_TOLERANCE):
        return None
    wanted = ", ".join(
        part
        for part in (
            f"GM {gm}" if gm is not None else "",
            f"share {share:g}" if share is not None else "",
        )
        if part
    )
    return MeghaError(
        f"user {name!r} exists with GM {has[0]} and share {has[1]:g} ({where}), not {wanted}",
        reason="user_differs",
    )


def issue_token(
    home: Path, name: str, gm: str | None = None, share: float | None = None
) -> str | None:
    """A new token for ``name`` (revoked before, or new): recorded hashed, kept for the
    operator in ``tokens/<name>``; its GM and share from the federation's config.  None
    when ``name`` holds a live token with that GM and share already (nothing changes);
    ``MeghaError`` (``user_differs``) when it exists with another GM or share."""
    store = TokenStore.in_home(home)
    held = store.get(name)
    live = held if held is not None and not held.revoked else None
    path = home / "federation.toml"
    if path.exists():
        cfg = load_config(path)
        conf = next((u for u in cfg.user_configs if u.user == name), None)
        if conf is None:
            raise MeghaError(
                f"{name!r} is not a user of this federation: add it to `users` in the config "
                "and start the federation again",
                reason="unknown_user",
            )
        where = "in the federation's config: change it there and run `megha up` again"
        refusal = _differs(name, (conf.gm, conf.share), (gm, share), where)
        if refusal is not None:
            raise refusal
        gm, share = conf.gm, conf.share
    elif live is not None:
        where = f"to change them, `megha user revoke {name}` and add it again"
        refusal = _differs(name, (live.gm, live.share), (gm, share), where)
        if refusal is not None:
            raise refusal
    if live is not None:
        return None
    gm = _choose_gm(store, None, gm)
    share = store.free_share() if share is None else share
    if share <= 0:
        raise MeghaError("no unallocated share left: pass --share", reason="shares_exceed")
    token = store.add(name, gm=gm, share=share, now=time.time())
    save_token(home, name, token)
    save_outcome_key(home, name, gm)
    if path.exists():
        restore_broker_login(load_config(path), home, name)
    return token


def revoke_user(home: Path, name: str) -> str:
    """Revoke ``name``'s token and forget the operator's copy of it; delete its broker
    login (its connections close).  Its GM ends its queued and running tasks
    (``user_revoked``) once it reads the token file again (within a second).  Returns
    what was done at the broker."""
    TokenStore.in_home(home).revoke(name, now=time.time())
    with contextlib.suppress(FileNotFoundError):
        (tokens_dir(home) / name).unlink()
    path = home / "federation.toml"
    if not path.exists():
        return "no federation config here: no broker login to remove"
    return revoke_broker_login(load_config(path), home, name)
