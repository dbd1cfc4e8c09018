"""A worker pool's app (``runtime.http.service_app``, its two message routes) around a
scripted service, and the signed bytes an LM's ``runtime.h1`` client sends it: what
tests/security/test_lean_path.py and benchmarks/bench_lean_http.py serve, by the lean
path and by aiohttp."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from common import codec
from common.config import FederationConfig
from common.errors import ValidationError
from common.ids import GmId, LmId, NodeIndex, TaskId, UserId
from common.messages import Refused, StopTask, StopTasks
from runtime import http
from runtime.prometheus import ServiceMetrics
from security.access import Access
from security.identity import lm, workers
from security.secret import Secret

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
CFG = FederationConfig().validate()
POOL = workers("lm0")
LM0 = Access(lm("lm0"), CFG, SECRET)
INCARNATION = "0123456789abcdef"


class _Driver:
    """Answers a ``StopTasks`` as its first task's ``task_id`` says."""

    def feed(self, msg: object) -> object | None:
        assert isinstance(msg, StopTasks)
        what = msg.tasks[0].task_id
        if what == "bug":
            raise RuntimeError("a server bug")
        if what == "invalid":
            raise ValidationError("not this one", path="tasks[0]")
        answers: dict[str, object | None] = {
            "none": None,
            "conflict": Refused(reason="stale_epoch", detail="an old epoch"),
            "wrong": Refused(reason="unknown_node", detail="node 9"),
        }
        return answers.get(what, msg)


class Pool:
    """A scripted service: ``ready`` says whether it takes messages; ``durable`` waits
    for ``hold`` (set: at once) after a real turn of the loop."""

    role = "workers"

    def __init__(self) -> None:
        self.driver: Any = _Driver()
        self.ready = True
        self.hold = asyncio.Event()
        self.hold.set()
        self.fed = asyncio.Event()
        """Set once a message reached ``durable``."""

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def ident(self) -> str:
        return "lm0"

    def status(self) -> str:
        return "ok"

    def refusal(self) -> Refused | None:
        return None if self.ready else Refused(reason="not_ready", detail="registering")

    async def durable(self, msg: object) -> None:
        self.fed.set()
        await asyncio.sleep(0)
        await self.hold.wait()

    def state_page(self) -> dict[str, Any]:
        return {}


def pool_app(pool: Pool | None = None) -> web.Application:
    """The pool's app: ``/v1/start`` and ``/v1/stop`` (both take ``StopTasks`` here)."""
    access = Access(POOL, CFG, SECRET)
    metrics = ServiceMetrics("megha_workers", dict, dict)
    app = http.service_app(
        CFG, pool or Pool(), metrics, access, {"/v1/start": StopTasks, "/v1/stop": StopTasks}
    )
    app[http.INCARNATION_KEY] = INCARNATION
    return app


def stop_tasks(task_id: str, lm_name: str = "lm0", n: int = 1) -> StopTasks:
    """A ``StopTasks`` of ``n`` tasks, the first's id scripting the answer."""
    tasks = tuple(
        StopTask(node=NodeIndex(i), user=UserId("u"),
                 task_id=TaskId(f"{task_id}-{i}" if i else task_id), attempt=0, gm=GmId("gm0"))
        for i in range(n)
    )  # fmt: skip
    return StopTasks(lm=LmId(lm_name), tasks=tasks)


def stop(task_id: str, lm_name: str = "lm0") -> bytes:
    """A ``StopTasks`` body whose one task's id scripts the answer."""
    return codec.encode(stop_tasks(task_id, lm_name))


def call(
    body: bytes,
    path: str = "/v1/stop",
    *,
    sender: Access = LM0,
    incarnation: str = INCARNATION,
    extra: dict[str, str] | None = None,
    signed_body: bytes | None = None,
) -> bytes:
    """The bytes of a signed POST as ``runtime.h1`` writes them (``extra``: more
    headers)."""
    now = time.time()
    signed = sender.sign(POOL, "POST", path, body if signed_body is None else signed_body, now,
                         incarnation)  # fmt: skip
    headers = {"Host": "127.0.0.1", **signed, "Content-Type": http.MSGPACK, **(extra or {}),
               "Content-Length": str(len(body))}  # fmt: skip
    lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + body
