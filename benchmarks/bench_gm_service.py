"""The GM service's own work per task-event delivery, around a stub core: CPU per
event of what ``global_master.app`` does for each delivery from an LM (seal check,
decode, de-duplication, outcomes batched to their user and published, the delivery
acknowledged once they are out), and the decide loop's wake-ups -- not the core's
decisions (``bench_gm_replay`` measures those).  This tree against another checkout,
alternating in one sitting (old, new, new, old, ...), each arm a fresh process with
its tree first on ``PYTHONPATH``; the figure is the median CPU (``time.process_time``)
per event and the ratio new/old.

The broker is a stub: a publication waits ``--publish-ms`` (a confirm's round trip)
and is counted; deliveries come as aiormq hands them over, a task each, ``--burst``
per loop turn, a burst every ``--gap-ms`` (0: every three turns of the loop, and a
publication waits three turns: no clock, the CPU is the work alone).

    python benchmarks/bench_gm_service.py --against /work/wt/base --rounds 3 --out FILE

Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


class _Delivery:
    """What the service reads of a broker delivery, and its acknowledgement."""

    def __init__(self, body: bytes, headers: dict[str, Any], message_id: str) -> None:
        self.body, self.headers, self.message_id = body, headers, message_id
        self.redelivered = False
        self.acked = False

    async def ack(self) -> None:
        self.acked = True
        ACKED[0] += 1


ACKED = [0]


async def _pause(s: float) -> None:
    """``s`` seconds; 0: three turns of the loop (a run that never sleeps: its CPU is
    the work alone, as nothing waits on a clock)."""
    if s > 0:
        await asyncio.sleep(s)
        return
    for _ in range(3):
        await asyncio.sleep(0)


def _service(publish_s: float) -> tuple[Any, list[int]]:
    """A GM service of ``gm0`` around a stub core, its broker's publications counted."""
    from common.config import FederationConfig
    from common.effects import ToUser
    from common.ids import GmId, JobId, TaskId, UserId
    from common.messages import TaskEvents, TaskOutcome
    from common.model import Task, TaskSpec
    from global_master.app import GmService
    from security.access import Access
    from security.identity import gm
    from security.tokens import TokenStore

    cfg = FederationConfig().validate()
    home = Path(tempfile.mkdtemp(prefix="bench-gm-service-"))
    os.environ["MEGHA_RUN_DIR"] = str(home / "run")
    store = TokenStore.in_home(home)
    store.add("u0", gm="gm0", share=1.0, now=0.0)
    svc = GmService(cfg, GmId("gm0"), Access(gm("gm0"), cfg, _secret(), users_file=store.path))
    user = UserId("u0")
    spec = TaskSpec(task_id=TaskId("t"), job_id=JobId("j"), user=user, demand=(1, 1),
                    duration=0.02)  # fmt: skip
    outcome = TaskOutcome(task=Task(spec=spec, attempt=1), finished=True)

    class Stub:
        """A core that answers each event with its task's outcome."""

        def handle(self, msg: object, now: float) -> list[Any]:
            if isinstance(msg, TaskEvents):
                return [ToUser(user=user, msg=outcome) for _ in msg.events]
            return []

    svc.driver.core = Stub()
    published = [0]

    async def publish(exchange: str, key: str, body: Any, **_: Any) -> None:
        await _pause(publish_s)
        published[0] += 1

    svc.broker.publish = publish  # type: ignore[method-assign, assignment]
    return svc, published


def _secret() -> Any:
    from security.secret import Secret

    return Secret.from_text("0123456789abcdef0123456789abcdef-bench", "bench")


