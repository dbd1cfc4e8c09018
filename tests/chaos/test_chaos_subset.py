"""The quick subset of ``megha chaos`` (``quick = true`` in config/chaos.toml): a live
federation per fault, under load, in the secure set-up ``megha up`` makes (a vhost and
a broker user per party: the broker's permissions hold while faults strike, and the
replays publish as the LM that sealed each message); no task may be lost or launched
twice, and the fault must be shown to have struck: a step that waits for its moment or
its fault errs when it does not come, and each scenario names the evidence counters
its fault leaves (``expect``).  Each on free ports of its own (``free_base``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.drive import run_scenario
from chaos.results import verdict
from chaos.scenarios import DEFAULT_SCENARIOS, Scenario, load_scenarios
from common.config import FederationConfig
from federation.processes import broker_reachable
from tests.conftest import free_base

pytestmark = pytest.mark.e2e

QUICK = [s for s in load_scenarios(DEFAULT_SCENARIOS) if s.quick]


def test_the_quick_subset_covers_at_least_ten_faults_and_shows_each() -> None:
    assert len(QUICK) >= 10
    assert len({s.steps[0].action for s in QUICK}) >= 7  # kills, stops, restarts, replays...
    actions = {s.action for sc in QUICK for s in sc.steps}
    assert {"consumer_error", "die_on_repartition"} <= actions
    # every fault leaves evidence, or proves itself in its step (a kill, a restart, an
    # armed fault that must strike): none passes on "the steps ran" alone
    self_proving = {"kill", "restart", "restart_clean", "consumer_error", "die_on_repartition"}
    for sc in QUICK:
        assert sc.expect or {s.action for s in sc.steps} <= self_proving, sc.name


@pytest.mark.parametrize("scenario", QUICK, ids=[s.name for s in QUICK])
def test_fault_loses_nothing_and_launches_nothing_twice(scenario: Scenario, tmp_path: Path) -> None:
    base = FederationConfig(name="chaos-t", base_port=free_base()).validate()
    if not broker_reachable(base.broker_url):
        pytest.fail("RabbitMQ is not reachable on 127.0.0.1:5672 (rabbitmq-server -detached)")
    row = run_scenario(scenario, base, tmp_path, insecure=False, progress=False)
    assert "error" not in row, row.get("error")
    assert row["submitted"] > 0
    assert len(row["steps"]) == len(scenario.steps)
    assert row["lost"] == 0, row["lost_ids"]
    assert row["duplicate_launches"] == 0, row["duplicate_log"]
    assert row["completed"] == row["submitted"]
    assert verdict(row) == "ok", (verdict(row), row["evidence"])  # the fault showed


def test_a_run_whose_fault_left_no_evidence_fails() -> None:
    row = {"lost": 0, "duplicate_launches": 0, "expect": ["jobs_redelivered"], "evidence": {}}
    assert verdict(row).startswith("FAIL (no jobs_redelivered")
    row["evidence"] = {"jobs_redelivered": 1}
    assert verdict(row) == "ok"
