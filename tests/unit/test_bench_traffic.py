"""The bench sums each path's messages and items over the services' state pages."""

from __future__ import annotations

from reporting.live import traffic_from


def test_paths_are_summed_over_services_of_a_role() -> None:
    states = {
        "gm0": {
            "counters": {"launch_requests": 3, "decisions": 30},
            "batches": {"outcomes": {"messages": 5, "items": 20}},
        },
        "gm1": {
            "counters": {"launch_requests": 1, "decisions": 4},
            "batches": {"outcomes": {"messages": 1, "items": 4}},
        },
        "lm0": {"counters": {}, "batches": {"events": {"messages": 7, "items": 24}}},
        "lm0-workers": {"counters": {}, "batches": {"reports": {"messages": 2, "items": 9}}},
        "lm1": {"error": "connection refused"},
    }
    assert traffic_from(states) == {
        "gm_to_lm_launches": {"messages": 4, "items": 34},
        "gm_outcomes": {"messages": 6, "items": 24},
        "lm_events": {"messages": 7, "items": 24},
        "pool_reports": {"messages": 2, "items": 9},
    }
