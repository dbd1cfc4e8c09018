"""``megha submit / jobs / job / cancel / logs``: a user's own jobs, through the GMs'
front door, with the Python client (``client``) as any program would use it.

Exit codes: 0 done (``submit --wait``: every task finished); 1 a job ended otherwise
(failed, cancelled) or ``--wait`` timed out; 2 bad input (a malformed job file, bad
arguments); 3 no such job or task (also another user's); 4 credentials refused
(unknown user, bad or revoked token); 5 the federation cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from client import Client, FrontDoorError, JobView, load_job
from common.errors import ConfigError
from megha_cli.progress import Progress

EXIT = {
    "bad_job_file": 2, "bad_job_id": 2, "bad_state": 2, "bad_stream": 2, "duplicate_job_id": 2,
    "unknown_job": 3, "unknown_task": 3, "missing_credentials": 4, "unknown_user": 4,
    "bad_token": 4, "revoked_token": 4, "no_token": 4, "unreachable": 5, "no_federation": 5,
    "timeout": 1, "wrong_resources": 2, "impossible_resources": 2, "zero_demand": 2,
    "commands_disabled": 2, "duration_too_long": 2, "bad_dag": 2, "user_task_limit": 5,
    "env_not_allowed": 2, "bad_env": 2, "broker_unavailable": 5, "queue_full": 5, "busy": 5, "too_many_bodies": 5,
}  # fmt: skip
"""Exit code per refusal reason (anything else: 1)."""
COMMANDS = frozenset({"submit", "jobs", "job", "cancel", "logs"})
"""The sub-commands ``register`` adds (``megha_cli.main`` loads this module alone for them)."""


def _client(args: argparse.Namespace) -> Client:
    return Client.connect(
        args.address, user=args.user, token_file=args.token_file, state_dir=args.state_dir
    )


def _fail(cmd: str, exc: FrontDoorError | ConfigError) -> int:
    """One line on stderr; the exit code its reason means."""
    print(f"megha {cmd}: {exc.reason}: {exc}", file=sys.stderr)
    return EXIT.get(exc.reason, 1)


def _out(args: argparse.Namespace, doc: Any, text: str) -> None:
    print(json.dumps(doc, indent=1) if args.json else text)


def _counts(v: JobView) -> str:
    return " ".join(f"{s} {n}" for s, n in sorted(v.tasks_by_state.items()))


def _ended_code(views: list[JobView]) -> int:
    return 0 if all(v.state == "finished" for v in views) else 1


# ------------------------------------------------------------------ commands
def cmd_submit(args: argparse.Namespace) -> int:
    try:
        job = load_job(args.jobfile)
        fed = _client(args)
        handle = fed.submit(job, args.id)
        if not args.wait:
            _out(args, {"job_id": handle.job_id, "tasks": handle.task_ids}, handle.job_id)
            return 0
        if not args.json:
            print(handle.job_id, flush=True)
        with Progress(handle.job_id, len(handle.task_ids), quiet=args.json) as bar:

            def show(v: JobView) -> None:
                bar.update(v.done, total=v.tasks, detail=f"{v.state}: {_counts(v)}")

            view = handle.wait(timeout_s=args.timeout, on_progress=show)
    except (FrontDoorError, ConfigError) as exc:
        return _fail("submit", exc)
    _out(args, asdict(view), f"{view.job_id} {view.state}: {_counts(view)}")
    return _ended_code([view])


def cmd_jobs(args: argparse.Namespace) -> int:
    try:
        views = _client(args).jobs(args.state)
    except (FrontDoorError, ConfigError) as exc:
        return _fail("jobs", exc)
    lines = [f"{'JOB':<32} {'STATE':<10} TASKS"] + [
        f"{v.job_id:<32} {v.state:<10} {_counts(v)}" for v in views
    ]
    _out(args, [asdict(v) for v in views], "\n".join(lines))
    return 0


def _when(at: float, since: float) -> str:
    """A time of a job's timeline as its user reads it: UTC, and seconds since it came."""
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp} UTC (+{max(0.0, at - since):.1f} s)"


