"""Leases and liveness on a steady clock (issue 32, item 6): a step of a host's wall
clock reaches no lease, liveness or fencing decision (``runtime.clock``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from common.effects import Reply, ToLm
from common.ids import GmId, LmId
from common.messages import (
    CheckLease,
    LeaseRenewed,
    ReportKind,
    StartTask,
    StartTasks,
    WorkerReport,
)
from runtime import faults
from runtime.clock import CLOCK_STEP, SteadyClock, wall
from tests.conftest import make_task
from worker.core import WorkerPool

ROOT = Path(__file__).resolve().parents[2]


class Host:
    """A host's two clocks, moved by hand: the wall clock (stepped) and elapsed time."""

    def __init__(self) -> None:
        self.wall_s = 1_700_000_000.0
        self.elapsed_s = 100.0

    def wall(self) -> float:
        return self.wall_s

    def elapsed(self) -> float:
        return self.elapsed_s

    def wait(self, s: float) -> None:
        self.wall_s += s
        self.elapsed_s += s


def test_the_steady_clock_starts_at_wall_time_and_ignores_its_steps() -> None:
    host = Host()
    clock = SteadyClock(host.wall, host.elapsed)
    assert clock() == host.wall_s
    host.wait(5.0)
    host.wall_s -= 3600.0  # date -s, or NTP stepping
    assert clock() == 1_700_000_005.0
    host.wait(1.0)
    assert clock() == 1_700_000_006.0


def test_observe_counts_a_step_not_a_slew() -> None:
    host = Host()
    clock = SteadyClock(host.wall, host.elapsed)
    host.wall_s += 0.01  # NTP slewing: no step
    assert abs(clock.observe() - 0.01) < 1e-6
    assert clock.steps == 0
    host.wall_s -= 3600.0
    assert round(clock.observe()) == -3600
    assert clock.steps == 1
    host.wait(2.0)  # still 1 h off: the same step
    clock.observe()
    assert clock.steps == 1
    page = clock.page()
    assert page["steps"] == 1
    assert round(page["offset_s"]) == -3600


def _running_pool(now: float) -> WorkerPool:
    pool = WorkerPool(LmId("lm0"), 2, lease_s=0.9)
    pool.handle(LeaseRenewed(sent=now), now)
    spec = make_task(duration=60.0)
    start = StartTask(node=0, spec=spec, attempt=1, gm=GmId("gm0"))  # type: ignore[arg-type]
    pool.handle(StartTasks(lm=LmId("lm0"), epoch=1, tasks=(start,)), now)
    assert len(pool.running) == 1
    return pool


def _lost(pool: WorkerPool, now: float) -> list[ReportKind]:
    effects = pool.handle(CheckLease(lease=0.9), now)
    return [e.msg.kind for e in effects if isinstance(e, ToLm) and isinstance(e.msg, WorkerReport)]


def test_a_pool_cut_off_fences_itself_though_its_wall_clock_stepped_back() -> None:
    """Cut off for 10 s while its wall clock steps back 1 h: on the steady clock its
    lease has run out and it stops its task; on the wall clock it would run on for an
    hour while its LM gives the node up and runs the task elsewhere."""
    host = Host()
    clock = SteadyClock(host.wall, host.elapsed)
    on_steady = _running_pool(clock())
    on_wall = _running_pool(host.wall())
    host.wait(10.0)
    host.wall_s -= 3600.0
    assert _lost(on_steady, clock()) == [ReportKind.LOST]
    assert on_steady.running == {}
    assert _lost(on_wall, host.wall()) == []  # what feeding the cores time.time did


def test_the_chaos_hook_steps_the_wall_clock_only() -> None:
    """``clock_step`` (a chaos run's fault) moves ``wall``; the steady clock made
    before it does not follow."""
    clock = SteadyClock()
    before = clock()
    faults_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"megha-clock-{os.getpid()}"
    faults.set_value(faults_dir, "p", CLOCK_STEP, -3600.0)
    os.environ[faults.FAULTS_DIR_ENV] = str(faults_dir)
    try:
        faults.arm("p")
        assert wall() < clock() - 3500
        assert clock() >= before
        assert round(clock.observe()) == -3600
        assert clock.steps == 1
    finally:
        del os.environ[faults.FAULTS_DIR_ENV]
        faults.arm("p")
        (faults_dir / "p" / CLOCK_STEP).unlink()


DRIVEN = textwrap.dedent(
    """
    import time
    real = time.time
    step = [0.0]
    time.time = lambda: real() + step[0]   # this process's wall clock, steppable
    from runtime.driver import CoreDriver
    from runtime.supervisor import Supervisor

    class Core:
        seen = []
        def handle(self, msg, now):
            self.seen.append(now)
            return []

    core = Core()
    driver = CoreDriver(core, Supervisor("t"))
    driver.feed(1)
    step[0] = -3600.0
    driver.feed(2)
    print(core.seen[1] - core.seen[0])
    """
)


def test_the_driver_feeds_cores_a_clock_a_wall_step_does_not_reach() -> None:
    """A service's driver (its default clock) gives its core no time that went back
    when ``time.time`` stepped back 1 h (a fresh interpreter: the step is real there)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", DRIVEN], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert 0.0 <= float(out) < 60.0


def _start(task_id: str, sent: float) -> StartTasks:
    spec = make_task(duration=60.0, task_id=task_id)
    start = StartTask(node=1, spec=spec, attempt=1, gm=GmId("gm0"))  # type: ignore[arg-type]
    return StartTasks(lm=LmId("lm0"), epoch=1, tasks=(start,), sent=sent)


def _kinds(effects: list[object]) -> list[ReportKind]:
    (reply,) = [e for e in effects if isinstance(e, Reply)]
    return [r.kind for r in reply.msg.reports]  # type: ignore[attr-defined]


def test_a_start_sent_before_a_lapse_is_not_run_when_a_renewal_came_first() -> None:
    """The clock-step race (one run in three): lm0's start left at t=1.5 as its pool
    froze; the pool woke at 12, its heartbeat's answer (sent at 12) renewed the lease
    before the start, read from its socket, was handled, and it ran the attempt its LM
    had given up at 9.5 and run elsewhere.  Now a start sent before the renewal that
    ended the lapse goes back LOST; one sent after it runs."""
    pool = _running_pool(1.0)
    stale = _start("stale", sent=1.5)
    assert _lost(pool, 12.0) == [ReportKind.LOST]  # the wake: fenced
    pool.handle(LeaseRenewed(sent=12.0), 12.05)  # the heartbeat's answer came first
    assert pool.regained == 12.0
    assert _kinds(pool.handle(stale, 12.1)) == [ReportKind.LOST]
    assert "stale" not in {k[1] for k in pool.running}
    assert _kinds(pool.handle(_start("fresh", sent=12.2), 12.3)) == [ReportKind.STARTED]
    # without a time (the simulator, an older LM) nothing changes
    assert _kinds(pool.handle(_start("untimed", sent=-1.0), 12.4)) == [ReportKind.STARTED]


def test_a_renewal_without_a_lapse_makes_no_start_stale() -> None:
    pool = _running_pool(1.0)
    pool.handle(LeaseRenewed(sent=1.5), 1.6)  # within the lease: no lapse
    assert pool.regained == -1.0
    assert _kinds(pool.handle(_start("t", sent=1.2), 1.7)) == [ReportKind.STARTED]
