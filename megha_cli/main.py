"""``megha``: the command line.  Each sub-command lives in its own module and
registers itself here, so the simulator and the live federation never share a file."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

# (module, function) pairs; each function adds its sub-commands to the parser.
COMMAND_MODULES: tuple[str, ...] = (
    "megha_cli.simulate",
    "megha_cli.federation",
    "megha_cli.users",
    "megha_cli.ops",
    "megha_cli.dashboard.server",
    "megha_cli.chaos",
)

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megha",
        description=(
            "Megha: a decentralized federated cluster scheduler. Run a federation "
            "(up/down/status/demo/bench), watch and question it (top/why), or simulate one at "
            "scale (simulate)."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        register: Registrar = module.register
        register(sub)
    return parser


INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        code = run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except KeyboardInterrupt:
        print(f"\nmegha {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # the reader went away (`megha status | head`): nothing more to say, and nothing
        # for the interpreter to flush into the closed pipe at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
