"""A worker pool's task timers (``worker.timers``) and how its service uses them: ends
due in one tick share a loop timer, none is fed before it is due, and the ends due by
the time the pool's reports leave go with them."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from typing import Any

import pytest

from common.config import FederationConfig
from common.effects import After
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import (
    Registered,
    ReportKind,
    StartTask,
    StartTasks,
    StopTask,
    StopTasks,
    TaskDue,
    WorkerReport,
    WorkerReports,
)
from common.model import TaskSpec
from security.access import Access
from security.identity import workers
from security.secret import Secret
from worker.app import TICK_SHARE, WorkerService
from worker.timers import DueTimers

SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")


def _due(i: int) -> TaskDue:
    return TaskDue(user=UserId("u"), task_id=TaskId(f"t{i}"), attempt=1)


def _fed_at(fed: list[tuple[float, Any]], loop: asyncio.AbstractEventLoop) -> Any:
    return lambda msg: fed.append((loop.time(), msg))


def test_ends_due_in_one_tick_share_one_loop_timer_and_none_comes_early() -> None:
    async def run() -> tuple[DueTimers, list[tuple[float, Any]], list[float]]:
        loop = asyncio.get_running_loop()
        fed: list[tuple[float, Any]] = []
        timers = DueTimers(_fed_at(fed, loop), tick_s=0.05, busy_per_tick=0)
        # just after a tick began: all four are due within it (the loop's grain: 1 ms)
        await asyncio.sleep(math.ceil(loop.time() / 0.05) * 0.05 - loop.time() + 0.002)
        asked = loop.time()
        delays = [0.001, 0.004, 0.002, 0.003]
        for i, d in enumerate(delays):
            timers.after(After(d, _due(i)))
        dues = [asked + d for d in delays]
        await asyncio.sleep(0.12)
        return timers, fed, dues

    timers, fed, dues = asyncio.run(run())
    assert [m.task_id for _, m in fed] == ["t0", "t1", "t2", "t3"]  # in the order asked
    assert timers.timers <= 2  # one, unless the loop came late to the tick
    assert timers.fed == 4
    assert timers.pending() == 0
    for (at, _), due in zip(fed, dues, strict=True):
        assert at >= due - 1e-3  # (the loop's clock has a millisecond's grain)


def test_a_tick_s_timer_comes_its_grace_late_and_a_wake_up_before_feeds_it() -> None:
    async def run() -> tuple[list[Any], list[Any], int, list[Any]]:
        loop = asyncio.get_running_loop()
        fed: list[tuple[float, Any]] = []
        timers = DueTimers(_fed_at(fed, loop), tick_s=0.01, grace_s=1.0, busy_per_tick=0)
        timers.after(After(0.0, _due(0)))
        timers.after(After(0.0, _due(1)))
        await asyncio.sleep(0.05)  # due, and its tick over: its timer not come yet
        before = [m.task_id for _, m in fed]
        n = timers.run_due()  # a wake-up: both fed, the timer cancelled
        woke = [m.task_id for _, m in fed]
        timers.after(After(0.0, _due(2)))  # no wake-up comes: the timer does
        await asyncio.sleep(0.05)
        not_yet = [m.task_id for _, m in fed]
        await asyncio.sleep(1.2)
        return before, woke, n, [not_yet, [m.task_id for _, m in fed]]

    before, woke, n, (not_yet, last) = asyncio.run(run())
    assert before == []
    assert (woke, n) == (["t0", "t1"], 2)
    assert not_yet == ["t0", "t1"]
    assert last == ["t0", "t1", "t2"]


def test_a_quiet_pool_s_ends_keep_a_timer_each_a_busy_one_s_share_them() -> None:
    async def run() -> tuple[int, int, float]:
        loop = asyncio.get_running_loop()
        fed: list[tuple[float, Any]] = []
        timers = DueTimers(_fed_at(fed, loop), tick_s=0.05, busy_per_tick=2.0)
        for i in range(3):  # the first window: its rate unknown, quiet
            timers.after(After(0.001, _due(i)))
        quiet = timers.timers
        timers._window = (loop.time() - 1.0, 120)  # 120 asked in the last second:
        for i in range(3, 7):  # 6 per tick, busy
            timers.after(After(0.001, _due(i)))
        busy = timers.timers - quiet
        await asyncio.sleep(0.15)
        assert len(fed) == 7
        return quiet, busy, timers.rate

    quiet, busy, rate = asyncio.run(run())
    assert quiet == 3
    assert busy <= 2
    assert rate == pytest.approx(120.0, rel=0.05)


def test_a_pool_turning_busy_shares_ticks_before_its_window_is_over() -> None:
    async def run() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        fed: list[tuple[float, Any]] = []
        timers = DueTimers(_fed_at(fed, loop), tick_s=0.05, busy_per_tick=2.0)
        timers.after(After(0.001, _due(0)))  # quiet so far: a timer of its own
        for i in range(1, 40):  # 40 asked at once: 40 a window at least, 2 a tick
            timers.after(After(0.001, _due(i)))
        first = timers.timers  # 39 timers of their own, then the 40th's tick
        for i in range(40, 50):
            timers.after(After(0.002, _due(i)))
        await asyncio.sleep(0.15)
        assert len(fed) == 50
        return first, timers.timers - first

    first, busy = asyncio.run(run())
    assert first == 40
    assert busy <= 1  # the window is not over, its rate so far says busy


def test_a_tick_of_zero_arms_a_timer_each() -> None:
    async def run() -> tuple[DueTimers, list[tuple[float, Any]]]:
        loop = asyncio.get_running_loop()
        fed: list[tuple[float, Any]] = []
        timers = DueTimers(_fed_at(fed, loop), tick_s=0.0)
        for i in range(3):
            timers.after(After(0.001, _due(i)))
        await asyncio.sleep(0.05)
        return timers, fed

    timers, fed = asyncio.run(run())
    assert timers.timers == 3
    assert len(fed) == 3


def test_run_due_feeds_what_is_due_and_an_emptied_tick_fires_no_more() -> None:
    async def run() -> tuple[int, int, list[Any], list[Any], list[Any]]:
        loop = asyncio.get_running_loop()
        fed: list[tuple[float, Any]] = []
        timers = DueTimers(_fed_at(fed, loop), tick_s=10.0, busy_per_tick=0)  # comes late
        timers.after(After(0.0, _due(0)))
        timers.after(After(0.02, _due(1)))
        timers.after(After(30.0, _due(2)))  # a later tick
        first = timers.run_due()  # t0 only: t1 is not due yet
        after_first = [m.task_id for _, m in fed]
        await asyncio.sleep(0.03)
        second = timers.run_due()  # t1; its tick is empty now
        after_second = [m.task_id for _, m in fed]
        handles = [t.handle for t in timers._ticks.values()]
        return first, second, after_first, after_second, handles

    first, second, after_first, after_second, handles = asyncio.run(run())
    assert (first, second) == (1, 1)
    assert after_first == ["t0"]
    assert after_second == ["t0", "t1"]
    assert len(handles) == 1  # t2's tick waits; t0's and t1's is gone, its timer cancelled


def test_a_failing_message_does_not_keep_the_others_of_its_tick() -> None:
    async def run() -> list[Any]:
        got: list[Any] = []

        def feed(msg: Any) -> None:
            if msg.task_id == "t0":
                raise RuntimeError("boom")
            got.append(msg.task_id)

        timers = DueTimers(feed, tick_s=0.01, busy_per_tick=0)
        for i in range(3):
            timers.after(After(0.0, _due(i)))
        await asyncio.sleep(0.05)
        return got

    assert asyncio.run(run()) == ["t1", "t2"]


def test_a_negative_tick_is_refused() -> None:
    with pytest.raises(ValueError, match="tick_s"):
        DueTimers(lambda m: None, tick_s=-1.0)
    with pytest.raises(ValueError, match="grace_s"):
        DueTimers(lambda m: None, tick_s=1.0, grace_s=-1.0)


# ------------------------------------------------------------ the pool service
class _Lm:
    """The pool's LM, answering at once (or after ``wait_s``): what each post carried."""

    def __init__(self) -> None:
        self.reports: list[list[WorkerReport]] = []
        self.wait_s = 0.0

    async def post(self, path: str, msg: Any, *, expect: Any = None, policy: Any = None) -> Any:
        if path == "/v1/register":
            return Registered(lm=LmId("lm0"), epoch=1)
        if path == "/v1/worker-report":
            self.reports.append(list(msg.reports))
            await asyncio.sleep(self.wait_s)
            return WorkerReports(lm=LmId("lm0"), reports=())
        return None


