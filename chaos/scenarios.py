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
    background: bool = False
    """The later steps go on while this one runs (a restart waits until its service is
    healthy, and a GM is healthy only with a view of every LM: a GM restarted while an
    LM is stopped would otherwise hold back the step that continues it).  The run waits
    for it before it checks anything."""


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


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def load_scenarios(path: Path) -> list[Scenario]:
    """The scenarios of a chaos TOML file (``[[scenario]]`` tables, each merged over
    ``[defaults.federation]`` and ``[defaults.load]``), checked."""
    data = _read(path)
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


RANDOM_TARGETS = ("gm0", "gm1", "lm0", "lm1", "lm0-workers", "lm1-workers")
"""The services of the file's default federation (2 GMs, 2 LMs, a pool each)."""
RANDOM_FAULTS = ("kill", "kill", "stop", "restart_clean")
RANDOM_AT = (0.3, 4.5)
"""When a random fault strikes (s after the first submission: while jobs arrive)."""
RANDOM_DOWN = (0.1, 4.0)
"""How long a killed service stays dead, a stopped one stopped: from less than a
heartbeat to past ``worker_timeout_s`` and a pool's lease."""


def random_scenarios(path: Path, seed: int, n: int, *, wide: bool = False) -> list[Scenario]:
    """``n`` scenarios of faults drawn at random (seeded), on the file's default
    federation and load: each one to three services (distinct) hit once -- SIGKILL and
    start again, SIGSTOP and SIGCONT (after ``RANDOM_DOWN``), or a clean restart -- at
    ``RANDOM_AT``; so faults overlap, and a GM, an LM and a pool may be down at once.
    A quarter of the loads are DAG jobs (Carbyne's queues).  Every service hit comes
    back: the check is the suite's own, nothing lost and nothing launched twice.

    ``wide``: one to three faults of distinct kinds drawn from every kind the driver
    has (``WIDE_KINDS``): a process fault as above; a host cut off or slowed (network
    namespaces); the private broker node stopped, killed or under a memory alarm;
    submissions, event batches or state updates published again; a service's wall
    clock stepped and put right; or every process killed or stopped at once and
    started again.  Names are ``random-wide-SEED-ROUND``."""
    defaults = _read(path).get("defaults", {})
    fed = dict(defaults.get("federation", {}))
    FederationConfig(**fed).validate()  # a bad file says so before anything starts
    out: list[Scenario] = []
    for r in range(1, n + 1):
        rng = random.Random(f"random{'-wide' if wide else ''}:{seed}:{r}")
        kinds: list[str] = []
        steps: list[Step] = []
        if wide:
            kinds = _wide_kinds(rng)
            targets = rng.sample(RANDOM_TARGETS, len(kinds))
            for kind, target in zip(kinds, targets, strict=True):
                steps += _wide_fault(rng, kind, target, alarm="whole" not in kinds)
            steps = _broker_first(steps)
        else:
            for target in rng.sample(RANDOM_TARGETS, rng.choice((1, 2, 2, 3))):
                kind, at = rng.choice(RANDOM_FAULTS), round(rng.uniform(*RANDOM_AT), 3)
                back = at if kind == "restart_clean" else round(at + rng.uniform(*RANDOM_DOWN), 3)
                steps += _process_fault(kind, target, at, back)
        steps.sort(key=lambda s: s.at)
        dag = rng.random() < 0.25
        load = Load(**{**defaults.get("load", {}), "seed": rng.randrange(1, 2**31)})
        if dag:
            load = replace(load, dag=True, jobs=8, rate=2.0, duration=0.5)
        fault = "; ".join(_told(s) for s in steps)
        out.append(Scenario(
            name=f"random{'-wide' if wide else ''}-{seed}-{r}",
            fault=fault + (" (DAG jobs)" if dag else ""), steps=steps, load=load,
            federation={**fed, "queue_policy": "carbyne"} if dag else fed,
            broker="private" if "broker" in kinds else "shared", netns="network" in kinds,
        ))  # fmt: skip
    return out


def _wide_kinds(rng: random.Random) -> list[str]:
    """One to three distinct kinds of fault; a whole-federation restart brings every
    process back at once, so it never meets a single process's fault."""
    kinds = list(dict.fromkeys(rng.choice(WIDE_KINDS) for _ in range(rng.choice((1, 2, 2, 3)))))
    if "whole" in kinds and "process" in kinds:
        kinds.remove("process")
    return kinds