def _job_text(v: JobView) -> str:
    out = [f"job {v.job_id} ({v.user}): {v.state}  tasks: {_counts(v)}"]
    if v.reason:
        out.append(f"reason: {v.reason}")
    out += [f"  {_when(e['at'], v.submitted_at)}  {e['what']}" for e in v.timeline]
    out.append(f"{'TASK':<36} {'STATE':<10} {'ATTEMPTS':>8} {'EXIT':>5}  REASON")
    out += [
        f"{t.task_id:<36} {t.state:<10} {t.attempts:>8} "
        f"{'-' if t.exit_code is None else t.exit_code:>5}  {t.reason}"
        for t in v.task_list
    ]
    return "\n".join(out)


def cmd_job(args: argparse.Namespace) -> int:
    try:
        v = _client(args).status(args.job_id)
    except (FrontDoorError, ConfigError) as exc:
        return _fail("job", exc)
    _out(args, asdict(v), _job_text(v))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    fed: Client | None = None
    code = 0
    for jid in args.job_ids:
        try:
            fed = fed or _client(args)
            v = fed.cancel(jid)
        except (FrontDoorError, ConfigError) as exc:
            code = max(code, _fail("cancel", exc))
            continue
        said = "ended before the cancel" if v.ended and v.state != "cancelled" else "cancel taken"
        _out(args, asdict(v), f"{jid}: {said} ({v.state}: {_counts(v)})")
    return code


def cmd_logs(args: argparse.Namespace) -> int:
    try:
        fed = _client(args)
        data = fed.logs(args.task_id, "stderr" if args.stderr else "stdout")
        if args.json:
            t = fed.task(args.task_id)
            print(json.dumps(asdict(t) | {"output": data.decode(errors="replace")}, indent=1))
            return 0
    except (FrontDoorError, ConfigError) as exc:
        return _fail("logs", exc)
    sys.stdout.buffer.write(data)
    return 0


# ------------------------------------------------------------------ parsers
def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user", required=True, help="your user name")
    p.add_argument("--token-file", help="your token (default: $MEGHA_HOME/tokens/USER)")
    p.add_argument("--address", help="your GM's URL (default: from the federation's config)")
    p.add_argument("--state-dir", help="the federation's directory ($MEGHA_HOME or ./.megha)")
    p.add_argument("--json", action="store_true", help="print JSON (for scripts)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    epilog = (
        "exit codes: 0 ok (submit --wait: every task finished), 1 a job failed or was "
        "cancelled, 2 bad input, 3 no such job or task, 4 credentials refused, 5 unreachable"
    )
    s = sub.add_parser("submit", help="submit a job file (megha-job/1) to your GM",
                       description="Submit JOBFILE; print its job id (--wait: follow it with a "
                       "progress bar until it ends).", epilog=epilog)  # fmt: skip
    s.add_argument("jobfile", metavar="JOBFILE", help="a megha-job/1 JSON file (examples/)")
    s.add_argument("--id", help="the job's id (default: its name and a random suffix)")
    s.add_argument("--wait", action="store_true", help="follow it until every task ended")
    s.add_argument("--timeout", type=float, default=None, help="--wait at most this long (s)")
    _common(s)
    s.set_defaults(run=cmd_submit)
    j = sub.add_parser("jobs", help="your jobs (live, or ended lately)", epilog=epilog,
                       description="List your jobs, oldest first.")  # fmt: skip
    j.add_argument("--state", help="only jobs in this state (queued, running, finished, ...)")
    _common(j)
    j.set_defaults(run=cmd_jobs)
    one = sub.add_parser("job", help="one job: state, tasks by state, timeline", epilog=epilog,
                         description="A job's state, each task's state, attempts and exit code, "
                         "and its timeline.")  # fmt: skip
    one.add_argument("job_id", metavar="ID")
    _common(one)
    one.set_defaults(run=cmd_job)
    c = sub.add_parser("cancel", help="cancel jobs (idempotent)", epilog=epilog,
                       description="Cancel each job: queued tasks are dropped, running ones "
                       "stopped; each ends cancelled.")  # fmt: skip
    c.add_argument("job_ids", metavar="ID", nargs="+")
    _common(c)
    c.set_defaults(run=cmd_cancel)
    lg = sub.add_parser("logs", help="a task's output (the last 64 KiB)", epilog=epilog,
                        description="Print a task's stdout (or --stderr), as its worker "
                        "captured it (commands on).")  # fmt: skip
    lg.add_argument("task_id", metavar="TASK_ID")
    lg.add_argument("--stderr", action="store_true", help="its stderr instead of its stdout")
    _common(lg)
    lg.set_defaults(run=cmd_logs)
