"""The GM's front door: its users submit, follow, cancel and read their jobs over HTTP.

Every call names its user (``X-Megha-User``) and carries the user's token
(``Authorization: Bearer mgu_...``), checked against the federation's token file as a
submission through the broker is; service signatures are not asked for here
(``security.signing.is_user_api``).  A GM answers for the users whose queues it
serves; for another user it answers 421 ``wrong_gm`` naming the right GM and its URL.

A submission is checked whole (``common.jobspec``, then the wire schema) and published
to the user's durable queue, as ``megha bench`` publishes: the GM then admits it as any
job, so an accepted job is placed or ends with an explicit failure, and never runs
twice.  Everything a user reads comes from the core's job book
(``global_master.lifecycle``).  A job of another user is answered as an unknown one
(404): no one learns what others run.  ``OPENAPI`` documents every route;
``tests/unit/test_frontdoor.py`` checks it against these handlers.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from common import codec
from common.dag import parse_json
from common.errors import ConfigError, MeghaError, Unauthorized
from common.ids import ID_CHARS, MAX_ID_LEN, JobId, TaskId, UserId
from common.jobspec import parse_job
from common.messages import CancelJob, SubmitJob
from common.reasons import JobReason
from global_master.core import GlobalMaster
from global_master.intake import dag_edges_error
from global_master.lifecycle import JobBook, JobRecord, JobStatus
from security.tokens import TokenStore

API = "/api/v1"
MAX_JOB_BODY = 8 << 20
"""A job body (JSON) of at most this many bytes."""
BODY_S = 30.0
"""A job body comes whole within this many seconds of its head, or is refused (408)."""
BODIES_BYTES = 64 << 20
"""What one GM process holds of job bodies still coming in, over every caller: past it
a body is refused (503 ``busy``) until others have come whole or been refused.  A token
holder's connections could each hold ``MAX_JOB_BODY`` for ``BODY_S`` (256 of them:
2 GiB)."""
USER_BODIES = 2
"""One user's bodies still coming in hold at most this many ``MAX_JOB_BODY`` (429
``too_many_bodies`` past it): one user cannot take ``BODIES_BYTES`` from the others."""
PENDING_S = 600.0
"""A job published and not admitted within this long is forgotten here.  A job its GM
refuses before its core sees it (``user_backlog``, ``too_many_edges``,
``internal_error``) is in the book as failed, with why (``GmService._refusal``); only
one whose GM could not read it (``poison``: it died handling it) goes this way, and
its dead letter says why."""

Publish = Callable[[SubmitJob], Awaitable[None]]
_ID = re.compile(rf"[{ID_CHARS}]{{1,{MAX_ID_LEN - 20}}}")
"""A job id (room left for its tasks' ``.s<stage>.t<i>``)."""
SWEEP_S = 1.0
"""``FrontDoor.pending`` is swept of jobs admitted or forgotten at most this often."""
PUBLISH_S = 5.0
"""How long a submission waits for the broker to take it into its user's queue before
it is refused (``NotQueued``): a full queue (``max_user_queue``) nacks every publish
until its GM reads it down, and a retry that never ends held the request, and the job,
until it went through, long after its caller had given up."""
SHOWN_ID = 80
"""A refused job id is quoted back up to this many characters (it may be megabytes)."""


def _error(status: int, reason: str, detail: str) -> web.Response:
    return web.json_response({"error": reason, "detail": detail}, status=status)


class FrontDoor:
    """The user-facing operations of one GM, over its core and its users' tokens."""

    def __init__(
        self, core: GlobalMaster, tokens: TokenStore, publish: Publish,
        feed: Callable[[object], None], gm_url: Callable[[str], str],
    ) -> None:  # fmt: skip
        if core.book is None:
            core.book = JobBook()
        self.book: JobBook = core.book
        self.core, self.tokens, self.publish, self.feed, self.gm_url = (
            core, tokens, publish, feed, gm_url,
        )  # fmt: skip
        self.pending: dict[tuple[UserId, JobId], SubmitJob] = {}
        """Jobs published to their user's queue and not yet admitted."""
        self._swept_at = float("-inf")
        self.bodies = BodyBudget()

    # ------------------------------------------------------------ who asks
    def caller(self, request: web.Request) -> tuple[UserId, str]:
        """The user a request is from, its token checked; ``Unauthorized`` if not."""
        self._forget_pending(time.time())
        headers = request.headers
        if (
            len(headers.getall("X-Megha-User", ())) > 1
            or len(headers.getall("Authorization", ())) > 1
        ):
            # which one counts would be up to each reader: a proxy keeping the last one
            # (to route, limit or log by user) would not see the user answered here
            raise Unauthorized(
                "send X-Megha-User and Authorization once each", reason="malformed_credentials"
            )
        user = headers.get("X-Megha-User", "")
        auth = headers.get("Authorization", "")
        if not user or not auth.startswith("Bearer "):
            raise Unauthorized(
                "send X-Megha-User and Authorization: Bearer <token>", reason="missing_credentials"
            )
        token = auth[len("Bearer ") :].strip()
        self.tokens.refresh(time.time())
        rec = self.tokens.verify(user, token)
        if rec.gm != self.core.gm_id:
            raise WrongGm(rec.gm, self.gm_url(rec.gm))
        return UserId(user), token

    def _forget_pending(self, now: float) -> None:
        """Forget the jobs admitted since (the book has them) or refused before the core
        (``PENDING_S`` passed), each of them, at most once per ``SWEEP_S``.  (Only those
        before the first still waiting were: one job refused before the core, of any
        user, kept every job sent after it -- whole, up to 100,000 tasks each -- for
        ``PENDING_S``, admitted, ended and cancelled ones alike.)"""
        if now - self._swept_at < SWEEP_S:
            return
        self._swept_at = now
        for jk, sub in list(self.pending.items()):
            if sub.submitted_at + PENDING_S <= now or self._in_book(jk, sub) is not None:
                del self.pending[jk]

    def _in_book(self, jk: tuple[UserId, JobId], sub: SubmitJob | None) -> JobRecord | None:
        """The book's record of ``jk``, but not a refusal older than ``sub`` (its id,
        sent again: the job sent again is not in the book yet)."""
        rec = self.book.get(*jk)
        if rec is not None and sub is not None and rec.refused:
            return None if rec.submitted_at < sub.submitted_at else rec
        return rec

    # ------------------------------------------------------------ handlers
    async def submit(self, request: web.Request) -> web.Response:
        user, token = self.caller(request)
        job = parse_job(parse_json(await _job_body(request, self.bodies, user), "job"))
        jid = request.query.get("id") or f"{job.name}-{secrets.token_hex(4)}"
        if not _ID.fullmatch(jid):
            raise ConfigError(f"bad job id {_shown(jid)!r}", reason="bad_job_id")
        jk = (user, JobId(jid))
        if jk in self.pending or self.book.admitted(*jk) is not None or jk in self.core.jobs:
            return _error(409, "duplicate_job_id", f"job {jid!r} exists")
        sub = job.submission(jid, user, token, time.time())
        sub = codec.decode(codec.encode(sub), expect=SubmitJob)  # the wire's own checks
        why = self.core.task_refusal(sub)  # what the core's admission would refuse it for
        if why is not None:
            raise Unadmittable(why.reason, why.detail)
        too_many = dag_edges_error(sub)  # what its GM refuses before the core sees it
        if too_many is not None:  # (it was a 202, "submitted" for PENDING_S, then unknown)
            raise Unadmittable(*too_many)
        # the id is taken before the publish is awaited: a second submission of it
        # meanwhile is a 409, not a second 202 whose job the GM then drops as a duplicate
        self.pending[jk] = sub
        try:
            await self.publish(sub)
        except BaseException:
            self.pending.pop(jk, None)  # not published (``NotQueued``): the id is free again
            raise
        ids = [s.task_id for s in sub.tasks]
        body = {"job_id": jid, "user": user, "gm": self.core.gm_id, "tasks": ids,
                "state": "submitted"}  # fmt: skip
        return web.json_response(body, status=202)

    def _record(self, user: UserId, job_id: str) -> JobRecord | dict[str, Any]:
        """The book's record of a job, or what is known of one published and not yet
        admitted; ``UnknownJob`` if neither (also for another user's job)."""
        jk = (user, JobId(job_id))
        sub = self.pending.get(jk)
        rec = self._in_book(jk, sub)
        if rec is not None:
            self.pending.pop(jk, None)
            return rec
        if sub is None:
            raise UnknownJob(job_id)
        return _submitted(sub)

    async def jobs(self, request: web.Request) -> web.Response:
        user, _ = self.caller(request)
        state = request.query.get("state")
        if state is not None and state not in {*JobStatus, "submitted"}:
            raise ConfigError(f"unknown state {state!r}", reason="bad_state")
        ledger = self.core.ledger
        waiting = {jk: sub for jk, sub in list(self.pending.items()) if jk[0] == user}
        out = []
        for r in self.book.of_user(user):
            jk = (user, r.job_id)
            if self._in_book(jk, waiting.get(jk)) is not None:  # else: sent again, below
                out.append(self.book.summary(r, ledger))
                waiting.pop(jk, None)
        out += [_submitted(sub) for sub in waiting.values()]
        if state is not None:
            out = [j for j in out if j["state"] == state]
        return web.json_response({"jobs": out})

    async def job(self, request: web.Request) -> web.Response:
        user, _ = self.caller(request)
        got = self._record(user, request.match_info["job_id"])
        if isinstance(got, dict):
            return web.json_response(got | {"timeline": [], "task_list": []})
        return web.json_response(self.book.detail(got, self.core.ledger))

    async def cancel(self, request: web.Request) -> web.Response:
        user, _ = self.caller(request)
        job_id = request.match_info["job_id"]
        got = self._record(user, job_id)
        if isinstance(got, dict):
            return _error(409, "not_admitted_yet", f"job {job_id!r} is not admitted yet: retry")
        self.feed(CancelJob(user=user, job_id=JobId(job_id)))
        return web.json_response(self.book.summary(got, self.core.ledger), status=202)

    async def task(self, request: web.Request) -> web.Response:
        user, _ = self.caller(request)
        tid = request.match_info["task_id"]
        found = self.book.task(user, TaskId(tid))
        if found is None:
            raise UnknownTask(tid)
        return web.json_response(self.book.task_detail(*found, self.core.ledger))

    async def logs(self, request: web.Request) -> web.Response:
        user, _ = self.caller(request)
        tid = request.match_info["task_id"]
        stream = request.query.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise ConfigError(f"stream is stdout or stderr, not {stream!r}", reason="bad_stream")
        found = self.book.task(user, TaskId(tid))
        if found is None:
            raise UnknownTask(tid)
        data = found[1].stdout if stream == "stdout" else found[1].stderr
        return web.Response(body=data, content_type="text/plain", charset="utf-8")

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI)


