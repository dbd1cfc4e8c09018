"""Answers to an operator's questions about one GM: where a task is and why it waits
(``GET /v1/tasks/{user}/{task_id}``), what it knows under a task or job id of any user
(``GET /v1/find/{id}``), and each user's queue (``GET /v1/inspect``).

Pure functions of a ``GlobalMaster`` (read only): the reasons are the ones the core
records as it decides (``WaitReason`` counts per task and per GM, see
``GlobalMaster._note``), the timeline is its ``Journal`` (``global_master.journal``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from common.ids import JobId, TaskId
from common.model import COMPONENTS, Task, TaskKey, WaitReason
from global_master.core import GlobalMaster
from global_master.journal import EndedTask, Trail

Record = Task | EndedTask
"""A task this GM holds, or what it kept of one that ended."""

FIND_LIMIT = 200
"""``find`` answers at most this many tasks in full (a job of 100,000 tasks is counted
beyond it): the first of its job's tasks, in the job's order."""

STATES = ("queued", "waiting", "in_flight", "running", "finished", "failed")
"""queued: in its user's queue; waiting: its DAG's parent stages have not finished;
in_flight: a request to an LM is unanswered; running: an LM accepted it (started or
about to); finished, failed: ended."""


def waits_of(counts: Sequence[int]) -> dict[str, int]:
    """The non-zero wait reasons of ``counts`` (indexed by ``WaitReason``), by name."""
    return WaitReason.counts(counts, nonzero=True)


def _timeline(task: Record, trail: Trail) -> list[dict[str, object]]:
    return [{"at": task.submitted_at, "what": "submitted"}, *(s.as_dict() for s in trail.steps)]


def _state(core: GlobalMaster, key: TaskKey, task: Task) -> str:
    if key in core.inflight:
        return "in_flight"
    if key in core.placed:
        return "running"
    return "waiting" if core.queues.held_back(task) else "queued"


QueuedOf = Callable[[GlobalMaster, str], int]
"""How many tasks of a user are queued at a GM."""


def _why(
    core: GlobalMaster, key: TaskKey, task: Task, state: str, queued_of: QueuedOf
) -> list[str]:
    """Why a task has not started (yet): its position, then the reasons counted."""
    lines: list[str] = []
    if state == "waiting":
        lines.append("its DAG job's parent stages have not all finished")
    elif state == "in_flight":
        fl = core.inflight[key]
        kind = "preemption" if fl.node < 0 else ("repartition" if fl.repartition else "launch")
        lines.append(f"a {kind} request to {fl.lm} is unanswered (attempt {fl.task.attempt})")
    elif state == "queued" and (gang := core.gang.describe(key)) is not None:
        lines.append(gang)
    elif state == "queued":
        lines.append(f"in {task.user}'s queue ({queued_of(core, task.user)} tasks queued there)")
        lines += core.queues.ahead_of(task)
        if task.user in core.queues and core.queues.parked(task.user):
            lines.append(
                "its user's queue is parked: tasks in a row could not be placed since the "
                "GM's view last changed; it is tried again when an LM reports a change"
            )
        if not core.ready:
            lines.append(f"{core.gm_id} has no view of every LM yet: it does not decide")
    return lines + reasons(task)


def reasons(task: Record) -> list[str]:
    """The reasons decisions did not place ``task``, with how often, in words."""
    return [f"{r.key} x{n}: {r.text}" for r in WaitReason if (n := task.waits[r])]


def _queued_of(core: GlobalMaster, user: str) -> int:
    return sum(1 for k, t in core.live.items() if k[0] == user and _state(core, k, t) == "queued")


def _answer(core: GlobalMaster, task: Record, state: str, trail: Trail) -> dict[str, Any]:
    return {
        "gm": core.gm_id,
        "user": task.user,
        "task_id": task.task_id,
        "job_id": task.job_id,
        "state": state,
        "attempt": task.attempt,
        "lm": task.lm or "",
        "submitted_at": task.submitted_at,
        "started_at": task.started_at,
        "finished_at": task.finished_at,
        "decisions": task.decisions,
        "waits": waits_of(task.waits),
        "components_s": dict(zip(COMPONENTS, task.components(), strict=False)),
        "timeline": _timeline(task, trail),
        "timeline_dropped": trail.dropped,
    }


def task_answer(
    core: GlobalMaster, key: TaskKey, queued_of: QueuedOf = _queued_of
) -> dict[str, Any] | None:
    """Where task ``key`` of this GM's users is, its timeline and why it waits (None:
    this GM does not know it -- never submitted here, or ended too long ago).
    ``queued_of`` counts a user's queued tasks (a walk over every task held)."""
    journal = core.journal
    task = core.live.get(key)
    if task is not None:
        state = _state(core, key, task)
        trail = journal.trail(key) if journal is not None else Trail()
        out = _answer(core, task, state, trail)
        out["priority"] = task.spec.priority
        out["reason"] = ""
        out["why"] = _why(core, key, task, state, queued_of)
        return out
    ended = journal.ended.get(key) if journal is not None else None
    if ended is not None:
        state = "finished" if ended.finished else "failed"
        out = _answer(core, ended, state, ended.trail())
        out["reason"] = ended.reason
        ran = ["it ran; before that:"] if ended.finished and any(ended.waits) else []
        failed = [] if ended.finished else [f"failed: {ended.reason}"]
        out["why"] = failed + ran + reasons(ended)
        return out
    if key in core.failed or key in core.finished:  # no journal: what the ledger says
        return {
            "gm": core.gm_id, "user": key[0], "task_id": key[1],
            "state": "failed" if key in core.failed else "finished",
            "reason": core.failed.get(key, ""), "why": [], "timeline": [], "timeline_dropped": 0,
        }  # fmt: skip
    return None


