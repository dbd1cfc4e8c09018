"""Tables for the operator's terminal: ``rich`` tables on a TTY, aligned plain text
otherwise (or with ``--quiet``), from the same rows.

A command builds ``Section`` values (a title, column headers, rows of strings) once;
``show`` prints them either way.  ``plain`` decides: plain text when asked, or when
the stream is not a terminal (a pipe, a file, a test's capture).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any


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
    from rich.console import Console

    Console(file=out).print(render_rich(sections))
