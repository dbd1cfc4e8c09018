"""What the operator's terminal shows, without a federation: plain tables, progress
lines, a bench summary's counters, ``megha top`` with a service down."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest

from megha_cli.live import bench_sections
from megha_cli.ops import top_sections, why_sections
from megha_cli.progress import Progress, eta
from megha_cli.terminal import LiveTables, Section, columns, render_plain, show, terminal_size


def test_plain_columns_right_align_numbers_and_left_align_text() -> None:
    lines = columns(["name", "n", "t"], [["gm0", "7", "1.5ms"], ["lm10", "12", "-"]])
    assert lines == ["name   n  t", "gm0    7  1.5ms", "lm10  12  -"]


def test_show_is_plain_text_when_not_a_terminal() -> None:
    out = io.StringIO()
    show([Section("T", ["a"], [["x"]], ["note"])], stream=out)
    assert out.getvalue() == "T\n  a\n  x\n  note\n"


def test_progress_lines_when_not_a_terminal_and_nothing_when_quiet() -> None:
    out = io.StringIO()
    with Progress("sim", 10, stream=out, every_s=3600) as bar:
        bar.update(2, virtual_s=5.0)
        bar.update(5, virtual_s=9.0)  # within every_s: no second line
        bar.note("a note")
        bar.update(10, virtual_s=20.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sim: 2/10 tasks ( 20.0%)  virtual 5 s  wall 0:00  ETA ")
    assert lines[1] == "a note"
    assert lines[2].startswith("sim: 10/10 tasks (100.0%)  virtual 20 s  wall ")
    assert "ETA" not in lines[2]
    assert len(lines) == 3
    quiet = io.StringIO()
    with Progress("sim", 10, stream=quiet, quiet=True) as bar:
        bar.update(10)
        bar.note("x")
    assert quiet.getvalue() == ""


def test_eta_is_the_rate_so_far() -> None:
    assert eta(0, 10, 5.0) is None
    assert eta(5, 10, 5.0) == 5.0
    assert eta(10, 10, 5.0) == 0.0


def _summary(counters: dict[str, int]) -> dict[str, Any]:
    p = dict.fromkeys(("p50", "p90", "p99", "p999", "max", "mean"), 0.001)
    return {
        "allocation_time_s": p, "components_s": {"queueing": p}, "submission_s": p,
        "tasks": 3, "tasks_finished": 3, "tasks_failed": 0, "unfinished_tasks": 0,
        "duplicate_launches": 0, "throughput_tasks_per_s": 1.0, "floor_rtt_s": 0.0003,
        "floor": {"lm_during_run_s": {"p50": 0.0004}}, "counters": counters,
    }  # fmt: skip


def test_a_bench_summary_lists_only_counters_that_are_not_zero() -> None:
    none = render_plain(bench_sections(_summary({"requeues": 0, "preemptions": 0})))
    assert "this run's counters: none" in none
    assert "requeues" not in none
    some = render_plain(bench_sections(_summary({"requeues": 4, "preemptions": 0})))
    assert "this run's counters (not zero)" in some
    assert "requeues" in some
    assert "preemptions" not in some


def test_top_shows_a_service_that_does_not_answer() -> None:
    gm_page = {
        "ready": True, "totals": {"queued": 3, "waiting": 0, "in_flight": 1, "running": 2},
        "recently_ended": {"finished": 5, "failed": 1},
        "users": {"u0": {"dominant_share": 0.25, "share": 0.5}},
    }  # fmt: skip
    pages: dict[str, dict[str, dict[str, Any]]] = {
        "gms": {"gm0": gm_page, "gm1": {"error": "refused"}},
        "lms": {},
    }
    text = render_plain(top_sections(pages, None, "head"))
    rows = [ln.split() for ln in text.splitlines()]
    assert ["gm0", "ready", "3", "0", "1", "2", "5/1", "u0", "0.25/0.50"] in rows
    assert ["gm1", "unreachable:", "refused"] in rows
    assert "broker: unreachable" in text


def test_why_shows_steps_relative_to_submission_with_repeats() -> None:
    answer = {
        "gm": "gm0", "user": "u0", "task_id": "t1", "job_id": "j", "state": "in_flight",
        "attempt": 2, "lm": "", "submitted_at": 100.0, "started_at": -1.0, "finished_at": -1.0,
        "timeline": [
            {"at": 100.0, "what": "submitted"},
            {"at": 100.5, "what": "waits", "detail": "no_free_resources", "count": 3,
             "last_at": 101.25},
            {"at": 102.0, "what": "launch", "lm": "lm1", "node": 4, "partition": "gm1"},
        ],
        "timeline_dropped": 0, "why": ["a launch request to lm1 is unanswered (attempt 2)"],
    }  # fmt: skip
    text = render_plain(why_sections(answer))
    assert "u0/t1 (job j) at gm0: in flight" in text
    rows = [ln.split() for ln in text.splitlines()]
    assert ["+0.500s", "waits", "no_free_resources", "x3", "until", "+1.250s"] in rows
    assert ["+2.000s", "launch", "lm1", "4", "gm1"] in rows
    assert "  - a launch request to lm1 is unanswered (attempt 2)" in text


# ------------------------------------------------------- the terminal's real width
class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal (no file descriptor: its size is the
    environment's)."""

    def isatty(self) -> bool:
        return True


