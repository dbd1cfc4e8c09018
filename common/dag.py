"""DAG jobs: stages of tasks with dependencies (Carbyne, seed ``carbyne-paper.txt`` §3).

A job is a list of **stages**; a stage is a list of tasks (same code, similar demand)
and the stages it depends on (``parents``).  A task is *runnable* once every parent
stage has finished; a stage with several parents is a **barrier**.  A plain job (as
in the trace files) is one stage without parents.

Job file format (JSON, UTF-8)::

    {
      "format": "megha-dag/1",
      "resources": ["cpu", "mem"],          # names of the demand components
      "jobs": [
        {
          "id": "j1", "user": "alice", "arrival": 0.0,
          "stages": [
            {"id": 0, "parents": [], "count": 2, "demand": [4, 1], "duration": 1.0},
            {"id": 1, "parents": [], "tasks": [
                {"demand": [21, 2], "duration": 1.0},
                {"demand": [21, 2], "duration": 1.5, "constraints": 3}]},
            {"id": 2, "parents": [0, 1], "count": 1, "demand": [10, 1], "duration": 0.1}
          ]
        }
      ]
    }

* Demands are vectors of non-negative **integers**, one per name in ``resources``
  (scale fractions first: a demand of 0.21 of a 1.0 resource is ``21`` of ``100``).
* A stage lists its tasks either one by one (``tasks``: ``demand``, ``duration``,
  optional ``constraints`` bit mask) or as ``count`` identical tasks with one
  ``demand`` and ``duration``; stage ids are unique integers within a job.
* ``parents`` name stage ids of the same job; cycles are refused.
* A job may name its ``"priority"`` class (an integer 0-1000, default 0): a higher class
  is served first and preempts lower ones (``global_master.policy.classes``).
* Task ids are ``"<job id>.s<stage id>.t<i>"``; job ids are unique within a file.
* A job holds at most ``MAX_JOB_TASKS`` tasks in at most ``MAX_STAGES`` stages, as a
  live GM admits (``common.messages``); a file at most ``MAX_FILE_TASKS`` in all.

:func:`load_jobs` is strict: unknown keys, a key given twice in one object, wrong
types, negative or non-finite values, unknown parents, cycles, duplicate ids and jobs
larger than the limits raise ``ConfigError`` naming the job and stage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from common.errors import ConfigError
from common.ids import JobId, TaskId, UserId
from common.messages import MAX_JOB_TASKS, MAX_STAGES
from common.model import MAX_PRIORITY, N_CONSTRAINTS, Resources, Task, TaskSpec

FORMAT = "megha-dag/1"
MAX_FILE_TASKS = 5_000_000
"""Tasks a job file may hold in all.  ``count`` makes a file of a few hundred bytes hold
any number of tasks: 10,000 jobs of 100,000 tasks each ran the loader out of memory.
Each task costs ~0.45 KB once read (~2.2 GB here), more once simulated: split a larger
workload into several files."""


@dataclass(slots=True)
class Stage:
    """Tasks that run the same code, and the stages that must finish first."""

    stage_id: int
    tasks: list[Task]
    parents: tuple[int, ...] = ()
    gang: int = 0
    """A gang stage: the fewest of its tasks that may start (all-or-nothing at that
    count: ``global_master.gang``); 0: not a gang."""


@dataclass(slots=True)
class DagJob:
    """A job whose stages form a DAG; ``stages`` are in a topological order."""

    job_id: JobId
    user: UserId
    arrival: float
    stages: list[Stage]

    @property
    def tasks(self) -> list[Task]:
        return [t for s in self.stages for t in s.tasks]

    def critical_path(self) -> float:
        """Length of the longest chain of stage durations (each stage: its longest task)."""
        finish = finish_times(
            {s.stage_id: s.parents for s in self.stages},
            {s.stage_id: max((t.duration for t in s.tasks), default=0.0) for s in self.stages},
        )
        return max(finish.values(), default=0.0)


# ------------------------------------------------------------- graph helpers
class CycleError(ValueError):
    """The stages' dependencies form a cycle through ``stage``."""

    def __init__(self, stage: int) -> None:
        super().__init__(f"stages form a cycle through stage {stage}")
        self.stage = stage


