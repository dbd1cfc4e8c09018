"""``megha user add | revoke | list``: the users of a federation and their tokens.

A federation's users, their GMs and shares are in its configuration (``users``);
``megha up`` issues each a token.  Tokens live hashed in ``$MEGHA_HOME/users.json``
(``security.tokens``); the operator's copy of each is in ``$MEGHA_HOME/tokens/<user>``
(0600) to hand over.  ``revoke`` makes a token useless at once (running services
re-read the file within a second), deletes the user's broker login (its connections
close) and has its GM end its queued and running tasks; ``add`` issues a new one and
prints it.
"""

from __future__ import annotations

import argparse
import sys
import time

from common.errors import MeghaError
from federation.processes import state_dir
from federation.users import issue_token, revoke_user
from security.access import tokens_dir
from security.tokens import TokenStore


def cmd_add(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    try:
        token = issue_token(home, args.name, args.gm, args.share)
    except MeghaError as exc:
        print(f"megha user add: {exc}", file=sys.stderr)
        return 1
    rec = TokenStore.in_home(home).get(args.name)
    assert rec is not None
    if token is None:
        print(f"user {args.name!r} exists already with GM {rec.gm} and share {rec.share:g}: "
              f"nothing changed (its token: {tokens_dir(home) / args.name}; a new one: "
              f"`megha user revoke {args.name}` first)")  # fmt: skip
        return 0
    print(f"user {args.name!r}: a new token (GM {rec.gm}, share {rec.share:g}).")
    print("Its token, shown this once (only a hash is kept; the operator's copy is in "
          f"{tokens_dir(home) / args.name}):")  # fmt: skip
    print(token)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    try:
        broker = revoke_user(home, args.name)
    except MeghaError as exc:
        print(f"megha user revoke: {exc}", file=sys.stderr)
        return 1
    print(f"revoked the token of {args.name!r}; running services refuse it from now on")
    print(f"  broker: {broker}")
    print("  its GM ends its queued and running tasks (reason user_revoked) within a second")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    home = state_dir(args.state_dir)
    try:
        users = TokenStore.in_home(home).users()
    except MeghaError as exc:
        print(f"megha user list: {exc}", file=sys.stderr)
        return 1
    if not users:
        print(f"no users in {home} (add one with `megha user add NAME`)")
        return 0
    print(f"{'user':<20} {'gm':<10} {'share':>6}  {'created (UTC)':<20} status")
    for r in users:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.created_at))
        print(
            f"{r.user:<20} {r.gm:<10} {r.share:>6.3g}  {created:<20} {'revoked' if r.revoked else 'active'}"
        )
    return 0


def _state_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="the federation's directory ($MEGHA_HOME or ./.megha)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "user",
        help="add, revoke and list the users of a federation (submission tokens)",
        description="Users submit jobs with a token of their own. Tokens are stored hashed "
        "in $MEGHA_HOME/users.json (mode 0600); services re-read it when it changes.",
    )
    users = p.add_subparsers(dest="user_command", metavar="ACTION", required=True)

    a = users.add_parser(
        "add",
        help="add a user and print its new token once",
        description="Issue a new token for user NAME (a user of the federation's config, "
        "whose GM and share it takes) and print it. Only a hash is stored; the operator's "
        "copy is kept in $MEGHA_HOME/tokens/NAME (0600). A user that has a token already "
        "is left as it is (exit 0) when --gm and --share are its own or not given, and "
        "refused (exit 1, naming its GM and share) when they differ; revoke it first for "
        "a new token.",
    )
    a.add_argument("name", metavar="NAME", help="1-64 of [A-Za-z0-9_-]")
    a.add_argument(
        "--gm", help="the GM that serves this user (default: the GM with the fewest users)"
    )
    a.add_argument(
        "--share", type=float, help="share of the federation in (0, 1] (default: what is left)"
    )
    _state_dir_arg(a)
    a.set_defaults(run=cmd_add)

    r = users.add_parser(
        "revoke",
        help="revoke a user's token and broker login; its queued and running tasks end "
        "(user_revoked)",
        description="Revoke NAME's token. Running services re-read the users file and "
        "refuse it within a second; its broker login is deleted (the broker closes its "
        "connections); its GM ends its queued tasks and has its LMs stop its running ones, "
        "each ending with reason user_revoked. `megha user add NAME` issues a new token "
        "and broker password.",
    )
    r.add_argument("name", metavar="NAME")
    _state_dir_arg(r)
    r.set_defaults(run=cmd_revoke)

    ls = users.add_parser(
        "list",
        help="list users, their GM, share and status",
        description="List the users of the federation (never their tokens).",
    )
    _state_dir_arg(ls)
    ls.set_defaults(run=cmd_list)
