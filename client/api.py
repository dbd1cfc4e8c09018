"""The front-door client: typed views of jobs and tasks, sync (``Client``, stdlib
``urllib``) and asyncio (``AsyncClient``, aiohttp), over one request layer."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.config import load_config
from common.errors import MeghaError
from common.jobspec import JobDef, load_job, parse_job

API = "/api/v1"
ENDED = frozenset({"finished", "failed", "cancelled"})
RETRY_CANCEL_S = 10.0
"""A job published a moment ago may not be admitted yet: a cancel is asked again this long."""


class FrontDoorError(MeghaError):
    """A call the front door refused (``reason``, ``status``) or could not reach."""

    def __init__(self, detail: str, *, reason: str, status: int = 0) -> None:
        super().__init__(detail, reason=reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class TaskView:
    task_id: str
    job_id: str
    state: str
    attempts: int
    exit_code: int | None
    reason: str = ""
    stage: int = 0
    lm: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stdout_bytes: int = 0
    stderr_bytes: int = 0

    @classmethod
    def of(cls, d: dict[str, Any]) -> TaskView:
        return cls(**{k: d[k] for k in cls.__slots__ if k in d})


@dataclass(frozen=True, slots=True)
class JobView:
    job_id: str
    user: str
    state: str
    tasks: int
    tasks_by_state: dict[str, int]
    submitted_at: float
    ended_at: float | None = None
    reason: str = ""
    task_list: list[TaskView] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, d: dict[str, Any]) -> JobView:
        kw = {k: d[k] for k in cls.__slots__ if k in d}
        kw["task_list"] = [TaskView.of(t) for t in d.get("task_list", [])]
        return cls(**kw)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def done(self) -> int:
        return sum(n for s, n in self.tasks_by_state.items() if s in ENDED)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a user's GM answers, and who the user is."""

    url: str
    user: str
    token: str

    def headers(self) -> dict[str, str]:
        return {"X-Megha-User": self.user, "Authorization": f"Bearer {self.token}"}


def endpoint(
    address: str | None = None, *, user: str, token: str | None = None,
    token_file: str | Path | None = None, state_dir: str | Path | None = None,
) -> Endpoint:  # fmt: skip
    """The user's GM (``address``, else the federation's config in ``state_dir`` or
    ``$MEGHA_HOME``) and token (``token``, ``token_file``, else the state dir's)."""
    home = Path(state_dir or os.environ.get("MEGHA_HOME") or ".megha")
    if token is None:
        path = Path(token_file) if token_file is not None else home / "tokens" / user
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise FrontDoorError(f"cannot read the token of {user!r} from {path}: "
                                 f"{exc.strerror}", reason="no_token") from None  # fmt: skip
    if address is None:
        cfg_path = home / "federation.toml"
        if not cfg_path.exists():
            raise FrontDoorError(f"no federation in {home} (give --address, or start one "
                                 "with `megha up`)", reason="no_federation")  # fmt: skip
        cfg = load_config(cfg_path)
        gm = next((u.gm for u in cfg.user_configs if u.user == user), None)
        if gm is None:
            raise FrontDoorError(f"no user {user!r} in {cfg_path}", reason="unknown_user")
        address = cfg.gm_url(gm)
    return Endpoint(address.rstrip("/"), user, token)


def _job_body(job: JobDef | dict[str, Any] | str | Path) -> JobDef:
    if isinstance(job, JobDef):
        return job
    if isinstance(job, dict):
        return parse_job(job)
    return load_job(job)


def _refusal(status: int, data: bytes) -> FrontDoorError:
    try:
        doc = json.loads(data)
        return FrontDoorError(doc["detail"], reason=doc["error"], status=status)
    except (ValueError, KeyError, TypeError):
        text = data.decode(errors="replace").strip().splitlines()[:1]
        return FrontDoorError(text[0] if text else f"HTTP {status}", reason="http_error",
                              status=status)  # fmt: skip


