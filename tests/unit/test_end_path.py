"""Where an end's way to its GM goes: ``runtime.driver.EndLag`` at each point, and the
live benchmark's segments made of them (``benchmarks.bench_live``)."""

from __future__ import annotations

from benchmarks.bench_live import _end_segments, _ends_at_gms
from runtime.driver import EndLag


def test_end_lag_sums_each_end_s_lag_at_its_point() -> None:
    e = EndLag()
    e.note([1.0, 1.5], now=2.0)
    e.note(iter(()), now=3.0)
    assert e.as_dict() == {"ends": 2, "lag_s": 1.5}


def _pages(pool: float, lm_got: float, lm_sent: float, gm: float, n: int) -> dict:
    def lag(s: float) -> dict:
        return {"ends": n, "lag_s": s * n}

    return {
        "gm1": {"counters": {"ends_seen": n, "end_lag_s": gm * n}},
        "lm1": {"end_lag": {"lm_got": lag(lm_got), "lm_sent": lag(lm_sent)}},
        "lm1-workers": {"end_lag": {"pool_sent": lag(pool)}},
    }


def test_segments_of_a_step_are_differences_of_its_points() -> None:
    before = _ends_at_gms(_pages(0.010, 0.020, 0.030, 0.040, n=10))
    after = _ends_at_gms(_pages(0.010, 0.020, 0.030, 0.040, n=10))
    for p, e in _ends_at_gms(_pages(0.005, 0.007, 0.017, 0.027, n=20)).items():
        after[p] = {k: after[p][k] + e[k] for k in e}
    seg = _end_segments(after, before)  # the step's 20 ends only
    assert seg["pool_linger_ms"] == 5.0
    assert seg["pool_to_lm_ms"] == 2.0
    assert seg["lm_linger_ms"] == 10.0
    assert seg["lm_to_gm_ms"] == 10.0
    assert seg["at_gm_ms"] == 27.0


def test_no_segments_without_every_point() -> None:  # an older tree's pages
    pages = {"gm1": {"counters": {"ends_seen": 3, "end_lag_s": 0.3}}}
    assert _end_segments(_ends_at_gms(pages), {}) == {"at_gm_ms": 100.0}