def _starts(durations: list[float], name: str = "t") -> StartTasks:
    tasks = tuple(
        StartTask(
            spec=TaskSpec(task_id=TaskId(f"{name}{i}"), job_id=JobId("j"), user=UserId("u"),
                          demand=(1, 1), duration=d),
            attempt=1, node=NodeIndex(i), gm=GmId("gm0"),
        )
        for i, d in enumerate(durations)
    )  # fmt: skip
    return StartTasks(lm=LmId("lm0"), epoch=1, tasks=tasks, sent=-1.0)


async def _pool(linger_s: float) -> tuple[WorkerService, _Lm]:
    cfg = replace(FederationConfig(), lms=1, nodes_per_lm=8, journal=False,
                  linger_s=linger_s).validate()  # fmt: skip
    svc = WorkerService(cfg, LmId("lm0"), Access(workers("lm0"), cfg, SECRET))
    await svc.open()
    lm = _Lm()
    svc.lm = lm  # type: ignore[assignment]  # before the registration runs
    await asyncio.wait_for(svc.registered.wait(), 5.0)
    return svc, lm


def test_the_pool_s_ends_of_one_tick_share_a_timer() -> None:
    async def run() -> tuple[int, float, int]:
        svc, _ = await _pool(linger_s=0.05)
        svc.timers.busy_per_tick = 0  # (as busy)
        svc.driver.feed(_starts([0.003, 0.004, 0.005, 0.006]))
        armed = svc.timers.timers
        await asyncio.sleep(0.15)  # (its tick, its grace: 20 ms at most)
        finished = svc.core.counters.finished
        await svc.close()
        return armed, svc.timers.tick_s, finished

    armed, tick_s, finished = asyncio.run(run())
    assert tick_s == pytest.approx(TICK_SHARE * 0.05)
    assert armed <= 2  # a timer each before
    assert finished == 4


