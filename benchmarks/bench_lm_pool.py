"""An LM's and its worker pool's per-task work, this tree against another checkout,
alternating in one sitting (issue 35 item 1).

Each arm is a fresh process with its tree first on ``sys.path``, running that tree's
code without sockets: batches of ``--batch`` placements go through a durable LM core
(``local_master.core``) and a durable pool core (``worker.core``) as the services carry
them, each hop encoded and decoded once (``common.codec``), journal records written
through ``runtime.journal.DurableState`` (to a directory under ``/dev/shm``):

* ``lm``: the launch (decode, ``handle``, the answer and the starts encoded), the
  start reports the pool answered (decoded, ``handle``), the end reports (decoded,
  ``handle``, the events encoded per GM), the LM's journal;
* ``pool``: the starts (decode, ``handle``, the answer encoded), each task's timer
  (``TaskDue``: ``handle``), the reports encoded, the lease renewal and the reports
  taken, the pool's journal;
* ``signing``: one signed request and its answer (``security.signing``: ``sign``,
  ``verify_headers``, ``verify_body``, ``check_incarnation``, ``authorize``,
  ``sign_response``, ``verify_response``) on aiohttp-shaped headers.

CPU time (``time.process_time``) per task (per request for ``signing``); each figure is
the median over rounds, and the ratio new/old.

    git worktree add --detach /work/wt/lmpool-base main
    python benchmarks/bench_lm_pool.py --against /work/wt/lmpool-base --rounds 5

writes ``docs/figures/bench_lm_pool/<date>/lm_pool.json`` (``--out``).  Not part of the
test suite.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
N_NODES = 120


class _Pipeline:
    """A durable LM core and its durable pool core, batches going through both as the
    services carry them (each hop encoded and decoded once)."""

    def __init__(self, batch: int, tmp: str) -> None:
        from common.ids import GmId, LmId
        from common.messages import LeaseRenewed
        from common.model import NodeSpec
        from local_master.core import LocalMaster
        from runtime.journal import DurableState
        from worker.core import WorkerPool

        self.batch = batch
        self.lm_id, self.gms = LmId("lm0"), [GmId("gm0"), GmId("gm1"), GmId("gm2")]
        nodes = [NodeSpec(capacity=(4, 8), constraints=7)] * N_NODES
        home = [self.gms[i % 3] for i in range(N_NODES)]
        self.lm = LocalMaster(self.lm_id, nodes, home, gms=self.gms, epoch=1, durable=True)
        self.pool = WorkerPool(self.lm_id, N_NODES, lease_s=10.0, durable=True)
        self.lm_journal = DurableState(f"{tmp}/lm", "lm", sync_s=1.0)
        self.pool_journal = DurableState(f"{tmp}/pool", "pool", sync_s=1.0)
        self.lm_journal.open()
        self.pool_journal.open()
        self.now, self.version = 1.0, -1
        self.pool.handle(LeaseRenewed(sent=self.now), self.now)

    def launch_request(self, r: int) -> bytes:
        """A GM's launch of ``batch`` tasks, as it arrives (encoded)."""
        from common import codec
        from common.ids import JobId, NodeIndex, TaskId, UserId
        from common.messages import LaunchRequest, Placement
        from common.model import TaskSpec

        placements = tuple(
            Placement(
                spec=TaskSpec(
                    task_id=TaskId(f"j{r}.t{i}"), job_id=JobId(f"j{r}"), user=UserId("u0"),
                    demand=(1, 1), duration=0.5,
                ),
                attempt=1, node=NodeIndex((r * self.batch + i) % N_NODES), queued_at=self.now,
            )
            for i in range(self.batch)
        )  # fmt: skip
        return codec.encode(
            LaunchRequest(gm=self.gms[r % 3], lm=self.lm_id, request_id=r,
                          placements=placements, known_version=self.version, sent_at=self.now)
        )  # fmt: skip

    def lm_launch(self, request: bytes) -> bytes:
        """LM: the launch, its answer, the starts to the pool (encoded)."""
        from common import codec
        from common.effects import Record, Reply, ToWorker
        from common.messages import LaunchRequest, StartTasks

        starts: list[Any] = []
        for e in self.lm.handle(codec.decode(request, expect=LaunchRequest), self.now):
            if type(e) is Reply:
                codec.encode(e.msg)
                self.version = e.msg.delta.version  # type: ignore[attr-defined]
            elif type(e) is ToWorker:
                starts.append(e.msg)
            elif type(e) is Record:
                self.lm_journal.record(e)
        self.lm_journal.flush()
        return codec.encode(StartTasks(lm=self.lm_id, epoch=1, tasks=tuple(starts), sent=self.now))

    def pool_run(self, start_body: bytes) -> tuple[bytes, bytes, Any]:
        """Pool: the starts and their answer, each task's timer, the reports out."""
        from common import codec
        from common.effects import After, Record, Reply, ToLm
        from common.messages import StartTasks, WorkerReports

        dues, answer = [], b""
        for e in self.pool.handle(codec.decode(start_body, expect=StartTasks), self.now):
            if type(e) is Reply:
                answer = codec.encode(e.msg)
            elif type(e) is After:
                dues.append(e.msg)
            elif type(e) is Record:
                self.pool_journal.record(e)
        self.pool_journal.flush()
        self.now += 0.01
        reports: list[Any] = []
        for d in dues:
            for e in self.pool.handle(d, self.now):
                if type(e) is ToLm:
                    reports.append(e.msg)
                elif type(e) is Record:
                    self.pool_journal.record(e)
        self.pool_journal.flush()
        sent = WorkerReports(lm=self.lm_id, reports=tuple(reports))
        return answer, codec.encode(sent), sent.reports

    def lm_reports(self, answer: bytes, report_body: bytes) -> None:
        """LM: the start reports (the starts' answer), the end reports, events per GM."""
        from common import codec
        from common.effects import Record, ToGm
        from common.messages import TaskEvents, WorkerReports

        self.lm.handle(codec.decode(answer, expect=WorkerReports), self.now)
        events: dict[str, list[Any]] = {}
        for e in self.lm.handle(codec.decode(report_body, expect=WorkerReports), self.now):
            if type(e) is ToGm:
                events.setdefault(e.gm, []).append(e.msg)
            elif type(e) is Record:
                self.lm_journal.record(e)
        self.lm_journal.flush()
        for evs in events.values():
            codec.encode(TaskEvents(lm=self.lm_id, epoch=1, events=tuple(evs)))

    def pool_taken(self, reports: Any) -> None:
        """Pool: the LM's answer renews the lease; its reports were taken."""
        from common.effects import Record
        from common.messages import LeaseRenewed, ReportsTaken

        self.pool.handle(LeaseRenewed(sent=self.now), self.now)
        for e in self.pool.handle(ReportsTaken(reports=reports), self.now):
            if type(e) is Record:
                self.pool_journal.record(e)
        self.pool_journal.flush()

    def close(self) -> None:
        self.lm_journal.close()
        self.pool_journal.close()


