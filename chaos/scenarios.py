"""The scenarios of ``megha chaos``: a TOML file of ``[[scenario]]`` tables (a fault's
steps, the load, the federation and its broker), read and checked (``config/chaos.toml``)."""

from __future__ import annotations

import random
import signal
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.config import FederationConfig
from common.errors import ConfigError

DEFAULT_SCENARIOS = Path(__file__).resolve().parent.parent / "config" / "chaos.toml"
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}
ACTIONS = (
    *SIGNALS, "restart", "restart_clean", "broker_stop", "broker_start", "broker_kill",
    "broker_alarm", "broker_unalarm", "partition", "heal", "delay", "undelay",
    "duplicate_jobs", "replay_events", "replay_state", "consumer_error", "die_on_repartition",
    "kill_all", "stop_all", "start_all", "clock_step",
)  # fmt: skip
FAULT_WAIT_S = 30.0
"""How long a step waits for the fault it armed to strike (else the scenario errs: a
fault that never struck proves nothing)."""
BROKERS = ("shared", "private", "cluster")
JITTER = (0.25, 1.75)
"""``jittered``: a scenario's first fault comes at its ``at`` times a factor drawn
from this range (a load of ~5 s: every fault still strikes while jobs run)."""


@dataclass(frozen=True)
class Load:
    """What a scenario submits: synthetic jobs (Poisson at ``rate`` jobs/s) or DAG jobs."""

    jobs: int = 30
    rate: float = 15.0
    tasks_per_job: int = 3
    duration: float = 0.5
    """Mean task seconds (DAG jobs: the median stage duration)."""
    dag: bool = False
    users: list[str] = field(default_factory=list)
    """Only these users submit (empty: every user)."""
    seed: int = 1


@dataclass(frozen=True)
class Step:
    """One fault action at ``at`` seconds after the load starts (and, with ``when``,
    once the condition holds: ``unacked`` = ``target``'s GM holds an unacknowledged
    job whose tasks LMs accepted and run)."""

    at: float
    action: str
    target: str = ""
    value: float = 0.0
    when: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str
    """What goes wrong, in a few words (the table's second column)."""
    steps: list[Step]
    load: Load = Load()
    federation: dict[str, Any] = field(default_factory=dict)
    broker: str = "shared"
    netns: bool = False
    quick: bool = False
    timeout_s: float = 90.0
    expect: list[str] = field(default_factory=list)
    """Evidence counters that must be above 0 when the run ends: that the fault struck
    (``jobs_redelivered`` for a kill while a job is unacknowledged...)."""


def load_scenarios(path: Path) -> list[Scenario]:
    """The scenarios of a chaos TOML file (``[[scenario]]`` tables, each merged over
    ``[defaults.federation]`` and ``[defaults.load]``), checked."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    defaults = data.get("defaults", {})
    out: list[Scenario] = []
    for raw in data.get("scenario", []):
        raw = dict(raw)
        steps = [Step(**s) for s in raw.pop("step", [])]
        load = Load(**{**defaults.get("load", {}), **raw.pop("load", {})})
        fed = {**defaults.get("federation", {}), **raw.pop("federation", {})}
        sc = Scenario(steps=steps, load=load, federation=fed, **raw)
        bad = [s.action for s in sc.steps if s.action not in ACTIONS]
        if bad or sc.broker not in BROKERS or not sc.steps:
            raise ConfigError(f"{path}: scenario {sc.name!r}: bad action, broker or no step")
        FederationConfig(**sc.federation).validate()
        out.append(sc)
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: scenario names must be unique")
    return out


def jittered(scenarios: list[Scenario], seed: int, repeat: int = 1) -> list[Scenario]:
    """Each scenario ``repeat`` times with its fault moved in time and its load drawn
    anew (seeded: the same ``seed`` gives the same runs).  Its steps move together --
    the gaps between them (a restart within a lease, a stop past a timeout) are what
    the scenario means -- by what puts the first step at its ``at`` times a factor in
    ``JITTER``; the load's seed is drawn too, so the fault meets other jobs, stages
    and placements.  Names get ``-jSEED-ROUND``; the fault's text says what moved."""
    out: list[Scenario] = []
    for r in range(1, repeat + 1):
        for sc in scenarios:
            rng = random.Random(f"{seed}:{r}:{sc.name}")
            first = min(s.at for s in sc.steps)
            shift = round(first * rng.uniform(*JITTER) - first, 3)
            load_seed = rng.randrange(1, 2**31)
            out.append(replace(
                sc,
                name=f"{sc.name}-j{seed}-{r}",
                fault=f"{sc.fault} (steps {shift:+.3f} s, load seed {load_seed})",
                steps=[replace(s, at=round(s.at + shift, 3)) for s in sc.steps],
                load=replace(sc.load, seed=load_seed),
            ))  # fmt: skip
    return out