def test_ends_due_as_the_reports_leave_go_with_them() -> None:
    """A batch of reports leaving takes the ends due by then whose tick is still to
    come: one post, not one now and one at the tick."""

    async def run() -> tuple[list[list[str]], int]:
        svc, lm = await _pool(linger_s=1.0)
        svc.timers.tick_s = 1e9  # no tick comes within the test
        svc.timers.busy_per_tick = 0  # (as busy)
        svc.driver.feed(_starts([0.0, 0.01, 5.0]))  # t0, t1 soon; t2 much later
        await asyncio.sleep(0.03)  # due, their tick to come
        assert svc.core.counters.finished == 0
        await svc._send_reports("lm", [])  # (as the batcher calls it)
        sent = [[r.task_id for r in batch] for batch in lm.reports]
        joined = svc.joined
        await svc.close()
        return sent, joined

    sent, joined = asyncio.run(run())
    assert sent == [["t0", "t1"]]
    assert joined == 2


def test_a_start_feeds_the_ends_due_by_then_first() -> None:
    async def run() -> int:
        svc, _ = await _pool(linger_s=1.0)
        svc.timers.tick_s = 1e9  # no tick comes within the test
        svc.timers.busy_per_tick = 0  # (as busy)
        svc.driver.feed(_starts([0.0]))
        await asyncio.sleep(0.01)
        msg = _starts([1.0], name="s")
        assert svc.refusal() is None  # (as the service's routes ask before the feed)
        assert svc.core.counters.finished == 1
        svc.driver.feed(msg)
        finished = svc.core.counters.finished
        await asyncio.sleep(0.01)  # its report leaves
        await svc.close()
        return finished

    assert asyncio.run(run()) == 1


def test_ends_due_as_the_lm_answers_reports_are_fed_then() -> None:
    async def run() -> tuple[int, int, int]:
        svc, lm = await _pool(linger_s=1.0)
        svc.timers.tick_s = 1e9  # no tick comes within the test
        svc.timers.busy_per_tick = 0  # (as busy)
        lm.wait_s = 0.05
        svc.driver.feed(_starts([0.01]))  # due while the reports are on their way
        await svc._send_reports("lm", [])
        got = (svc.core.counters.finished, svc.reports.pending(), len(lm.reports))
        await asyncio.sleep(0.01)  # its report leaves
        await svc.close()
        return got

    assert asyncio.run(run()) == (1, 1, 1)  # fed as the answer came; to leave next


def test_a_stop_after_a_task_s_end_finds_it_ended() -> None:
    """Its end is due but its tick to come: the stop does not make it STOPPED."""

    async def run() -> tuple[list[ReportKind], int]:
        svc, _ = await _pool(linger_s=1.0)
        svc.timers.tick_s = 1e9  # no tick comes within the test
        svc.timers.busy_per_tick = 0  # (as busy)
        svc.driver.feed(_starts([0.0]))
        await asyncio.sleep(0.01)
        stop = StopTasks(lm=LmId("lm0"), epoch=1, tasks=(
            StopTask(user=UserId("u"), task_id=TaskId("t0"), attempt=1, node=NodeIndex(0),
                     gm=GmId("gm0")),
        ))  # fmt: skip
        assert svc.refusal() is None  # (as the service's routes ask before the feed)
        answer = svc.driver.feed(stop)
        assert isinstance(answer, WorkerReports)
        await asyncio.sleep(0.01)  # its report leaves
        await svc.close()
        return [r.kind for r in answer.reports], svc.core.counters.finished

    kinds, finished = asyncio.run(run())
    assert finished == 1
    assert kinds == [ReportKind.STOPPED]  # confirmed: it runs here no more (it ended)


def test_how_late_the_messages_were_fed_is_summed() -> None:
    async def run() -> DueTimers:
        timers = DueTimers(lambda m: None, tick_s=10.0, busy_per_tick=0)
        timers.after(After(0.0, _due(0)))
        await asyncio.sleep(0.03)
        timers.run_due()
        return timers

    timers = asyncio.run(run())
    assert timers.fed == 1
    assert 0.02 <= timers.late_s < 10.0
