"""What a task's command costs to start and end in the sandbox, against the bare spawn
it replaced.

Two ways to run ``/bin/true``, alternating in rounds so a noisy spell of the shared host
falls on both:

* ``bare``: the least a pool can do -- ``Popen`` as one uid, with rlimits set by a
  ``preexec_fn``, in a new session, waited for in a thread, its process group killed
  (the spawn of the pool before per-task uids, less its checks and /proc scans);
* ``sandbox``: ``security.sandbox.Sandbox.run`` -- a uid leased from the range, the
  launcher (a fresh interpreter: namespaces, read-only mounts, the scratch tmpfs, a
  private /proc, rlimits, uid), the end (group and uid killed, the uid given back).

Each round runs ``--samples`` commands one after the other with each, then ``--burst``
at once with each.  Figures: wall time per command (ms, p50/p90/p99 of the sequential
ones), commands per second in a burst, and the pool process's CPU per command.
Needs root.

    python benchmarks/bench_sandbox.py --out results/bench_sandbox.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from common.metrics import percentiles
from security.sandbox import Sandbox, SandboxPolicy

TRUE = "/bin/true"
Run = Callable[[], Awaitable[object]]


def _bare(uid: int) -> Run:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NPROC, (32, 32))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [TRUE], user=uid, group=uid, extra_groups=[], start_new_session=True,
            umask=0o077, preexec_fn=limits, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    async def run() -> object:
        loop = asyncio.get_running_loop()
        proc = await loop.run_in_executor(None, spawn)
        code = await loop.run_in_executor(None, proc.wait)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return code

    return run


def _sandboxed(box: Sandbox) -> Run:
    async def run() -> object:
        res = await box.run([TRUE])
        if not res.ok:
            raise SystemExit(f"the sandbox refused /bin/true: {res}")
        return res

    return run


async def _sequential(run: Run, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await run()
        out.append(time.perf_counter() - t0)
    return out


async def _burst(run: Run, n: int) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(run() for _ in range(n)))
    return n / (time.perf_counter() - t0)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(rounds: int, samples: int, burst: int, uid_first: int) -> dict[str, object]:
    root = tempfile.mkdtemp(prefix="megha-bench-sandbox-")
    os.chmod(root, 0o711)
    policy = SandboxPolicy(
        enabled=True, allow=(TRUE,), uid_first=uid_first, uids_per_pool=max(burst, 1),
        work_root=root, lock_dir=f"{root}/locks",
    )  # fmt: skip
    ways = {"bare": _bare(uid_first), "sandbox": _sandboxed(Sandbox(policy))}
    walls: dict[str, list[float]] = {k: [] for k in ways}
    rates: dict[str, list[float]] = {k: [] for k in ways}
    cpu: dict[str, float] = dict.fromkeys(ways, 0.0)
    for r in range(rounds):
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for name in order:
            c0 = _cpu()
            walls[name] += await _sequential(ways[name], samples)
            rates[name].append(await _burst(ways[name], burst))
            cpu[name] += _cpu() - c0
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    per_way = {}
    for name in ways:
        ms = percentiles([w * 1000 for w in walls[name]])
        per_way[name] = {
            "wall_ms": {k: round(ms[k], 2) for k in ("p50", "p90", "p99", "mean")},
            "burst_commands_per_s": [round(x, 1) for x in rates[name]],
            "pool_cpu_ms_per_command": round(cpu[name] * 1000 / (rounds * (samples + burst)), 2),
        }
    return {
        "rounds": rounds,
        "samples": samples,
        "burst": burst,
        "ways": per_way,
        "sandbox_over_bare_p50": round(
            percentiles(walls["sandbox"])["p50"] / percentiles(walls["bare"])["p50"], 2
        ),
        "host": os.uname().release,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--samples", type=int, default=25, help="sequential commands per round")
    ap.add_argument("--burst", type=int, default=16, help="commands at once per round")
    ap.add_argument("--uid-first", type=int, default=1_500_000_000, help="a free block of uids")
    ap.add_argument("--out", type=Path, default=Path("results/bench_sandbox.json"))
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench_sandbox: switching uid needs root")
    figures = asyncio.run(measure(args.rounds, args.samples, args.burst, args.uid_first))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
