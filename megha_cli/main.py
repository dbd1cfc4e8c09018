"""``megha``: the command line.  Each sub-command lives in its own module and
registers itself here, so the simulator and the live federation never share a file."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence

from megha_cli import jobs
from megha_cli.terminal import INTERRUPTED

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def registrars() -> tuple[Registrar, ...]:
    """Each adds its sub-commands to the parser, in the order ``megha --help`` lists them."""
    from megha_cli import chaos, live, ops, simulate, users
    from megha_cli.dashboard import server as dashboard

    return (simulate.register, live.register, jobs.register, users.register, ops.register,
            dashboard.register, chaos.register)  # fmt: skip


def build_parser(only: Sequence[Registrar] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megha",
        description=(
            "Megha: a decentralized federated cluster scheduler. Run a federation "
            "(up/down/status/demo/bench), run your jobs on it (submit/jobs/job/cancel/logs), "
            "watch and question it (top/why), or simulate one at scale (simulate)."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in registrars() if only is None else only:
        register(sub)
    return parser


def exit_on_sigterm() -> None:
    """A SIGTERM (``timeout``, ``kill``, a container's stop) ends the command as an
    interrupt does: ``with`` blocks and ``finally`` clauses run (a simulation's scratch
    files, a bench's federation), and the exit code is 143.  Left alone where SIGTERM is
    ignored (``nohup``-like parents) or already handled."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def terminated(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends it at once
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # the program (not a caller's in-process use)
        exit_on_sigterm()
    argv = sys.argv[1:] if argv is None else list(argv)
    # a user's own commands (submit, jobs, job, cancel, logs) load theirs alone: the
    # others' modules (the simulator, chaos, the services) took 5 of the 7 s a call
    # spent importing on a loaded 2-core machine (python -X importtime)
    front_door = bool(argv) and argv[0] in jobs.COMMANDS
    parser = build_parser([jobs.register] if front_door else None)
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