def topological_order(parents: Mapping[int, Iterable[int]]) -> list[int]:
    """Stage ids with every stage after its parents; ``CycleError`` on a cycle.

    Parents that are not keys of ``parents`` are ignored (a job's finished stages).
    Stable: stages already in a topological order come back in that order, parents
    are visited in the order they are listed.
    """
    order: list[int] = []
    state: dict[int, int] = {}  # 1 = visiting, 2 = done
    for root in parents:
        if state.get(root) == 2:
            continue
        # iterative DFS: job files may hold long chains
        state[root] = 1
        stack: list[tuple[int, Iterator[int]]] = [(root, iter(parents[root]))]
        while stack:
            cur, todo = stack[-1]
            nxt = next((p for p in todo if p in parents and state.get(p) != 2), None)
            if nxt is None:
                stack.pop()
                state[cur] = 2
                order.append(cur)
            elif state.get(nxt) == 1:
                raise CycleError(nxt)
            else:
                state[nxt] = 1
                stack.append((nxt, iter(parents[nxt])))
    return order


def children_of(parents: Mapping[int, Iterable[int]]) -> dict[int, list[int]]:
    """The inverse of ``parents`` (restricted to its keys): stage -> stages waiting on it."""
    children: dict[int, list[int]] = {}
    for s, ps in parents.items():
        for p in ps:
            if p in parents:
                children.setdefault(p, []).append(s)
    return children


def finish_times(
    parents: Mapping[int, Iterable[int]],
    length: Mapping[int, float],
    *,
    start: float = 0.0,
    not_before: Mapping[int, float] | None = None,
) -> dict[int, float]:
    """The critical path method: when each stage ends if it starts as soon as its
    parents end (never before ``start``, nor ends before ``not_before[stage]``) and
    takes ``length[stage]``."""
    finish: dict[int, float] = {}
    floor = not_before or {}
    for s in topological_order(parents):
        begin = max((finish[p] for p in parents[s] if p in finish), default=start)
        finish[s] = max(begin + length[s], floor.get(s, start))
    return finish


def levels(parents: Mapping[int, Iterable[int]]) -> dict[int, int]:
    """Each stage's depth: 0 for a root, else one more than its deepest parent (the
    order of a breadth-first walk, as Tez's default scheduler takes stages)."""
    one = dict.fromkeys(parents, 1.0)
    return {s: round(f) - 1 for s, f in finish_times(parents, one).items()}


def task_id(job_id: str, stage_id: int, i: int) -> TaskId:
    return TaskId(f"{job_id}.s{stage_id}.t{i}")


def _task(
    job_id: str, user: str, stage_id: int, i: int, demand: Resources, duration: float, mask: int
) -> Task:
    spec = TaskSpec(
        task_id=task_id(job_id, stage_id, i),
        job_id=JobId(job_id),
        user=UserId(user),
        demand=tuple(demand),
        duration=float(duration),
        constraints=mask,
    )
    return Task(spec=spec)


def make_job(
    job_id: str,
    user: str,
    arrival: float,
    stages: Sequence[tuple[int, Sequence[tuple[Resources, float]], Sequence[int]]],
    *,
    constraints: Sequence[Sequence[int]] | None = None,
    gangs: Sequence[int] | None = None,
) -> DagJob:
    """Build and check a job from ``(stage id, [(demand, duration)], parents)`` triples
    (``gangs``: each stage's ``Stage.gang``); stages are re-ordered topologically."""
    jid, uid = JobId(job_id), UserId(user)
    built: list[Stage] = []
    for k, (sid, tasks, parents) in enumerate(stages):
        masks = constraints[k] if constraints is not None else [0] * len(tasks)
        built.append(
            Stage(
                sid,
                [_task(job_id, user, sid, i, d, dur, masks[i]) for i, (d, dur) in enumerate(tasks)],
                tuple(parents),
                gangs[k] if gangs is not None else 0,
            )
        )
    return DagJob(jid, uid, float(arrival), _topological(job_id, built))


