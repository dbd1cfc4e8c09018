"""The scenarios of ``megha chaos``: a TOML file of ``[[scenario]]`` tables (a fault's
steps, the load, the federation and its broker), read and checked (``config/chaos.toml``)."""

from __future__ import annotations

import signal
import tomllib
from dataclasses import dataclass, field
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