def _pipeline(rounds: int, batch: int, tmp: str) -> dict[str, float]:
    """CPU seconds of the LM's and the pool's side of ``rounds`` batches."""
    p = _Pipeline(batch, tmp)
    clock = time.process_time
    spent = {"lm": 0.0, "pool": 0.0}
    for r in range(rounds):
        p.now += 0.01
        request = p.launch_request(r)
        t0 = clock()
        start_body = p.lm_launch(request)
        t1 = clock()
        answer, report_body, reports = p.pool_run(start_body)
        t2 = clock()
        p.lm_reports(answer, report_body)
        t3 = clock()
        p.pool_taken(reports)
        t4 = clock()
        spent["lm"] += (t1 - t0) + (t3 - t2)
        spent["pool"] += (t2 - t1) + (t4 - t3)
    p.close()
    return spent


def _signing(requests: int) -> float:
    """CPU seconds of ``requests`` signed requests and answers, both ends."""
    from multidict import CIMultiDict, CIMultiDictProxy

    from security import signing
    from security.identity import lm, workers
    from security.secret import Secret

    secret = Secret.from_text("bench-secret-" + "x" * 40, "bench", insecure_dev=True)
    caller, me = workers("lm0"), lm("lm0")
    key_in = signing.signing_key(secret, caller, me)
    key_out = signing.signing_key(secret, me, caller)
    keyring = {caller: key_in}
    replays = signing.ReplayCache()
    mine = signing.new_incarnation()
    body, answer = b"r" * 900, b""
    clock = time.process_time
    t0 = clock()
    for _ in range(requests):
        now = time.time()
        sent = signing.sign(
            "POST", "/v1/worker-report", body, caller, key_in, now, incarnation=mine
        )
        headers = CIMultiDictProxy(
            CIMultiDict({"Host": "127.0.0.1:45001", "Content-Type": "application/x-msgpack",
                         "Content-Length": str(len(body)), **sent})
        )  # fmt: skip
        claim = signing.verify_headers(headers, "POST", "/v1/worker-report", keyring, now, replays)
        signing.authorize(claim.identity, me, "POST", "/v1/worker-report")
        who = signing.verify_body(claim, body, now, replays)
        signing.check_incarnation(who, claim, mine)
        back = signing.sign_response(204, answer, claim.nonce, me, key_out, now, mine)
        signing.verify_response(back, 204, answer, sent[signing.HEADER_NONCE], me, key_out, now)
    return clock() - t0


def _arm(args: argparse.Namespace) -> int:
    sys.path.insert(0, args.tree)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        _pipeline(50, args.batch, tmp + "/warm")  # imports, decoders, caches
        gc.collect()
        spent = _pipeline(args.batches, args.batch, tmp + "/run")
    _signing(200)
    gc.collect()
    sig = _signing(args.requests)
    tasks = args.batches * args.batch
    row = {
        "lm_us_per_task": round(1e6 * spent["lm"] / tasks, 2),
        "pool_us_per_task": round(1e6 * spent["pool"] / tasks, 2),
        "signing_us_per_request": round(1e6 * sig / args.requests, 2),
    }
    Path(args.arm_out).write_text(json.dumps(row))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the old checkout (a git worktree)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=10, help="placements per launch")
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        return _arm(args)
    from benchmarks import arms  # (the parent only: an arm imports its own tree)

    arm_args = [
        "--batches", str(args.batches), "--batch", str(args.batch),
        "--requests", str(args.requests),
    ]  # fmt: skip
    rows = arms.run_arms(__file__, args.against, args.rounds, arm_args)
    doc = {
        "what": "LM and pool per-task CPU without sockets, and one signed hop (bench_lm_pool)",
        "against": args.against, "rounds": args.rounds, "batches": args.batches,
        "batch": args.batch, "requests": args.requests,
    }  # fmt: skip
    arms.write(doc, rows, args.out, "bench_lm_pool", "lm_pool.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
