"""The wire form of every message: msgpack, with an explicit type tag and schema version.

This module is the only one that imports msgpack.  A body is ``[tag, version, fields]``
(``fields`` a map) or, for several messages in one body, ``["batch", version,
[[tag, fields], ...]]``.  Decoding is strict: the body size and every msgpack
container are bounded, unknown tags and versions raise ``DecodeError``, and every
field is checked (type, sign, range) with ``ValidationError`` naming the field.

Besides the messages of ``common.messages`` the wire carries three driver-level
messages defined here: ``SubmitJob`` (request generator -> a user's queue),
``TaskReport`` (worker -> LM: a ``WorkerReport`` with the worker's copy of the task
and its ledger) and ``WorkerHeartbeat`` (worker -> LM).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from common.dag import StageLayout
from common.errors import DecodeError, ValidationError
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    ClusterLayout,
    LaunchRequest,
    LaunchResponse,
    Placement,
    PlacementResult,
    PreemptRequest,
    PreemptResponse,
    SnapshotRequest,
    StartTask,
    StateDelta,
    StateSnapshot,
    StateUpdated,
    StopTask,
    TaskEvent,
    TaskFailed,
    WorkerReport,
)
from common.model import N_CONSTRAINTS, Phase, Resources, Task, WaitReason

SCHEMA_VERSION = 1
MAX_BODY = 8 * 1024 * 1024
"""Largest body any endpoint or consumer accepts (bytes)."""
MAX_ID_LEN = 200
MAX_RESOURCES = 16
MAX_COMMAND = 64
MAX_STAGES = 10_000
REPORT_KINDS = frozenset({"started", "finished", "failed"})
EVENT_KINDS = frozenset({"started", "finished", "failed", "preempted", "requeued"})


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitJob:
    """A job into its user's queue; ``token`` is the user's submission credential."""

    job_id: JobId
    user: UserId
    token: str
    submitted_at: float
    tasks: tuple[Task, ...]
    stages: StageLayout | None = None
    """A DAG job: per stage (id, parent ids, task count), tasks listed stage by stage."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskReport:
    """Worker -> LM: ``report`` plus the worker's copy of the task (its ledger)."""

    report: WorkerReport
    task: Task


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerHeartbeat:
    """Worker pool -> LM: these nodes are alive at ``at``."""

    lm: LmId
    nodes: tuple[NodeIndex, ...]
    at: float


Message = (
    Task
    | StateDelta
    | ClusterLayout
    | StateSnapshot
    | StateUpdated
    | SnapshotRequest
    | LaunchRequest
    | LaunchResponse
    | PreemptRequest
    | PreemptResponse
    | StartTask
    | StopTask
    | WorkerReport
    | TaskEvent
    | TaskFailed
    | SubmitJob
    | TaskReport
    | WorkerHeartbeat
)


