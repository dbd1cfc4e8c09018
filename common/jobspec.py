"""A user's job, as a job file (``megha submit``), a Python object or an HTTP body.

Job file format (JSON, UTF-8; ``format`` ``megha-job/1``)::

    {"format": "megha-job/1", "name": "wordcount",
     "stages": [
       {"id": 0, "count": 4, "demand": [1], "duration": 60,
        "command": ["/usr/bin/python3", "examples/wordcount/wc.py", "map", "{i}", "{n}"]},
       {"id": 1, "parents": [0], "count": 1, "demand": [1], "duration": 60,
        "command": ["/usr/bin/python3", "examples/wordcount/wc.py", "reduce", "0", "{n}"]}]}

The single-stage short form puts one stage's keys at the top (no ``stages``)::

    {"format": "megha-job/1", "count": 2, "demand": [1], "duration": 5}

* ``demand``: non-negative integers, one per resource of the federation, in its units:
  the same file means the same thing live and in ``megha simulate``
  (``common.config`` profiles: ``slots`` has one resource of 1 per node, so ``[1]``
  is a whole node; ``common.units.check_demands`` holds both to it).
* ``duration``: seconds (synthetic tasks hold their resources that long; a task with a
  ``command`` runs it, ``duration`` bounding it as its timeout).
* ``command``: an argv (absolute executable) run through the operator's sandbox when
  commands are enabled; ``{i}`` is the task's index in its stage, ``{n}`` the stage's
  task count.  A stage may list ``tasks`` one by one instead of ``count``, each with its
  own ``demand``, ``duration``, ``constraints`` and ``command``.
* ``env``: variables for the command (``{"NAME": "value"}``), on a stage (for each of
  its tasks) or a task (over its stage's); the federation passes only the names its
  operator allows (``task_env_allow``) and refuses a job naming another
  (``env_not_allowed``, ``common.taskenv``).
* ``parents``: stage ids that must finish first.  Task ids are ``<job id>.s<stage>.t<i>``.
* ``gang``: ``true`` starts the stage's tasks all-or-nothing across LMs; ``min``: ``k``
  lets it start with at least ``k`` of them, the rest then run as ordinary tasks
  (``global_master.gang``; as a ``megha-dag/1`` stage's).

``parse_job`` is strict: unknown keys, wrong types, empty demands, unknown parents and
cycles raise ``ConfigError`` (``bad_job_file``) naming the stage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.dag import (
    CycleError,
    DagJob,
    gang_of,
    make_job,
    read_json,
    task_id,
    topological_order,
)
from common.errors import ConfigError
from common.ids import JobId, UserId
from common.messages import MAX_JOB_TASKS, MAX_STAGES, StageSpec, SubmitJob
from common.model import MAX_COMMAND, MAX_ENV, N_CONSTRAINTS, TaskSpec
from common.taskenv import bad_entry, entries

FORMAT = "megha-job/1"
_TOP = {"format", "name", "stages"}
_STAGE = {
    "id", "parents", "tasks", "count", "demand", "duration", "command", "constraints", "env",
    "gang", "min",
}  # fmt: skip
_TASK = {"demand", "duration", "command", "constraints", "env"}


@dataclass(frozen=True, slots=True)
class TaskDef:
    """One task: what it asks for, how long, and what it runs (empty: synthetic)."""

    demand: tuple[int, ...]
    duration: float
    command: tuple[str, ...] = ()
    constraints: int = 0
    env: tuple[str, ...] = ()
    """``NAME=value`` each, in name order (``common.taskenv``)."""


@dataclass(frozen=True, slots=True)
class StageDef:
    """A stage: its tasks and the stages that must finish first."""

    stage_id: int
    tasks: tuple[TaskDef, ...]
    parents: tuple[int, ...] = ()
    gang: int = 0
    """A gang stage: the fewest of its tasks that may start, all-or-nothing at that
    count (``global_master.gang``); 0: not a gang."""


@dataclass(frozen=True, slots=True)
class JobDef:
    """A job before it is submitted: built in code (``JobDef.single``) or read from a
    file (``load_job``); ``submission`` makes the message a GM admits."""

    stages: tuple[StageDef, ...]
    name: str = "job"
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def single(
        cls, count: int, demand: list[int] | tuple[int, ...], duration: float,
        command: list[str] | tuple[str, ...] = (), name: str = "job",
        env: Mapping[str, str] | None = None,
    ) -> JobDef:  # fmt: skip
        """A one-stage job of ``count`` like tasks (``{i}`` in ``command``: the index;
        ``env``: variables for the command)."""
        return parse_job(
            {"format": FORMAT, "name": name, "count": count, "demand": list(demand),
             "duration": duration, "command": list(command), "env": dict(env or {})}
        )  # fmt: skip

    @property
    def n_tasks(self) -> int:
        return sum(len(s.tasks) for s in self.stages)

    def submission(self, job_id: str, user: str, token: str, now: float) -> SubmitJob:
        """The ``SubmitJob`` for ``user`` (stages in a topological order)."""
        specs = [
            TaskSpec(
                task_id=task_id(job_id, s.stage_id, i),
                job_id=JobId(job_id),
                user=UserId(user),
                demand=t.demand,
                duration=t.duration,
                constraints=t.constraints,
                command=t.command,
                env=t.env,
            )
            for s in self.stages
            for i, t in enumerate(s.tasks)
        ]
        layout = None
        if len(self.stages) > 1 or self.stages[0].parents or self.stages[0].gang:
            layout = tuple(
                StageSpec(stage_id=s.stage_id, parents=s.parents, count=len(s.tasks),
                          gang=s.gang > 0, min_count=s.gang if s.gang < len(s.tasks) else 0)
                for s in self.stages
            )  # fmt: skip
        return SubmitJob(job_id=JobId(job_id), user=UserId(user), token=token, submitted_at=now,
                         tasks=tuple(specs), stages=layout)  # fmt: skip

    def dag_job(self, job_id: str, user: str, arrival: float = 0.0) -> DagJob:
        """The job as ``megha simulate`` runs it: the same task ids, stages, demands (in
        the federation's units, ``common.units``) and durations as ``submission`` (a
        task's ``command`` is not run there: ``duration`` is how long it holds its
        resources)."""
        stages = [
            (s.stage_id, [(t.demand, t.duration) for t in s.tasks], s.parents) for s in self.stages
        ]
        masks = [[t.constraints for t in s.tasks] for s in self.stages]
        gangs = [s.gang for s in self.stages]
        return make_job(job_id, user, arrival, stages, constraints=masks, gangs=gangs)

    def to_doc(self) -> dict[str, Any]:
        """The job-file form (tasks one by one)."""
        stages = [
            {"id": s.stage_id, "parents": list(s.parents), "tasks": [
                {"demand": list(t.demand), "duration": t.duration, "command": list(t.command),
                 "constraints": t.constraints,
                 "env": dict(e.split("=", 1) for e in t.env)} for t in s.tasks],
             **({"gang": True, "min": s.gang} if s.gang else {})}
            for s in self.stages
        ]  # fmt: skip
        return {"format": FORMAT, "name": self.name, "stages": stages}


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}", reason="bad_job_file")


def _keys(obj: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _fail(where, f"expected an object, got {type(obj).__name__}")
    unknown = set(obj) - allowed
    if unknown:
        raise _fail(where, f"unknown keys {sorted(unknown)}")
    return obj


MAX_INT = 1 << 63
"""Every integer of a job file (a stage id, a parent, a demand) is below this: what the
wire carries as an integer.  A stage id of 2**64 failed in the encoder, past every
check: the front door's 500 in plain text."""