class BodyBudget:
    """The bytes of job bodies still coming in, per user and in all (``BODIES_BYTES``,
    ``USER_BODIES``): ``take`` before a body's bytes are held, ``give`` once it is read
    or refused."""

    def __init__(self) -> None:
        self.held: dict[UserId, int] = {}
        self.total = 0

    def take(self, user: UserId, n: int) -> None:
        mine = self.held.get(user, 0)
        if mine + n > USER_BODIES * MAX_JOB_BODY:
            raise BodyRefused(429, "too_many_bodies", f"your job bodies still coming in "
                              f"would pass {USER_BODIES * MAX_JOB_BODY} bytes: send them "
                              "one after another")  # fmt: skip
        if self.total + n > BODIES_BYTES:
            raise BodyRefused(503, "busy", "this GM holds as many job bodies coming in as "
                              "it takes: send it again shortly")  # fmt: skip
        self.held[user] = mine + n
        self.total += n

    def give(self, user: UserId, n: int) -> None:
        left = self.held.pop(user, 0) - n
        if left > 0:
            self.held[user] = left
        self.total -= n


async def _job_body(request: web.Request, budget: BodyBudget, user: UserId) -> bytes:
    """A job's body, read as it comes: ``BodyRefused`` 413 ``too_large`` as soon as it
    is past ``MAX_JOB_BODY`` (declared or chunked), 408 ``request_timeout`` if it has not
    come whole within ``BODY_S``, 429 / 503 past the ``budget`` of bodies coming in.
    ``request.read()`` took a chunked body up to the app's 16 MiB and waited for the rest
    for ever: a user's connections that sent 15 MiB and stopped held them in the GM (24
    grew it from 88 to 645 MB, kept when closed)."""
    declared = request.content_length
    if declared is not None and declared > MAX_JOB_BODY:
        raise BodyRefused(413, "too_large", f"a job body is at most {MAX_JOB_BODY} bytes")
    body = bytearray()
    held = 0
    try:
        if declared:
            budget.take(user, declared)  # (all of it at once: refused before it comes)
            held = declared
        async with asyncio.timeout(BODY_S):
            async for chunk in request.content.iter_any():
                body += chunk
                if len(body) > MAX_JOB_BODY:
                    raise BodyRefused(
                        413, "too_large", f"a job body is at most {MAX_JOB_BODY} bytes"
                    )
                if len(body) > held:
                    budget.take(user, len(body) - held)
                    held = len(body)
    except TimeoutError:
        raise BodyRefused(
            408, "request_timeout", f"the job body did not come whole within {BODY_S:g} s"
        ) from None
    finally:
        budget.give(user, held)
    return bytes(body)


