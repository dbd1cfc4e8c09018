"""Who wakes whom in the live federation: the scheduler's wake-ups of every process of
``bench_live.py``'s 3 GMs x 3 LMs x 120 nodes at one rate, by the role that woke it.

A process that sleeps between messages pays a wake-up each time one comes (on this
host ~90 us of CPU each: README, "Where the live federation's time goes"), so wake-ups
per task say which messages cost a hop, not only a parse.  The script runs
``bench_live.py --rates RATE`` as a child, waits until its rate step is under way,
then records the kernel's ``sched:sched_wakeup`` and ``sched:sched_switch`` events on
every CPU for ``--window`` seconds (``perf record -a``; root) and attributes each
wake-up of a GM, LM, worker pool, the bench client or the broker to the role of the
process running when it was made: a sender's ``write`` wakes its receiver, so the
waker of a socket wake-up is the sender; ``idle/irq`` is a timer or an interrupt that
came while the CPU slept.  Involuntary switches (preempted while runnable) are
counted apart.  Figures are per task (offered rate x window).

    python benchmarks/bench_wakes.py --rate 1000 --out docs/figures/bench_wakes/DATE/wakes_1000.json

Needs ``perf`` with the ``sched`` tracepoints, RabbitMQ on 127.0.0.1:5672, and the
machine otherwise quiet.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
ROLES = (
    ("global_master.app", "gm"),
    ("local_master.app", "lm"),
    ("worker.app", "workers"),
    ("bench_live.py", "bench_client"),
)
_EVENT = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+\[\d+\]\s+[\d.]+:\s+sched:(\w+):\s+(.*)")


def _role_of_cmdline(pid: str) -> str | None:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    if comm == "beam.smp":
        return "broker"
    for needle, role in ROLES:
        if needle in cmd:
            return role
    return None


def roles_by_thread() -> dict[int, str]:
    """Every thread of a federation process, the bench client and the broker: its role."""
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        role = _role_of_cmdline(d.name)
        if role is None:
            continue
        try:
            tids = [int(t.name) for t in (d / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            out[tid] = role
    return out


def attribute(
    lines: list[str], roles: dict[int, str]
) -> tuple[Counter[tuple[str, str]], Counter[str]]:
    """Wake-ups ``(woken role, waker role)`` and involuntary switches per role, from
    ``perf script`` lines (``comm pid/tid [cpu] time: sched:EVENT: fields``)."""
    wakes: Counter[tuple[str, str]] = Counter()
    preempted: Counter[str] = Counter()
    for line in lines:
        m = _EVENT.match(line)
        if m is None:
            continue
        _comm, _pid, tid, event, fields = m.groups()
        if event == "sched_wakeup":
            target = re.search(r"\bpid=(\d+)", fields)
            if target is None or int(target[1]) not in roles:
                continue
            waker_tid = int(tid)
            waker = "idle/irq" if waker_tid == 0 else roles.get(waker_tid, "other")
            wakes[(roles[int(target[1])], waker)] += 1
        elif event == "sched_switch":
            prev = re.search(r"prev_pid=(\d+) .*prev_state=(\S+)", fields)
            if prev is not None and int(prev[1]) in roles and prev[2].startswith("R"):
                preempted[roles[int(prev[1])]] += 1
    return wakes, preempted


def per_task(
    wakes: Counter[tuple[str, str]], preempted: Counter[str], tasks: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role in sorted({r for r, _ in wakes} | set(preempted)):
        by = {w: round(n / tasks, 4) for (r, w), n in wakes.most_common() if r == role}
        out[role] = {
            "wakes_per_task": round(sum(n for (r, _), n in wakes.items() if r == role) / tasks, 4),
            "by_waker": by,
            "preempted_per_task": round(preempted[role] / tasks, 4),
        }
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Wake-ups per task of every live federation process, by who woke it "
        "(perf sched tracepoints during a bench_live.py rate step)"
    )
    p.add_argument("--rate", type=float, default=1000.0, help="tasks/s of the step")
    p.add_argument("--seconds", type=float, default=20.0, help="the step's submission time")
    p.add_argument("--window", type=float, default=5.0, help="seconds recorded mid-step")
    p.add_argument("--start-after", type=float, default=8.0,
                   help="seconds into the step before recording")  # fmt: skip
    p.add_argument("--base-port", type=int, default=47600)
    p.add_argument("--out", default="results/bench_wakes/wakes.json")
    return p


def main() -> int:
    args = _parser().parse_args()
    if args.start_after + args.window >= args.seconds:
        sys.exit("bench_wakes: --start-after + --window must end before the step does")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-wakes-"))
    live = subprocess.Popen(
        [sys.executable, "-u", str(HERE / "benchmarks" / "bench_live.py"), "--rates", f"{args.rate:g}",
         "--seconds", f"{args.seconds:g}", "--base-port", str(args.base_port),
         "--out", str(work / "bench_live.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE,
    )  # fmt: skip
    assert live.stdout is not None
    for line in live.stdout:  # the ramp's step follows the 50% load step
        print(line, end="", file=sys.stderr)
        if line.strip().startswith("load50:"):
            break
    else:
        sys.exit(f"bench_wakes: bench_live.py ended before its rate step (exit {live.wait()})")
    time.sleep(args.start_after)
    roles = roles_by_thread()
    print(f"recording {args.window:g} s ({len(roles)} threads of the federation)", file=sys.stderr)
    data = work / "perf.data"
    subprocess.run(
        ["perf", "record", "-q", "-e", "sched:sched_wakeup,sched:sched_switch", "-a",
         "-o", str(data), "--", "sleep", f"{args.window:g}"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,cpu,time,event,trace"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    rest = live.stdout.read()
    print(rest, end="", file=sys.stderr)
    if live.wait() != 0:
        sys.exit(f"bench_wakes: bench_live.py failed (exit {live.returncode})")
    wakes, preempted = attribute(script.stdout.splitlines(), roles)
    tasks = args.rate * args.window
    result = {
        "rate": args.rate,
        "window_s": args.window,
        "tasks_in_window": tasks,
        "loadavg": os.getloadavg(),
        "roles": per_task(wakes, preempted, tasks),
        "wakes_per_task_python": round(
            sum(n for (r, _), n in wakes.items() if r != "broker") / tasks, 4
        ),
        "bench_live": json.loads((work / "bench_live.json").read_text())["ramp"][-1][
            "cpu_ms_per_task"
        ],
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    for role, row in result["roles"].items():
        print(f"{role:>13}: {row['wakes_per_task']:.3f} wakes/task {row['by_waker']}, "
              f"preempted {row['preempted_per_task']:.3f}/task")  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
