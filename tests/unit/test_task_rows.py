"""A task's row of tasks.csv: each time and duration rounded to 1e-9 s as ``round(x, 9)``
rounds it, without the decimal conversion where a float has no digit there to round
(a timestamp)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from common.ids import JobId, TaskId, UserId
from common.model import Phase, TaskSpec, new_task
from reporting.tasks import _r9, task_row, task_state


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_r9_is_round_to_nine_places(x: float) -> None:
    want = round(x, 9) if math.isfinite(x) else x
    got = _r9(x)
    assert got == want or (math.isnan(got) and math.isnan(want))
    assert math.copysign(1.0, got) == math.copysign(1.0, want) or math.isnan(want)


@given(
    st.floats(0.0, 2e9),
    st.lists(st.floats(0.0, 0.1), min_size=0, max_size=3),
    st.one_of(st.none(), st.floats(0.0, 0.2)),
    st.booleans(),
    st.sampled_from([None, "infeasible"]),
)
def test_a_row_is_every_value_rounded_as_before(
    at: float, steps: list[float], start: float | None, ended: bool, failure: str | None
) -> None:
    spec = TaskSpec(
        task_id=TaskId("t1.0"), job_id=JobId("t1"), user=UserId("u0"), demand=(1,), duration=0.02
    )
    task = new_task(spec, at)
    phase = [Phase.PROCESSING, Phase.COMMUNICATION, Phase.QUEUEING]
    for k, dt in enumerate(steps):
        task.mark(phase[k], at + dt)
    if start is not None:
        task.start(at + start)
        if ended:
            task.finished_at = task.started_at + 0.02
    started, first = task.started_at, task.first_started_at
    want = [
        "t1.0", "t1", "u0", "",
        round(at, 9), round(first, 9), round(started, 9), round(task.finished_at, 9),
        round(task.allocation_time, 9), round(task.first_allocation_time, 9),
        round(max(0.0, started - first), 9) if started >= 0 else -1.0,
        *(round(v, 9) for v in task.components()),
        task.attempt, task.decisions, *task.waits,
        task_state(task, failure), failure or "",
    ]  # fmt: skip
    assert repr(task_row(task, failure)) == repr(want)