def _known(core: GlobalMaster, key: TaskKey) -> bool:
    journal = core.journal
    return (
        key in core.live
        or (journal is not None and key in journal.ended)
        or key in core.failed
        or key in core.finished
    )


def _jobs_named(core: GlobalMaster, job_id: JobId) -> tuple[list[dict[str, Any]], list[TaskKey]]:
    """The jobs of id ``job_id`` (of any user) this GM holds, and their tasks' keys."""
    jobs: list[dict[str, Any]] = []
    keys: list[TaskKey] = []
    for user in core.users:
        jk = (user, job_id)
        rec = core.jobs.get(jk)
        if rec is not None:
            jobs.append({
                "user": user, "job_id": job_id, "state": "settled" if rec.settled else "active",
                "tasks": len(rec.tasks), "left": rec.left, "unsettled": len(rec.unsettled),
            })  # fmt: skip
            keys.extend(rec.tasks)
        adm = core.admitting.get(jk)
        if adm is not None:
            jobs.append({
                "user": user, "job_id": job_id, "state": "admitting", "at": adm.at,
                "tasks": len(adm.job.tasks), "checked": adm.checked, "queued": adm.queued,
            })  # fmt: skip
        for admit, at in core.held_admissions.get(user, ()):
            if admit.job.job_id == job_id:
                jobs.append({"user": user, "job_id": job_id, "state": "held", "at": at,
                             "tasks": len(admit.job.tasks)})  # fmt: skip
    return jobs, keys


def find(core: GlobalMaster, ident: str, limit: int = FIND_LIMIT) -> dict[str, Any] | None:
    """What this GM knows under ``ident``, for any of its users: the task of that id,
    the jobs of that id and their tasks (each as ``task_answer`` gives it; the first
    ``limit`` of them, in time order).  None: nothing here has that id.

    Walks every task this GM holds (a task adopted after a restart, or returned to its
    queue, may have no job record), as ``overview`` does."""
    jobs, job_keys = _jobs_named(core, JobId(ident))
    found: dict[TaskKey, None] = dict.fromkeys(job_keys)
    for user in core.users:
        key = (user, TaskId(ident))
        if _known(core, key):
            found[key] = None
    for key, task in core.live.items():
        if task.job_id == ident:
            found[key] = None
    journal = core.journal
    if journal is not None:
        for key, ended in journal.ended.items():
            if ended.job_id == ident:
                found[key] = None
    if not found and not jobs:
        return None
    counts: dict[str, int] = {}

    def queued_of(c: GlobalMaster, user: str) -> int:
        if user not in counts:
            counts[user] = _queued_of(c, user)
        return counts[user]

    tasks = [a for k in list(found)[:limit] if (a := task_answer(core, k, queued_of)) is not None]
    tasks.sort(key=lambda a: (float(a.get("submitted_at", 0.0)), a["user"], a["task_id"]))
    return {
        "gm": core.gm_id,
        "id": ident,
        "jobs": jobs,
        "tasks": tasks,
        "tasks_found": len(found),
        "tasks_shown": len(tasks),
    }


def overview(core: GlobalMaster) -> dict[str, Any]:
    """Per user of this GM: tasks queued, waiting, in flight and running, the reasons
    its waiting tasks did not get placed, its dominant share against its share."""
    shares = core.dominant_shares()
    users: dict[str, dict[str, Any]] = {}
    sums: dict[str, list[int]] = {}
    for u, cfg in core.users.items():
        if cfg.gm != core.gm_id:
            continue
        users[u] = {
            "queued": 0, "waiting": 0, "in_flight": 0, "running": 0,
            "share": cfg.share, "dominant_share": shares.get(u, 0.0),
            "parked": u in core.queues and core.queues.parked(u),
        }  # fmt: skip
        sums[u] = [0] * len(WaitReason)
    for key, task in core.live.items():
        row = users.get(key[0])
        if row is None:
            continue
        state = _state(core, key, task)
        row[state] += 1
        if state in ("queued", "waiting"):
            acc = sums[key[0]]
            for r, n in enumerate(task.waits):
                acc[r] += n
    for name, row in users.items():
        row["wait_reasons"] = waits_of(sums[name])
    journal = core.journal
    recent = list(journal.ended.values()) if journal is not None else []
    return {
        "gm": core.gm_id,
        "ready": core.ready,
        "lms_in_view": len(core.views),
        "users": users,
        "totals": {s: sum(r[s] for r in users.values()) for s in STATES[:4]},
        "wait_reasons": WaitReason.counts(core.wait_reasons),
        "dominant_shares": shares,
        "recently_ended": {
            "finished": sum(1 for e in recent if e.finished),
            "failed": sum(1 for e in recent if not e.finished),
            "kept": journal.limit if journal is not None else 0,
        },
    }