def _topological(job_id: str, stages: list[Stage]) -> list[Stage]:
    by_id: dict[int, Stage] = {}
    for s in stages:
        if s.stage_id in by_id:
            raise ConfigError(f"job {job_id}: duplicate stage id {s.stage_id}", reason="bad_dag")
        if not s.tasks:
            raise ConfigError(f"job {job_id}: stage {s.stage_id} has no tasks", reason="bad_dag")
        by_id[s.stage_id] = s
    for s in stages:
        for p in s.parents:
            if p not in by_id:
                raise ConfigError(
                    f"job {job_id}: stage {s.stage_id} depends on unknown stage {p}",
                    reason="bad_dag",
                )
            if p == s.stage_id:
                raise ConfigError(
                    f"job {job_id}: stage {s.stage_id} depends on itself", reason="bad_dag"
                )
    try:
        order = topological_order({s.stage_id: s.parents for s in stages})
    except CycleError as exc:
        raise ConfigError(f"job {job_id}: {exc}", reason="bad_dag") from None
    return [by_id[s] for s in order]


class DagProgress:
    """Which stages of one job have finished, and which tasks that releases.

    The queues (every policy) use it: roots are runnable at submission; a stage's
    tasks are released when its last parent stage finishes.  Tasks already out when
    the job came (``started``: running, in flight or ended, as a GM restarted under a
    redelivered job finds them) are never released again; their ends count as any.
    """

    __slots__ = ("_children", "_left", "_stage_of", "_started", "_waiting", "job")

    def __init__(self, job: DagJob, started: Collection[TaskId] = ()) -> None:
        self.job = job
        self._started = frozenset(started)
        self._stage_of: dict[TaskId, int] = {}
        self._left: dict[int, int] = {}
        self._waiting: dict[int, int] = {}
        self._children: dict[int, list[Stage]] = {}
        for s in job.stages:
            self._left[s.stage_id] = len(s.tasks)
            self._waiting[s.stage_id] = len(set(s.parents))
            for p in set(s.parents):
                self._children.setdefault(p, []).append(s)
            for t in s.tasks:
                self._stage_of[t.task_id] = s.stage_id

    def roots(self) -> list[Task]:
        return [t for s in self.job.stages if not s.parents for t in self._released(s)]

    def _released(self, stage: Stage) -> list[Task]:
        started = self._started
        return [t for t in stage.tasks if t.task_id not in started] if started else stage.tasks

    def waiting(self, tid: TaskId) -> bool:
        """Task ``tid``'s stage is not released yet (a parent stage has not finished)."""
        sid = self._stage_of.get(tid)
        return sid is not None and tid not in self._started and self._waiting[sid] > 0

    def finish(self, tid: TaskId) -> list[Task]:
        """Task ``tid`` finished; the tasks of stages that become runnable now."""
        sid = self._stage_of.pop(tid, None)
        if sid is None:
            return []
        self._left[sid] -= 1
        if self._left[sid]:
            return []
        released: list[Task] = []
        for child in self._children.get(sid, ()):
            self._waiting[child.stage_id] -= 1
            if self._waiting[child.stage_id] == 0:
                released.extend(self._released(child))
        return released

    def abandon(self, tid: TaskId) -> list[Task]:
        """Task ``tid`` failed for good: the tasks of every stage that needed it
        (transitively), which can now never run."""
        sid = self._stage_of.pop(tid, None)
        if sid is None:
            return []
        lost: list[Task] = []
        todo = list(self._children.get(sid, ()))
        seen: set[int] = set()
        while todo:
            st = todo.pop()
            if st.stage_id in seen:
                continue
            seen.add(st.stage_id)
            for t in st.tasks:
                if self._stage_of.pop(t.task_id, None) is not None:
                    lost.append(t)
            todo.extend(self._children.get(st.stage_id, ()))
        return lost

    def stage_of(self, tid: TaskId) -> int | None:
        return self._stage_of.get(tid)

    @property
    def done(self) -> bool:
        return not self._stage_of