def _deliveries(batches: int, per_batch: int) -> list[_Delivery]:
    """``batches`` sealed task-event batches of lm0 to gm0, ``per_batch`` ends each."""
    from common import codec
    from common.ids import GmId, LmId, NodeIndex, TaskId, UserId
    from common.messages import EventKind, TaskEvent, TaskEvents
    from security import sealing
    from security.identity import gm, lm

    lm0, gm0 = lm("lm0"), gm("gm0")
    key = {gm0: sealing.sealing_key(_secret(), lm0, gm0)}
    out = []
    for seq in range(1, batches + 1):
        evs = tuple(
            TaskEvent(kind=EventKind.FINISHED, lm=LmId("lm0"), gm=GmId("gm0"),
                      user=UserId("u0"), task_id=TaskId(f"t{seq}.{i}"), attempt=1,
                      node=NodeIndex(0), node_free=(1,), node_version=1, at=1.0)
            for i in range(per_batch)
        )  # fmt: skip
        body = codec.encode(TaskEvents(lm=LmId("lm0"), epoch=1, events=evs))
        headers = dict(sealing.seal(body, lm0, 1, seq, key, stream="events.gm0"))
        out.append(_Delivery(body, headers, f"lm0.1.{seq}"))
    return out


async def _drive(svc: Any, deliveries: list[_Delivery], burst: int, gap_s: float) -> float:
    """The CPU the service spends until every delivery is acked."""
    guarded = svc.broker.guarded("events", svc._on_events)
    await svc.sup.__aenter__()
    svc.sup.run_forever(svc._decide_loop(), "decide loop")
    loop = asyncio.get_running_loop()
    gc.collect()
    t0 = time.process_time()
    tasks: set[asyncio.Task[None]] = set()
    for i in range(0, len(deliveries), burst):
        for d in deliveries[i : i + burst]:  # a task each, as aiormq hands them
            t: asyncio.Task[None] = loop.create_task(guarded(d))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await _pause(gap_s)
    while ACKED[0] < len(deliveries):
        await _pause(gap_s)
    used = time.process_time() - t0
    await svc.sup.__aexit__(None, None, None)
    return used


def _arm(tree: str, batches: int, per_batch: int, burst: int, gap_s: float,
         publish_s: float) -> dict[str, Any]:  # fmt: skip
    sys.path.insert(0, tree)
    svc, published = _service(publish_s)
    deliveries = _deliveries(batches, per_batch)
    used = asyncio.run(_drive(svc, deliveries, burst, gap_s))
    return {
        "events": batches * per_batch,
        "cpu_us_per_event": round(1e6 * used / (batches * per_batch), 3),
        "cpu_us_per_delivery": round(1e6 * used / batches, 3),
        "publishes": published[0],
        "dropped": dict(svc.event_seals.drops),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--against", help="another checkout, measured alternating")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=20000)
    p.add_argument("--per-batch", type=int, default=5)
    p.add_argument("--burst", type=int, default=2)
    p.add_argument("--gap-ms", type=float, default=0.0)
    p.add_argument("--publish-ms", type=float, default=0.0)
    p.add_argument("--out")
    p.add_argument("--arm", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.arm:
        row = _arm(args.arm, args.batches, args.per_batch, args.burst, args.gap_ms / 1e3,
                   args.publish_ms / 1e3)  # fmt: skip
        print(json.dumps(row))
        return 0
    trees = {"new": str(HERE)}
    if args.against:
        trees["old"] = str(Path(args.against).resolve())
    order: list[str] = []
    for r in range(args.rounds):
        if args.against:
            order += ["old", "new"] if r % 2 == 0 else ["new", "old"]
        else:
            order.append("new")
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for arm in order:
        tree = trees[arm]
        out = subprocess.run(
            [sys.executable, __file__, "--arm", tree, "--batches", str(args.batches),
             "--per-batch", str(args.per_batch), "--burst", str(args.burst),
             "--gap-ms", str(args.gap_ms), "--publish-ms", str(args.publish_ms)],
            env={**os.environ, "PYTHONPATH": tree}, cwd=tree, check=True,
            capture_output=True, text=True,
        ).stdout  # fmt: skip
        row = json.loads(out.strip().splitlines()[-1])
        runs[arm].append(row)
        print(arm, row, flush=True)
    med = {k: statistics.median(r["cpu_us_per_event"] for r in v) for k, v in runs.items()}
    result: dict[str, Any] = {"args": vars(args), "order": order, "runs": runs,
                              "median_cpu_us_per_event": med}  # fmt: skip
    if "old" in med:
        result["new_over_old"] = round(med["new"] / med["old"], 3)
    print(json.dumps({"median_cpu_us_per_event": med, "new_over_old": result.get("new_over_old")}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
