"""Tables for the operator's terminal: ``rich`` tables on a TTY, aligned plain text
otherwise (or with ``--quiet``), from the same rows.

A command builds ``Section`` values (a title, column headers, rows of strings) once;
``show`` prints them either way.  ``plain`` decides: plain text when asked, or when
the stream is not a terminal (a pipe, a file, a test's capture).

``rich`` is always given the terminal's real size (``terminal_size``): left to itself it
takes 80 x 25 whenever ``TERM`` is ``dumb`` or ``unknown`` (an IDE's terminal, some
``ssh`` and ``screen`` set-ups), and wraps every wide table there.  ``LiveTables`` (``megha
top``) reads the size again at each refresh, so it follows a resized terminal.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from common.metrics import PERCENTILE_KEYS

INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it."""

FALLBACK_SIZE = (80, 24)
"""Columns and lines when neither the environment nor any terminal says."""


@dataclass(frozen=True, slots=True)
class Section:
    """One table: ``rows`` of cells under ``headers`` (cells are already text)."""

    title: str
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    notes: Sequence[str] = field(default_factory=tuple)
    """Lines printed under the table (what does not fit in columns)."""


def plain(quiet: bool, stream: IO[str] | None = None) -> bool:
    """Plain text: asked for (``--quiet``), or ``stream`` (stdout) is not a terminal."""
    s = stream if stream is not None else sys.stdout
    return quiet or not s.isatty()


def terminal_size(stream: IO[str] | None = None) -> os.terminal_size:
    """The terminal's columns and lines: ``COLUMNS`` and ``LINES`` where set, else the
    size of the terminal stdout is on (``shutil.get_terminal_size``), else of the one
    ``stream`` is on, else ``FALLBACK_SIZE``."""
    cols, lines = shutil.get_terminal_size((0, 0))
    if (cols <= 0 or lines <= 0) and stream is not None:
        try:
            real = os.get_terminal_size(stream.fileno())
        except (AttributeError, ValueError, OSError):  # not a terminal (a test's capture)
            pass
        else:
            cols, lines = cols if cols > 0 else real.columns, lines if lines > 0 else real.lines
    return os.terminal_size(
        (cols if cols > 0 else FALLBACK_SIZE[0], lines if lines > 0 else FALLBACK_SIZE[1])
    )


def console(stream: IO[str] | None = None) -> Any:
    """A ``rich`` console on ``stream`` (stdout) at the terminal's real size."""
    from rich.console import Console

    out = stream if stream is not None else sys.stdout
    cols, lines = terminal_size(out)
    return Console(file=out, width=cols, height=lines)


def columns(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned plain-text lines: numbers right-aligned, text left-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [all(_numeric(r[i]) for r in rows) and bool(rows) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric, strict=True)
        ]
        return "  ".join(out).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _numeric(cell: str) -> bool:
    """A number, maybe with a unit (``1.06ms``, ``-3``, ``12/40``): right-aligned."""
    return cell[:1].isdigit() or (cell[:1] == "-" and cell[1:2].isdigit())


def render_plain(sections: Sequence[Section]) -> str:
    out: list[str] = []
    for s in sections:
        if out:
            out.append("")
        if s.title:
            out.append(s.title)
        if s.headers:
            out.extend("  " + ln for ln in columns(s.headers, s.rows))
        out.extend("  " + n for n in s.notes)
    return "\n".join(out)


def render_rich(sections: Sequence[Section]) -> Any:
    """A ``rich`` renderable of ``sections`` (tables one under another)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for s in sections:
        if s.headers:
            table = Table(title=s.title or None, title_justify="left", expand=False)
            for i, h in enumerate(s.headers):
                num = bool(s.rows) and all(_numeric(r[i]) for r in s.rows)
                table.add_column(h, justify="right" if num else "left")
            for row in s.rows:
                table.add_row(*row)
            parts.append(table)
        elif s.title:
            parts.append(Text(s.title, style="bold"))
        parts.extend(Text(n) for n in s.notes)
    return Group(*parts)


def show(
    sections: Sequence[Section], *, quiet: bool = False, stream: IO[str] | None = None
) -> None:
    """Print ``sections``: rich tables on a terminal, plain text otherwise."""
    out = stream if stream is not None else sys.stdout
    if plain(quiet, out):
        print(render_plain(sections), file=out, flush=True)
        return
    console(out).print(render_rich(sections))


class LiveTables:
    """Sections shown live on a terminal (``rich.live.Live``), redrawn in place at the
    terminal's size as it is at each ``update`` or ``redraw`` (call it on ``SIGWINCH``):
    a resized terminal gets tables of its new width, not of the size it had at start.
    A terminal that cannot move its cursor (``TERM=dumb``), where ``Live`` would show
    nothing until it stops, gets the tables printed one set after another instead."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        from rich.live import Live

        self.stream = stream if stream is not None else sys.stdout
        self.console = console(self.stream)
        self.in_place = not self.console.is_dumb_terminal
        self.live = Live(console=self.console, refresh_per_second=4) if self.in_place else None

    def start(self) -> None:
        if self.live is not None:
            self.live.start()

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()

    def refit(self) -> None:
        """Take the terminal's current size."""
        self.console.size = terminal_size(self.stream)

    def update(self, sections: Sequence[Section]) -> None:
        self.refit()
        if self.live is None:
            self.console.print(render_rich(sections))
            self.console.print()
            return
        self.live.update(render_rich(sections), refresh=True)

    def redraw(self) -> None:
        """Draw the last sections again at the terminal's current size (in place only)."""
        self.refit()
        if self.live is not None:
            self.live.refresh()


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) < 1e-3:
        return f"{x * 1e6:.0f}us"
    if abs(x) < 1:
        return f"{x * 1e3:.2f}ms"
    return f"{x:.2f}s"


def percentile_cells(rows: Mapping[str, Mapping[str, float]]) -> list[list[str]]:
    """One row of cells per label: the label, then each percentile with its unit."""
    return [[label, *(_fmt(p[k]) for k in PERCENTILE_KEYS)] for label, p in rows.items()]
