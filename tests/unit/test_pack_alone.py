"""Carbyne's packings pack a stage released alone (a chain's next link) without the
list scheduler's heaps (``altruism._Packing._alone``): the same floats, to the bit, as
the code before, ``global_master/policy/altruism.py`` at ``REFERENCE`` (taken from the
repository's history when the test runs).

Random DAGs -- chains most of the time, as the fast path is for them -- with running
tasks, allocations from smaller than one task to larger than the job, durations that
end within ``EPS`` of each other: forward packing (``T_k``), ``job_finish`` and
reverse packing (latest starts, in order) must be equal."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.dag import make_job
from global_master.policy import altruism
from global_master.policy.jobs import JobState, StageState
from tests.unit.packing_calls import packing_calls

REFERENCE = "aa9ebb5"
"""main before the chain fast path."""
ROOT = Path(__file__).resolve().parents[2]
DEMANDS = [(1, 1), (2, 1), (1, 2), (3, 2), (4, 4)]
DURATIONS = [0.5, 1.0, 1.0 + 4e-10, 1.5, 0.1 + 0.2, 0.3, 3.0]


@functools.cache
def reference() -> ModuleType:
    """``altruism.py`` at ``REFERENCE`` (it imports today's ``jobs``: unchanged)."""
    try:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{REFERENCE}:global_master/policy/altruism.py"],
            capture_output=True, check=True, timeout=60, text=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"needs the repository's history back to {REFERENCE}: {exc}")
    spec = importlib.util.spec_from_loader("reference_altruism", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(text, "reference_altruism.py", "exec"), module.__dict__)
    return module


_TASK = st.tuples(st.integers(0, len(DEMANDS) - 1), st.sampled_from(DURATIONS))
_STAGE = st.tuples(st.lists(_TASK, min_size=1, max_size=4), st.booleans(), st.integers(0, 9))


@st.composite
def histories(draw: st.DrawFn) -> tuple[JobState, float, list[float]]:
    """A job with some stages done and some tasks running, ``now``, an allocation."""
    specs = draw(st.lists(_STAGE, min_size=1, max_size=14))
    stages = []
    for s, (tasks, chain, other) in enumerate(specs):
        parents = [s - 1] if s and chain else ([other % s] if s and other % 2 else [])
        stages.append((s, [(DEMANDS[d], dur) for d, dur in tasks], parents))
    job = make_job("j", "u", 0.0, stages)
    state = JobState(job.job_id, job.user, 0.0, None)
    for s in job.stages:
        state.stages[s.stage_id] = StageState(s.parents, {t.task_id: t for t in s.tasks}, 0)
        for t in s.tasks:
            state.stage_of[t.task_id] = s.stage_id
    done = draw(st.integers(0, len(job.stages) - 1))
    for s in job.stages[:done]:
        del state.stages[s.stage_id]
    now = draw(st.sampled_from([0.0, 0.25, 1.0, 2.0 + 1e-10]))
    ready = [
        s for s, stg in state.stages.items() if not any(p in state.stages for p in stg.parents)
    ]
    for s in ready[: draw(st.integers(0, len(ready)))]:
        stg = state.stages[s]
        for tid in list(stg.waiting)[: draw(st.integers(0, len(stg.waiting)))]:
            task = stg.waiting.pop(tid)
            stg.running += 1
            state.start(task, now - draw(st.sampled_from([0.0, 0.1, 0.4])))
    for stg in state.stages.values():
        for tid, t in stg.waiting.items():
            if not any(p in state.stages for p in stg.parents):
                state.enqueue(t)
            del tid
    cap = draw(st.sampled_from([[1.0, 1.0], [3.0, 2.0], [4.0, 4.0], [6.0, 5.0], [40.0, 40.0]]))
    return state, now, cap


@settings(max_examples=400, deadline=None)
@given(histories())
def test_the_packings_are_those_of_the_list_scheduler_before(
    h: tuple[JobState, float, list[float]],
) -> None:
    job, now, cap = h
    old = reference()
    capacity = [40.0, 40.0]
    running = job.running_list()
    fwd = altruism.forward_pack(now, cap, capacity, job.stages, running, job.children())
    assert fwd == old.forward_pack(now, cap, capacity, job.stages, running, job.children())
    assert altruism.job_finish(now, cap, capacity, job) == old.job_finish(now, cap, capacity, job)
    for horizon in (fwd, fwd + 1.5):
        args = (now, horizon, cap, capacity, job.stages, running, set(job.queued))
        new = altruism.must_start(*args, job.live_parents())
        before = old.must_start(*args, job.live_parents())
        assert [(x, t.task_id) for x, t in new] == [(x, t.task_id) for x, t in before]


def test_a_chain_is_packed_link_by_link_without_the_scheduler() -> None:
    """A chain of stages that fit their allocation goes through the fast path only."""
    job = make_job("c", "u", 0.0, [(s, [((1, 1), 1.0 + s / 7)] * 2, [s - 1] if s else [])
                                   for s in range(50)])  # fmt: skip
    stages = {s.stage_id: StageState(s.parents, {t.task_id: t for t in s.tasks}, 0)
              for s in job.stages}  # fmt: skip
    with packing_calls() as calls:
        finish = altruism.forward_pack(0.0, [2.0, 2.0], [2.0, 2.0], stages, [])
    assert finish == reference().forward_pack(0.0, [2.0, 2.0], [2.0, 2.0], stages, [])
    assert calls == {"alone": 50, "scheduler": 0}