# ------------------------------------------------------- a DAG over the wire
StageLayout = tuple[tuple[int, tuple[int, ...], int], ...]
"""Per stage, in order: (stage id, parent stage ids, number of tasks).  With the job's
flat task list (stage by stage) it is the whole DAG: what a submission carries."""


def stage_layout(job: DagJob) -> StageLayout:
    return tuple((s.stage_id, tuple(s.parents), len(s.tasks)) for s in job.stages)


def from_layout(
    job_id: JobId, user: UserId, arrival: float, tasks: Sequence[Task], layout: StageLayout
) -> DagJob:
    """The DagJob of a submission (flat tasks + layout); ``ConfigError`` if they disagree."""
    if sum(n for _, _, n in layout) != len(tasks):
        raise ConfigError(
            f"job {job_id}: the stages hold {sum(n for _, _, n in layout)} tasks, "
            f"the job has {len(tasks)}",
            reason="bad_dag",
        )
    stages: list[Stage] = []
    k = 0
    for sid, parents, n in layout:
        if n < 1:
            raise ConfigError(f"job {job_id}: stage {sid} has no tasks", reason="bad_dag")
        stages.append(Stage(sid, list(tasks[k : k + n]), tuple(parents)))
        k += n
    return DagJob(job_id, user, arrival, _topological(job_id, stages))


# ------------------------------------------------------------------ job files
_JOB_KEYS = {"id", "user", "arrival", "stages"}
_STAGE_KEYS = {"id", "parents", "tasks", "count", "demand", "duration", "gang", "min"}
_TASK_KEYS = {"demand", "duration", "constraints"}


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}", reason="bad_job_file")


