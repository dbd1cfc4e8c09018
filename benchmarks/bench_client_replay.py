"""The bench client's own work per task, replayed: this tree against another checkout,
alternating in one sitting (issue 35 item 1, the request generator's share).

Record first: a live run at ``--rate`` tasks/s (3 GMs x 3 LMs x 120 nodes, as
``bench_cpu_halving``), with the client's inputs written down as they come: the
workload, each job's publication time, every outcome message (its seal headers and
body, as the broker delivered it) and every page of the pools' launch logs (the
bytes), in the order they came.

    python benchmarks/bench_client_replay.py --record /tmp/client-rec --base-port 48000

Each arm is then a fresh process with its tree first on ``sys.path``; it feeds the
recording through that tree's client, as ``request_generator.bench._drive`` wires it
(``Submitter.submit`` with a broker that takes every publish at once,
``Submitter.take_outcomes``, ``LaunchLog.poll`` on a session that answers the recorded
pages, the ``RunTally`` behind ``sink_into``, ``close_tally``), and takes the CPU
(``time.process_time``) of the run (``run``: what ``bench_cpu_halving``'s run window
holds of the client, but for the AMQP and HTTP I/O) and of the summary after it
(``summary``: ``summarize_run``'s tally figures and the duplicate-launch check's
result).  Arms go old, new, new, old, ...; the figure is the median CPU per task, and
the ratio new/old.

Both arms must report alike: each arm digests what it wrote and found (``tasks.csv``'s
bytes, the tally's summary, the publication columns, the job ends, the runs, the
duplicate-launch result and counts) and the script fails if the digests differ.

    python benchmarks/bench_client_replay.py --against /work/wt/base /tmp/client-rec

writes JSON to ``--out``.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import hashlib
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
EVENTS = "events.pickle"


# ------------------------------------------------------------------- record
def _record(args: argparse.Namespace) -> int:
    """A live run with the client's inputs written to ``args.record``."""
    from dataclasses import replace

    from benchmarks import bench_live as bl
    from common.config import parse_config
    from federation.processes import start_federation, stop_federation
    from federation.provision import purge

    where = Path(args.record)
    where.mkdir(parents=True, exist_ok=True)
    cfg = replace(
        parse_config({}), name=f"client-rec-{os.getpid()}", gms=3, lms=3,
        nodes_per_lm=bl.NODES // 3, base_port=args.base_port,
    ).validate()  # fmt: skip
    home = Path(tempfile.mkdtemp(prefix=f"{cfg.name}-"))
    events: list[tuple[Any, ...]] = []
    on = [False]
    _install_recorders(events, on)
    start_federation(cfg, home)
    try:
        per_job = 10
        row = bl._step(
            cfg, home, Path(tempfile.mkdtemp(prefix="client-rec-step-")), "record", {},
            jobs=int(args.rate * args.seconds / per_job), tasks_per_job=per_job,
            mean_duration=0.02, rate=args.rate / per_job, timeout_s=120.0,
            profile=args.profile,
        )  # fmt: skip
    finally:
        stop_federation(home)
        purge(cfg, home)
    shutil.copytree(
        home, where / "home", dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.log")
    )
    with (where / EVENTS).open("wb") as f:
        pickle.dump({"cfg": {"gms": 3, "lms": 3, "nodes_per_lm": bl.NODES // 3,
                             "base_port": args.base_port, "name": cfg.name},
                     "events": events}, f)  # fmt: skip
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e[0]] = kinds.get(e[0], 0) + 1
    print(json.dumps({"tasks": row["tasks"], "events": kinds, "unfinished": row["unfinished_tasks"],
                      "cpu_ms_per_task": row["cpu_ms_per_task"]}))  # fmt: skip
    if args.profile:
        (where / "profile.json").write_text(json.dumps(row["profile"], indent=1) + "\n")
    return 0