def _int(x: Any, where: str, name: str, lo: int = 0, hi: int = MAX_INT) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < lo:
        raise _fail(where, f"{name} must be an integer >= {lo}, got {x!r}")
    if x >= hi:
        raise _fail(where, f"{name} must be below {hi}, got {x!r:.40}")
    return x


def _env(obj: Any, where: str, over: dict[str, str] | None = None) -> dict[str, str]:
    """A stage's or task's ``env`` (over its stage's ``over``)."""
    env = obj.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _fail(where, f"env must be an object of strings, got {env!r:.80}")
    out = {**(over or {}), **env}
    if len(out) > MAX_ENV:
        raise _fail(where, f"env names {len(out)} variables, at most {MAX_ENV}")
    for entry in entries(out):
        why = bad_entry(entry)
        if why is not None:
            raise _fail(where, f"env: {why}")
    return out


def _task(
    obj: dict[str, Any], where: str, i: int, n: int, over: dict[str, str] | None = None
) -> TaskDef:
    demand = obj.get("demand")
    if not isinstance(demand, list) or not demand:
        raise _fail(where, f"demand must be a non-empty list of integers, got {demand!r}")
    d = tuple(_int(v, where, "each demand") for v in demand)
    if not any(d):
        raise _fail(where, "demand must ask for some resource")
    dur = obj.get("duration")
    if isinstance(dur, bool) or not isinstance(dur, int | float) or not math.isfinite(dur):
        raise _fail(where, f"duration must be a number of seconds, got {dur!r}")
    if dur < 0:
        raise _fail(where, f"duration must not be negative, got {dur!r}")
    cmd = obj.get("command", [])
    if not isinstance(cmd, list) or not all(isinstance(a, str) for a in cmd):
        raise _fail(where, f"command must be a list of strings (an argv), got {cmd!r}")
    if len(cmd) > MAX_COMMAND:
        raise _fail(where, f"command has {len(cmd)} arguments, at most {MAX_COMMAND}")
    argv = tuple(a.replace("{i}", str(i)).replace("{n}", str(n)) for a in cmd)
    mask = _int(obj.get("constraints", 0), where, "constraints", 0, 1 << N_CONSTRAINTS)
    return TaskDef(d, float(dur), argv, mask, entries(_env(obj, where, over)))