def _submitted(sub: SubmitJob) -> dict[str, Any]:
    """A job published to its user's queue, not yet admitted by its GM."""
    n = len(sub.tasks)
    return {"job_id": sub.job_id, "user": sub.user, "state": "submitted", "tasks": n,
            "tasks_by_state": {"queued": n}, "submitted_at": sub.submitted_at,
            "ended_at": None, "reason": ""}  # fmt: skip


class NotQueued(MeghaError):
    """A job the broker did not take into its user's queue within ``PUBLISH_S``: that
    queue is full (``queue_full``, 429) or the broker is out of reach
    (``broker_unavailable``, 503).  No publish of it is left running: a full queue
    took nothing; a broker that did not confirm may have taken it, so the detail names
    its id, and the same id submitted again is refused as a duplicate if it did (a
    retry never runs the job twice)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail, reason=reason)


class BodyRefused(MeghaError):
    """A job body too large or too slow (``_job_body``): its ``status``."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail, reason=reason)
        self.status = status


class WrongGm(MeghaError):
    def __init__(self, gm: str, url: str) -> None:
        super().__init__(f"this user's jobs are on {gm} ({url})", reason="wrong_gm")
        self.gm, self.url = gm, url


class Unadmittable(MeghaError):
    """A job its GM's admission would refuse (``JobReason``): said before it is sent."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail, reason=str(reason))


def _shown(an_id: str) -> str:
    """An id as an answer quotes it: cut past ``SHOWN_ID`` characters."""
    return an_id if len(an_id) <= SHOWN_ID else f"{an_id[:SHOWN_ID]}... ({len(an_id)} characters)"


class UnknownJob(MeghaError):
    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"no job {_shown(job_id)!r} of yours here (now or lately)", reason="unknown_job"
        )


class UnknownTask(MeghaError):
    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"no task {_shown(task_id)!r} of yours here (now or lately)", reason="unknown_task"
        )


def _status(exc: MeghaError) -> int:
    if isinstance(exc, WrongGm):
        return 421
    if isinstance(exc, UnknownJob | UnknownTask):
        return 404
    if isinstance(exc, Unauthorized):
        return 401
    if isinstance(exc, Unadmittable):  # (a user at its task limit may send it later)
        return 429 if exc.reason == JobReason.USER_TASK_LIMIT else 422
    if isinstance(exc, BodyRefused):
        return exc.status
    if isinstance(exc, NotQueued):
        return 429 if exc.reason == "queue_full" else 503
    return 422 if exc.reason in ("bad_job_file", "bad_job_id") else 400


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every refusal of a user's call: a status, a reason, one line of detail."""
    if not request.path.startswith(API):
        return await handler(request)  # type: ignore[no-any-return]
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except MeghaError as exc:
        body: dict[str, Any] = {"error": exc.reason, "detail": str(exc)}
        if isinstance(exc, WrongGm):
            body |= {"gm": exc.gm, "url": exc.url}
        return web.json_response(body, status=_status(exc))