def _number(x: Any, where: str, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise _fail(where, f"{name} must be a non-negative number, got {x!r}")
    try:
        v = float(x)  # a JSON integer past 1e308 has no float
    except OverflowError:
        raise _fail(where, f"{name} must be a finite number, got an integer past 1e308") from None
    if not math.isfinite(v) or v < 0:
        raise _fail(where, f"{name} must be a finite non-negative number, got {x!r}")
    return v


def _demand(x: Any, width: int, where: str) -> Resources:
    if not isinstance(x, list) or len(x) != width:
        raise _fail(where, f"demand must be a list of {width} integers, got {x!r}")
    for v in x:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _fail(where, f"demand must hold non-negative integers, got {x!r}")
    if not any(x):
        raise _fail(where, "demand must ask for some resource")
    return tuple(x)


def _keys(obj: Any, allowed: set[str], required: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _fail(where, f"expected an object, got {type(obj).__name__}")
    unknown = set(obj) - allowed
    if unknown:
        raise _fail(where, f"unknown keys {sorted(unknown)}")
    missing = required - set(obj)
    if missing:
        raise _fail(where, f"missing keys {sorted(missing)}")
    return obj


def _stage(
    obj: Any, job_id: str, user: str, width: int, k: int, room: int
) -> tuple[int, list[Task], tuple[int, ...]]:
    """Stage ``#k`` of a job; ``room``: how many more tasks the job may hold."""
    where = f"job {job_id} stage #{k}"
    st = _keys(obj, _STAGE_KEYS, {"id"}, where)
    sid = st["id"]
    if isinstance(sid, bool) or not isinstance(sid, int) or sid < 0:
        raise _fail(where, f"id must be a non-negative integer, got {sid!r}")
    where = f"job {job_id} stage {sid}"
    parents = st.get("parents", [])
    if not isinstance(parents, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in parents
    ):
        raise _fail(where, f"parents must be a list of stage ids, got {parents!r}")
    specs: list[tuple[Resources, float, int]] = []
    if "tasks" in st:
        if {"count", "demand", "duration"} & set(st):
            raise _fail(where, "give either tasks or count/demand/duration, not both")
        if not isinstance(st["tasks"], list) or not st["tasks"]:
            raise _fail(where, "tasks must be a non-empty list")
        if len(st["tasks"]) > room:
            raise _fail(
                where, f"{len(st['tasks'])} tasks take the job past {MAX_JOB_TASKS:,} tasks"
            )
        for i, tobj in enumerate(st["tasks"]):
            tw = f"{where} task {i}"
            t = _keys(tobj, _TASK_KEYS, {"demand", "duration"}, tw)
            mask = t.get("constraints", 0)
            if (
                isinstance(mask, bool)
                or not isinstance(mask, int)
                or not 0 <= mask < 1 << N_CONSTRAINTS
            ):
                raise _fail(tw, f"constraints must be a bit mask below 2**{N_CONSTRAINTS}")
            specs.append(
                (_demand(t["demand"], width, tw), _number(t["duration"], tw, "duration"), mask)
            )
    else:
        missing = {"count", "demand", "duration"} - set(st)
        if missing:
            raise _fail(where, f"missing keys {sorted(missing)} (or give a tasks list)")
        count = st["count"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise _fail(where, f"count must be a positive integer, got {count!r}")
        if count > room:
            raise _fail(where, f"count {count} takes the job past {MAX_JOB_TASKS:,} tasks")
        d = _demand(st["demand"], width, where)
        dur = _number(st["duration"], where, "duration")
        specs = [(d, dur, 0)] * count
    tasks = [_task(job_id, user, sid, i, d, dur, mask) for i, (d, dur, mask) in enumerate(specs)]
    return sid, tasks, tuple(parents)


def gang_of(obj: Any, n: int, where: str) -> int:
    """A stage's ``"gang": true`` (and optional ``"min": k``, 1..n): the fewest of its
    ``n`` tasks that may start; 0 for a stage that is not a gang."""
    gang = obj.get("gang", False)
    if not isinstance(gang, bool):
        raise _fail(where, f"gang must be true or false, got {gang!r}")
    k = obj.get("min", n)
    if "min" in obj and not gang:
        raise _fail(where, "min applies to a gang stage only")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise _fail(where, f"min must be an integer from 1 to the stage's {n} tasks, got {k!r}")
    return k if gang else 0


def parse_jobs(doc: Any) -> tuple[tuple[str, ...], list[DagJob]]:
    """Jobs from a decoded job file; returns (resource names, jobs by arrival)."""
    top = _keys(doc, {"format", "resources", "jobs"}, {"format", "resources", "jobs"}, "file")
    if top["format"] != FORMAT:
        raise _fail("file", f"format must be {FORMAT!r}, got {top['format']!r}")
    names = top["resources"]
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n for n in names)
        or len(set(names)) != len(names)
    ):
        raise _fail("file", f"resources must be a list of distinct names, got {names!r}")
    if not isinstance(top["jobs"], list) or not top["jobs"]:
        raise _fail("file", "jobs must be a non-empty list")
    jobs: list[DagJob] = []
    seen: set[str] = set()
    total = 0
    for k, jobj in enumerate(top["jobs"]):
        j = _keys(jobj, _JOB_KEYS | {"priority"}, _JOB_KEYS, f"job #{k}")
        jid, user = j["id"], j["user"]
        if not isinstance(jid, str) or not jid:
            raise _fail(f"job #{k}", f"id must be a non-empty string, got {jid!r}")
        if jid in seen:
            raise _fail(f"job {jid}", "duplicate job id")
        seen.add(jid)
        if not isinstance(user, str) or not user:
            raise _fail(f"job {jid}", f"user must be a non-empty string, got {user!r}")
        arrival = _number(j["arrival"], f"job {jid}", "arrival")
        if not isinstance(j["stages"], list) or not j["stages"]:
            raise _fail(f"job {jid}", "stages must be a non-empty list")
        if len(j["stages"]) > MAX_STAGES:
            raise _fail(f"job {jid}", f"{len(j['stages'])} stages, at most {MAX_STAGES:,}")
        stages: list[Stage] = []
        room = MAX_JOB_TASKS
        for i, s in enumerate(j["stages"]):
            sid, tasks, parents = _stage(s, jid, user, len(names), i, room)
            room -= len(tasks)
            total += len(tasks)
            if total > MAX_FILE_TASKS:
                raise _fail(
                    f"job {jid} stage {sid}",
                    f"the file's jobs hold more than {MAX_FILE_TASKS:,} tasks in all "
                    "(split the workload into several files)",
                )
            stages.append(
                Stage(sid, tasks, parents, gang_of(s, len(tasks), f"job {jid} stage {sid}"))
            )
        job = DagJob(JobId(jid), UserId(user), arrival, _topological(jid, stages))
        jobs.append(_with_priority(job, j.get("priority", 0)))
    jobs.sort(key=lambda job: job.arrival)
    return tuple(names), jobs


def _with_priority(job: DagJob, priority: Any) -> DagJob:
    """``job`` with every task in priority class ``priority`` (an integer 0-1000)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise _fail(f"job {job.job_id}", f"priority must be an integer, got {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise _fail(f"job {job.job_id}", f"priority must be 0-{MAX_PRIORITY}, got {priority}")
    if priority:
        for t in job.tasks:
            t.spec = replace(t.spec, priority=priority)
    return job


class _DuplicateKey(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are distinct: ``json`` keeps the last of a repeated key,
    which would drop the jobs (or stages, or a duration) given first without a word."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            named = obj.get("id", dict(pairs).get("id"))
            where = f" (in the object with id {named!r})" if isinstance(named, str | int) else ""
            raise _DuplicateKey(f"key {key!r} appears twice in one object{where}")
        obj[key] = value
    return obj


def load_jobs(path: str | Path) -> tuple[tuple[str, ...], list[DagJob]]:
    """Read a job file (see the module docstring); ``ConfigError`` says what is wrong.
    UTF-8, with or without a byte-order mark."""
    return parse_jobs(read_json(path))


def read_json(path: str | Path) -> Any:
    """A job file's JSON document (any format), read strictly (``parse_json``);
    ``ConfigError`` (``bad_job_file``) naming the file otherwise."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read job file {p}: {exc}", reason="bad_job_file") from None
    return parse_json(data, str(p))


