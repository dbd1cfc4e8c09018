"""The bench client takes a message of outcomes, or a page of a pool's launch log, as a
batch: what it writes and finds is what it wrote and found taking them one by one.

The references here are the one-at-a-time forms: ``task_row`` through ``csv.writer``
(the rows of ``tasks.csv`` before), ``Task.components``, ``DuplicateLaunches`` reading
one row at a time (its ``add`` as it was, kept below), ``Outcomes.record`` and
``RunTally.add`` per task."""

from __future__ import annotations

import csv
import io
import itertools
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import codec
from common.config import FederationConfig
from common.errors import DecodeError
from common.ids import GmId, JobId, TaskId, UserId
from common.messages import TaskOutcome
from common.metrics import DuplicateLaunches, LaunchRow
from common.model import Phase, Task, TaskSpec, new_task
from reporting.tally import FloatColumns
from reporting.tasks import (
    TASK_COLUMNS,
    OrderedRows,
    TaskCsv,
    components_all,
    components_of,
    task_lines,
    task_row,
)
from request_generator.bench import (
    BenchOptions,
    RunTally,
    _OfRun,
    _run_prefix,
    build_workload,
    read_page,
    sink_into,
)
from request_generator.submitter import Outcomes
from workload.jobs import specs_of

T0 = 1_795_940_654.688773


def reference_csv(tasks: list[Task], failures: list[str | None]) -> str:
    """``tasks.csv``'s rows as ``TaskCsv`` wrote them before: ``task_row`` each, by
    ``csv.writer``."""
    out = io.StringIO(newline="")
    w = csv.writer(out)
    for t, f in zip(tasks, failures, strict=True):
        w.writerow(task_row(t, f))
    return out.getvalue()


ID = st.sampled_from(["t1.0", "r1a.j0.t5", "a,b", 'q"d', "None", "x\ny", "u:0@h+1-2_z"])
TIME = st.one_of(
    st.sampled_from([T0, T0 + 0.5, 0.0, -0.0, 2.0**23, -(2.0**23), 1e-5, 123.456]),
    st.floats(0.0, 2e9),
    st.floats(-10.0, 10.0),
)


@st.composite
def ledgers(draw: st.DrawFn) -> Task:
    """A task's ledger as a GM may report it: started or not, maybe more than once,
    maybe ended; times shared between tasks at times (a job's submission, a launch's
    start)."""
    spec = TaskSpec(
        task_id=TaskId(draw(ID)), job_id=JobId(draw(ID)), user=UserId(draw(ID)),
        demand=(1,), duration=0.02,
    )  # fmt: skip
    at = draw(TIME)
    task = new_task(spec, at, gm=draw(st.sampled_from([None, GmId("gm0")])))
    for dt in draw(st.lists(st.floats(0.0, 0.1), max_size=4)):
        task.mark(draw(st.sampled_from(list(Phase)[:4])), at + dt)
    for dt in draw(st.lists(st.sampled_from([0.0, 0.003, 0.2, 1e-7]), max_size=2)):
        task.start(at + dt)
    if task.started_at >= 0 and draw(st.booleans()):
        task.finished_at = task.started_at + draw(st.sampled_from([0.0, 0.02, -0.5]))
    task.attempt = draw(st.integers(0, 3))
    task.decisions = draw(st.integers(0, 5))
    task.waits = draw(st.lists(st.integers(0, 3), min_size=7, max_size=7))
    return task


FAILURE = st.sampled_from([None, "infeasible", "refused: a, b", 'said "no"', "two\r\nlines", ""])


@settings(max_examples=300)
@given(st.lists(st.tuples(ledgers(), FAILURE), max_size=12))
def test_a_batch_of_rows_is_what_csv_writer_wrote_of_task_row(
    batch: list[tuple[Task, str | None]],
) -> None:
    tasks = [t for t, _ in batch]
    failures = [f for _, f in batch]
    for t in tasks:
        assert components_of(t) == t.components()
    assert task_lines(tasks, failures) == reference_csv(tasks, failures)