def _install_recorders(events: list[tuple[Any, ...]], on: list[bool]) -> None:
    """The client's inputs appended to ``events`` as they come, once ``on[0]`` (the
    workload's submission turns it on): the workload, each job's publication time,
    every outcome message, every launch-log page and each poll."""
    from request_generator import bench as rg
    from request_generator import submitter as sm

    submit_all, submit, take = rg._submit_all, sm.Submitter.submit, sm.Submitter.take_outcomes
    fetch = rg.LaunchLog._fetch

    async def recording_submit_all(sub: Any, jobs: Any, *a: Any, **kw: Any) -> Any:
        on[0] = True
        events.append(("jobs", pickle.dumps(jobs)))
        return await submit_all(sub, jobs, *a, **kw)

    async def recording_submit(self: Any, job: Any, **kw: Any) -> float:
        at: float = await submit(self, job, **kw)
        if on[0]:
            events.append(("submit", job.job_id, at))
        return at

    def recording_take(self: Any, gm: str, key: bytes, headers: Any, body: bytes) -> None:
        if on[0]:
            events.append(("outcomes", gm, key, dict(headers or {}), bytes(body)))
        take(self, gm, key, headers, body)

    async def recording_fetch(self: Any, session: Any, lm: Any, after: int) -> bytes:
        body: bytes = await fetch(self, session, lm, after)
        if on[0]:
            events.append(("page", lm, after, body))
        return body

    real_poll = rg.LaunchLog.poll

    async def recording_poll(self: Any, session: Any, *, record: bool = True) -> None:
        if on[0]:
            events.append(("poll", record))
        await real_poll(self, session, record=record)

    rg._submit_all = recording_submit_all
    sm.Submitter.submit = recording_submit  # type: ignore[method-assign]
    sm.Submitter.take_outcomes = recording_take  # type: ignore[method-assign]
    rg.LaunchLog._fetch = recording_fetch  # type: ignore[method-assign]
    rg.LaunchLog.poll = recording_poll  # type: ignore[method-assign]


# -------------------------------------------------------------------- arm
class _Answer:
    def __init__(self, body: bytes) -> None:
        self.body = body

    async def __aenter__(self) -> _Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def raise_for_status(self) -> None:
        return None

    async def read(self) -> bytes:
        return self.body


class _Session:
    """Answers ``GET /v1/launches`` with the recorded pages, in their order."""

    def __init__(self) -> None:
        self.pages: list[bytes] = []

    def get(self, url: str, headers: Any = None) -> _Answer:
        return _Answer(self.pages.pop(0))


class _Clock:
    """``time`` for the submitter: the recorded publication time of the job submitted."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now


def _digest(tally: Any, log: Any, sub: Any, prefix: str, unfinished: Any) -> str:
    """What both trees must agree on, hashed."""
    from request_generator.bench import _OfRun

    h = hashlib.sha256()
    h.update(tally.csv.path.read_bytes())
    h.update(json.dumps(tally.tasks.summary(), sort_keys=True).encode())
    for name, col in sorted(tally.publish.columns().items()):
        h.update(name.encode() + col.tobytes())
    h.update(tally.job_end.tobytes())
    h.update(repr(list(tally.spans())).encode())
    h.update(repr((tally.first, tally.last, sorted(tally.users.items()))).encode())
    h.update(json.dumps(log.check.result(_OfRun(prefix)), sort_keys=True).encode())
    h.update(repr((log.check.rows, log.check.restarts, log.missed)).encode())
    out = sub.outcomes
    h.update(repr((out.n_finished, sorted(out.failed.items()), out.duplicates, out.forged,
                   out.events, len(unfinished))).encode())  # fmt: skip
    return h.hexdigest()


def _script(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The recorded inputs after the workload's, in order, the pages of each poll
    handed to the session just before it (the other inputs that came while a poll
    waited for its pages come after it)."""
    start = next(i for i, e in enumerate(events) if e[0] == "jobs")
    script: list[tuple[Any, ...]] = []
    pages: list[bytes] = []
    for e in events[start + 1 :]:
        if e[0] == "page":
            pages.append(e[3])
        elif e[0] == "poll":
            pages = []
            script.append(("poll", e[1], pages))
        else:
            script.append(e)
    return script


async def _run_script(
    script: list[tuple[Any, ...]], clock: _Clock, sub: Any, by_id: Any, session: _Session, log: Any
) -> float:
    """``script`` through the client: CPU seconds (``time.process_time``)."""
    t0 = time.process_time()
    for e in script:
        kind = e[0]
        if kind == "submit":
            clock.now = e[2]
            await sub.submit(by_id[e[1]])
        elif kind == "outcomes":
            sub.take_outcomes(e[1], e[2], e[3], e[4])
        elif kind == "poll":
            session.pages = list(e[2])
            await log.poll(session, record=e[1])
    return time.process_time() - t0