def add_routes(app: web.Application, door: FrontDoor) -> None:
    """The front door's routes on a GM's app (``OPENAPI`` lists the same)."""
    app.middlewares.append(_errors)
    r = app.router
    r.add_post(f"{API}/jobs", door.submit)
    r.add_get(f"{API}/jobs", door.jobs)
    r.add_get(f"{API}/jobs/{{job_id}}", door.job)
    r.add_post(f"{API}/jobs/{{job_id}}/cancel", door.cancel)
    r.add_get(f"{API}/tasks/{{task_id}}", door.task)
    r.add_get(f"{API}/tasks/{{task_id}}/logs", door.logs)
    r.add_get("/openapi.json", door.openapi)


# ------------------------------------------------------------------ OpenAPI
_ERR = {"$ref": "#/components/schemas/Error"}
_JSON = "application/json"


def _resp(desc: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": desc, "content": {_JSON: {"schema": schema or _ERR}}}


_ERRORS = {
    "401": _resp("no or bad credentials (missing_credentials, malformed_credentials, "
                 "unknown_user, bad_token, "
                 "revoked_token)"),
    "421": _resp("the user's jobs are on another GM (wrong_gm: gm, url)"),
}  # fmt: skip
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_TASK_ID = {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}
_NULL_NUM = {"type": ["number", "null"]}
_SUMMARY = {
    "type": "object",
    "required": ["job_id", "user", "state", "tasks", "tasks_by_state", "submitted_at"],
    "properties": {
        "job_id": {"type": "string"}, "user": {"type": "string"},
        "state": {"enum": ["submitted", *[str(s) for s in JobStatus]]},
        "tasks": {"type": "integer"},
        "tasks_by_state": {"type": "object", "additionalProperties": {"type": "integer"}},
        "submitted_at": {"type": "number"}, "ended_at": _NULL_NUM,
        "reason": {"type": "string"},
    },
}  # fmt: skip
_TASK = {
    "type": "object",
    "required": ["task_id", "job_id", "state", "attempts", "exit_code"],
    "properties": {
        "task_id": {"type": "string"}, "job_id": {"type": "string"},
        "stage": {"type": "integer"},
        "state": {"enum": ["queued", "running", "finished", "failed", "cancelled"]},
        "attempts": {"type": "integer"}, "lm": {"type": ["string", "null"]},
        "exit_code": {"type": ["integer", "null"]}, "reason": {"type": "string"},
        "started_at": _NULL_NUM, "ended_at": _NULL_NUM,
        "stdout_bytes": {"type": "integer"}, "stderr_bytes": {"type": "integer"},
    },
}  # fmt: skip
_DETAIL = {
    "allOf": [{"$ref": "#/components/schemas/JobSummary"}],
    "type": "object",
    "properties": {
        "timeline": {"type": "array", "items": {
            "type": "object", "properties": {"at": {"type": "number"},
                                             "what": {"type": "string"}}}},
        "task_list": {"type": "array", "items": {"$ref": "#/components/schemas/Task"}},
    },
}  # fmt: skip
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Megha front door", "version": "1",
             "description": "Submit, follow, cancel and read your jobs on a Megha GM."},
    "components": {
        "securitySchemes": {
            "token": {"type": "http", "scheme": "bearer"},
            "user": {"type": "apiKey", "in": "header", "name": "X-Megha-User"},
        },
        "schemas": {
            "Error": {"type": "object", "required": ["error", "detail"],
                      "properties": {"error": {"type": "string"}, "detail": {"type": "string"},
                                     "gm": {"type": "string"}, "url": {"type": "string"}}},
            "JobFile": {"type": "object", "required": ["format"],
                        "description": "a megha-job/1 job (common/jobspec.py)",
                        "properties": {"format": {"const": "megha-job/1"}}},
            "Submitted": {"type": "object", "required": ["job_id", "tasks", "state"],
                          "properties": {"job_id": {"type": "string"},
                                         "user": {"type": "string"}, "gm": {"type": "string"},
                                         "tasks": {"type": "array",
                                                   "items": {"type": "string"}},
                                         "state": {"const": "submitted"}}},
            "JobSummary": _SUMMARY,
            "JobDetail": _DETAIL,
            "Task": _TASK,
            "Jobs": {"type": "object", "required": ["jobs"], "properties": {
                "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/JobSummary"}}}},
        },
    },
    "security": [{"token": [], "user": []}],
    "paths": {
        f"{API}/jobs": {
            "post": {"operationId": "submit", "summary": "submit a job",
                     "parameters": [{"name": "id", "in": "query", "required": False,
                                     "schema": {"type": "string"}}],
                     "requestBody": {"required": True, "content": {
                         _JSON: {"schema": {"$ref": "#/components/schemas/JobFile"}}}},
                     "responses": {"202": _resp("published to your queue",
                                                {"$ref": "#/components/schemas/Submitted"}),
                                   "408": _resp("request_timeout: the body did not come "
                                                "whole in time"),
                                   "409": _resp("duplicate_job_id"),
                                   "413": _resp("too_large: a body over 8 MiB"),
                                   "429": _resp("queue_full: your queue at the broker is "
                                                "full; user_task_limit: your tasks on this "
                                                "GM and this job's would pass "
                                                "max_user_tasks; too_many_bodies: your "
                                                "bodies still coming in are at their "
                                                "bound; retry later"),
                                   "503": _resp("broker_unavailable: not confirmed, submit "
                                                "again with ?id= the id named; busy: the "
                                                "GM holds all the bodies coming in it "
                                                "takes, retry shortly"),
                                   "422": _resp("bad_job_file, bad_job_id, a wire bound, or "
                                                 "what admission refuses (wrong_resources, "
                                                 "impossible_resources, commands_disabled, "
                                                 "duration_too_long, ...)"),
                                   **_ERRORS}},
            "get": {"operationId": "jobs", "summary": "your jobs (live, or ended lately)",
                    "parameters": [{"name": "state", "in": "query", "required": False,
                                    "schema": {"type": "string"}}],
                    "responses": {"200": _resp("your jobs", {"$ref": "#/components/schemas/Jobs"}),
                                  "400": _resp("bad_state"), **_ERRORS}},
        },
        f"{API}/jobs/{{job_id}}": {
            "get": {"operationId": "job", "summary": "a job: state, tasks, timeline",
                    "parameters": [_JOB_ID],
                    "responses": {"200": _resp("the job",
                                               {"$ref": "#/components/schemas/JobDetail"}),
                                  "404": _resp("unknown_job"), **_ERRORS}},
        },
        f"{API}/jobs/{{job_id}}/cancel": {
            "post": {"operationId": "cancel", "summary": "cancel a job (idempotent)",
                     "parameters": [_JOB_ID],
                     "responses": {"202": _resp("cancel taken",
                                                {"$ref": "#/components/schemas/JobSummary"}),
                                   "404": _resp("unknown_job"),
                                   "409": _resp("not_admitted_yet: retry"), **_ERRORS}},
        },
        f"{API}/tasks/{{task_id}}": {
            "get": {"operationId": "task", "summary": "a task: state, attempts, exit code",
                    "parameters": [_TASK_ID],
                    "responses": {"200": _resp("the task", {"$ref": "#/components/schemas/Task"}),
                                  "404": _resp("unknown_task"), **_ERRORS}},
        },
        f"{API}/tasks/{{task_id}}/logs": {
            "get": {"operationId": "logs", "summary": "the last 64 KiB of a task's output",
                    "parameters": [_TASK_ID, {"name": "stream", "in": "query", "required": False,
                                              "schema": {"enum": ["stdout", "stderr"]}}],
                    "responses": {"200": {"description": "the output",
                                          "content": {"text/plain": {"schema": {"type": "string"}}}},
                                  "400": _resp("bad_stream"),
                                  "404": _resp("unknown_task"), **_ERRORS}},
        },
        "/openapi.json": {
            "get": {"operationId": "openapi", "summary": "this document", "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1",
                                          "content": {_JSON: {"schema": {"type": "object"}}}}}},
        },
    },
}  # fmt: skip