def test_task_lines_of_recorded_like_ledgers_share_the_times_they_share() -> None:
    """A job's tasks submitted at once and launched at once: the same text as each
    row made alone."""
    spec = TaskSpec(task_id=TaskId("j.t0"), job_id=JobId("j"), user=UserId("u0"), demand=(1,),
                    duration=0.02)  # fmt: skip
    tasks = []
    for i in range(5):
        t = new_task(spec, T0)
        t.mark(Phase.PROCESSING, T0 + 0.0003)
        t.start(T0 + 0.03 if i < 3 else T0 + 0.04)
        t.finished_at = t.started_at + 0.001 * i
        tasks.append(t)
    assert task_lines(tasks) == "".join(task_lines([t]) for t in tasks)
    assert task_lines(tasks) == reference_csv(tasks, [None] * 5)


def test_rows_that_share_a_head_and_tail_keep_each_zero_sign_and_each_launch_apart() -> None:
    """Rows one after the other with equal times but a zero of the other sign, or with
    the same marks but another start, each get their own text."""
    spec = TaskSpec(task_id=TaskId("j.t0"), job_id=JobId("j"), user=UserId("u0"), demand=(1,),
                    duration=0.02)  # fmt: skip
    tasks = []
    for sub, start in [(0.0, 0.5), (-0.0, 0.5), (-0.0, 0.5), (T0, T0 + 1), (T0, T0 + 2)]:
        t = new_task(spec, sub)
        t.mark(Phase.PROCESSING, sub + 0.25)
        t.start(start)
        t.finished_at = t.started_at + 0.5
        tasks.append(t)
    comps = components_all(tasks)
    assert comps == [t.components() for t in tasks]
    assert comps[1] is comps[2]
    assert comps[3] is not comps[4]
    lines = task_lines(tasks, None, comps)
    assert lines == reference_csv(tasks, [None] * 5)
    assert lines.splitlines()[0].split(",")[4] == "0.0"
    assert lines.splitlines()[1].split(",")[4] == "-0.0"


def test_a_task_csv_written_in_batches_is_the_one_written_row_by_row(tmp_path: Path) -> None:
    rng = random.Random(3)
    spec = TaskSpec(task_id=TaskId("j.t0"), job_id=JobId("j"), user=UserId("u0"), demand=(1,),
                    duration=0.02)  # fmt: skip
    tasks = []
    for i in range(50):
        t = new_task(spec, T0 + i)
        t.start(t.submitted_at + rng.uniform(0, 0.1))
        t.finished_at = t.started_at + rng.uniform(0, 1)
        tasks.append(t)
    failures = [None if i % 9 else "worker_lost, again" for i in range(50)]
    with TaskCsv(tmp_path / "batches.csv", flush_every=7) as out:
        k = 0
        while k < len(tasks):
            n = rng.randrange(1, 12)
            out.write_many(tasks[k : k + n], failures[k : k + n])
            k += n
        assert out.rows == 50
    text = (tmp_path / "batches.csv").read_bytes().decode()
    head = io.StringIO(newline="")
    csv.writer(head).writerow(TASK_COLUMNS)
    assert text == head.getvalue() + reference_csv(tasks, failures)
    rows = OrderedRows(run_rows=8, fan_in=2)
    for i in reversed(range(50)):
        rows.add(i, tasks[i], failures[i])
    rows.write(tmp_path / "ordered.csv")
    rows.close()
    assert (tmp_path / "ordered.csv").read_bytes().decode() == text


