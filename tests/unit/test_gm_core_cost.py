"""What a GM core does per task, made cheaper without changing a decision (issue 35
item 1): a round walks the views once per class that finds no room, the journal and
the job book keep what outlives a task where the collector never walks it, FIFO
classed queues keep no arrivals of their own, and the waiting index hands one user's
tasks out at once.  Pure cores driven by hand."""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Sequence

import pytest

from common.effects import JobRefused, ToLm
from common.ids import TaskId, UserId
from common.messages import LaunchRequest
from common.model import TaskSpec, WaitReason, new_task
from common.reasons import JobReason
from global_master.admission import Admissions, Cluster, Refusal
from global_master.journal import Journal, Step
from global_master.lifecycle import JobBook
from global_master.placement import Placer
from global_master.policy.classes import Aging, ClassedQueue
from global_master.policy.srpt import JobHeap, Remaining
from global_master.queues import WaitingTasks
from tests.conftest import decide, jobs_of, make_gm, make_lm, make_task, submit, sync_views


def _launched(effects: Sequence[object]) -> int:
    return sum(
        len(e.msg.placements)
        for e in effects
        if isinstance(e, ToLm) and isinstance(e.msg, LaunchRequest)
    )


def test_a_class_that_found_no_room_is_walked_once_per_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = make_gm()
    sync_views(core, make_lm(nodes=((2, 2),)))
    specs = [make_task(1, 1) for _ in range(6)]
    submit(core, specs, 0.0)
    walks: list[int] = []
    find = Placer.find

    def counted(self: Placer, *args: object) -> object:
        walks.append(1)
        return find(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Placer, "find", counted)
    effects = decide(core, 1.0, max_tasks=6)
    assert _launched(effects) == 2  # the node holds two
    assert len(walks) == 3  # two matches, then one walk that found no room
    # every task that found none is noted as such and goes back, as if it had walked
    assert core.wait_reasons[WaitReason.NO_FREE_RESOURCES] == 4
    assert core.counters.requeues == 4
    # a new round walks again (the views may have room by then)
    walks.clear()
    decide(core, 2.0, max_tasks=1)
    assert len(walks) <= 1


def test_what_is_kept_of_an_ended_task_is_never_tracked_by_the_collector() -> None:
    j = Journal()
    task = new_task(make_task(), 0.0)
    j.note(task.key, 0.0, "launch", lm="lm0", node=1)
    task.finished_at = 2.0
    j.close_task(task, finished=True, reason="")
    ended = j.ended[task.key]
    assert not gc.is_tracked(ended)
    assert [s.what for s in ended.trail().steps] == ["launch", "finished"]
    book = JobBook()
    (job,) = jobs_of([make_task(task_id="a"), make_task(task_id="b")], 0.0)
    book.opened(job, 0.0)
    rec = book.get(job.user, job.job_id)
    assert rec is not None
    assert not any(gc.is_tracked(t) for t in rec.tasks.values())


def test_the_journal_keeps_a_live_task_s_steps_as_rows_and_reads_them_as_steps() -> None:
    j = Journal(per_task=2)
    k = (UserId("u0"), TaskId("t0"))
    j.note(k, 1.0, "launch", lm="lm0")
    j.note(k, 2.0, "launch", lm="lm0")  # the same step again: counted
    j.wait(k, 3.0, "no_free_resources")
    j.wait(k, 3.0, "user_at_share")  # the same decision: one step
    (row_a, row_b) = j.trails[k].steps
    assert isinstance(row_a, tuple)
    assert row_a == (1.0, "launch", "lm0", -1, "", "", 2, 2.0)
    assert row_b[1] == "waits"
    assert row_b[5] == "no_free_resources, user_at_share"
    j.note(k, 4.0, "started")  # past the bound: the oldest goes
    trail = j.trail(k)
    assert all(isinstance(s, Step) for s in trail.steps)
    assert [s.what for s in trail.steps] == ["waits", "started"]
    assert trail.dropped == 1


def test_a_fifo_classed_queue_finds_its_oldest_without_arrivals() -> None:
    aging = Aging()
    q = ClassedQueue(deque, aging)
    tasks = [new_task(make_task(), float(i)) for i in range(4)]
    for t in tasks[1:]:
        q.append(t)
    q.appendleft(tasks[0])
    assert q.plain
    assert not any(q.arrivals.values())
    assert not q.where
    assert q.oldest(0) is tasks[0]
    assert q.popleft() is tasks[0]
    assert q.oldest(0) is tasks[1]
    q.remove(tasks[1])
    assert q.oldest(0) is tasks[2]
    assert len(q) == 2
    # a queue of its own order (srpt) keeps them: its first is not its oldest
    remaining = Remaining()
    keyed = ClassedQueue(lambda: JobHeap(remaining), aging)
    assert not keyed.plain


def test_the_waiting_index_hands_one_user_s_tasks_out_oldest_first() -> None:
    w = WaitingTasks()
    tasks = [new_task(make_task(), float(i)) for i in range(5)]
    for t in tasks:
        w.add(t)
    cls = (tasks[0].constraints, tasks[0].demand)
    assert w.take(cls, 3, ()) == tasks[:3]
    assert len(w) == 2
    assert w.count(tasks[0].user) == 2
    assert w.take(cls, 9, ()) == tasks[3:]
    assert not w
    assert not w.by_class
    assert w.count(tasks[0].user) == 0


def test_a_job_s_alike_tasks_are_checked_once_and_an_unlike_one_still_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core = make_gm()
    sync_views(core, make_lm(nodes=((2, 2),)))
    checked: list[str] = []
    spec_error = Admissions.spec_error

    def counted(self: Admissions, spec: TaskSpec, cluster: Cluster) -> Refusal | None:
        checked.append(spec.task_id)
        return spec_error(self, spec, cluster)

    monkeypatch.setattr(Admissions, "spec_error", counted)
    submit(core, [make_task(1, 1, job="a") for _ in range(5)], 0.0)
    assert len(checked) == 1
    assert core.counters.jobs_admitted == 1
    checked.clear()
    too_big = make_task(9, 9, job="b")
    effects = submit(core, [make_task(1, 1, job="b"), too_big], 0.0)
    assert len(checked) == 2  # the first task's shape, then the one too big
    assert checked[1] == too_big.task_id
    (refused,) = [e for e in effects if isinstance(e, JobRefused)]
    assert refused.reason == JobReason.IMPOSSIBLE_RESOURCES
