"""The GM's pages: ``/v1/state`` (tables, counters, recent allocations) and, for
operators, ``/v1/inspect`` (users' queues, shares, wait reasons),
``/v1/tasks/{user}/{task_id}`` (one task's timeline and why it waits) and
``/v1/find/{id}`` (the tasks and jobs of that id, of any user), answered by
``global_master.inspect`` from the service's core.  They read; they change nothing."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from common.ids import TaskId, UserId
from common.metrics import percentiles
from common.model import WaitReason
from global_master import inspect

if TYPE_CHECKING:
    from global_master.app import GmService

ALLOCATION_WINDOW_S = 60.0
"""The state page lists the allocation times of the tasks finished this long ago at most."""


def _sample(svc: GmService) -> dict[str, Any]:
    """A few of each table's entries, for a reader of ``/v1/state``."""
    core = svc.core
    return {
        "placed": [f"{u}/{t}@{x.attempt}" for (u, t), x in list(core.placed.items())[:20]],
        "queued": [f"{t.user}/{t.task_id}" for t in list(core.queues)[:20]],
        "inflight": [f"{u}/{t}" for (u, t) in list(core.inflight)[:20]],
        "jobs": {
            f"{u}/{j}": [r.left, len(r.unsettled), r.settled]
            for (u, j), r in list(core.jobs.items())[:20]
        },
        "known_done": len(core.known_done),
    }


def state_page(svc: GmService) -> dict[str, Any]:
    """What ``/v1/state`` answers: the tables' sizes, counters, batches, drops."""
    core = svc.core
    rtts = [x for p in svc.lms.values() for x in p.rtts]
    since = time.time() - ALLOCATION_WINDOW_S  # (once: not a clock read per allocation)
    return {
        "gm": core.gm_id,
        "ready": svc.consuming,
        "queues": {u: len(q) for u, q in core.queues.queues.items()},
        "queued": len(core.queues),
        "inflight": len(core.inflight),
        "running_tasks": len(core.placed),
        "jobs_active": len(core.jobs),
        "jobs_admitting": len(core.admitting),
        "unread_job_bytes": {
            "now": svc.unread.total(),
            "peak_per_user": svc.unread.peak,
            "limit_per_user": svc.unread.limit,
        },
        "sample": _sample(svc),
        "jobs_unacked": len(svc.deliveries),
        "allocations": {
            "window_s": ALLOCATION_WINDOW_S,
            "recent": [
                [round(at, 3), round(a, 6)] for at, a in svc.recent_allocations if at >= since
            ],
        },
        "views": {lm: v.version for lm, v in core.views.items()},
        "shares": core.dominant_shares(),
        "counters": {
            **core.counters.as_dict(),
            "jobs_refused_by_driver": svc.refused_jobs,
            "jobs_redelivered": svc.redelivered_jobs,
            "lm_errors": sum(p.errors for p in svc.lms.values()),
            "requests_in_doubt": svc.requests_in_doubt,
            "duplicate_events": svc.events_seen.dropped,
            "background_failures": svc.sup.failures,
            "handler_errors": svc.broker.handler_errors,
            "poisoned": svc.poison.poisoned,
        },
        "batches": {
            "events_in": svc.events_in.as_dict(),
            "outcomes": svc.outcomes.traffic(),
            "persists": svc.persists.traffic(),
            "keep_ends": svc.keeps.traffic(),
        },
        "dead_lettered": svc.broker.dead_lettered,
        "dropped": {
            "state": dict(svc.state_seals.drops),
            "events": dict(svc.event_seals.drops),
            "forged": svc.forged,
        },
        "wait_reasons": WaitReason.counts(core.wait_reasons),
        "gangs": {**core.gang.stats, "open": len(core.gang.gangs)},
        "job_history": svc.history.stats() if svc.history is not None else None,
        "lm_request_rtt_s": percentiles(rtts) if rtts else {},
    }


def add_routes(app: web.Application, svc: GmService) -> None:
    """``svc``'s operators' routes (read-only)."""

    async def overview(request: web.Request) -> web.Response:
        return web.json_response(inspect.overview(svc.core))

    async def task(request: web.Request) -> web.Response:
        user, task_id = request.match_info["user"], request.match_info["task_id"]
        answer = inspect.task_answer(svc.core, (UserId(user), TaskId(task_id)))
        if answer is None:
            detail = f"{svc.core.gm_id} knows no task {task_id!r} of user {user!r} (now or lately)"
            return web.json_response({"error": "unknown_task", "detail": detail}, status=404)
        return web.json_response(answer)

    async def find(request: web.Request) -> web.Response:
        ident = request.match_info["id"]
        answer = inspect.find(svc.core, ident)
        if answer is None:
            detail = f"{svc.core.gm_id} knows no task or job {ident!r} (now or lately)"
            body = {"error": "not_found", "gm": svc.core.gm_id, "id": ident, "detail": detail}
            return web.json_response(body, status=404)
        return web.json_response(answer)

    app.router.add_get("/v1/inspect", overview)
    app.router.add_get("/v1/tasks/{user}/{task_id}", task)
    app.router.add_get("/v1/find/{id}", find)
