"""The AMQP hot path per message: publish (confirmed) and consume + ack, this tree
against another checkout, alternating in one sitting (issue 35 item 1).

Each arm is a fresh process with its own tree first on ``sys.path`` and uvloop (as the
services run): it declares a private federation's topology on the broker, then

* ``publish``: ``--n`` persistent messages (``--body`` bytes, a seal-sized header
  table) through ``Broker.publish`` to a GM's events queue, ``--concurrency`` at a
  time, each waiting for its confirm (as a GM's or LM's publishes do);
* ``consume``: the same messages taken back through ``Broker.consume``, each acked by
  its handler (as a GM's consumer does);

and writes its process's CPU (user + system) per message for each, and the broker's
(the ``beam.smp`` process, shared with whatever else runs: a rough figure).  Arms go
old, new, new, old... and the medians' ratios are reported.  ``--transient`` publishes
messages the broker need not write to disk (what persistence costs it: ``--against``
this very tree, once with and once without).

    python benchmarks/bench_amqp.py --against /work/wt/amqplean-base --rounds 3

writes ``--out`` (JSON).  Needs RabbitMQ on 127.0.0.1:5672.  Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
SEAL: dict[str, str | int] = {
    "x-megha-sender": "lm:lm0",
    "x-megha-epoch": 1764300000000,
    "x-megha-seq": 123456,
    "x-megha-mac": "k1:" + "ab" * 32,
    "x-megha-to": "gm:gm0",
}
"""A header table of the size and shape of a sealed message's (~300 bytes)."""


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on TCP ``port`` (``/proc/net/tcp*``)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    out.add(f[9])
    return out


def _beam_pid(port: int) -> int:
    """The ``beam.smp`` of the RabbitMQ node listening on ``port`` (0 if none is found):
    the node the bench talks to, not another one on this machine."""
    inodes = _listening_inodes(port)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "beam.smp":
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
        except OSError:
            continue
        if any(f"socket:[{i}]" in links for i in inodes):
            return int(pid)
    return 0


def _beam_cpu(pid: int) -> float:
    """The CPU seconds so far (user + system) of the ``beam.smp`` ``pid`` (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _syscalls(pid: int | str) -> int:
    """Read-class plus write-class system calls so far of process ``pid`` (sockets,
    files; ``/proc/PID/io``), 0 where the kernel does not say."""
    try:
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    except (OSError, ValueError):
        return 0
    return int(io.get("syscr", 0)) + int(io.get("syscw", 0))


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _with_queue_version(topology: Any, version: int) -> Any:
    """``security.broker_acl.topology`` with every queue declared as classic queue
    version ``version`` (``x-queue-version``): what that version costs the broker."""
    from dataclasses import replace

    def topo(layout: Any) -> Any:
        t = topology(layout)
        qs = tuple(
            replace(q, arguments=(*q.arguments, ("x-queue-version", version))) for q in t.queues
        )
        return replace(t, queues=qs)

    return topo


@dataclass
class _Rig:
    """An arm's broker and what it publishes (``--body`` bytes to a GM's events
    queue), the ``beam.smp`` to watch, and the consumer's count of deliveries."""

    b: Any
    key: str
    body: bytes
    headers: dict[str, str | int] | None
    make: Any
    mandatory: bool
    beam: int
    idle: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[int] = field(default_factory=lambda: [0])
    want: list[int] = field(default_factory=lambda: [0])

    def snap(self) -> tuple[float, float, float, tuple[int, int]]:
        """This process's CPU, the broker's, the wall clock and both's syscalls."""
        return _cpu(), _beam_cpu(self.beam), time.perf_counter(), _sys_pair(self.beam)

    def figures(
        self, n: int, before: tuple[float, float, float, tuple[int, int]]
    ) -> dict[str, float]:
        """``_figures`` of ``n`` messages since ``before`` (a ``snap``)."""
        c1, k1, t1, s1 = self.snap()
        c0, k0, t0, s0 = before
        return _figures(n, c1 - c0, k1 - k0, t1 - t0, self.idle, s0, s1)