def _replay_once(rec: dict[str, Any], home: Path, tmp: Path) -> dict[str, Any]:
    """One replay through this process's tree: CPU seconds of the run and the summary."""
    from dataclasses import replace

    from common.config import parse_config
    from request_generator import bench as rg
    from request_generator import submitter as sm

    cfg = replace(parse_config({}), **rec["cfg"]).validate()
    events = rec["events"]
    jobs = pickle.loads(next(e[1] for e in events if e[0] == "jobs"))
    by_id = {j.job_id: j for j in jobs}
    n_tasks = sum(len(j.tasks) for j in jobs)
    clock = _Clock()
    setattr(sm, "time", clock)  # noqa: B010 - the submitter's clock, for this process
    sub = sm.Submitter.operator(cfg, home, keep=False)

    async def publish(*a: Any, **kw: Any) -> None:
        return None

    sub.broker.publish = publish  # type: ignore[method-assign]
    session = _Session()
    prefix = rg._run_prefix(jobs)
    out = tmp / "run"
    out.mkdir(parents=True, exist_ok=True)
    tally = rg.RunTally(cfg, jobs, out / "tasks.csv")
    sub.outcomes.sink = rg.sink_into(tally, sub.outcomes)
    sub.outcomes.owns = rg._OfRun(prefix).__contains__
    log = rg.LaunchLog(cfg, sub.access, horizon_s=rg.LAUNCH_HORIZON_S)
    script = _script(events)
    gc.collect()
    if os.environ.get("CLIENT_REPLAY_STOP") == "setup":  # (--callgrind: what setup costs)
        return {"tasks": n_tasks, "run_s": 0.0, "summary_s": 0.0, "digest": ""}
    gc.freeze()  # as ``_drive`` does once the workload is built
    try:
        run_s = asyncio.run(_run_script(script, clock, sub, by_id, session, log))
    finally:
        gc.unfreeze()
    if os.environ.get("CLIENT_REPLAY_STOP") == "run":
        return {"tasks": n_tasks, "run_s": run_s, "summary_s": 0.0, "digest": ""}
    t0 = time.process_time()
    unfinished = rg.close_tally(sub.outcomes, tally)
    tally.tasks.summary()
    tally.publish.columns()
    list(tally.spans())
    log.check.result(rg._OfRun(prefix))
    summary_s = time.process_time() - t0
    digest = _digest(tally, log, sub, prefix, unfinished)
    tally.close()
    return {"tasks": n_tasks, "run_s": run_s, "summary_s": summary_s, "digest": digest}


def _arm(args: argparse.Namespace) -> int:
    sys.path.insert(0, args.tree)
    with (Path(args.recording) / EVENTS).open("rb") as f:
        rec = pickle.load(f)
    home = Path(args.recording) / "home"
    rows = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="client-replay-") as tmp:
            rows.append(_replay_once(rec, home, Path(tmp)))
    Path(args.arm_out).write_text(json.dumps(rows) + "\n")
    return 0


def _instructions(tree: str, recording: str, stop: str) -> int:
    """Instructions (callgrind) of one replay in a fresh process, up to ``stop``
    (``setup``, ``run``, or ``all``: the summary too); hashes seeded alike."""
    out = Path(tempfile.mkstemp(prefix="client-cg-")[1])
    arm_out = Path(tempfile.mkstemp(prefix="client-arm-", suffix=".json")[1])
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0", "CLIENT_REPLAY_STOP": stop}
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            sys.executable, str(Path(__file__).resolve()), "--arm", "--tree", tree,
            "--arm-out", str(arm_out), "--repeat", "1", recording]  # fmt: skip
    subprocess.run(argv, env=env, cwd=tree, check=True, stderr=subprocess.DEVNULL)
    total = 0
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
    out.unlink()
    arm_out.unlink()
    return total