# ------------------------------------------------------------------ sync
class Client:
    """A user's connection to its GM's front door (blocking calls)."""

    def __init__(self, ep: Endpoint, *, timeout_s: float = 30.0) -> None:
        self.ep, self.timeout_s = ep, timeout_s

    @classmethod
    def connect(cls, address: str | None = None, **kw: Any) -> Client:
        """``address`` (a GM's URL) or ``state_dir``; ``user``; ``token`` or ``token_file``."""
        timeout = kw.pop("timeout_s", 30.0)
        return cls(endpoint(address, **kw), timeout_s=timeout)

    def _call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        for _ in range(2):  # a GM that serves another user's queue names the right one
            req = urllib.request.Request(self.ep.url + path, data=body, method=method,
                                         headers=self.ep.headers())  # fmt: skip
            if body is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return bytes(resp.read())
            except urllib.error.HTTPError as exc:
                data = exc.read()
                err = _refusal(exc.code, data)
                if err.reason != "wrong_gm":
                    raise err from None
                self.ep = Endpoint(json.loads(data)["url"], self.ep.user, self.ep.token)
            except urllib.error.URLError as exc:
                raise FrontDoorError(f"cannot reach {self.ep.url}: {exc.reason}",
                                     reason="unreachable") from None  # fmt: skip
        raise FrontDoorError("the GMs disagree on which serves this user", reason="wrong_gm")

    def _json(self, method: str, path: str, body: bytes | None = None) -> Any:
        return json.loads(self._call(method, path, body))

    def submit(
        self, job: JobDef | dict[str, Any] | str | Path, job_id: str | None = None
    ) -> JobHandle:
        """Submit a job (built in code, a job-file document, or a file's path)."""
        doc = json.dumps(_job_body(job).to_doc()).encode()
        q = f"?id={urllib.parse.quote(job_id)}" if job_id else ""
        got = self._json("POST", f"{API}/jobs{q}", doc)
        return JobHandle(self, got["job_id"], list(got["tasks"]))

    def handle(self, job_id: str) -> JobHandle:
        return JobHandle(self, job_id, [])

    def jobs(self, state: str | None = None) -> list[JobView]:
        q = f"?state={urllib.parse.quote(state)}" if state else ""
        return [JobView.of(j) for j in self._json("GET", f"{API}/jobs{q}")["jobs"]]

    def status(self, job_id: str) -> JobView:
        return JobView.of(self._json("GET", f"{API}/jobs/{urllib.parse.quote(job_id)}"))

    def cancel(self, job_id: str) -> JobView:
        deadline = time.monotonic() + RETRY_CANCEL_S
        while True:
            try:
                path = f"{API}/jobs/{urllib.parse.quote(job_id)}/cancel"
                return JobView.of(self._json("POST", path, b""))
            except FrontDoorError as exc:
                if exc.reason != "not_admitted_yet" or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def task(self, task_id: str) -> TaskView:
        return TaskView.of(self._json("GET", f"{API}/tasks/{urllib.parse.quote(task_id)}"))

    def logs(self, task_id: str, stream: str = "stdout") -> bytes:
        return self._call("GET", f"{API}/tasks/{urllib.parse.quote(task_id)}/logs?stream={stream}")

    def wait(
        self, job_id: str, *, timeout_s: float | None = None, poll_s: float = 0.5,
        on_progress: Callable[[JobView], None] | None = None,
    ) -> JobView:  # fmt: skip
        """Until job ``job_id`` ended (or ``timeout_s``: ``FrontDoorError`` ``timeout``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = self.status(job_id)
            if on_progress is not None:
                on_progress(view)
            if view.ended:
                return view
            if deadline is not None and time.monotonic() > deadline:
                raise FrontDoorError(f"job {job_id} still {view.state}", reason="timeout")
            time.sleep(poll_s)


@dataclass(slots=True)
class JobHandle:
    """A submitted job: ask its status, wait for it, cancel it, read its tasks."""

    client: Client
    job_id: str
    task_ids: list[str]

    def status(self) -> JobView:
        return self.client.status(self.job_id)

    def wait(self, timeout_s: float | None = None, **kw: Any) -> JobView:
        return self.client.wait(self.job_id, timeout_s=timeout_s, **kw)

    def cancel(self) -> JobView:
        return self.client.cancel(self.job_id)

    def results(self) -> list[TaskView]:
        """Each task: its state, attempts and exit code (``client.logs`` its output)."""
        return self.status().task_list


# ------------------------------------------------------------------ asyncio
class AsyncClient:
    """``Client`` with ``await``: ``async with AsyncClient.connect(user=...) as fed``."""

    def __init__(self, ep: Endpoint, *, timeout_s: float = 30.0) -> None:
        import aiohttp

        self.ep, self._aiohttp = ep, aiohttp
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: Any = None

    @classmethod
    def connect(cls, address: str | None = None, **kw: Any) -> AsyncClient:
        timeout = kw.pop("timeout_s", 30.0)
        return cls(endpoint(address, **kw), timeout_s=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        if self._session is None:
            self._session = self._aiohttp.ClientSession(timeout=self._timeout)
        for _ in range(2):
            headers = self.ep.headers() | ({"Content-Type": "application/json"} if body else {})
            try:
                async with self._session.request(method, self.ep.url + path, data=body,
                                                 headers=headers) as resp:  # fmt: skip
                    data = await resp.read()
                    if resp.status < 300:
                        return bytes(data)
            except self._aiohttp.ClientError as exc:
                raise FrontDoorError(f"cannot reach {self.ep.url}: {exc}",
                                     reason="unreachable") from None  # fmt: skip
            err = _refusal(resp.status, data)
            if err.reason != "wrong_gm":
                raise err
            self.ep = Endpoint(json.loads(data)["url"], self.ep.user, self.ep.token)
        raise FrontDoorError("the GMs disagree on which serves this user", reason="wrong_gm")

    async def _json(self, method: str, path: str, body: bytes | None = None) -> Any:
        return json.loads(await self._call(method, path, body))

    async def submit(
        self, job: JobDef | dict[str, Any] | str | Path, job_id: str | None = None
    ) -> AsyncJobHandle:
        doc = json.dumps(_job_body(job).to_doc()).encode()
        q = f"?id={urllib.parse.quote(job_id)}" if job_id else ""
        got = await self._json("POST", f"{API}/jobs{q}", doc)
        return AsyncJobHandle(self, got["job_id"], list(got["tasks"]))

    async def jobs(self, state: str | None = None) -> list[JobView]:
        q = f"?state={urllib.parse.quote(state)}" if state else ""
        return [JobView.of(j) for j in (await self._json("GET", f"{API}/jobs{q}"))["jobs"]]

    async def status(self, job_id: str) -> JobView:
        return JobView.of(await self._json("GET", f"{API}/jobs/{urllib.parse.quote(job_id)}"))

    async def cancel(self, job_id: str) -> JobView:
        deadline = time.monotonic() + RETRY_CANCEL_S
        while True:
            try:
                path = f"{API}/jobs/{urllib.parse.quote(job_id)}/cancel"
                return JobView.of(await self._json("POST", path, b""))
            except FrontDoorError as exc:
                if exc.reason != "not_admitted_yet" or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def task(self, task_id: str) -> TaskView:
        return TaskView.of(await self._json("GET", f"{API}/tasks/{urllib.parse.quote(task_id)}"))

    async def logs(self, task_id: str, stream: str = "stdout") -> bytes:
        path = f"{API}/tasks/{urllib.parse.quote(task_id)}/logs?stream={stream}"
        return await self._call("GET", path)

    async def wait(self, job_id: str, *, timeout_s: float | None = None,
                   poll_s: float = 0.5) -> JobView:  # fmt: skip
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            view = await self.status(job_id)
            if view.ended:
                return view
            if deadline is not None and time.monotonic() > deadline:
                raise FrontDoorError(f"job {job_id} still {view.state}", reason="timeout")
            await asyncio.sleep(poll_s)


@dataclass(slots=True)
class AsyncJobHandle:
    client: AsyncClient
    job_id: str
    task_ids: list[str]

    async def status(self) -> JobView:
        return await self.client.status(self.job_id)

    async def wait(self, timeout_s: float | None = None) -> JobView:
        return await self.client.wait(self.job_id, timeout_s=timeout_s)

    async def cancel(self) -> JobView:
        return await self.client.cancel(self.job_id)

    async def results(self) -> list[TaskView]:
        return (await self.status()).task_list
