"""Two hot paths of the live federation, this tree's code against an old checkout's, in
one sitting (issue 35 item 1).

* ``pop``: a GM's ``fifo`` policy (``ClassedFifo``, priority classes with aging) holding
  ``--tasks`` tasks of ``--users`` users, popped to the end; with all tasks of one class
  (the usual case) and of three classes.  The old and new arms pop the same tasks and
  must pop them in the same order (checked: the script fails otherwise).
* ``verify_headers``: a signed request's headers checked as a service's middleware does
  (``security.signing.verify_headers``: parse, keyring, MAC, replay cache), on a
  ``CIMultiDict`` shaped like aiohttp's request headers; and the parsing alone
  (``_parse``).  Both arms must accept the same request and refuse the same bad ones
  with the same reasons and messages (checked).

The old arm is the old checkout's ``global_master/policy/classes.py`` and
``security/signing.py``, loaded by path (everything they import is this tree's, the
same code as long as only those two files differ).  Arms alternate (old, new, new,
old, ...) ``--rounds`` times; each figure is the median per call, and the ratio new/old.

    git worktree add --detach /work/wt/live2-old main
    python benchmarks/bench_hot_paths.py --against /work/wt/live2-old

writes ``docs/figures/bench_hot_paths/<date>/hot_paths.json`` (``--out``).  Not part of
the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

from multidict import CIMultiDict

from common.errors import Unauthorized
from common.ids import JobId, TaskId, UserId
from common.model import Task, TaskSpec
from global_master.policy import classes
from security import signing
from security.identity import gm, lm
from security.secret import Secret

HERE = Path(__file__).resolve().parent.parent


def load_old(tree: Path, relative: str, name: str) -> ModuleType:
    """The old checkout's module at ``relative``, as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, tree / relative)
    if spec is None or spec.loader is None:
        raise SystemExit(f"no {relative} in {tree}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ pop
def make_tasks(n: int, users: list[UserId], n_classes: int) -> list[Task]:
    out = []
    for i in range(n):
        spec = TaskSpec(
            task_id=TaskId(f"t{i}"), job_id=JobId(f"j{i // 50}"), user=users[i % len(users)],
            demand=(1, 1), duration=1.0, priority=(i // 7) % n_classes,
        )  # fmt: skip
        out.append(Task(spec=spec, submitted_at=i * 0.001))
    return out


def pop_all(module: ModuleType, tasks: list[Task], users: list[UserId]) -> tuple[float, list[Any]]:
    """Seconds to pop every task of a filled ``ClassedFifo``, and the order popped."""
    q = module.ClassedFifo(users, aging_s=1.0)
    for t in tasks:
        q.push_back(t)
    order: list[Any] = []
    gc.collect()
    start = time.perf_counter()
    while (t := q.pop()) is not None:
        order.append(t.key)
    return time.perf_counter() - start, order


def pop_seconds(module: ModuleType, tasks: list[Task], users: list[UserId]) -> float:
    return pop_all(module, tasks, users)[0]


# --------------------------------------------------------------- verify
SECRET = Secret.from_text("bench-hot-paths-0123456789abcdef-not-a-key", "bench")
CALLER, ME = gm("gm0"), lm("lm0")
PATH = "/v1/launch"
BODY = b'{"tasks": []}' * 40
NOW = 1_800_000_000.0
INCARNATION = "0123456789abcdef"


def request_headers(module: ModuleType) -> CIMultiDict[str]:
    """A launch's headers as aiohttp hands them to the middleware."""
    key = module.signing_key(SECRET, CALLER, ME)
    signed = module.sign("POST", PATH, BODY, CALLER, key, NOW, incarnation=INCARNATION)
    h: CIMultiDict[str] = CIMultiDict()
    for name, value in (
        ("Host", "127.0.0.1:18801"),
        ("User-Agent", "Python/3.11 aiohttp/3.9"),
        ("Accept", "*/*"),
        ("Accept-Encoding", "gzip, deflate"),
        ("Content-Type", "application/msgpack"),
        ("Content-Length", str(len(BODY))),
        *signed.items(),
    ):
        h.add(name, value)
    return h


def bad_requests(good: CIMultiDict[str]) -> dict[str, CIMultiDict[str]]:
    """Refused requests, one per way the headers can be wrong."""
    out: dict[str, CIMultiDict[str]] = {}
    for name in (*signing.SIGNED_HEADERS, signing.HEADER_INCARNATION):
        gone = good.copy()
        del gone[name]
        out[f"without {name}"] = gone
        twice = good.copy()
        twice.add(name.lower(), good[name])
        out[f"twice {name}"] = twice
        bad = good.copy()
        bad[name] = "x" if name != signing.HEADER_IDENTITY else "nobody:x:y"
        out[f"bad {name}"] = bad
    return out


def outcome(module: ModuleType, headers: CIMultiDict[str]) -> str:
    keyring = module.keyring_for(SECRET, ME, [CALLER])
    try:
        claim = module.verify_headers(headers, "POST", PATH, keyring, NOW, module.ReplayCache())
    except Unauthorized as exc:
        return f"{exc.reason}: {exc}"
    return f"accepted {claim.identity} {claim.incarnation}"


def verify_many(module: ModuleType, headers: CIMultiDict[str], n: int) -> float:
    keyring = module.keyring_for(SECRET, ME, [CALLER])
    cache = module.ReplayCache()
    verify = module.verify_headers
    start = time.perf_counter()
    for _ in range(n):
        verify(headers, "POST", PATH, keyring, NOW, cache)
    return time.perf_counter() - start


def parse_many(module: ModuleType, headers: CIMultiDict[str], n: int) -> float:
    parse = module._parse
    start = time.perf_counter()
    for _ in range(n):
        parse(headers)
    return time.perf_counter() - start


# ------------------------------------------------------------------ run
def alternate(
    rounds: int, arms: dict[str, ModuleType], run: Callable[[ModuleType], float]
) -> dict[str, list[float]]:
    """Seconds per arm, in the order old, new, new, old, old, new, ..."""
    times: dict[str, list[float]] = {a: [] for a in arms}
    names = list(arms)
    for r in range(rounds):
        for a in names if r % 2 == 0 else names[::-1]:
            times[a].append(run(arms[a]))
    return times


def figure(times: dict[str, list[float]], per: int, unit: str) -> dict[str, Any]:
    scale = {"us": 1e6, "ns": 1e9}[unit]
    med = {a: statistics.median(v) / per * scale for a, v in times.items()}
    ratios = [n / o for o, n in zip(times["old"], times["new"], strict=True)]
    return {
        f"old_{unit}_per_call": round(med["old"], 3),
        f"new_{unit}_per_call": round(med["new"], 3),
        "new_over_old": round(med["new"] / med["old"], 3),
        "new_over_old_per_pair": [round(x, 3) for x in ratios],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="/work/wt/live2-old", help="the old checkout")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=5_000)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--verifies", type=int, default=5_000)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tree = Path(args.against)
    old_c = load_old(tree, "global_master/policy/classes.py", "old_classes")
    old_s = load_old(tree, "security/signing.py", "old_signing")
    users = [UserId(f"u{i}") for i in range(args.users)]
    result: dict[str, Any] = {
        "how": " ".join(["python benchmarks/bench_hot_paths.py", *sys.argv[1:]]),
        "against": str(tree),
        "load_average": list(os.getloadavg()),
        "tasks": args.tasks,
        "users": args.users,
        "rounds": args.rounds,
    }
    for n_classes in (1, 3):
        tasks = make_tasks(args.tasks, users, n_classes)
        _, old_order = pop_all(old_c, tasks, users)
        _, new_order = pop_all(classes, tasks, users)
        if old_order != new_order:
            print(f"pop order differs with {n_classes} classes", file=sys.stderr)
            return 1
        times = alternate(
            args.rounds,
            {"old": old_c, "new": classes},
            partial(pop_seconds, tasks=tasks, users=users),
        )
        result[f"pop_{n_classes}_class"] = figure(times, args.tasks, "us")
        print(f"pop, {n_classes} class(es): {result[f'pop_{n_classes}_class']}", file=sys.stderr)
    good = request_headers(signing)
    cases = {"good": good, **bad_requests(good)}
    differ = [c for c, h in cases.items() if outcome(old_s, h) != outcome(signing, h)]
    if differ or not outcome(signing, good).startswith("accepted"):
        print(f"verify_headers differs: {differ}", file=sys.stderr)
        return 1
    result["refusals_compared"] = len(cases) - 1
    n = args.verifies
    runs: dict[str, Callable[..., float]] = {"verify_headers": verify_many, "parse": parse_many}
    for label, run in runs.items():
        times = alternate(
            args.rounds, {"old": old_s, "new": signing}, partial(run, headers=good, n=n)
        )
        result[label] = figure(times, n, "us")
        print(f"{label}: {result[label]}", file=sys.stderr)
    day = datetime.date.today().isoformat()
    out = Path(args.out or HERE / "docs/figures/bench_hot_paths" / day / "hot_paths.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
