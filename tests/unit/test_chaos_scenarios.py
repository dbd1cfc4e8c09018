"""The chaos scenario file: it loads, covers the faults the suite promises, and a bad
scenario is refused before anything starts (megha_cli.chaos)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.results import table, verdict
from chaos.scenarios import DEFAULT_SCENARIOS, JITTER, jittered, load_scenarios
from common.errors import ConfigError


def test_the_shipped_scenarios_cover_twenty_faults_and_every_kind() -> None:
    scenarios = load_scenarios(DEFAULT_SCENARIOS)
    assert len(scenarios) >= 20
    actions = {s.action for sc in scenarios for s in sc.steps}
    assert {"kill", "stop", "cont", "restart", "restart_clean", "broker_stop",
            "broker_kill", "partition", "heal", "delay", "duplicate_jobs",
            "replay_events", "replay_state"} <= actions  # fmt: skip
    assert {sc.broker for sc in scenarios} == {"shared", "private", "cluster"}
    assert any(sc.netns for sc in scenarios)
    assert any(sc.load.dag for sc in scenarios)
    assert any(sc.federation.get("lm_standby") for sc in scenarios)
    assert any(len({s.target for s in sc.steps if s.action == "kill"}) >= 2 for sc in scenarios)
    assert any(s.when == "unacked" for sc in scenarios for s in sc.steps)
    assert sum(sc.quick for sc in scenarios) >= 8


def test_defaults_are_merged_under_each_scenario(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[defaults.federation]\ngms = 1\nlms = 1\nnodes_per_lm = 2\n"
        "[defaults.load]\njobs = 5\nrate = 2.0\n"
        '[[scenario]]\nname = "a"\nfault = "x"\nload = { rate = 4.0 }\n'
        'federation = { lms = 2 }\nstep = [{ at = 1.0, action = "kill", target = "gm0" }]\n'
    )
    (sc,) = load_scenarios(path)
    assert sc.federation == {"gms": 1, "lms": 2, "nodes_per_lm": 2}
    assert (sc.load.jobs, sc.load.rate) == (5, 4.0)


@pytest.mark.parametrize(
    "bad",
    [
        'step = [{ at = 1.0, action = "explode" }]',
        'broker = "remote"\nstep = [{ at = 1.0, action = "kill", target = "gm0" }]',
        "step = []",
        'federation = { gms = 0 }\nstep = [{ at = 1.0, action = "kill", target = "gm0" }]',
    ],
)
def test_a_bad_scenario_is_refused(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f'[[scenario]]\nname = "a"\nfault = "x"\n{bad}\n')
    with pytest.raises(ConfigError):
        load_scenarios(path)


def test_the_table_says_fail_on_a_duplicate_and_error_when_a_scenario_did_not_run() -> None:
    ok = {"scenario": "a", "fault": "f", "submitted": 3, "completed": 3, "lost": 0,
          "duplicate_launches": 0, "recovery_s": 1.0, "evidence": {"workers_lost": 2}}  # fmt: skip
    dup = {**ok, "scenario": "b", "duplicate_launches": 1}
    err = {"scenario": "c", "fault": "f", "error": "ConfigError: boom"}
    assert [verdict(r) for r in (ok, dup)] == ["ok", "FAIL"]
    text = table([ok, dup, err])
    assert "| a | f | 3 | 3 | 0 | 0 | 1.0 | ok | workers_lost 2 |" in text
    assert "ERROR ConfigError: boom" in text


def test_only_and_quick_that_leave_nothing_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    from megha_cli.main import main

    assert main(["chaos", "--quick", "--only", "pool-hang"]) == 1
    assert "no scenario named by --only is in the --quick subset" in capsys.readouterr().err
    assert main(["chaos", "--only", "no-such"]) == 1
    assert "no such scenario: no-such" in capsys.readouterr().err


def test_jitter_moves_each_fault_and_keeps_its_gaps() -> None:
    scenarios = load_scenarios(DEFAULT_SCENARIOS)
    runs = jittered(scenarios, seed=7, repeat=2)
    assert len(runs) == 2 * len(scenarios)
    assert len({r.name for r in runs}) == len(runs)
    assert jittered(scenarios, seed=7, repeat=2) == runs  # seeded: the same runs again
    moved = 0
    for i, run in enumerate(runs):
        sc = scenarios[i % len(scenarios)]
        assert run.name == f"{sc.name}-j7-{i // len(scenarios) + 1}"
        first, now = min(s.at for s in sc.steps), min(s.at for s in run.steps)
        assert JITTER[0] * first - 1e-3 <= now <= JITTER[1] * first + 1e-3
        # the steps move together: what they mean (a restart within a lease) stays
        gaps = [b.at - a.at for a, b in zip(sc.steps, sc.steps[1:], strict=False)]
        now_gaps = [b.at - a.at for a, b in zip(run.steps, run.steps[1:], strict=False)]
        assert now_gaps == pytest.approx(gaps, abs=2e-3)
        assert [(s.action, s.target, s.value, s.when) for s in run.steps] == [
            (s.action, s.target, s.value, s.when) for s in sc.steps
        ]
        assert run.load.seed != sc.load.seed
        assert run.federation == sc.federation
        moved += now != first
    assert moved > len(runs) // 2
    assert jittered(scenarios, seed=8)[0] != runs[0]


def test_repeat_is_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    from megha_cli.main import main

    with pytest.raises(SystemExit):
        main(["chaos", "--jitter", "1", "--repeat", "0", "--list"])
    assert "must be >= 1" in capsys.readouterr().err
    assert main(["chaos", "--repeat", "2", "--list"]) == 1  # nothing to draw anew
    assert "needs --jitter" in capsys.readouterr().err
    assert main(["chaos", "--jitter", "0", "--repeat", "2", "--list"]) == 0  # seed 0 is a seed
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 * len(load_scenarios(DEFAULT_SCENARIOS))
    assert listed[0].startswith("gm-kill-unacked-j0-1 ")
