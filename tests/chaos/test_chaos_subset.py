"""The quick subset of ``megha chaos`` (``quick = true`` in config/chaos.toml): a live
federation per fault, under load; no task may be lost or launched twice.

Each scenario starts its own federation on the shared broker (``--insecure-dev``: no
broker users per party, which saves about 10 s of ``rabbitmqctl`` per scenario; the
secure set-up is exercised by tests/e2e and tests/security) on ports 19500-19599."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.drive import run_scenario
from chaos.scenarios import DEFAULT_SCENARIOS, Scenario, load_scenarios
from common.config import FederationConfig
from federation.processes import broker_reachable

pytestmark = pytest.mark.e2e

QUICK = [s for s in load_scenarios(DEFAULT_SCENARIOS) if s.quick]


def test_the_quick_subset_covers_at_least_eight_faults() -> None:
    assert len(QUICK) >= 8
    assert len({s.steps[0].action for s in QUICK}) >= 5  # kills, stops, restarts, replays


@pytest.mark.parametrize("scenario", QUICK, ids=[s.name for s in QUICK])
def test_fault_loses_nothing_and_launches_nothing_twice(scenario: Scenario, tmp_path: Path) -> None:
    base = FederationConfig(name="chaos-t", base_port=19500).validate()
    if not broker_reachable(base.broker_url):
        pytest.fail("RabbitMQ is not reachable on 127.0.0.1:5672 (rabbitmq-server -detached)")
    row = run_scenario(scenario, base, tmp_path, insecure=True, progress=False)
    assert "error" not in row, row.get("error")
    assert row["submitted"] > 0
    assert row["steps"], "the fault was never injected"
    assert row["lost"] == 0, row["lost_ids"]
    assert row["duplicate_launches"] == 0, row["duplicate_log"]
    assert row["completed"] == row["submitted"]
