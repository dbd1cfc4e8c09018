"""The dashboard's aggregation (``megha_cli.dashboard.aggregate``): counters over the
last minute, allocation times from the GMs' pages, and the board's snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from common.metrics import LmCounters
from megha_cli.dashboard.aggregate import (
    EDGES_S,
    Board,
    Curve,
    Layout,
    allocation_summary,
    histogram,
    metric_totals,
)
from runtime.prometheus import ServiceMetrics

GM_COUNTERS = (
    "tasks_finished", "failed", "preempted_requeued", "lost_with_lm",
    "internal_inconsistencies", "external_inconsistencies",
)  # fmt: skip
LM_COUNTERS = ("preemptions", "repartitions", "launches")


def gm_page(
    queued: int = 0,
    inflight: int = 0,
    running: int = 0,
    recent: list[list[float]] | None = None,
    **counters: int,
) -> dict[str, Any]:
    return {
        "ready": True,
        "allocations": {"window_s": 60.0, "recent": recent or []},
        "queued": queued,
        "inflight": inflight,
        "running_tasks": running,
        "queues": {"u0": queued},
        "shares": {"u0": 0.25},
        "counters": {**dict.fromkeys(GM_COUNTERS, 0), **counters},
    }


def lm_page(
    lm: str, epoch: int = 1, free: list[list[int]] | None = None, active: bool = True, **c: int
) -> dict[str, Any]:
    return {
        "lm": lm,
        "active": active,
        "epoch": epoch,
        "nodes_alive": 4,
        "running_tasks": 0,
        "logical_nodes": c.get("repartitions", 0),
        "free": free if free is not None else [[1], [1], [1], [1]],
        "counters": {**dict.fromkeys(LM_COUNTERS, 0), **c},
    }


LAYOUT = Layout(
    name="t",
    gms=("gm0", "gm1"),
    lms=("lm0", "lm1"),
    processes={"lm0": ("lm0",), "lm1": ("lm1", "lm1-standby")},
    homes={"lm0": ("gm0", "gm0", "gm1", "gm1"), "lm1": ("gm1", "gm0", "gm1", "gm0")},
    users=(("u0", "gm0", 0.5), ("u1", "gm1", 0.5)),
)


# ------------------------------------------------------------------- curves
def test_curve_interpolates_and_inverts() -> None:
    c = Curve()
    for t, v in [(0.0, 0.0), (1.0, 10.0), (2.0, 10.0), (3.0, 40.0)]:
        c.add(t, v)
    assert c.at(0.5) == pytest.approx(5.0)
    assert c.at(2.5) == pytest.approx(25.0)
    assert c.at(-1.0) == 0.0
    assert c.at(9.0) == 40.0
    assert c.when(5.0) == pytest.approx(0.5)
    assert c.when(10.0) == pytest.approx(1.0)  # the first time it got there
    assert c.when(25.0) == pytest.approx(2.5)
    assert c.when(41.0) is None


def test_a_counter_that_falls_began_anew() -> None:
    c = Curve()
    assert c.add(0.0, 10.0) == 10.0
    assert c.add(1.0, 20.0) == 20.0
    assert c.add(2.0, 5.0) == 25.0  # the process restarted and counted 5 since
    assert c.add(3.0, 7.0) == 27.0
    held = Curve(restarts=False)
    held.add(0.0, 10.0)
    assert held.add(1.0, 4.0) == 10.0


def test_rate_is_over_the_last_minute_or_since_the_first_sample() -> None:
    c = Curve()
    for t in range(121):
        c.add(float(t), 2.0 * t)  # 2 per second
    assert c.per_minute(120.0) == pytest.approx(120.0)
    young = Curve()
    young.add(0.0, 0.0)
    young.add(10.0, 5.0)
    assert young.per_minute(10.0) == pytest.approx(30.0)
    assert Curve().per_minute(5.0) == 0.0


def test_old_samples_are_forgotten_but_one_is_kept_before_the_horizon() -> None:
    c = Curve(keep_s=10.0)
    for t in range(100):
        c.add(float(t), float(t))
    assert c.times[0] <= 99 - 10
    assert len(c.times) <= 12
    assert c.at(89.5) == pytest.approx(89.5)


# ------------------------------------------------------------ allocation
def test_allocation_summary_is_over_the_last_minute_of_every_gm() -> None:
    pages = [
        {"allocations": {"recent": [[10.0, 5.0], [50.0, 0.002], [69.0, 0.004]]}},
        {"allocations": {"recent": [[70.0, 0.003], [70.0, -1.0]]}},  # -1: never started
        {},  # a GM of an older version: no list
    ]
    s = allocation_summary(pages, 70.0)
    assert s["tasks"] == 3  # 10.0 is older than a minute
    assert s["p50_s"] == pytest.approx(0.003)
    assert s["mean_s"] == pytest.approx(0.003)
    assert sum(s["counts"]) == 3


def test_histogram_bins() -> None:
    counts = histogram([0.0, 0.0009, 0.001, 0.0015, 31.0, 1000.0])
    assert len(counts) == len(EDGES_S) + 1
    assert counts[0] == 2
    assert counts[1] == 2
    assert counts[-1] == 2
    assert sum(counts) == 6


def test_board_counts_services_and_draws_partitions() -> None:
    b = Board(LAYOUT)
    b.observe(0.0, "gm0", gm_page(queued=3))
    b.observe(0.0, "gm1", None, "connection refused")
    b.observe(0.0, "lm0", lm_page("lm0", free=[[1], [0], [2], [0]]))
    b.observe(0.0, "lm1", None, "connection refused")
    b.observe(0.0, "lm1-standby", lm_page("lm1", active=False))
    b.observe_broker(0.0, False)
    s = b.snapshot(0.0)
    assert s["counts"] == {"gms": 2, "gms_up": 1, "lms": 2, "lms_up": 2}
    lm0, lm1 = s["lms"]
    assert lm0["avail"] == "1010"
    assert lm0["partitions"] == {"gm0": "1100", "gm1": "0011"}
    assert lm1["partitions"] == {"gm0": "0101", "gm1": "1010"}
    assert lm1["active"] is None
    assert lm1["stale"]
    assert [p["role"] for p in lm1["processes"]] == ["down", "standby"]
    assert s["users"][0] == {
        "user": "u0", "gm": "gm0", "queue": 3, "dominant_share": 0.25, "share": 0.5
    }  # fmt: skip
    assert s["users"][1]["queue"] is None  # its GM is down
    assert s["broker"] == {"up": False}
    whats = {(e["who"], e["what"]) for e in s["events"]}
    assert ("gm1", "down (connection refused)") in whats
    assert ("broker", "down (no TCP connection)") in whats


def test_board_reports_lm_down_repartitions_and_new_epochs() -> None:
    b = Board(LAYOUT)
    b.observe(0.0, "lm0", lm_page("lm0", epoch=5))
    b.observe(1.0, "lm0", lm_page("lm0", epoch=5, repartitions=3))
    b.observe(2.0, "lm0", None, "timeout")
    s = b.snapshot(2.0)
    assert not s["lms"][0]["up"]
    assert s["lms"][0]["stale"]
    assert s["lms"][0]["epoch"] == 5  # last known, shown faded
    b.observe(3.0, "lm0", lm_page("lm0", epoch=9))
    events = [e["what"] for e in b.snapshot(3.0)["events"]]
    assert events[:4] == [
        "new incarnation, epoch 9",
        "up again",
        "down (timeout)",
        "+3 repartitions (logical nodes now 3)",
    ]


def test_board_rates_survive_restarts_and_sum_services() -> None:
    b = Board(LAYOUT)
    for t in range(61):
        b.observe(float(t), "gm0", gm_page(internal_inconsistencies=t))
        b.observe(float(t), "gm1", gm_page(external_inconsistencies=2 * t))
        # lm0 restarts at t = 30: its counters begin anew
        b.observe(float(t), "lm0", lm_page("lm0", preemptions=t if t < 30 else t - 30))
    s = b.snapshot(60.0)
    assert s["rates_per_min"]["inconsistencies"] == pytest.approx(180.0)
    assert s["rates_per_min"]["preemptions"] == pytest.approx(59.0)


def test_board_allocation_from_gm_pages() -> None:
    """The allocation figures are those the GMs list; a GM that is down counts out."""
    b = Board(LAYOUT)
    for t in range(31):
        recent = [[float(x), 0.5] for x in range(t + 1)]
        b.observe(float(t), "gm0", gm_page(running=10, tasks_finished=10 * t, recent=recent))
    a = b.snapshot(30.0)["allocation"]
    assert a["tasks"] == 31
    assert a["p50_s"] == pytest.approx(0.5)
    assert a["p99_s"] == pytest.approx(0.5)
    assert b.snapshot(30.0)["rates_per_min"]["allocations"] == pytest.approx(600.0)
    b.observe(31.0, "gm0", None, "connection refused")
    assert b.snapshot(31.0)["allocation"]["tasks"] == 0


def _metrics_text(requests: int, refused: int) -> str:
    """A ``/metrics`` page exactly as a service renders it."""
    m = ServiceMetrics("megha_lm", lambda: LmCounters(launches=7), lambda: {"epoch": 3})
    m.requests.labels("/v1/launch").inc(requests)
    if refused:
        m.errors.labels("bad_signature").inc(refused)
    return m.render().decode()


def test_metrics_pages_give_requests_and_refusals() -> None:
    assert metric_totals(_metrics_text(5, 2)) == {"http_requests": 5.0, "http_refused": 2.0}
    assert metric_totals(_metrics_text(0, 0)) == {"http_requests": 0.0, "http_refused": 0.0}
    b = Board(LAYOUT)
    for t in range(0, 61, 5):
        b.observe_metrics(float(t), "lm0", _metrics_text(10 * t, t))
        b.observe_metrics(float(t), "lm1-standby", _metrics_text(t, 0))
    b.observe_metrics(61.0, "lm0", "not { a metrics page")  # ignored
    rates = b.snapshot(60.0)["rates_per_min"]
    assert rates["http_requests"] == pytest.approx(660.0)
    assert rates["http_refused"] == pytest.approx(60.0)
