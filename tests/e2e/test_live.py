"""A live federation end to end: a workload to completion, a bench summary, bad input."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from msgspec.structs import replace

from common import codec
from common.config import FederationConfig
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import LaunchRequest, Placement, SubmitJob, WorkerHeartbeat
from common.model import N_CONSTRAINTS, TaskSpec
from request_generator.bench import BenchOptions, run_bench
from request_generator.submitter import SubmissionRefused, Submitter
from runtime import broker
from security.access import Access, load_tokens
from security.identity import OPERATOR, Identity, Role, gm, lm
from tests.e2e.conftest import incarnation, service_state

pytestmark = pytest.mark.e2e

Federation = tuple[FederationConfig, Path]


@pytest.fixture(scope="module")
def fed(make_federation: Callable[..., Federation]) -> Federation:
    return make_federation(gms=2, lms=2, nodes_per_lm=6, heartbeat_s=0.5, worker_timeout_s=3.0)


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any] | bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
        return resp.status, (json.loads(body) if "json" in resp.headers["Content-Type"] else body)


def test_workload_runs_to_completion_with_a_correct_summary(
    fed: Federation, tmp_path: Path
) -> None:
    cfg, home = fed
    opts = BenchOptions(
        jobs=40, tasks_per_job=3, mean_duration=0.05, job_rate=40.0, out=str(tmp_path),
        floor_samples=50, timeout_s=60.0, progress=False,
    )  # fmt: skip
    summary = asyncio.run(run_bench(cfg, opts, home))
    assert summary["tasks"] == 120
    assert summary["unfinished_tasks"] == 0
    assert summary["tasks_finished"] + summary["tasks_failed"] == 120
    assert summary["tasks_failed"] == 0
    # the pools' launch logs were read (a start and an end per task), none found twice
    assert summary["launch_log_rows"] >= 240
    assert summary["duplicate_launches"] == 0
    for key in ("p50", "p90", "p99", "p999", "max", "mean"):
        assert summary["allocation_time_s"][key] >= 0
    assert 0 < summary["allocation_time_s"]["p50"] <= summary["allocation_time_s"]["max"]
    assert set(summary["components_s"]) == {
        "queueing", "processing", "worker_queueing", "communication", "preempted_running"
    }  # fmt: skip
    assert summary["submission_s"]["p50"] > 0  # publish -> GM queue, reported beside it
    assert summary["floor_rtt_s"] > 0
    assert summary["throughput_tasks_per_s"] > 0
    assert set(summary["counters"]) >= {"inconsistencies", "repartitions", "preemptions"}
    assert "wait_reasons" in summary
    # every task's split adds up to its measured start - submit
    rows = (tmp_path / "tasks.csv").read_text().splitlines()
    assert len(rows) == 121
    header = rows[0].split(",")
    for line in rows[1:]:
        r = dict(zip(header, line.split(","), strict=True))
        span = float(r["started_at"]) - float(r["submitted_at"])
        parts = sum(
            float(r[f"{c}_s"])
            for c in ("queueing", "processing", "worker_queueing", "communication",
                      "preempted_running")
        )  # fmt: skip
        # to the final start, exactly: no wait disappears
        assert abs(float(r["allocation_s"]) - parts) < 1e-6
        assert abs(parts - span) < 1e-6
        assert float(r["finished_at"]) >= float(r["started_at"]) > 0
    for name in ("summary.json", "allocation_cdf.png", "components.png"):
        assert (tmp_path / name).stat().st_size > 0
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["allocation_time_s"] == summary["allocation_time_s"]


def _launch_fields(cfg: FederationConfig, **task_over: object) -> dict[str, Any]:
    t = TaskSpec(task_id=TaskId("bad.t0"), job_id=JobId("bad"), user=UserId("u0"), demand=(1,),
                 duration=0.1)  # fmt: skip
    req = LaunchRequest(
        gm=GmId("gm0"), lm=LmId("lm0"), request_id=1, known_version=-1,
        placements=(Placement(spec=t, attempt=1, node=NodeIndex(0)),),
    )  # fmt: skip
    fields: dict[str, Any] = msgpack.unpackb(codec.encode(req))[2]
    fields["placements"][0]["spec"].update(task_over)
    return fields


def _pack(fields: object, tag: str = "launch") -> bytes:
    out: bytes = msgpack.packb([tag, codec.SCHEMA_VERSION, fields])
    return out


def _as(cfg: FederationConfig, home: Path, me: Identity, to: Identity) -> Any:
    """Headers for a request from ``me`` to ``to``, signed with the federation's keys
    (bound to ``to``'s incarnation, as a service's calls are)."""
    access = Access.in_home(home, cfg, me)
    name = f"{to.name}-workers" if to.role is Role.WORKERS else to.name
    bound = incarnation(cfg.url(name)) if me != OPERATOR else ""

    def headers(path: str, body: bytes) -> dict[str, str]:
        signed = access.sign(to, "POST", path, body, time.time(), bound)
        return {**signed, "Content-Type": "application/x-msgpack"}

    return headers


def test_lm_refuses_bad_requests_and_keeps_serving(fed: Federation) -> None:
    """Bad bodies from an authenticated GM get 4xx with the field's reason; calls not
    signed by a party allowed to make them are refused before any handler runs."""
    cfg, home = fed
    path = "/v1/launch"
    url = cfg.lm_url("lm0") + path
    as_gm = _as(cfg, home, gm("gm0"), lm("lm0"))
    auth = "as gm0"
    missing = _launch_fields(cfg)
    del missing["placements"][0]["spec"]["demand"]
    unknown_gm = _launch_fields(cfg)
    unknown_gm["gm"] = "evil"
    dup = _launch_fields(cfg)
    dup["placements"].append(dup["placements"][0])
    cases: list[tuple[bytes, dict[str, str], int, str]] = [
        (b"\xc1not msgpack", auth, 400, "malformed_body"),
        (_pack({}, tag="no_such_message"), auth, 400, "unknown_tag"),
        (_pack(_launch_fields(cfg, duration="soon")), auth, 422, "wrong_type"),
        (_pack(missing), auth, 422, "missing_field"),
        (_pack(_launch_fields(cfg, demand=[-1])), auth, 422, "negative_value"),
        (_pack(_launch_fields(cfg, demand=[1, 1, 1])), auth, 422, "wrong_resources"),
        (_pack(_launch_fields(cfg, constraints=1 << (N_CONSTRAINTS + 2))), auth, 422,
         "unknown_constraint"),
        (_pack(dup), auth, 422, "duplicate_task_id"),
        # a GM naming another GM (known or not) is refused before validation
        (_pack(unknown_gm), auth, 403, "sender_mismatch"),
        (_pack(_launch_fields(cfg, evil=1)), auth, 422, "unknown_field"),
        (_pack(_launch_fields(cfg, duration=1e400)), auth, 422, "out_of_range"),
        (b"\x00" * (cfg.max_body + 10), "no credentials", 413, "too_large"),
        (_pack(_launch_fields(cfg)), "no credentials", 401, "missing_credentials"),
    ]  # fmt: skip
    for body, who, status, reason in cases:
        headers = as_gm(path, body) if who == auth else {}
        got, answer = post(url, body, headers)
        assert (got, answer["error"]) == (status, reason), answer  # type: ignore[index]
    # forged, replayed, or from a party that may not launch
    body = _pack(_launch_fields(cfg, duration=3.0))  # still running when counted below
    forged = {**as_gm(path, body), "X-Megha-Signature": "0" * 64}
    once = as_gm(path, body)
    assert post(url, body, once)[0] == 200
    evil = Access(gm("evil"), cfg, Access.in_home(home, cfg).secret).sign(
        lm("lm0"), "POST", path, body, time.time()
    )
    pool = _as(cfg, home, Identity.parse("workers:lm0"), lm("lm0"))(path, body)
    for headers, status, reason in [
        (forged, 401, "bad_signature"),
        (once, 401, "replayed_nonce"),
        (evil, 401, "unknown_identity"),
        (pool, 403, "forbidden_endpoint"),
        (_as(cfg, home, OPERATOR, lm("lm0"))(path, body), 403, "forbidden_endpoint"),
        ({**as_gm(path, body), "X-Megha-Content-SHA256": "1" * 64}, 401, "bad_signature"),
        (as_gm(path, b"another body"), 401, "body_digest_mismatch"),
    ]:
        got, answer = post(url, body, headers)
        assert (got, answer["error"]) == (status, reason), answer  # type: ignore[index]
    # the worker-facing endpoints too
    bad_node = codec.encode(WorkerHeartbeat(lm=LmId("lm0"), nodes=(NodeIndex(999),), at=0.0))
    as_pool = _as(cfg, home, Identity.parse("workers:lm0"), lm("lm0"))
    got, answer = post(
        cfg.lm_url("lm0") + "/v1/worker-heartbeat",
        bad_node,
        as_pool("/v1/worker-heartbeat", bad_node),
    )
    assert (got, answer["error"]) == (422, "unknown_node")  # type: ignore[index]
    as_lm = _as(cfg, home, lm("lm0"), Identity.parse("workers:lm0"))
    got, answer = post(cfg.worker_url("lm0") + "/v1/start", b"\x93", as_lm("/v1/start", b"\x93"))
    assert (got, answer["error"]) == (400, "malformed_body")  # type: ignore[index]
    # still serving, and it counted what it refused
    assert get(cfg.lm_url("lm0") + "/health")[0] == 200
    state = service_state(cfg, home, "lm0")
    assert state["running_tasks"] == 1  # the one good launch above
    metrics = get(cfg.lm_url("lm0") + "/metrics")[1]  # public, as for a Prometheus scrape
    assert b'megha_lm_refused_total{reason="malformed_body"}' in metrics
    assert b"megha_lm_launches_total" in metrics
    with pytest.raises(urllib.error.HTTPError) as err:
        get(cfg.gm_url("gm0") + "/v1/state")
    err.value.close()
    assert err.value.code == 401


def test_bad_submissions_are_dead_lettered_with_their_reason(fed: Federation) -> None:
    cfg, home = fed
    refused, ok_result, letters = asyncio.run(_submit_bad(cfg, home))
    assert refused == {
        "bad-token": "bad_token",
        "wrong-queue": "wrong_queue",
        "impossible": "impossible_resources",
        "dup-ids": "duplicate_task_id",
        "reused-job": "duplicate_job_id",
        "unknown-field": "unknown_field",
        "long": "duration_too_long",
        "zero": "zero_demand",
        "wrong-types": "wrong_type",
        "missing": "missing_field",
        "constraint": "unknown_constraint",
        "negative": "negative_value",
        "malformed": "malformed_body",
        "oversized": "too_large",
    }
    assert ok_result == "finished"
    # a dead letter keeps a bounded prefix of a large body, and says how large it was
    assert letters["oversized"] == (broker.DEAD_LETTER_BODY, cfg.max_body + 1, True)
    assert letters["malformed"] == (3, 3, False)
    state = service_state(cfg, home, "gm0")
    assert state["dead_lettered"] >= 14
    assert get(cfg.gm_url("gm0") + "/health")[0] == 200


async def _submit_bad(
    cfg: FederationConfig, home: Path
) -> tuple[dict[str, str], str, dict[str, tuple[int, int, bool]]]:
    sub = Submitter.operator(cfg, home)
    await sub.open()
    dead: dict[str, str] = {}
    letters: dict[str, tuple[int, int, bool]] = {}
    got_all = asyncio.Event()
    n_bad = 14

    async def on_dead(msg: Any) -> None:
        tag = msg.headers["x-megha-tag"]
        letters[tag] = (
            len(msg.body),
            msg.headers.get(broker.SIZE_HEADER),
            msg.headers.get(broker.TRUNCATED_HEADER),
        )
        dead[tag] = msg.headers["x-megha-reason"]
        if len(dead) == n_bad:
            got_all.set()

    assert sub.broker.conn is not None
    ch = await sub.broker.conn.channel()
    q = await ch.declare_queue(exclusive=True, auto_delete=True)
    await q.bind(cfg.dead_letter_exchange, routing_key="")
    await q.consume(on_dead, no_ack=True)

    tokens = load_tokens(home)

    def task(tid: str, job: str, user: str = "u0", demand: tuple[int, ...] = (1,)) -> TaskSpec:
        return TaskSpec(task_id=TaskId(tid), job_id=JobId(job), user=UserId(user), demand=demand,
                        duration=0.05)  # fmt: skip

    def job(jid: str, tasks: list[TaskSpec], user: str = "u0", token: str | None = None) -> bytes:
        tok = tokens.get(user, "") if token is None else token
        return codec.encode(
            SubmitJob(job_id=JobId(jid), user=UserId(user), token=tok, submitted_at=1.0,
                      tasks=tuple(tasks))
        )  # fmt: skip

    def fields_with(**over: object) -> bytes:
        f = msgpack.unpackb(job("x", [task("x.t0", "x")]))
        f[2]["tasks"][0].update(over)
        out: bytes = msgpack.packb(f)
        return out

    missing = msgpack.unpackb(job("m", [task("m.t0", "m")]))
    del missing[2]["tasks"][0]["user"]
    bodies = {
        "bad-token": job("a", [task("a.t0", "a")], token="forged"),
        "wrong-queue": job("b", [task("b.t0", "b", user="u1")], user="u1"),
        "impossible": job("c", [task("c.t0", "c", demand=(5,))]),
        "dup-ids": job("d", [task("d.t0", "d"), task("d.t0", "d")]),
        "wrong-types": fields_with(duration="forever"),
        "missing": msgpack.packb(missing),
        "constraint": fields_with(constraints=1 << 30),
        "negative": fields_with(demand=[-3]),
        "malformed": b"\xc1\xc1\xc1",
        "oversized": b"\x00" * (cfg.max_body + 1),
        "unknown-field": fields_with(evil=1),
        "long": fields_with(duration=1e300),
        "zero": fields_with(demand=[0]),
    }
    # a job id reused while the first job is still active
    slow = TaskSpec(task_id=TaskId("r.t0"), job_id=JobId("reused"), user=UserId("u0"),
                    demand=(1,), duration=2.0)  # fmt: skip
    await sub.broker.ex.submit.publish(
        broker.persistent(job("reused", [slow])), routing_key="u0", mandatory=True
    )
    bodies["reused-job"] = job("reused", [replace(slow, task_id=TaskId("r.t1"))])
    for tag, body in bodies.items():
        msg = broker.persistent(body, headers={"x-megha-tag": tag})
        await sub.broker.ex.submit.publish(msg, routing_key="u0", mandatory=True)
    # an unknown user has no queue: the publish itself is refused, nothing is lost silently
    with pytest.raises(SubmissionRefused):
        await sub.publish_raw("mallory", job("e", [task("e.t0", "e", user="mallory")], "mallory"))
    await asyncio.wait_for(got_all.wait(), timeout=30)
    # the GM keeps serving: a good job still runs
    from workload.jobs import Job

    good = Job(JobId("good"), UserId("u0"), 0.0, [task("good.t0", "good")])
    await sub.submit(good)
    key = (UserId("u0"), TaskId("good.t0"))
    for _ in range(300):
        if key in sub.outcomes.finished:
            break
        await asyncio.sleep(0.1)
    result = "finished" if key in sub.outcomes.finished else "missing"
    await sub.close()
    return dead, result, letters
