"""The chaos scenario file: it loads, covers the faults the suite promises, and a bad
scenario is refused before anything starts (megha_cli.chaos)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.results import table, verdict
from chaos.scenarios import (
    DEFAULT_SCENARIOS,
    JITTER,
    RANDOM_AT,
    RANDOM_DOWN,
    jittered,
    load_scenarios,
    random_scenarios,
)
from common.config import FederationConfig
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


def test_random_faults_hit_real_services_and_bring_each_back() -> None:
    runs = random_scenarios(DEFAULT_SCENARIOS, seed=3, n=60)
    assert random_scenarios(DEFAULT_SCENARIOS, seed=3, n=60) == runs  # seeded
    assert random_scenarios(DEFAULT_SCENARIOS, seed=4, n=60) != runs
    assert [r.name for r in runs] == [f"random-3-{i}" for i in range(1, 61)]
    kinds, sizes, dags = set(), set(), 0
    for run in runs:
        services = set(FederationConfig(**run.federation).validate().process_names)
        assert [s.at for s in run.steps] == sorted(s.at for s in run.steps)
        hit: dict[str, list[tuple[str, float]]] = {}
        for s in run.steps:
            assert s.target in services
            hit.setdefault(s.target, []).append((s.action, s.at))
        sizes.add(len(hit))
        for steps in hit.values():  # each service once, and back
            kinds.add(steps[0][0])
            assert RANDOM_AT[0] <= steps[0][1] <= RANDOM_AT[1]
            if steps[0][0] == "restart_clean":
                assert len(steps) == 1
                continue
            (fault, at), (back, again) = steps
            assert back == {"kill": "restart", "stop": "cont"}[fault]
            assert RANDOM_DOWN[0] - 1e-3 <= again - at <= RANDOM_DOWN[1] + 1e-3
        dags += run.load.dag
        assert run.load.dag == (run.federation.get("queue_policy") == "carbyne")
    assert kinds == {"kill", "stop", "restart_clean"}
    assert sizes == {1, 2, 3}
    assert 5 <= dags <= 30


UNDONE_BY = {
    "kill": "restart", "stop": "cont", "partition": "heal", "delay": "undelay",
    "broker_stop": "broker_start", "broker_kill": "broker_start",
    "broker_alarm": "broker_unalarm", "kill_all": "start_all", "stop_all": "start_all",
}  # fmt: skip
AT_ONCE = {"restart_clean", "duplicate_jobs", "replay_events", "replay_state"}


def test_wide_random_faults_are_of_every_kind_and_each_undone() -> None:
    runs = random_scenarios(DEFAULT_SCENARIOS, seed=5, n=120, wide=True)
    assert random_scenarios(DEFAULT_SCENARIOS, seed=5, n=120, wide=True) == runs
    assert runs != random_scenarios(DEFAULT_SCENARIOS, seed=5, n=120)  # not the narrow draw
    assert [r.name for r in runs] == [f"random-wide-5-{i}" for i in range(1, 121)]
    actions: set[str] = set()
    for run in runs:
        services = set(FederationConfig(**run.federation).validate().process_names)
        acts = [s.action for s in run.steps]
        actions.update(acts)
        assert [s.at for s in run.steps] == sorted(s.at for s in run.steps)
        assert run.netns == bool({"partition", "delay"} & set(acts))  # hosts only for them
        assert (run.broker == "private") == any(a.startswith("broker_") for a in acts)
        whole = "start_all" in acts
        if whole:  # every process back at once: no single one's fault, no alarm
            assert not {"kill", "stop", "restart_clean", "broker_alarm"} & set(acts)
            if "broker_start" in acts:  # megha up needs the broker: it comes back first
                assert acts.index("broker_start") < acts.index("start_all")
        if "broker_start" in acts:  # nothing published again while the node is down
            down = next(s.at for s in run.steps if s.action in ("broker_stop", "broker_kill"))
            up = next(s.at for s in run.steps if s.action == "broker_start")
            assert not [s for s in run.steps if s.action in AT_ONCE - {"restart_clean"}
                        and down <= s.at < up]  # fmt: skip
        pending: list[tuple[str, str]] = []  # faults not undone yet, in order
        for s in run.steps:
            assert s.target in services | {""}
            if s.action == "clock_step":
                key = ("clock_step", s.target)
                if s.value:
                    pending.append(key)
                else:
                    pending.remove(key)
            elif s.action in UNDONE_BY:
                assert RANDOM_AT[0] <= s.at <= RANDOM_AT[1]
                pending.append((UNDONE_BY[s.action], s.target))
            elif s.action not in AT_ONCE:
                pending.remove((s.action, s.target))
        assert pending == []  # every fault is undone before the run is checked
    assert set(UNDONE_BY) | set(UNDONE_BY.values()) | AT_ONCE | {"clock_step"} == actions


def test_random_draws_its_own_and_refuses_the_file_s_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from megha_cli.main import main

    assert main(["chaos", "--random", "1", "--repeat", "3", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == ["random-1-1", "random-1-2", "random-1-3"]
    for extra in (["--quick"], ["--only", "lm-kill"], ["--jitter", "2"]):
        assert main(["chaos", "--random", "1", *extra]) == 1
        assert "--random draws its own" in capsys.readouterr().err
    assert main(["chaos", "--random", "1", "--wide", "--list"]) == 0
    assert capsys.readouterr().out.startswith("random-wide-1-1 ")
    assert main(["chaos", "--wide", "--list"]) == 1  # nothing to widen
    assert "needs --random" in capsys.readouterr().err


def test_a_background_step_does_not_hold_back_the_step_it_waits_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GM restarted while an LM is stopped is healthy only once the LM continues: the
    restart runs in the background, the continue goes on, the run waits for both."""
    import asyncio
    import time

    from chaos import drive
    from chaos.scenarios import Scenario, Step

    async def act(st: object, step: Step, *rest: object) -> str:
        if step.action == "restart":  # healthy once the LM is continued
            await asyncio.wait_for(continued.wait(), timeout=1)
        if step.action == "cont":
            continued.set()
        return f"{step.action} {step.target}"

    monkeypatch.setattr(drive, "_act", act)
    continued = asyncio.Event()
    steps = [Step(0.0, "stop", "lm0"), Step(0.01, "restart", "gm0", background=True),
             Step(0.02, "cont", "lm0")]  # fmt: skip
    run = drive.Run()
    sc = Scenario(name="x", fault="x", steps=steps)

    async def go() -> None:
        await drive._faults(None, sc, None, run, {}, time.time(), False)  # type: ignore[arg-type]

    asyncio.run(go())
    assert [s["note"] for s in run.steps] == ["stop lm0", "cont lm0", "restart gm0"]
    # the same restart awaited in line waits for a continue that never comes
    run = drive.Run()
    continued = asyncio.Event()
    sc = Scenario(name="x", fault="x", steps=[Step(0.0, "restart", "gm0"), steps[2]])
    with pytest.raises(TimeoutError):
        asyncio.run(go())
