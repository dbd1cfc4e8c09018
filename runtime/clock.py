"""The services' clock: wall time read once, then advanced by a clock that never steps.

Every lease, liveness and fencing decision compares two readings of the clock a core
is fed (``CoreDriver.clock``).  Fed ``time.time``, a pool whose host's clock steps back
while it is cut off sees its lease as fresh for as long as the step, and runs on while
its LM gives its nodes up and runs their tasks elsewhere (issue 32, item 6).

``SteadyClock`` reads the wall clock once, when the process starts, and from then on
adds the time elapsed on ``CLOCK_BOOTTIME`` (Linux: monotonic, and it counts a host
suspended or a VM paused as time gone by, as a lease must) or ``time.monotonic``
elsewhere.  Its readings stay close to wall time, so the times cores put in reports
(started, finished) still compare across hosts, but a step of the wall clock (an
operator's ``date -s``, NTP stepping) moves them not at all.  ``observe`` notes such a
step (``steps``, ``offset_s`` on every service's state page): an operator sees that
this host's wall clock and the services' clock parted, and by how much.

``wall`` is the wall clock as the services read it: ``time.time``, plus, in a process
of a chaos run only, the seconds of its ``clock_step`` fault (``runtime.faults``): the
``clock-step`` scenario steps one process's clock through it.  (libfaketime, the
Debian way to step one process's clock, leaves CLOCK_MONOTONIC alone only with
``FAKETIME_DONT_FAKE_MONOTONIC``, and then Python 3.11's ``time.sleep`` fails with
EINVAL, which gunicorn's arbiter calls: hence this hook; docs/chaos.md.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runtime import faults

CLOCK_STEP = "clock_step"
"""The fault that steps this process's wall clock by its value, in seconds."""


def wall() -> float:
    """The wall clock: ``time.time`` (stepped by a chaos run's ``clock_step``)."""
    return time.time() + faults.value(CLOCK_STEP)


def _elapsed_source() -> Callable[[], float]:
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic
    return lambda: time.clock_gettime(boottime)


STEP_S = 1.0
"""A wall clock that parts from the steady one by more than this since the last look
has stepped (NTP slews by at most 0.5 ms per second)."""


class SteadyClock:
    """Wall time at the start plus monotonic time since: never steps, never goes back."""

    __slots__ = ("_elapsed", "_offset", "_wall", "offset_s", "steps")

    def __init__(
        self,
        wall: Callable[[], float] = wall,
        elapsed: Callable[[], float] | None = None,
    ) -> None:
        self._wall = wall
        self._elapsed = elapsed or _elapsed_source()
        self._offset = wall() - self._elapsed()
        self.offset_s = 0.0
        """The wall clock minus this one, at the last look (``observe``)."""
        self.steps = 0
        """Steps of the wall clock seen so far."""

    def __call__(self) -> float:
        return self._offset + self._elapsed()

    def observe(self) -> float:
        """Compare with the wall clock; a change of their difference by more than
        ``STEP_S`` since the last look counts as a step.  Returns the difference."""
        offset = self._wall() - self()
        if abs(offset - self.offset_s) > STEP_S:
            self.steps += 1
        self.offset_s = offset
        return offset

    def page(self) -> dict[str, Any]:
        """What a state page shows of it."""
        self.observe()
        return {"steady": self(), "wall": self._wall(), "offset_s": self.offset_s,
                "steps": self.steps}  # fmt: skip


steady = SteadyClock()
"""This process's clock: every core's driver reads it (``runtime.driver``)."""