async def _arm_async(args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import replace
    from urllib.parse import urlparse

    from common import broker_names as names
    from common.config import FederationConfig
    from runtime import broker as amqp

    cfg = replace(FederationConfig(), name=f"bench-amqp-{os.getpid()}", broker_url=args.url)
    cfg = cfg.validate()
    beam = _beam_pid(urlparse(args.url).port or 5672)
    if args.queue_version:
        amqp.topology = _with_queue_version(amqp.topology, args.queue_version)  # type: ignore[attr-defined]
    await amqp.declare_topology(cfg, cfg.broker_url)
    b = amqp.Broker(cfg, "bench", urls=[cfg.broker_url])
    await b.open(prefetch=args.prefetch)
    rig = _Rig(
        b, names.gm_event_key("gm0", "lm0"),
        bytes(range(256)) * (args.body // 256) + b"x" * (args.body % 256),
        SEAL if args.headers == "seal" else None,
        amqp.transient if args.transient else amqp.persistent, not args.no_mandatory, beam,
    )  # fmt: skip
    out: dict[str, Any] = {}
    k0, t0 = _beam_cpu(beam), time.perf_counter()
    await asyncio.sleep(1.0)
    out["broker_idle_us_per_s"] = round(1e6 * (_beam_cpu(beam) - k0) / (time.perf_counter() - t0))
    rig.idle = out["broker_idle_us_per_s"] / 1e6
    try:
        n = args.n if args.burst else 0
        await _publish(rig, n, args.concurrency, out)
        assert b.sub is not None
        q = await amqp.open_queue(b.sub, cfg.gm_events_queue("gm0"))
        await _consume(rig, q, n, out)
        if args.rate > 0:  # the live shape: sparse publishes, each delivered at once
            await _pipe(rig, args.n, args.rate, out)
    finally:
        await b.close()
        await amqp.delete_topology(cfg, cfg.broker_url)
    return out


async def _publish(rig: _Rig, n: int, concurrency: int, out: dict[str, Any]) -> None:
    """``publish``: ``n`` messages, ``concurrency`` at a time, each confirmed."""
    b, key, body, headers, make, mandatory = (
        rig.b, rig.key, rig.body, rig.headers, rig.make, rig.mandatory
    )  # fmt: skip
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            msg = make(body, message_id=f"m{i}", headers=headers)
            await b.publish("events", key, msg, mandatory=mandatory)

    before = rig.snap()
    await asyncio.gather(*(one(i) for i in range(n)))
    if n:
        out["publish"] = rig.figures(n, before)


async def _consume(rig: _Rig, q: Any, n: int, out: dict[str, Any]) -> None:
    """``consume``: the ``n`` messages published taken back, each acked (the consumer
    stays for ``_pipe``)."""
    body, done, seen, want = rig.body, rig.done, rig.seen, rig.want
    want[0] = n

    async def handler(msg: Any) -> None:
        assert msg.body == body
        await msg.ack()
        seen[0] += 1
        if seen[0] == want[0]:
            done.set()

    before = rig.snap()
    await rig.b.consume(q, handler)
    if n:
        await asyncio.wait_for(done.wait(), 120)
        out["consume"] = rig.figures(n, before)


async def _pipe(rig: _Rig, n: int, rate: float, out: dict[str, Any]) -> None:
    """``pipe``: ``n`` publishes paced at ``rate``/s, each delivered as it comes."""
    b, key, body, headers, make, mandatory = (
        rig.b, rig.key, rig.body, rig.headers, rig.make, rig.mandatory
    )  # fmt: skip
    rig.done.clear()
    rig.seen[0], rig.want[0] = 0, n
    loop = asyncio.get_running_loop()
    tasks = []
    before = rig.snap()
    start = loop.time()
    for i in range(n):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        msg = make(body, message_id=f"p{i}", headers=headers)
        tasks.append(loop.create_task(b.publish("events", key, msg, mandatory=mandatory)))
    await asyncio.gather(*tasks)
    await asyncio.wait_for(rig.done.wait(), 120)
    out["pipe"] = rig.figures(n, before)


def _sys_pair(beam: int) -> tuple[int, int]:
    return _syscalls("self"), _syscalls(beam)


def _figures(
    n: int,
    cpu: float,
    beam: float,
    wall: float,
    idle: float,
    s0: tuple[int, int],
    s1: tuple[int, int],
) -> dict[str, float]:
    return {
        "client_syscalls_per_msg": round((s1[0] - s0[0]) / n, 2),
        "broker_syscalls_per_msg": round((s1[1] - s0[1]) / n, 2),
        "client_us_per_msg": round(1e6 * cpu / n, 2),
        "broker_us_per_msg": round(1e6 * beam / n, 2),
        "broker_net_us_per_msg": round(1e6 * (beam - idle * wall) / n, 2),
        "msgs_per_s": round(n / wall, 1),
    }


def _arm(args: argparse.Namespace) -> int:
    sys.path.insert(0, args.tree)
    import uvloop

    out = uvloop.run(_arm_async(args))
    Path(args.arm_out).write_text(json.dumps(out) + "\n")
    return 0


def _run_arm(tree: str, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    out = Path(tempfile.mkstemp(prefix="amqp-arm-", suffix=".json")[1])
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--arm", "--tree", tree,
        "--arm-out", str(out), "--n", str(args.n), "--body", str(args.body),
        "--concurrency", str(args.concurrency), "--prefetch", str(args.prefetch),
        "--url", args.url, "--rate", str(args.rate), "--headers", args.headers,
        "--queue-version", str(args.queue_version),
        *(["--transient"] if args.transient else []),
        *(["--no-mandatory"] if args.no_mandatory else []),
        *([] if args.burst else ["--no-burst"]),
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": tree}
    subprocess.run(argv, env=env, cwd=tree, check=True)
    rows: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return rows


def _median(rows: list[dict[str, Any]], phase: str, key: str) -> float:
    return round(float(statistics.median(r[phase][key] for r in rows)), 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="", help="the old checkout (required)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=5000, help="messages per phase")
    ap.add_argument("--body", type=int, default=600, help="body bytes")
    ap.add_argument("--concurrency", type=int, default=16, help="publishes in flight")
    ap.add_argument("--prefetch", type=int, default=200)
    ap.add_argument("--transient", action="store_true", help="publish transient messages")
    ap.add_argument("--no-mandatory", action="store_true", help="publish without mandatory")
    ap.add_argument(
        "--no-burst",
        dest="burst",
        action="store_false",
        help="skip the publish and consume phases (with --rate: the paced phase only)",
    )
    ap.add_argument("--headers", choices=("seal", "none"), default="seal")
    ap.add_argument("--queue-version", type=int, default=0, help="x-queue-version (0: unset)")
    ap.add_argument(
        "--rate", type=float, default=0.0, help="also a paced publish+consume phase (msgs/s)"
    )
    ap.add_argument(
        "--url",
        default="amqp://guest:guest@127.0.0.1:5672/",
        help="the broker (a private node keeps others' traffic out of its CPU figure)",
    )
    ap.add_argument("--out", default="results/bench_amqp.json")
    ap.add_argument(
        "--new-args",
        default="",
        help="options for the new arm only (e.g. '--transient', against this very tree)",
    )
    ap.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        return _arm(args)
    if not args.against:
        ap.error("--against OLD_TREE is required")
    arms: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    trees = {"old": args.against, "new": str(HERE)}
    extra = {"old": [], "new": shlex.split(args.new_args)}
    for r in range(args.rounds):
        for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
            row = {"loadavg_before": os.getloadavg(), **_run_arm(trees[which], args, extra[which])}
            arms[which].append(row)
            print(which, json.dumps(row), flush=True)
    summary: dict[str, Any] = {}
    phases = [*(["publish", "consume"] if args.burst else []), *(["pipe"] if args.rate > 0 else [])]
    for phase in phases:
        summary[phase] = {}
        keys = (
            "client_us_per_msg",
            "broker_us_per_msg",
            "broker_net_us_per_msg",
            "client_syscalls_per_msg",
            "broker_syscalls_per_msg",
            "msgs_per_s",
        )
        for key in keys:
            o, n = _median(arms["old"], phase, key), _median(arms["new"], phase, key)
            summary[phase][key] = {
                "old": o,
                "new": n,
                "new_over_old": round(n / o, 3) if o else None,
            }
    doc = {
        "how": " ".join(sys.argv),
        "trees": trees,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "summary": summary,
        "arms": arms,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
