"""Progress of a long command on stderr: tasks done of the total, virtual time (a
simulation) beside wall time, and the time left.

On a terminal a ``rich`` progress bar; otherwise (a pipe, a log file) one plain line
at most every ``every_s`` seconds; with ``quiet`` nothing.  ``megha simulate`` and
``megha bench`` / ``megha demo`` report through it.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

from megha_cli.terminal import console


def eta(done: int, total: int, wall_s: float) -> float | None:
    """Seconds left at the rate so far (None before anything is done)."""
    if done <= 0 or total <= 0:
        return None
    return max(0.0, wall_s * (total - done) / done)


def _clock(s: float | None) -> str:
    if s is None:
        return "-:--"
    m, sec = divmod(int(s + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """One bar: ``update(done, virtual_s=...)`` as work goes on; ``note`` for a line."""

    def __init__(
        self,
        label: str,
        total: int,
        *,
        quiet: bool = False,
        stream: IO[str] | None = None,
        every_s: float = 1.0,
    ) -> None:
        self.label = label
        self.total = total
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.rich = not quiet and self.stream.isatty()
        self._bar: Any = None
        self._task: Any = None
        self._t0 = time.perf_counter()
        self._last = -1.0
        self.done = 0
        self._extra = ""

    def __enter__(self) -> Progress:
        self._t0 = time.perf_counter()
        if self.rich:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as Bar,
            )

            self._bar = Bar(
                TextColumn("{task.description:<12}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("tasks {task.fields[extra]}"),
                TextColumn("wall"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=console(self.stream),
            )
            self._bar.start()
            # total 0: not known yet (a streamed trace), an open-ended bar
            self._task = self._bar.add_task(self.label, total=self.total or None, extra="")
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        # a run that failed has no final count to show: its error says what happened
        if self._bar is not None:
            self._bar.live.transient = exc_type is not None
            self._bar.stop()
            self._bar = None
        elif not self.quiet and exc_type is None:
            self._line(final=True)

    def update(
        self,
        done: int,
        *,
        total: int | None = None,
        virtual_s: float | None = None,
        detail: str = "",
    ) -> None:
        """``done`` of ``total`` tasks are done (at virtual time ``virtual_s``; ``detail``:
        more to say, e.g. how many were submitted)."""
        self.done = done
        if total is not None:
            self.total = total
        parts = [detail] if detail else []
        if virtual_s is not None:
            parts.append(f"virtual {virtual_s:,.0f} s")
        extra = self._extra = "  ".join(parts)
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=self.total or None, extra=extra)
            return
        now = time.perf_counter()
        if (done < self.total or not self.total) and (
            self._last < 0 or now - self._last >= self.every_s
        ):
            self._last = now
            self._line()

    def note(self, text: str) -> None:
        """A line of its own (above the bar on a terminal)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def _line(self, final: bool = False) -> None:
        wall = time.perf_counter() - self._t0
        extra = self._extra
        if not self.total:  # not known yet: what is done so far
            print(f"{self.label}: {self.done} tasks{'  ' + extra if extra else ''}  "
                  f"wall {_clock(wall)}", file=self.stream, flush=True)  # fmt: skip
            return
        pct = 100.0 * self.done / self.total
        left = "" if final else f"  ETA {_clock(eta(self.done, self.total, wall))}"
        print(
            f"{self.label}: {self.done}/{self.total} tasks ({pct:5.1f}%)"
            f"{'  ' + extra if extra else ''}  wall {_clock(wall)}{left}",
            file=self.stream,
            flush=True,
        )