def _process_fault(action: str, target: str, at: float, back: float) -> list[Step]:
    """``target`` killed, stopped or restarted cleanly at ``at``; started again or
    continued at ``back``.  Restarts run in the background (a GM restarted while an LM
    is stopped is healthy only once the LM continues)."""
    if action == "restart_clean":
        return [Step(at, action, target, background=True)]
    again = "restart" if action == "kill" else "cont"
    return [Step(at, action, target), Step(back, again, target, background=again == "restart")]


def _broker_first(steps: list[Step]) -> list[Step]:
    """A whole-federation start comes after the broker's (``megha up`` checks the
    broker first and stops with a clear error if it is down, as on a host that boots
    the broker before the federation), and so do messages published again that would
    fall while the node is down (the driver publishes them through it)."""
    down = [s.at for s in steps if s.action in ("broker_stop", "broker_kill")]
    back = [s.at for s in steps if s.action == "broker_start"]
    if not back:
        return steps
    after = round(back[0] + BROKER_BEFORE_FEDERATION_S, 3)

    def moved(s: Step) -> bool:
        return s.action == "start_all" or (s.action in AGAIN and down[0] <= s.at < after)

    return [replace(s, at=max(s.at, after)) if moved(s) else s for s in steps]


def _wide_fault(rng: random.Random, kind: str, target: str, *, alarm: bool) -> list[Step]:
    """The steps of one fault of ``kind`` (``WIDE_KINDS``), on ``target`` where it
    names a service: the fault at ``RANDOM_AT`` and, unless it is over at once, what
    undoes it ``RANDOM_DOWN`` later.  A memory alarm only with ``alarm`` (it strikes
    once a publisher is blocked: none may be while every process is down)."""
    at = round(rng.uniform(*RANDOM_AT), 3)
    back = round(at + rng.uniform(*RANDOM_DOWN), 3)
    if kind == "process":
        return _process_fault(rng.choice(RANDOM_FAULTS), target, at, back)
    if kind == "network":
        if rng.random() < 0.5:
            return [Step(at, "partition", target), Step(back, "heal", target)]
        ms = float(rng.choice(WIDE_DELAYS_MS))
        return [Step(at, "delay", target, value=ms), Step(back, "undelay", target)]
    if kind == "broker":
        action = rng.choice(("broker_stop", "broker_kill", "broker_alarm")[: 2 + alarm])
        return [
            Step(at, action),
            Step(back, "broker_unalarm" if action == "broker_alarm" else "broker_start"),
        ]
    if kind == "messages":
        return [Step(at, rng.choice(AGAIN))]
    if kind == "clock":
        off = rng.choice((-1, 1)) * float(rng.choice(WIDE_CLOCK_STEPS_S))
        return [Step(at, "clock_step", target, value=off), Step(back, "clock_step", target)]
    return [
        Step(at, rng.choice(("kill_all", "stop_all"))),
        Step(back, "start_all", background=True),
    ]


def _told(s: Step) -> str:
    """A step as the fault's text shows it."""
    what = f"{s.action} {s.target}".rstrip()
    if s.action == "delay":
        what += f" {s.value:g} ms"
    elif s.action == "clock_step":
        what += f" {s.value:+g} s"
    return f"{what} at {s.at:.2f} s"


WIDE_KINDS = (
    "process", "process", "network", "network", "broker", "messages", "clock", "whole",
)  # fmt: skip
"""What a ``wide`` random fault may be (process and network faults twice as likely)."""
AGAIN = ("duplicate_jobs", "replay_events", "replay_state")
"""Messages published again: submissions, LMs' event batches, LMs' state updates."""
BROKER_BEFORE_FEDERATION_S = 0.5
"""A whole start at least this long after the broker node's."""
WIDE_DELAYS_MS = (20, 100, 300, 1000)
"""Added egress delay of a slowed host: a far rack to past a heartbeat."""
WIDE_CLOCK_STEPS_S = (0.5, 5, 60, 3600)
"""A wall clock stepped by this much, either way: a slew to a wrong time zone."""