# ----------------------------------------------------------------- launch logs
class ReferenceDuplicateLaunches(DuplicateLaunches):
    """``add`` as it read one row at a time before ``add_rows``."""

    def add(self, row: Mapping[str, Any]) -> None:
        self.rows += 1
        task = (str(row["user"]), str(row["task_id"]))
        attempt, at = int(row["attempt"]), float(row["at"])
        where = None
        if row.get("incarnation") is not None:
            where = (str(row["pool"]), str(row["incarnation"]))
            self.heard(*where, at)
        spans = self.spans.setdefault(task, {})
        if row["what"] == "start":
            if attempt in spans:
                if (task, attempt) not in self._died:
                    self.twice.setdefault(task, f"attempt {attempt} started twice")
                elif _overlap(spans):
                    self.twice.setdefault(task, "two attempts at once")
                self._died.discard((task, attempt))
            spans[attempt] = [at, math.inf]
            if where is not None:
                self._running.setdefault(where, set()).add((task, attempt))
        else:
            span = spans.get(attempt)
            if span is not None and span[1] == math.inf:
                span[1] = at
            if where is not None:
                self._running.get(where, set()).discard((task, attempt))
            if row["what"] == "end":
                n = self.ends[task] = self.ends.get(task, 0) + 1
                if n > 1:
                    self.twice.setdefault(task, self._ended_twice(task))
                elif where is not None:
                    self._first_end[task] = where
                if self.horizon_s is not None:
                    self._ended.append((at, task))
        if self.horizon_s is not None:
            self._latest = max(self._latest, at)
            self._forget(self._latest - self.horizon_s)


def _overlap(by_attempt: Mapping[int, list[float]]) -> bool:
    runs = sorted(by_attempt.values())
    return any(b[0] < a[1] for a, b in itertools.pairwise(runs))


def state_of(check: DuplicateLaunches) -> tuple[Any, ...]:
    return (
        check.result(), check.rows, check.restarts, check.spans, check.ends, check.twice,
        check._first_end, list(check._ended), check._latest, check._pools,
        {k: v for k, v in check._running.items() if v}, check._died,
    )  # fmt: skip


def random_pages(rng: random.Random) -> list[tuple[str, str | None, float, list[dict[str, Any]]]]:
    """Pages of several pools' logs as polled: starts, ends, stops of attempts, some
    run twice, some pools restarted (a new incarnation), some naming none."""
    pages = []
    now = 0.0
    incarnation = {"p0": "a", "p1": "b", "p2": None}
    for _ in range(rng.randrange(1, 12)):
        pool = rng.choice(list(incarnation))
        if incarnation[pool] is not None and rng.random() < 0.15:
            incarnation[pool] += "'"  # type: ignore[operator]
        rows = []
        for _ in range(rng.randrange(0, 15)):
            now += rng.choice([0.0, 0.1, 0.5, 3.0])
            rows.append({
                "what": rng.choice(["start", "start", "end", "stop"]), "user": "u0",
                "task_id": f"t{rng.randrange(8)}", "attempt": rng.randrange(1, 4),
                "node": 0, "at": now - rng.choice([0.0, 0.0, 1.0]),
            })  # fmt: skip
        pages.append((pool, incarnation[pool], now, rows))
    return pages


@pytest.mark.parametrize("seed", range(300))
def test_a_page_read_at_once_finds_what_its_rows_read_one_by_one_found(seed: int) -> None:
    rng = random.Random(seed)
    horizon = rng.choice([None, 2.0, 5.0])
    new, old = DuplicateLaunches(horizon), ReferenceDuplicateLaunches(horizon)
    for pool, incarnation, at, rows in random_pages(rng):
        if incarnation is not None and rng.random() < 0.7:  # the page's own word
            new.heard(pool, incarnation, at)
            old.heard(pool, incarnation, at)
        new.add_rows([LaunchRow.of(r) for r in rows], pool, incarnation)
        for r in rows:
            old.add({**r, "pool": pool, "incarnation": incarnation})
        assert state_of(new) == state_of(old)


def test_a_launch_page_is_read_typed_and_bounded() -> None:
    page = {"lm": "lm0", "next": 2, "missed": 0, "incarnation": "p1", "at": 3,
            "launches": [{"what": "start", "user": "u0", "task_id": "t", "attempt": 1,
                          "node": 4, "at": 1}]}  # fmt: skip
    got = read_page(codec.pack_plain(page))
    assert got.launches == [LaunchRow("start", "u0", "t", 1, 1.0)]
    assert (got.next, got.missed, got.incarnation, got.at) == (2, 0, "p1", 3.0)
    assert read_page(codec.pack_plain({**page, "incarnation": None})).incarnation is None
    with pytest.raises(DecodeError):
        read_page(codec.pack_plain({**page, "launches": [{"what": "start"}]}))
    with pytest.raises(DecodeError, match="exceeds"):
        read_page(b"\x80" * (codec.MAX_BODY + 1))


