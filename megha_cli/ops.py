"""``megha why | top``: an operator asks the running federation's services.

``why USER TASK_ID`` asks the GM of the task's user (``GET /v1/tasks/{user}/{task_id}``,
signed as the operator) where the task is, what happened to it and why it waits;
``why ID`` asks every GM what it knows under a task or job id (``GET /v1/find/{id}``)
and prints one timeline of everything found, in time order.
``top`` watches every GM's and LM's ``/v1/inspect`` and the broker's queue depths,
refreshed every second: a live ``rich`` table on a terminal, plain tables otherwise.
The answers are computed by the services (``global_master.inspect``,
``local_master.inspect``); this module only asks and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from common.config import FederationConfig, load_config
from common.errors import ConfigError, MeghaError
from federation.operator import depth_queues, find_everywhere, gather, operator_get, queue_depths
from federation.processes import state_dir
from megha_cli.terminal import LiveTables, Section, plain, render_plain, show
from security.access import Access


def _federation(args: argparse.Namespace) -> tuple[FederationConfig, Access]:
    home: Path = state_dir(args.state_dir)
    if not (home / "federation.toml").exists():
        raise ConfigError(f"no federation recorded in {home} (start one with `megha up`)")
    cfg = load_config(home / "federation.toml")
    return cfg, Access.in_home(home, cfg)


# ------------------------------------------------------------------- why
def task_ids(args: argparse.Namespace) -> tuple[str | None, str]:
    """(user, task id) from ``USER TASK_ID`` or ``TASK_ID --user USER``; (None, id)
    from a lone ``TASK_OR_JOB_ID`` (looked for on every GM)."""
    ids: list[str] = args.ids
    if len(ids) == 2 and args.user is None:
        return ids[0], ids[1]
    if len(ids) == 1:
        return args.user, ids[0]
    raise ConfigError(
        "give TASK_OR_JOB_ID, USER TASK_ID, or TASK_ID --user USER", reason="bad_arguments"
    )


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"


def _rel(at: float, t0: float) -> str:
    return f"{at - t0:+.3f}s"


def why_sections(answer: dict[str, Any]) -> list[Section]:
    """A GM's answer about one task, as tables: what it is, its timeline, why it waits."""
    t0 = float(answer.get("submitted_at", 0.0))
    head = [
        f"attempt {answer.get('attempt', 0)}" + (f" on {answer['lm']}" if answer.get("lm") else "")
    ]
    if answer.get("priority"):
        head.append(f"priority class {answer['priority']}")
    if t0 > 0:
        head.append(f"submitted {_clock(t0)}")
    for key, what in (("started_at", "started"), ("finished_at", "ended")):
        at = float(answer.get(key, -1.0))
        if at >= 0:
            head.append(f"{what} {_clock(at)} ({_rel(at, t0)} after submission)")
    if answer.get("reason"):
        head.append(f"reason: {answer['reason']}")
    title = (
        f"{answer['user']}/{answer['task_id']}"
        + (f" (job {answer['job_id']})" if answer.get("job_id") else "")
        + f" at {answer['gm']}: {answer['state'].replace('_', ' ')}"
    )
    rows = []
    for step in answer.get("timeline", []):
        count = int(step.get("count", 1))
        times = f"x{count} until {_rel(step['last_at'], t0)}" if count > 1 else ""
        node = step.get("node")
        rows.append(
            [
                _rel(step["at"], t0), step["what"], step.get("lm", ""),
                "" if node is None else str(node), step.get("partition", ""),
                step.get("detail", ""), times,
            ]
        )  # fmt: skip
    dropped = int(answer.get("timeline_dropped", 0))
    notes = [f"({dropped} earlier steps dropped: a timeline keeps its latest)"] if dropped else []
    timeline = Section(
        "timeline", ["at", "step", "LM", "node", "partition", "detail", "repeats"], rows, notes
    )
    reasons = answer.get("why") or ["nothing holds it back"]
    return [
        Section(title, [], [], head),
        timeline,
        Section("why", [], [], [f"- {line}" for line in reasons]),
    ]


