"""A GM holding many jobs: the job-aware policies keep what a plan reads of each job
across plans instead of rebuilding it for every job at every event -- with the same
decisions, to the bit, as the code before: ``global_master/policy`` as it was at
``REFERENCE``, taken from the repository's history when the test runs (a frozen copy
in the tree would be 1,800 lines written twice).

Both are driven through the same random history -- jobs of several users arriving,
tasks handed out and dispatched or found no node for, tasks ending, coming back,
failing for good, views changing -- and must hand out the same tasks, in the same
order, with the same ALTRUISTIC flags, the same budgets and counters.  No event loop."""

from __future__ import annotations

import functools
import importlib
import io
import random
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.dag import DagJob, make_job
from common.ids import GmId, UserId
from common.model import Task, UserConfig
from global_master.policy import make_policy
from global_master.policy.jobs import JobQueues

POLICIES = ["drf", "drf-wc", "carbyne", "carbyne-pack", "sjf", "tetris"]
REFERENCE = "bd1d10a"
"""main before the many-jobs work (its policy code is that of every later commit up to
it)."""
ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def reference() -> ModuleType:
    """``global_master.policy`` at ``REFERENCE``, importable as ``reference_policy``."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", REFERENCE, "global_master/policy"],
            capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:  # a tarball, or a shallow clone
        pytest.skip(f"needs the repository's history back to {REFERENCE}: {exc}")
    out = Path(tempfile.mkdtemp(prefix="reference-policy-"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(out, filter="data")
    package = out / "reference_policy"
    (out / "global_master" / "policy").rename(package)
    for module in package.glob("*.py"):
        text = module.read_text().replace("global_master.policy", "reference_policy")
        module.write_text(text)
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module("reference_policy")
    finally:
        sys.path.remove(str(out))


GM = GmId("gm0")
DEMANDS = [(1, 1), (2, 1), (1, 2), (3, 2), (4, 4), (9, 9)]


@dataclass(frozen=True)
class JobSpec:
    user: int
    stages: tuple[tuple[tuple[int, ...], tuple[tuple[int, float], ...]], ...]
    """Per stage: parents (earlier stages), (demand index, duration) per task."""


_TASK = st.tuples(st.integers(0, len(DEMANDS) - 1), st.sampled_from([0.5, 1.0, 1.5, 3.0]))


@st.composite
def job_specs(draw: st.DrawFn, users: int) -> JobSpec:
    n = draw(st.integers(1, 3))
    stages = []
    for s in range(n):
        parents = tuple(sorted(set(draw(st.lists(st.integers(0, s - 1), max_size=2))))) if s else ()
        stages.append((parents, tuple(draw(st.lists(_TASK, min_size=1, max_size=5)))))
    return JobSpec(draw(st.integers(0, users - 1)), tuple(stages))


def build(k: int, spec: JobSpec, arrival: float) -> DagJob:
    return make_job(
        f"j{k}",
        f"u{spec.user}",
        arrival,
        [
            (s, [(DEMANDS[d], dur) for d, dur in tasks], list(parents))
            for s, (parents, tasks) in enumerate(spec.stages)
        ],
    )


class Side:
    """One policy implementation and the tasks it has handed out."""

    def __init__(self, q: JobQueues) -> None:
        self.q = q
        self.running: dict[str, Task] = {}
        self.log: list[Any] = []

    def note(self, *what: Any) -> None:
        self.log.append(what)


def _state(q: JobQueues) -> tuple[Any, ...]:
    """What a plan leaves behind that later decisions depend on."""
    extra: tuple[Any, ...] = ()
    if hasattr(q, "last_yield"):
        extra = (
            sorted((j, [x.hex() for x in v]) for j, v in q.last_yield.items()),
            [x.hex() for x in q.last_leftover],
        )
    return (
        len(q),
        sorted((k, float(v).hex()) for k, v in q.counters.items()),
        sorted((j, [x.hex() for x in v]) for j, v in q._pools.items()),
        [x.hex() for x in q._room],
        [(a.task.task_id, a.job, a.altruistic, a.force) for a in q._plan],
        extra,
    )


def run_both(policy: str, seed: int, jobs: list[JobSpec], ops: list[tuple[int, int]]) -> None:
    users = [UserConfig(UserId(f"u{k}"), GM, share) for k, share in enumerate((0.5, 0.3, 0.2))]
    ids = [u.user for u in users]
    new = make_policy(policy, users, seed=seed)(GM, ids)
    old = reference().make_policy(policy, users, seed=seed)(GM, ids)
    assert isinstance(new, JobQueues)
    sides = [Side(new), Side(old)]  # type: ignore[arg-type]
    rng = random.Random(seed)
    cap = rng.choice([(8, 8), (12, 10), (20, 20)])
    for s in sides:
        s.q.set_cluster(cap, {(4, 4), (9, 9)})
    now = 0.0
    pending = list(enumerate(jobs))
    for op, x in ops:
        now += 0.25 * (x % 3)
        choices = rng.random(), rng.random()
        for s in sides:
            q = s.q
            if op == 0 and pending:  # a job arrives
                k, spec = pending[0]
                q.add_job(build(k, spec, now), now)
            elif op in (1, 2):  # the GM decides on up to x + 1 tasks
                r = random.Random(choices[0])
                for _ in range(x + 1):
                    s.note("has_work", q.has_work())
                    t = q.pop()
                    s.note("pop", None if t is None else (t.task_id, t.altruistic))
                    if t is None:
                        break
                    if r.random() < 0.85:
                        q.on_dispatched(t, now)
                        q.placed(t.user)
                        s.running[t.task_id] = t
                    else:  # no node in the view
                        q.push_back(t)
                        q.failed(t.user)
            elif op in (3, 4, 5) and s.running:  # a task ends
                tid = sorted(s.running)[x % len(s.running)]
                q.on_finished(s.running.pop(tid), now)
            elif op == 6 and s.running:  # one comes back (preempted, refused)
                tid = sorted(s.running)[x % len(s.running)]
                t = s.running.pop(tid)
                q.on_returned(t, now)
                q.push_front(t)
            elif op == 7 and s.running and choices[1] < 0.3:  # one fails for good
                tid = sorted(s.running)[x % len(s.running)]
                s.note("lost", [t.task_id for t in q.abandon(s.running.pop(tid), now)])
            elif op == 8:  # the view changed
                q.new_epoch()
                if choices[1] < 0.2:
                    q.set_cluster(cap, {(4, 4), (9, 9)})
            s.note("state", _state(q))
        if op == 0 and pending:
            pending.pop(0)
        assert sides[0].log == sides[1].log, f"{policy}: diverged at {op, x}"
        for s in sides:
            s.log.clear()
    # drain: what is left comes out in the same order
    for _ in range(120):
        for s in sides:
            t = s.q.pop()
            s.note("pop", None if t is None else (t.task_id, t.altruistic))
            if t is not None:
                s.q.on_dispatched(t, now)
                s.running[t.task_id] = t
            elif s.running:
                now_t = sorted(s.running)[0]
                s.q.on_finished(s.running.pop(now_t), now)
            s.note("state", _state(s.q))
        assert sides[0].log == sides[1].log, f"{policy}: diverged draining"
        now += 0.5


_OPS = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 7)), min_size=5, max_size=120)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_same_decisions_as_before_with_many_jobs(policy: str, data: Any, seed: int) -> None:
    jobs = data.draw(st.lists(job_specs(3), min_size=1, max_size=25))
    ops = data.draw(_OPS)
    run_both(policy, seed, jobs, ops)


@pytest.mark.parametrize("policy", POLICIES)
def test_same_decisions_as_before_with_hundreds_of_jobs(policy: str) -> None:
    rng = random.Random(7)
    specs = []
    for _ in range(100):
        stages = [((), tuple((rng.randrange(4), 1.0 + rng.randrange(4)) for _ in range(3)))]
        stages.append(((0,), ((rng.randrange(4), 2.0),)))
        specs.append(JobSpec(rng.randrange(3), tuple(stages)))
    ops = [(0, 0)] * 100 + [(rng.choice([1, 3, 4, 6, 8]), rng.randrange(8)) for _ in range(250)]
    run_both(policy, 11, specs, ops)