# ------------------------------------------------------------------ field checks
class _Fields:
    """A received map, read field by field with precise errors."""

    __slots__ = ("d", "where")

    def __init__(self, d: object, where: str) -> None:
        if not isinstance(d, dict):
            raise ValidationError(f"{where}: expected a map, got {type(d).__name__}")
        self.d: dict[Any, Any] = d
        self.where = where

    def _get(self, key: str) -> Any:
        try:
            return self.d[key]
        except KeyError:
            raise ValidationError(
                f"{self.where}: missing field {key!r}", reason="missing_field"
            ) from None

    def _bad(self, key: str, want: str, v: object) -> ValidationError:
        return ValidationError(
            f"{self.where}.{key}: expected {want}, got {type(v).__name__} {v!r:.60}",
            reason="wrong_type",
        )

    def str_(self, key: str, *, empty: bool = False) -> str:
        v = self._get(key)
        if not isinstance(v, str):
            raise self._bad(key, "a string", v)
        if (not empty and not v) or len(v) > MAX_ID_LEN:
            raise ValidationError(
                f"{self.where}.{key}: length {len(v)} not in [{0 if empty else 1}, {MAX_ID_LEN}]"
            )
        return v

    def text(self, key: str, limit: int = 4096) -> str:
        v = self._get(key)
        if not isinstance(v, str):
            raise self._bad(key, "a string", v)
        return v[:limit]

    def opt_str(self, key: str) -> str | None:
        if self.d.get(key) is None:
            return None
        return self.str_(key)

    def int_(self, key: str, lo: int | None = 0, hi: int | None = None) -> int:
        v = self._get(key)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self._bad(key, "an integer", v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            reason = "negative_value" if lo is not None and v < lo and lo == 0 else "out_of_range"
            raise ValidationError(f"{self.where}.{key}: {v} not in [{lo}, {hi}]", reason=reason)
        return v

    def opt_int(self, key: str) -> int | None:
        if self.d.get(key) is None:
            return None
        return self.int_(key)

    def float_(self, key: str, *, lo: float | None = None) -> float:
        v = self._get(key)
        return _float(v, f"{self.where}.{key}", lo)

    def bool_(self, key: str) -> bool:
        v = self._get(key)
        if not isinstance(v, bool):
            raise self._bad(key, "a boolean", v)
        return v

    def list_(self, key: str, limit: int | None = None) -> list[Any]:
        v = self._get(key)
        if not isinstance(v, list):
            raise self._bad(key, "an array", v)
        if limit is not None and len(v) > limit:
            raise ValidationError(
                f"{self.where}.{key}: {len(v)} items, at most {limit}", reason="too_large"
            )
        return v

    def map_(self, key: str) -> dict[Any, Any]:
        v = self._get(key)
        if not isinstance(v, dict):
            raise self._bad(key, "a map", v)
        return v

    def resources(self, key: str) -> Resources:
        return _resources(self._get(key), f"{self.where}.{key}")

    def any_(self, key: str) -> Any:
        return self._get(key)


def _float(v: object, where: str, lo: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValidationError(
            f"{where}: expected a number, got {type(v).__name__}", reason="wrong_type"
        )
    f = float(v)
    if not math.isfinite(f):
        raise ValidationError(f"{where}: not a finite number", reason="out_of_range")
    if lo is not None and f < lo:
        raise ValidationError(f"{where}: {f} < {lo}", reason="negative_value")
    return f


def _int(v: object, where: str, lo: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValidationError(
            f"{where}: expected an integer, got {type(v).__name__}", reason="wrong_type"
        )
    if v < lo:
        raise ValidationError(f"{where}: {v} < {lo}", reason="negative_value")
    return v


def _resources(v: object, where: str) -> Resources:
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_RESOURCES:
        raise ValidationError(
            f"{where}: expected 1..{MAX_RESOURCES} resource amounts", reason="wrong_type"
        )
    out = []
    for i, x in enumerate(v):
        if not isinstance(x, int) or isinstance(x, bool):
            raise ValidationError(
                f"{where}[{i}]: expected an integer, got {type(x).__name__}",
                reason="wrong_type",
            )
        if x < 0:
            raise ValidationError(f"{where}[{i}]: negative resource {x}", reason="negative_value")
        out.append(x)
    return tuple(out)


# ----------------------------------------------------------------------- Task
def task_fields(t: Task) -> dict[str, Any]:
    return {
        "id": t.task_id,
        "job": t.job_id,
        "user": t.user,
        "demand": list(t.demand),
        "duration": t.duration,
        "constraints": t.constraints,
        "command": list(t.command),
        "altruistic": t.altruistic,
        "gm": t.gm,
        "submitted_at": t.submitted_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "phase": int(t.phase),
        "phase_since": t.phase_since,
        "spent": t.spent,
        "attempts": t.attempts,
        "waits": t.waits,
    }


_TASK_KEYS = frozenset(task_fields(Task(TaskId("t"), JobId("j"), UserId("u"), (1,), 0.0)))
_N_PHASES = len(Phase)
_N_WAITS = len(WaitReason)
_MAX_MASK = (1 << N_CONSTRAINTS) - 1


def _ok_float(x: object) -> bool:
    return (type(x) is float and math.isfinite(x)) or type(x) is int


def _ok_id(x: object) -> bool:
    return type(x) is str and 0 < len(x) <= MAX_ID_LEN


def task_from(d: object, where: str = "task") -> Task:
    """A task from its wire map; the common well-formed case takes a fast path and
    anything else goes through the precise checks of ``_task_checked``."""
    if type(d) is dict and d.keys() == _TASK_KEYS:
        demand, spent, waits, cmd, gm = d["demand"], d["spent"], d["waits"], d["command"], d["gm"]
        c = d["constraints"]
        if (
            _ok_id(d["id"])
            and _ok_id(d["job"])
            and _ok_id(d["user"])
            and type(demand) is list
            and 0 < len(demand) <= MAX_RESOURCES
            and all(type(x) is int and x >= 0 for x in demand)
            and _ok_float(d["duration"])
            and d["duration"] >= 0
            and type(c) is int
            and 0 <= c <= _MAX_MASK
            and type(cmd) is list
            and len(cmd) <= MAX_COMMAND
            and all(type(x) is str for x in cmd)
            and type(d["altruistic"]) is bool
            and (gm is None or _ok_id(gm))
            and _ok_float(d["submitted_at"])
            and _ok_float(d["started_at"])
            and _ok_float(d["finished_at"])
            and type(d["phase"]) is int
            and 0 <= d["phase"] < _N_PHASES
            and _ok_float(d["phase_since"])
            and type(spent) is list
            and len(spent) == _N_PHASES
            and all(_ok_float(x) and x >= 0 for x in spent)
            and type(d["attempts"]) is int
            and d["attempts"] >= 0
            and type(waits) is list
            and len(waits) == _N_WAITS
            and all(type(x) is int and x >= 0 for x in waits)
        ):
            return Task(
                task_id=TaskId(d["id"]),
                job_id=JobId(d["job"]),
                user=UserId(d["user"]),
                demand=tuple(demand),
                duration=float(d["duration"]),
                constraints=c,
                command=tuple(cmd),
                altruistic=d["altruistic"],
                gm=None if gm is None else GmId(gm),
                submitted_at=float(d["submitted_at"]),
                started_at=float(d["started_at"]),
                finished_at=float(d["finished_at"]),
                phase=d["phase"],
                phase_since=float(d["phase_since"]),
                spent=[float(x) for x in spent],
                attempts=d["attempts"],
                waits=list(waits),
            )
    return _task_checked(d, where)


def _task_checked(d: object, where: str) -> Task:
    f = _Fields(d, where)
    constraints = f.int_("constraints", 0, None)
    if constraints >> N_CONSTRAINTS:
        bad = [
            i
            for i in range(constraints.bit_length())
            if constraints >> i & 1 and i >= N_CONSTRAINTS
        ]
        raise ValidationError(
            f"{where}.constraints: unknown constraint ids {bad[:5]} (valid: 0..{N_CONSTRAINTS - 1})",
            reason="unknown_constraint",
        )
    command = f.list_("command", MAX_COMMAND)
    for i, c in enumerate(command):
        if not isinstance(c, str):
            raise ValidationError(f"{where}.command[{i}]: expected a string", reason="wrong_type")
    spent = f.list_("spent")
    if len(spent) != len(Phase):
        raise ValidationError(f"{where}.spent: expected {len(Phase)} numbers")
    waits = f.list_("waits")
    if len(waits) != len(WaitReason):
        raise ValidationError(f"{where}.waits: expected {len(WaitReason)} counts")
    return Task(
        task_id=TaskId(f.str_("id")),
        job_id=JobId(f.str_("job")),
        user=UserId(f.str_("user")),
        demand=f.resources("demand"),
        duration=f.float_("duration", lo=0.0),
        constraints=constraints,
        command=tuple(command),
        altruistic=f.bool_("altruistic"),
        gm=None if (g := f.opt_str("gm")) is None else GmId(g),
        submitted_at=f.float_("submitted_at"),
        started_at=f.float_("started_at"),
        finished_at=f.float_("finished_at"),
        phase=f.int_("phase", 0, len(Phase) - 1),
        phase_since=f.float_("phase_since"),
        spent=[_float(x, f"{where}.spent[{i}]", 0.0) for i, x in enumerate(spent)],
        attempts=f.int_("attempts"),
        waits=[_int(x, f"{where}.waits[{i}]") for i, x in enumerate(waits)],
    )


# ---------------------------------------------------------------- state parts
def _delta_fields(m: StateDelta) -> dict[str, Any]:
    return {
        "lm": m.lm,
        "version": m.version,
        "base": m.base_version,
        "nodes": list(m.nodes),
        "free": [list(r) for r in m.free],
        "nv": list(m.node_versions),
        "usage": {u: list(r) for u, r in m.usage.items()},
    }


def _delta_from(d: object, where: str = "delta") -> StateDelta:
    f = _Fields(d, where)
    nodes = [NodeIndex(_int(x, f"{where}.nodes[{i}]")) for i, x in enumerate(f.list_("nodes"))]
    free = [_resources(x, f"{where}.free[{i}]") for i, x in enumerate(f.list_("free"))]
    nv = [_int(x, f"{where}.nv[{i}]") for i, x in enumerate(f.list_("nv"))]
    if not len(nodes) == len(free) == len(nv):
        raise ValidationError(f"{where}: nodes, free and nv differ in length")
    usage: dict[UserId, Resources] = {}
    for u, r in f.map_("usage").items():
        if not isinstance(u, str) or not u:
            raise ValidationError(f"{where}.usage: user ids are strings", reason="wrong_type")
        usage[UserId(u)] = _resources(r, f"{where}.usage[{u}]")
    return StateDelta(
        lm=LmId(f.str_("lm")),
        version=f.int_("version"),
        base_version=f.int_("base", -1),
        nodes=tuple(nodes),
        free=tuple(free),
        node_versions=tuple(nv),
        usage=usage,
    )


def _layout_fields(m: ClusterLayout) -> dict[str, Any]:
    return {
        "lm": m.lm,
        "capacity": [list(r) for r in m.capacity],
        "constraints": list(m.constraints),
        "home": list(m.home),
    }


def _layout_from(d: object, where: str = "layout") -> ClusterLayout:
    f = _Fields(d, where)
    cap = [_resources(x, f"{where}.capacity[{i}]") for i, x in enumerate(f.list_("capacity"))]
    cons = [_int(x, f"{where}.constraints[{i}]") for i, x in enumerate(f.list_("constraints"))]
    home = f.list_("home")
    if not len(cap) == len(cons) == len(home) or not cap:
        raise ValidationError(f"{where}: capacity, constraints and home differ in length")
    for i, h in enumerate(home):
        if not isinstance(h, str):
            raise ValidationError(f"{where}.home[{i}]: expected a string", reason="wrong_type")
    return ClusterLayout(
        lm=LmId(f.str_("lm")),
        capacity=tuple(cap),
        constraints=tuple(cons),
        home=tuple(GmId(h) for h in home),
    )


# ------------------------------------------------------------- per-message maps
def _enc_task(m: Task) -> dict[str, Any]:
    return task_fields(m)


def _enc_snapshot(m: StateSnapshot) -> dict[str, Any]:
    return {
        "layout": _layout_fields(m.layout),
        "state": _delta_fields(m.state),
        "placed": list(m.placed_by_gm),
    }


def _dec_snapshot(f: _Fields) -> StateSnapshot:
    placed = f.list_("placed")
    for i, t in enumerate(placed):
        if not isinstance(t, str):
            raise ValidationError(f"snapshot.placed[{i}]: expected a string", reason="wrong_type")
    return StateSnapshot(
        layout=_layout_from(f.any_("layout")),
        state=_delta_from(f.any_("state")),
        placed_by_gm=tuple(TaskId(t) for t in placed),
    )


def _enc_launch(m: LaunchRequest) -> dict[str, Any]:
    return {
        "gm": m.gm,
        "lm": m.lm,
        "rid": m.request_id,
        "kv": m.known_version,
        "placements": [
            {"task": task_fields(p.task), "node": p.node, "repartition": p.repartition}
            for p in m.placements
        ],
    }


def _dec_launch(f: _Fields) -> LaunchRequest:
    placements = []
    for i, p in enumerate(f.list_("placements")):
        pf = _Fields(p, f"placements[{i}]")
        placements.append(
            Placement(
                task=task_from(pf.any_("task"), f"placements[{i}].task"),
                node=NodeIndex(pf.int_("node")),
                repartition=pf.bool_("repartition"),
            )
        )
    return LaunchRequest(
        gm=GmId(f.str_("gm")),
        lm=LmId(f.str_("lm")),
        request_id=f.int_("rid"),
        placements=tuple(placements),
        known_version=f.int_("kv", -1),
    )


def _enc_launch_resp(m: LaunchResponse) -> dict[str, Any]:
    return {
        "gm": m.gm,
        "lm": m.lm,
        "rid": m.request_id,
        "results": [[r.task_id, r.accepted, r.reason] for r in m.results],
        "delta": _delta_fields(m.delta),
        "received_at": m.received_at,
        "sent_at": m.sent_at,
    }


def _dec_launch_resp(f: _Fields) -> LaunchResponse:
    results = []
    for i, r in enumerate(f.list_("results")):
        if (
            not isinstance(r, list)
            or len(r) != 3
            or not isinstance(r[0], str)
            or not isinstance(r[1], bool)
            or not isinstance(r[2], str)
        ):
            raise ValidationError(
                f"results[{i}]: expected [task_id, accepted, reason]", reason="wrong_type"
            )
        results.append(PlacementResult(task_id=TaskId(r[0]), accepted=r[1], reason=r[2]))
    return LaunchResponse(
        gm=GmId(f.str_("gm")),
        lm=LmId(f.str_("lm")),
        request_id=f.int_("rid"),
        results=tuple(results),
        delta=_delta_from(f.any_("delta")),
        received_at=f.float_("received_at"),
        sent_at=f.float_("sent_at"),
    )


def _enc_preempt(m: PreemptRequest) -> dict[str, Any]:
    return {
        "gm": m.gm,
        "lm": m.lm,
        "rid": m.request_id,
        "task": task_fields(m.task),
        "victim": m.victim,
        "kv": m.known_version,
    }


def _dec_preempt(f: _Fields) -> PreemptRequest:
    return PreemptRequest(
        gm=GmId(f.str_("gm")),
        lm=LmId(f.str_("lm")),
        request_id=f.int_("rid"),
        task=task_from(f.any_("task")),
        victim=UserId(f.str_("victim")),
        known_version=f.int_("kv", -1),
    )


def _enc_preempt_resp(m: PreemptResponse) -> dict[str, Any]:
    return {
        "gm": m.gm,
        "lm": m.lm,
        "rid": m.request_id,
        "task_id": m.task_id,
        "accepted": m.accepted,
        "reason": m.reason,
        "node": m.node,
        "preempted": list(m.preempted),
        "delta": _delta_fields(m.delta),
        "received_at": m.received_at,
        "sent_at": m.sent_at,
    }


def _dec_preempt_resp(f: _Fields) -> PreemptResponse:
    preempted = f.list_("preempted")
    for i, t in enumerate(preempted):
        if not isinstance(t, str):
            raise ValidationError(f"preempted[{i}]: expected a string", reason="wrong_type")
    node = f.opt_int("node")
    return PreemptResponse(
        gm=GmId(f.str_("gm")),
        lm=LmId(f.str_("lm")),
        request_id=f.int_("rid"),
        task_id=TaskId(f.str_("task_id")),
        accepted=f.bool_("accepted"),
        reason=f.str_("reason", empty=True),
        node=None if node is None else NodeIndex(node),
        preempted=tuple(TaskId(t) for t in preempted),
        delta=_delta_from(f.any_("delta")),
        received_at=f.float_("received_at"),
        sent_at=f.float_("sent_at"),
    )


def _enc_report(m: WorkerReport) -> dict[str, Any]:
    return {
        "lm": m.lm,
        "node": m.node,
        "task_id": m.task_id,
        "kind": m.kind,
        "at": m.at,
        "detail": m.detail,
    }


def _dec_report(f: _Fields) -> WorkerReport:
    kind = f.str_("kind")
    if kind not in REPORT_KINDS:
        raise ValidationError(f"report.kind: {kind!r} not in {sorted(REPORT_KINDS)}")
    return WorkerReport(
        lm=LmId(f.str_("lm")),
        node=NodeIndex(f.int_("node")),
        task_id=TaskId(f.str_("task_id")),
        kind=kind,
        at=f.float_("at"),
        detail=f.text("detail"),
    )


def _enc_event(m: TaskEvent) -> dict[str, Any]:
    return {
        "kind": m.kind,
        "lm": m.lm,
        "gm": m.gm,
        "task": task_fields(m.task),
        "node": m.node,
        "node_free": list(m.node_free),
        "nv": m.node_version,
        "at": m.at,
    }


def _dec_event(f: _Fields) -> TaskEvent:
    kind = f.str_("kind")
    if kind not in EVENT_KINDS:
        raise ValidationError(f"event.kind: {kind!r} not in {sorted(EVENT_KINDS)}")
    return TaskEvent(
        kind=kind,
        lm=LmId(f.str_("lm")),
        gm=GmId(f.str_("gm")),
        task=task_from(f.any_("task")),
        node=NodeIndex(f.int_("node")),
        node_free=f.resources("node_free"),
        node_version=f.int_("nv"),
        at=f.float_("at"),
    )


def _enc_submit(m: SubmitJob) -> dict[str, Any]:
    return {
        "job": m.job_id,
        "user": m.user,
        "token": m.token,
        "submitted_at": m.submitted_at,
        "tasks": [task_fields(t) for t in m.tasks],
        "stages": None
        if m.stages is None
        else [[sid, list(parents), n] for sid, parents, n in m.stages],
    }


def _stages_from(raw: object, n_tasks: int) -> StageLayout | None:
    """A DAG's stage layout: [[id, [parent ids], task count], ...] covering every task."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or len(raw) > MAX_STAGES:
        raise ValidationError(
            f"submit.stages: expected 1..{MAX_STAGES} stages", reason="wrong_type"
        )
    layout = []
    for i, st in enumerate(raw):
        where = f"submit.stages[{i}]"
        if (
            not isinstance(st, list)
            or len(st) != 3
            or not isinstance(st[0], int)
            or not isinstance(st[1], list)
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in st[1])
            or not isinstance(st[2], int)
            or isinstance(st[2], bool)
            or st[2] < 1
        ):
            raise ValidationError(
                f"{where}: expected [stage id, [parent ids], task count >= 1]",
                reason="wrong_type",
            )
        layout.append((st[0], tuple(st[1]), st[2]))
    if sum(n for _, _, n in layout) != n_tasks:
        raise ValidationError(
            f"submit.stages: the stages hold {sum(n for _, _, n in layout)} tasks, "
            f"the job has {n_tasks}",
            reason="bad_dag",
        )
    return tuple(layout)


def _dec_submit(f: _Fields) -> SubmitJob:
    raw = f.list_("tasks", 100_000)
    if not raw:
        raise ValidationError("submit.tasks: a job has at least one task", reason="empty_job")
    return SubmitJob(
        job_id=JobId(f.str_("job")),
        user=UserId(f.str_("user")),
        token=f.str_("token", empty=True),
        submitted_at=f.float_("submitted_at", lo=0.0),
        tasks=tuple(task_from(t, f"tasks[{i}]") for i, t in enumerate(raw)),
        stages=_stages_from(f.d.get("stages"), len(raw)),
    )


_Enc = Callable[[Any], dict[str, Any]]
_Dec = Callable[[_Fields], Any]

_CODECS: dict[type, tuple[str, _Enc]] = {
    Task: ("task", _enc_task),
    StateDelta: ("delta", _delta_fields),
    ClusterLayout: ("layout", _layout_fields),
    StateSnapshot: ("snapshot", _enc_snapshot),
    StateUpdated: ("state_updated", lambda m: {"delta": _delta_fields(m.delta)}),
    SnapshotRequest: ("snapshot_request", lambda m: {"gm": m.gm, "lm": m.lm}),
    LaunchRequest: ("launch", _enc_launch),
    LaunchResponse: ("launch_response", _enc_launch_resp),
    PreemptRequest: ("preempt", _enc_preempt),
    PreemptResponse: ("preempt_response", _enc_preempt_resp),
    StartTask: (
        "start_task",
        lambda m: {"lm": m.lm, "node": m.node, "task": task_fields(m.task)},
    ),
    StopTask: ("stop_task", lambda m: {"lm": m.lm, "node": m.node, "task_id": m.task_id}),
    WorkerReport: ("worker_report", _enc_report),
    TaskEvent: ("task_event", _enc_event),
    TaskFailed: (
        "task_failed",
        lambda m: {"gm": m.gm, "task": task_fields(m.task), "reason": m.reason, "at": m.at},
    ),
    SubmitJob: ("submit_job", _enc_submit),
    TaskReport: (
        "task_report",
        lambda m: {"report": _enc_report(m.report), "task": task_fields(m.task)},
    ),
    WorkerHeartbeat: (
        "worker_heartbeat",
        lambda m: {"lm": m.lm, "nodes": list(m.nodes), "at": m.at},
    ),
}

_DECODERS: dict[str, _Dec] = {
    "task": lambda f: task_from(f.d),
    "delta": lambda f: _delta_from(f.d),
    "layout": lambda f: _layout_from(f.d),
    "snapshot": _dec_snapshot,
    "state_updated": lambda f: StateUpdated(delta=_delta_from(f.any_("delta"))),
    "snapshot_request": lambda f: SnapshotRequest(gm=GmId(f.str_("gm")), lm=LmId(f.str_("lm"))),
    "launch": _dec_launch,
    "launch_response": _dec_launch_resp,
    "preempt": _dec_preempt,
    "preempt_response": _dec_preempt_resp,
    "start_task": lambda f: StartTask(
        lm=LmId(f.str_("lm")), node=NodeIndex(f.int_("node")), task=task_from(f.any_("task"))
    ),
    "stop_task": lambda f: StopTask(
        lm=LmId(f.str_("lm")), node=NodeIndex(f.int_("node")), task_id=TaskId(f.str_("task_id"))
    ),
    "worker_report": _dec_report,
    "task_event": _dec_event,
    "task_failed": lambda f: TaskFailed(
        gm=GmId(f.str_("gm")),
        task=task_from(f.any_("task")),
        reason=f.str_("reason", empty=True),
        at=f.float_("at"),
    ),
    "submit_job": _dec_submit,
    "task_report": lambda f: TaskReport(
        report=_dec_report(_Fields(f.any_("report"), "report")), task=task_from(f.any_("task"))
    ),
    "worker_heartbeat": lambda f: WorkerHeartbeat(
        lm=LmId(f.str_("lm")),
        nodes=tuple(
            NodeIndex(_int(x, f"nodes[{i}]")) for i, x in enumerate(f.list_("nodes", 1_000_000))
        ),
        at=f.float_("at"),
    ),
}

TAGS: frozenset[str] = frozenset(_DECODERS)


def tag_of(msg: Message) -> str:
    return _CODECS[type(msg)][0]


def _item(msg: Message) -> list[Any]:
    try:
        tag, enc = _CODECS[type(msg)]
    except KeyError:
        raise TypeError(f"no wire form for {type(msg).__name__}") from None
    return [tag, enc(msg)]


def encode(msg: Message) -> bytes:
    tag, fields = _item(msg)
    out: bytes = msgpack.packb([tag, SCHEMA_VERSION, fields], use_bin_type=True)
    return out


def encode_batch(msgs: Iterable[Message]) -> bytes:
    out: bytes = msgpack.packb(
        ["batch", SCHEMA_VERSION, [_item(m) for m in msgs]], use_bin_type=True
    )
    return out


def _unpack(data: bytes, max_size: int) -> list[Any]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError("body is not bytes")
    if len(data) > max_size:
        raise DecodeError(f"body of {len(data)} bytes exceeds {max_size}", reason="too_large")
    if not data:
        raise DecodeError("empty body")
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=1 << 20,
            max_bin_len=1 << 20,
            max_array_len=1 << 20,
            max_map_len=1 << 16,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, list) or len(obj) != 3 or not isinstance(obj[0], str):
        raise DecodeError("expected [tag, version, fields]", reason="bad_envelope")
    if obj[1] != SCHEMA_VERSION:
        raise DecodeError(
            f"schema version {obj[1]!r} not supported (want {SCHEMA_VERSION})",
            reason="unsupported_version",
        )
    return obj


def _decode_item(tag: object, fields: object) -> Message:
    if not isinstance(tag, str) or tag not in _DECODERS:
        raise DecodeError(f"unknown message tag {tag!r:.40}", reason="unknown_tag")
    msg: Message = _DECODERS[tag](_Fields(fields, tag))
    return msg


def _check(msg: Message, expect: type | tuple[type, ...] | None) -> None:
    if expect is not None and not isinstance(msg, expect):
        raise DecodeError(f"unexpected message {tag_of(msg)!r} here", reason="unexpected_message")


def decode(
    data: bytes,
    *,
    expect: type | tuple[type, ...] | None = None,
    max_size: int = MAX_BODY,
) -> Message:
    """One message; ``expect`` restricts which types are acceptable."""
    tag, _, fields = _unpack(data, max_size)
    if tag == "batch":
        raise DecodeError("expected one message, got a batch", reason="unexpected_message")
    msg = _decode_item(tag, fields)
    _check(msg, expect)
    return msg


def decode_batch(
    data: bytes,
    *,
    expect: type | tuple[type, ...] | None = None,
    max_size: int = MAX_BODY,
    max_items: int = 100_000,
) -> list[Message]:
    """A batch (or a single message, as a batch of one)."""
    tag, _, fields = _unpack(data, max_size)
    if tag != "batch":
        msg = _decode_item(tag, fields)
        _check(msg, expect)
        return [msg]
    if not isinstance(fields, list):
        raise DecodeError("batch: expected an array of [tag, fields]", reason="bad_envelope")
    if len(fields) > max_items:
        raise DecodeError(f"batch of {len(fields)} items exceeds {max_items}", reason="too_large")
    out = []
    for i, item in enumerate(fields):
        if not isinstance(item, list) or len(item) != 2:
            raise DecodeError(f"batch[{i}]: expected [tag, fields]", reason="bad_envelope")
        msg = _decode_item(item[0], item[1])
        _check(msg, expect)
        out.append(msg)
    return out


def pack_plain(obj: object) -> bytes:
    """Plain data (state pages, error bodies) in msgpack, for clients that ask for it."""
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def check_ids_unique(tasks: Sequence[Task]) -> None:
    seen: set[str] = set()
    for t in tasks:
        if t.task_id in seen:
            raise ValidationError(f"duplicate task id {t.task_id!r}", reason="duplicate_task_id")
        seen.add(t.task_id)