def merged_timeline(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every step of every task found, each with its GM, user and task, in time order
    (steps at the same time keep each task's own order)."""
    steps = [
        {**step, "gm": page["gm"], "user": task["user"], "task_id": task["task_id"]}
        for page in found
        for task in page["tasks"]
        for step in task.get("timeline", [])
    ]
    steps.sort(key=lambda s: float(s["at"]))
    return steps


def _state_of(task: dict[str, Any]) -> str:
    state = str(task["state"]).replace("_", " ")
    return f"{state}: {task['reason']}" if task.get("reason") else state


def _timeline_rows(steps: list[dict[str, Any]], t0: float) -> list[list[str]]:
    """The merged timeline's rows, times after ``t0``."""
    rows = []
    for step in steps:
        count = int(step.get("count", 1))
        node = step.get("node")
        rows.append(
            [
                _rel(step["at"], t0), step["gm"], step["task_id"], step["what"], step.get("lm", ""),
                "" if node is None else str(node), step.get("partition", ""),
                step.get("detail", ""),
                f"x{count} until {_rel(step['last_at'], t0)}" if count > 1 else "",
            ]
        )  # fmt: skip
    return rows


def find_sections(ident: str, found: list[dict[str, Any]]) -> list[Section]:
    """What the GMs know under ``ident``: one task's full story (``why_sections``), or the
    jobs and tasks found, their merged timeline and why the unfinished ones wait."""
    tasks = [t for page in found for t in page["tasks"]]
    jobs = [{**j, "gm": page["gm"]} for page in found for j in page["jobs"]]
    if len(tasks) == 1 and not jobs:
        return why_sections(tasks[0])
    steps = merged_timeline(found)
    t0 = min((float(s["at"]) for s in steps), default=0.0)
    shown = sum(int(p["tasks_shown"]) for p in found)
    total = sum(int(p["tasks_found"]) for p in found)
    gms = ", ".join(p["gm"] for p in found)
    head = [f"job(s): {len(jobs)}, task(s): {total}, on {gms}"]
    if t0 > 0:
        head.append(f"first step {_clock(t0)}; times below are after it")
    if shown < total:
        head.append(f"{shown} of the {total} tasks are shown (a GM answers the first of a job's)")
    job_rows = [
        [j["gm"], j["user"], j["job_id"], j["state"], str(j["tasks"]),
         str(j.get("left", "")), str(j.get("unsettled", ""))]
        for j in jobs
    ]  # fmt: skip
    task_rows = [
        [t["gm"], t["user"], t["task_id"], _state_of(t), str(t.get("attempt", "")), t.get("lm", "")]
        for t in tasks
    ]
    rows = _timeline_rows(steps, t0)
    waiting = [
        f"- {t['task_id']}: {t['why'][0]}"
        for t in tasks
        if t["state"] not in ("finished", "failed") and t.get("why")
    ]
    sections = [Section(f"{ident}", [], [], head)]
    if jobs:
        sections.append(
            Section(
                "jobs", ["GM", "user", "job", "state", "tasks", "left", "not accepted"], job_rows
            )
        )
    if tasks:
        sections.append(
            Section("tasks", ["GM", "user", "task", "state", "attempt", "LM"], task_rows)
        )
    sections.append(
        Section(
            "timeline",
            ["at", "GM", "task", "step", "LM", "node", "partition", "detail", "repeats"],
            rows,
        )
    )
    if waiting:
        sections.append(Section("why", [], [], waiting))
    return sections


def not_found_line(ident: str, unanswered: dict[str, str]) -> str:
    """What ``why`` says when no GM knows ``ident``."""
    if not unanswered:
        return f"{ident}: not found on any GM"
    missing = "; ".join(f"{g}: {why}" for g, why in sorted(unanswered.items()))
    return f"{ident}: not found on any GM that answered (no answer from {missing})"


def cmd_find(args: argparse.Namespace, cfg: FederationConfig, access: Access, ident: str) -> int:
    """``why ID``: ask every GM, print what they know."""
    found, unanswered = find_everywhere(cfg, access, ident)
    if args.json:
        doc = {"id": ident, "found": found, "unanswered": unanswered,
               "timeline": merged_timeline(found)}  # fmt: skip
        print(json.dumps(doc, indent=2, sort_keys=True))
    if not found:
        print(f"megha why: {not_found_line(ident, unanswered)}", file=sys.stderr)
        return 1
    if args.json:
        return 0
    sections = find_sections(ident, found)
    if unanswered:
        missing = [f"- {g}: {why}" for g, why in sorted(unanswered.items())]
        sections.append(Section("GMs that did not answer (they may know more)", [], [], missing))
    show(sections, quiet=args.quiet)
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    try:
        cfg, access = _federation(args)
        user, task_id = task_ids(args)
        if user is None:
            return cmd_find(args, cfg, access, task_id)
        gm = next((u.gm for u in cfg.user_configs if u.user == user), None)
        if gm is None:
            known = ", ".join(u.user for u in cfg.user_configs)
            raise ConfigError(f"no user {user!r} in this federation (users: {known})")
        path = f"/v1/tasks/{quote(user, safe='')}/{quote(task_id, safe='')}"
        answer = operator_get(cfg, access, gm, path)
    except MeghaError as exc:
        print(f"megha why: {exc}", file=sys.stderr)
        return 1
    if "error" in answer:
        print(f"megha why: {gm}: {answer.get('detail') or answer['error']}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
        return 0
    show(why_sections(answer), quiet=args.quiet)
    return 0


# ------------------------------------------------------------------- top


def _shares(users: dict[str, Any]) -> str:
    return "  ".join(
        f"{u} {row['dominant_share']:.2f}/{row['share']:.2f}" for u, row in sorted(users.items())
    )


def _error(page: dict[str, Any]) -> str:
    return f"unreachable: {page.get('detail') or page['error']}"[:60]


GM_COLUMNS = ("GM", "state", "queued", "waiting", "in flight", "running", "ended ok/failed",
              "dominant share/share")  # fmt: skip
LM_COLUMNS = ("LM", "epoch", "alive/nodes", "free nodes", "running", "free/capacity",
              "partitions: free/nodes", "repartitions")  # fmt: skip


def top_sections(
    pages: dict[str, dict[str, dict[str, Any]]], depths: dict[str, int] | None, header: str
) -> list[Section]:
    """GMs (queues, in flight, running, dominant shares), LMs (nodes, free, partitions)
    and the broker's queue depths, as tables."""
    gm_rows = []
    for g, p in pages["gms"].items():
        if "error" in p:
            gm_rows.append([g, _error(p), "", "", "", "", "", ""])
            continue
        tot, ended = p["totals"], p["recently_ended"]
        gm_rows.append(
            [
                g, "ready" if p["ready"] else "starting", str(tot["queued"]), str(tot["waiting"]),
                str(tot["in_flight"]), str(tot["running"]), f"{ended['finished']}/{ended['failed']}",
                _shares(p["users"]),
            ]
        )  # fmt: skip
    lm_rows = []
    for lm, p in pages["lms"].items():
        if "error" in p:
            lm_rows.append([lm, _error(p), "", "", "", "", "", ""])
            continue
        parts = "  ".join(
            f"{gm} {q['free_nodes']}/{q['nodes']}" for gm, q in sorted(p["partitions"].items())
        )
        lm_rows.append(
            [
                lm, str(p["epoch"]), f"{p['nodes_alive']}/{p['nodes']}", str(p["nodes_free"]),
                str(p["running_tasks"]), f"{p['free_total']}/{p['capacity_total']}", parts,
                str(p["repartitions_total"]),
            ]
        )  # fmt: skip
    sections = [
        Section(header, [], []),
        Section("GMs", GM_COLUMNS, gm_rows),
        Section("LMs", LM_COLUMNS, lm_rows),
    ]
    if depths is None:
        sections.append(Section("broker: unreachable", [], []))
    else:
        rows = [[q, "absent" if n < 0 else str(n)] for q, n in depths.items()]
        sections.append(Section("broker queues", ["queue", "ready"], rows))
    return sections


async def _top(args: argparse.Namespace, cfg: FederationConfig, access: Access) -> None:
    from runtime import broker

    conn: Any = None
    with contextlib.suppress(Exception):  # the table says the broker is unreachable
        conn, _ = await broker.connect_any(access.broker_urls())
    live: LiveTables | None = None
    loop = asyncio.get_running_loop()
    if not plain(args.quiet):
        live = LiveTables()
        live.start()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGWINCH, live.redraw)  # resized: redraw now
    try:
        n = 0
        while True:
            t = time.monotonic()
            pages = await asyncio.to_thread(gather, cfg, access)
            depths: dict[str, int] | None = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    depths = await queue_depths(conn, depth_queues(cfg))
            stamp = dt.datetime.now(dt.UTC).strftime("%H:%M:%S UTC")
            header = f"megha top: federation {cfg.name!r} at {stamp}"
            sections = top_sections(pages, depths, header)
            if live is not None:
                live.update(sections)
            else:
                print(render_plain(sections) + "\n", flush=True)
            n += 1
            if args.iterations and n >= args.iterations:
                break
            await asyncio.sleep(max(0.0, args.interval - (time.monotonic() - t)))
    finally:
        if live is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGWINCH)
            live.stop()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def cmd_top(args: argparse.Namespace) -> int:
    try:
        cfg, access = _federation(args)
        if args.interval <= 0 or args.iterations < 0:
            raise ConfigError("--interval must be > 0 and --iterations >= 0")
        asyncio.run(_top(args, cfg, access))
    except MeghaError as exc:
        print(f"megha top: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    why = sub.add_parser(
        "why",
        help="what happened to a task or a job: its timeline and why it waits",
        description="With a lone TASK_OR_JOB_ID: ask every GM (GET /v1/find/ID, signed as "
        "the operator) for the task of that id and the jobs of that id, of any user, and "
        "print one timeline of all their steps in time order (submitted, decisions that "
        "did not place them and why, launches with LM, node and partition, refusals with "
        "the LM's reason, accepted, started, preempted, requeued, finished or failed); "
        "exit 1 with 'not found on any GM' when none knows it. With USER TASK_ID (or "
        "TASK_ID --user USER): ask only the user's GM about that task. A task's state "
        "is queued, waiting, in flight, running, finished or failed; the reasons it "
        "waited come with counts. Ended tasks are remembered (each GM keeps the latest "
        "4096 that ended).",
    )
    why.add_argument(
        "ids",
        nargs="+",
        metavar="ID",
        help="TASK_OR_JOB_ID (looked for on every GM), or USER TASK_ID, or TASK_ID with --user",
    )
    why.add_argument("--user", help="the task's user (with a lone TASK_ID)")
    why.add_argument("--state-dir", help="the federation's state ($MEGHA_HOME or ./.megha)")
    why.add_argument(
        "--json",
        action="store_true",
        help="print the answer as JSON: the GM's, or with a lone ID every GM's that found it "
        "(found), those that did not answer (unanswered) and the merged timeline",
    )
    why.add_argument("--quiet", action="store_true", help="plain text (also when not a TTY)")
    why.set_defaults(run=cmd_why)
    top = sub.add_parser(
        "top",
        help="watch the federation live: queues, shares, nodes, partitions, broker",
        description="A table refreshed every --interval seconds from every GM's and LM's "
        "/v1/inspect and the broker: GMs (queued, waiting, in flight, running, dominant share "
        "against share per user), LMs (nodes alive, free nodes, running tasks, free resources, "
        "each partition's free nodes, repartitions), queue depths. Live on a terminal, at "
        "its width (COLUMNS, else the terminal's; followed when it is resized); plain "
        "tables, one per refresh, when not a TTY or with --quiet. Ctrl-C stops it.",
    )
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--iterations", type=int, default=0, help="stop after N refreshes (0: never)")
    top.add_argument("--state-dir", help="the federation's state ($MEGHA_HOME or ./.megha)")
    top.add_argument("--quiet", action="store_true", help="plain tables (also when not a TTY)")
    top.set_defaults(run=cmd_top)