def _callgrind(args: argparse.Namespace, old_tree: str, new_tree: str) -> dict[str, Any]:
    """Instructions per task of the run and of the summary, each tree (no noise: a
    replay runs the same instructions whatever else the machine does)."""
    with (Path(args.recording) / EVENTS).open("rb") as f:
        n = sum(len(j.tasks) for j in pickle.loads(
            next(e[1] for e in pickle.load(f)["events"] if e[0] == "jobs")))  # fmt: skip
    out: dict[str, Any] = {"tasks": n}
    for arm, tree in (("old", old_tree), ("new", new_tree)):
        setup, run, whole = (
            _instructions(tree, args.recording, s) for s in ("setup", "run", "all")
        )
        out[arm] = {"run_instructions_per_task": round((run - setup) / n),
                    "summary_instructions_per_task": round((whole - run) / n)}  # fmt: skip
        print(arm, out[arm], flush=True)
    for key in ("run_instructions_per_task", "summary_instructions_per_task"):
        out[key.replace("instructions", "ratio")] = round(out["new"][key] / out["old"][key], 3)
    return out


def _run_arm(tree: str, recording: str, repeat: int) -> list[dict[str, Any]]:
    out = Path(tempfile.mkstemp(prefix="client-arm-", suffix=".json")[1])
    env = {**os.environ, "PYTHONPATH": tree}
    argv = [sys.executable, str(Path(__file__).resolve()), "--arm", "--tree", tree,
            "--arm-out", str(out), "--repeat", str(repeat), recording]  # fmt: skip
    subprocess.run(argv, env=env, cwd=tree, check=True)
    rows: list[dict[str, Any]] = json.loads(out.read_text())
    out.unlink()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording", nargs="?", help="a directory written by --record")
    ap.add_argument("--record", help="record a live run into this directory")
    ap.add_argument("--base-port", type=int, default=48000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--profile", action="store_true", help="--record: py-spy every process")
    ap.add_argument("--against", default="/work/wt/base", help="the old checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3, help="replays per arm")
    ap.add_argument("--out", default="")
    ap.add_argument("--callgrind", action="store_true",
                    help="count instructions (valgrind) instead of timing")  # fmt: skip
    ap.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.record:
        return _record(args)
    if args.arm:
        return _arm(args)
    if not args.recording:
        ap.error("a recording (or --record DIR) is needed")
    new_tree, old_tree = str(HERE), str(Path(args.against).resolve())
    if args.callgrind:
        counts = _callgrind(args, old_tree, new_tree)
        day = datetime.date.today().isoformat()
        out = Path(args.out or HERE / "docs/figures/bench_client_replay" / day / "callgrind.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"recording": args.recording, "against": old_tree, **counts},
                                  indent=1) + "\n")  # fmt: skip
        print(f"wrote {out}")
        return 0
    order = []
    for i in range(args.rounds):
        pair = [("old", old_tree), ("new", new_tree)]
        order += pair if i % 2 == 0 else pair[::-1]
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    digests: dict[str, set[str]] = {"old": set(), "new": set()}
    for arm, tree in order:
        for row in _run_arm(tree, args.recording, args.repeat):
            n = row["tasks"]
            runs[arm].append({
                "run_ms_per_task": round(1e3 * row["run_s"] / n, 5),
                "summary_ms_per_task": round(1e3 * row["summary_s"] / n, 5),
            })  # fmt: skip
            digests[arm].add(row["digest"])
        print(arm, runs[arm][-1], flush=True)
    same = len(digests["old"] | digests["new"]) == 1
    result: dict[str, Any] = {
        "recording": args.recording,
        "against": old_tree,
        "rounds": args.rounds,
        "repeat": args.repeat,
        "tasks": row["tasks"],
        "runs": runs,
        "same_outputs": same,
        "digests": {k: sorted(v) for k, v in digests.items()},
    }
    for key in ("run_ms_per_task", "summary_ms_per_task"):
        mo = statistics.median(r[key] for r in runs["old"])
        mn = statistics.median(r[key] for r in runs["new"])
        lo = min(r[key] for r in runs["old"])
        ln = min(r[key] for r in runs["new"])
        result[key] = {"old_median": mo, "new_median": mn, "new_over_old": round(mn / mo, 3),
                       "old_least": lo, "new_least": ln, "least_ratio": round(ln / lo, 3)}  # fmt: skip
    day = datetime.date.today().isoformat()
    out = Path(args.out or HERE / "docs/figures/bench_client_replay" / day / "client_replay.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("run_ms_per_task", "summary_ms_per_task",
                                             "same_outputs")}, indent=1))  # fmt: skip
    print(f"wrote {out}")
    if not same:
        print("the trees' outputs differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