# ------------------------------------------------------------------- outcomes
def ledger(spec: TaskSpec, at: float, i: int) -> Task:
    rng = random.Random(i)
    t = new_task(spec, at + rng.uniform(0.001, 0.01))
    t.mark(Phase.PROCESSING, t.submitted_at + rng.uniform(0.0, 0.05))
    t.start(t.marks[-1][0] + rng.uniform(0.001, 0.02))
    t.finished_at = t.started_at + rng.expovariate(2.0)
    return t


CFG = FederationConfig(gms=2, lms=2, nodes_per_lm=4).validate()


def run_outcomes(tmp_path: Path, batched: bool, jobs: list[Any]) -> tuple[Any, ...]:
    """One run's outcomes, in messages: finished, failed then finished, failed for
    good, repeated, another run's; to a ``RunTally`` per task or a message at a time."""
    cfg = CFG
    tally = RunTally(cfg, jobs, tmp_path / f"{batched}.csv", spill_rows=8)
    out = Outcomes(keep=False, owns=_OfRun(_run_prefix(jobs)).__contains__)
    sink = sink_into(tally, out)
    if not batched:
        out.sink_many = None
    assert out.sink is None
    out.sink = sink
    specs = [(j, s) for j in jobs for s in specs_of(j)]
    for j in jobs:
        out.submitted(specs_of(j), j.arrival)
    rng = random.Random(8)
    messages: list[list[TaskOutcome]] = [[]]
    for i, (j, s) in enumerate(specs):
        t = ledger(s, j.arrival, i)
        if i % 11 == 3:
            failed = Task(spec=s, submitted_at=t.submitted_at)
            messages[-1].append(TaskOutcome(task=failed, finished=False, reason="worker_lost"))
            if i % 2:
                messages[-1].append(TaskOutcome(task=t, finished=True))  # finished after all
        else:
            messages[-1].append(TaskOutcome(task=t, finished=True))
        if i % 13 == 0:
            messages[-1].append(TaskOutcome(task=t, finished=True))  # said twice
        if rng.random() < 0.3:
            messages.append([])
    foreign = TaskSpec(task_id=TaskId("other.t0"), job_id=JobId("other"), user=UserId("u0"),
                       demand=(1,), duration=1.0)  # fmt: skip
    messages[-1].append(TaskOutcome(task=new_task(foreign, T0), finished=True))
    for m in messages:
        out.record_all(m)
    out.settle()
    tally.csv.close()
    figures = (
        (tmp_path / f"{batched}.csv").read_bytes(), tally.tasks.summary(),
        tally.publish.columns(), tally.runs.columns(), repr(list(tally.job_end)), list(tally.spans()),
        tally.first, tally.last, tally.users,
        out.n_finished, out.duplicates, dict(out.failed), len(out.outstanding),
    )  # fmt: skip
    tally.close()
    return figures


def test_outcomes_taken_a_message_at_a_time_make_the_same_run(tmp_path: Path) -> None:
    jobs = build_workload(CFG, BenchOptions(jobs=40, tasks_per_job=3, job_rate=40.0, seed=4))
    for j in jobs:
        j.arrival += T0
    batched = run_outcomes(tmp_path, True, jobs)
    one_by_one = run_outcomes(tmp_path, False, jobs)
    assert batched == one_by_one
    # each kind was there: finished, said twice, failed for good
    assert batched[9] > 100
    assert batched[10] > 5
    assert batched[11]


def test_float_columns_take_rows_flat() -> None:
    cols = FloatColumns(("a", "b"), spill_rows=3)
    cols.extend([1.0, 2.0, 3.0, 4.0])
    cols.extend([])
    for i in range(5):
        cols.extend([float(i), -float(i)] * 2)
        assert cols.held <= 6
    assert cols.rows == 12
    assert list(cols.columns()["a"]) == [1.0, 3.0] + [float(i) for i in range(5) for _ in "ab"]
    with pytest.raises(ValueError, match="columns"):
        cols.extend([1.0])
    cols.close()