def _stage(obj: Any, k: int) -> StageDef:
    st = _keys(obj, _STAGE, f"stage #{k}")
    sid = _int(st.get("id", k), f"stage #{k}", "id")
    where = f"stage {sid}"
    parents = st.get("parents", [])
    if not isinstance(parents, list):
        raise _fail(where, f"parents must be a list of stage ids, got {parents!r}")
    pids = tuple(_int(p, where, "a parent") for p in parents)
    if "tasks" in st:
        if {"count", "demand", "duration", "command"} & set(st):
            raise _fail(where, "give either tasks or count/demand/duration/command, not both")
        items = st["tasks"]
        if not isinstance(items, list) or not items:
            raise _fail(where, "tasks must be a non-empty list")
        env = _env(st, where)
        tasks = [
            _task(_keys(t, _TASK, f"{where} task {i}"), f"{where} task {i}", i, len(items), env)
            for i, t in enumerate(items)
        ]
    else:
        count = _int(st.get("count", 1), where, "count", 1)
        if count > MAX_JOB_TASKS:
            raise _fail(where, f"count {count} is more than a job may hold ({MAX_JOB_TASKS:,})")
        tasks = [_task(st, where, i, count) for i in range(count)]
    return StageDef(sid, tuple(tasks), pids, gang_of(st, len(tasks), where))


def parse_job(doc: Any) -> JobDef:
    """A job from a decoded job file (or HTTP body); ``ConfigError`` says what is wrong."""
    top = _keys(doc, _TOP | _STAGE, "job")
    if top.get("format") != FORMAT:
        raise _fail("job", f"format must be {FORMAT!r}, got {top.get('format')!r}")
    name = top.get("name", "job")
    if not isinstance(name, str) or not name:
        raise _fail("job", f"name must be a non-empty string, got {name!r}")
    if "stages" in top:
        if set(top) & (_STAGE - {"id"}):
            raise _fail("job", "give stages, or one stage's keys at the top, not both")
        raw = top["stages"]
        if not isinstance(raw, list) or not raw or len(raw) > MAX_STAGES:
            raise _fail("job", f"stages must be a list of 1 to {MAX_STAGES:,} stages")
    else:
        raw = [{k: v for k, v in top.items() if k in _STAGE} | {"id": 0}]
    stages = [_stage(s, k) for k, s in enumerate(raw)]
    return JobDef(_ordered(stages), name)


def _ordered(stages: list[StageDef]) -> tuple[StageDef, ...]:
    by_id = {s.stage_id: s for s in stages}
    if len(by_id) != len(stages):
        ids = [s.stage_id for s in stages]
        twice = next(i for k, i in enumerate(ids) if i in ids[:k])
        raise _fail(f"job: stage {twice}", "stage ids must be distinct (this one is given twice)")
    if sum(len(s.tasks) for s in stages) > MAX_JOB_TASKS:
        raise _fail("job", f"more than {MAX_JOB_TASKS:,} tasks")
    for s in stages:
        for p in s.parents:
            if p not in by_id:
                raise _fail(f"stage {s.stage_id}", f"unknown parent stage {p}")
    try:
        order = topological_order({s.stage_id: s.parents for s in stages})
    except CycleError as exc:
        raise _fail("job", str(exc)) from None
    return tuple(by_id[i] for i in order)


def load_job(path: str | Path) -> JobDef:
    """Read a job file; ``ConfigError`` (``bad_job_file``) in one line if it is wrong
    (read as strictly as a megha-dag/1 file: ``common.dag.read_json``)."""
    return job_of_doc(read_json(path), path)


def job_of_doc(doc: Any, path: str | Path) -> JobDef:
    """``parse_job`` of a document read from ``path``, its errors naming the file."""
    try:
        return parse_job(doc)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}", reason="bad_job_file") from None