def parse_json(data: bytes, where: str) -> Any:
    """A job's JSON document, read strictly: UTF-8 with or without a byte-order mark, no
    key twice in one object (a reader that keeps the first would see another job),
    nesting a decoder can follow; ``ConfigError`` (``bad_job_file``) naming ``where``
    (a file, or what a request carried) and the line otherwise."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{where}: not UTF-8 text (line {line}: {exc.reason})", reason="bad_job_file"
        ) from None
    try:
        doc = json.loads(text, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{where}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})",
            reason="bad_job_file",
        ) from None
    except _DuplicateKey as exc:
        raise ConfigError(f"{where}: {exc}", reason="bad_job_file") from None
    except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits()
        raise ConfigError(f"{where}: not a job file ({exc})", reason="bad_job_file") from None
    except RecursionError:  # the decoder recurses once per level of [ or {
        raise ConfigError(
            f"{where}: arrays or objects nested too deeply for a job file", reason="bad_job_file"
        ) from None
    return doc


def jobs_to_doc(jobs: Iterable[DagJob], names: Sequence[str]) -> dict[str, Any]:
    """The job-file form of ``jobs`` (tasks listed one by one)."""
    out: list[dict[str, Any]] = []
    for job in jobs:
        stages = []
        for s in job.stages:
            tasks: list[dict[str, Any]] = []
            for t in s.tasks:
                entry: dict[str, Any] = {"demand": list(t.demand), "duration": t.duration}
                if t.constraints:
                    entry["constraints"] = t.constraints
                tasks.append(entry)
            stage: dict[str, Any] = {"id": s.stage_id, "parents": list(s.parents), "tasks": tasks}
            if s.gang:
                stage.update(gang=True, min=s.gang)
            stages.append(stage)
        entry = {"id": job.job_id, "user": job.user, "arrival": job.arrival, "stages": stages}
        priority = max((t.spec.priority for t in job.tasks), default=0)
        out.append({**entry, "priority": priority} if priority else entry)
    return {"format": FORMAT, "resources": list(names), "jobs": out}


def write_jobs(path: str | Path, jobs: Iterable[DagJob], names: Sequence[str]) -> None:
    """Write a job file that :func:`load_jobs` reads back unchanged."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(jobs_to_doc(jobs, names), indent=1) + "\n", encoding="utf-8")
