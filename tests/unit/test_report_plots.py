"""The allocation-time CDF of a run where no task started (an empty workload, every
task refused) is still a plot a user keeps, drawn without warnings (pytest turns
them into errors)."""

from __future__ import annotations

from pathlib import Path

from reporting.plots import plot_cdfs


def test_a_cdf_with_no_started_task_is_drawn_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "cdf.png"
    plot_cdfs(out, {"megha": [], "sparrow": []}, "nothing started")
    assert out.stat().st_size > 0


def test_a_cdf_with_tasks_is_drawn(tmp_path: Path) -> None:
    out = tmp_path / "cdf.png"
    plot_cdfs(out, {"megha": [0.001, 0.002, 0.5], "sparrow": []}, "some started")
    assert out.stat().st_size > 0