WIDE = [Section("wide", [f"column {i}" for i in range(12)], [[f"cell {i:03d}" for i in range(12)]])]
"""A table of about 130 columns."""


def _longest(text: str) -> int:
    return max(len(ln.rstrip()) for ln in text.splitlines())


def test_rich_tables_take_the_terminals_width_even_when_term_is_dumb(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TERM", "dumb")  # rich alone would take 80 columns
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("LINES", "50")
    out = FakeTerminal()
    show(WIDE, stream=out)
    assert 120 < _longest(out.getvalue()) <= 200
    assert _rows_of_cells(out.getvalue()) == 1  # not wrapped


def test_the_terminal_size_is_the_environments_then_the_terminals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "123")
    monkeypatch.setenv("LINES", "45")
    assert tuple(terminal_size()) == (123, 45)
    monkeypatch.delenv("COLUMNS")
    monkeypatch.delenv("LINES")
    monkeypatch.setattr(os, "get_terminal_size", lambda *_: os.terminal_size((150, 40)))
    assert tuple(terminal_size()) == (150, 40)

    def no_terminal(*_: object) -> os.terminal_size:
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert tuple(terminal_size()) == (80, 24)


def _rows_of_cells(text: str) -> int:
    """Rows holding the wide table's first cell (1: not wrapped)."""
    return len([ln for ln in text.splitlines() if "cell 000" in ln and "cell 011" in ln])


def test_live_tables_follow_a_resized_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("LINES", "40")
    monkeypatch.setenv("COLUMNS", "100")
    out = FakeTerminal()
    live = LiveTables(out)
    assert live.in_place
    live.start()
    try:
        live.update(WIDE)
        assert live.console.size == (100, 40)
        assert _rows_of_cells(out.getvalue()) == 0  # 100 columns: wrapped
        monkeypatch.setenv("COLUMNS", "180")  # the window grew
        live.redraw()  # as on SIGWINCH
        assert live.console.size == (180, 40)
        before = len(out.getvalue())
        live.update(WIDE)
        drawn = out.getvalue()[before:]
    finally:
        live.stop()
    assert _rows_of_cells(drawn) == 1


def test_live_tables_on_a_dumb_terminal_print_each_refresh_at_its_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TERM", "dumb")  # no cursor moves: rich.Live would show nothing
    monkeypatch.setenv("LINES", "40")
    monkeypatch.setenv("COLUMNS", "180")
    out = FakeTerminal()
    live = LiveTables(out)
    assert not live.in_place
    live.start()
    live.update(WIDE)
    live.update(WIDE)
    live.stop()
    assert _rows_of_cells(out.getvalue()) == 2
