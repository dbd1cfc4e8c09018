"""Federation configuration: one TOML table, sane defaults, and the process plan.

``megha up``, docker compose and the tests all learn which processes make a
federation (their commands, environment and ports) from ``process_plan``: one
function, so the three cannot drift apart.
"""

from __future__ import annotations

import os
import random
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.ids import GmId, LmId
from common.model import UserConfig

DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/"
CONFIG_ENV = "MEGHA_CONFIG"
ROLE_ENV = "MEGHA_ROLE"
ID_ENV = "MEGHA_ID"
BROKER_ENV = "MEGHA_BROKER_URL"


@dataclass(frozen=True)
class FederationConfig:
    """Everything a federation's processes agree on (the ``[federation]`` table)."""

    name: str = "megha"
    """Prefix of every RabbitMQ exchange and queue of this federation."""
    gms: int = 3
    lms: int = 3
    nodes_per_lm: int = 40
    profile: str = "slots"
    constraints: bool = False
    users: str = ""
    """``NAME:SHARE@GM,...``; empty: one user per GM with equal shares."""
    host: str = "127.0.0.1"
    base_port: int = 18100
    """GM i listens on base_port+i, LM j on base_port+100+j, LM j's workers on +200+j."""
    broker_url: str = DEFAULT_BROKER_URL
    heartbeat_s: float = 1.0
    """LM state updates to all GMs, and worker heartbeats to their LM."""
    worker_timeout_s: float = 5.0
    secret: str = "megha-dev-secret-change-me"
    """Signs internal calls and users' submission tokens."""
    queue_type: str = "classic"
    """User queues: "classic" (durable, persistent messages; the lower latency: p50 6.1 vs
    12.5 ms at 50% load in benchmarks/bench_live.py) or "quorum" (adds a broker-side
    delivery limit that dead-letters a job which keeps a GM from acknowledging it)."""
    prefetch: int = 2000
    delivery_limit: int = 5
    decide_batch: int = 64
    max_body: int = 4 * 1024 * 1024
    seed: int = 1
    queue_policy: str = "fifo"
    """How each GM orders its user queues: fifo (Megha), drf, tetris, sjf, carbyne, ..."""
    p_altruism: float = 1.0
    """Carbyne's P(altruism) on every GM (0: plain DRF)."""

    # ------------------------------------------------------------ derived
    @cached_property
    def gm_ids(self) -> list[GmId]:
        return [GmId(f"gm{i}") for i in range(self.gms)]

    @cached_property
    def lm_ids(self) -> list[LmId]:
        return [LmId(f"lm{j}") for j in range(self.lms)]

    @cached_property
    def user_configs(self) -> list[UserConfig]:
        from request_generator.workload import parse_users

        return parse_users(self.users, self.gm_ids)

    @cached_property
    def clusters(self) -> list[Any]:
        """The clusters (nodes, constraints, homes): every process derives the same ones."""
        from request_generator.workload import make_federation, profile

        return make_federation(
            self.nodes_per_lm * self.lms,
            self.gm_ids,
            self.lms,
            profile(self.profile),
            self.constraints,
            random.Random(self.seed),
        )

    def gm_port(self, gm: str) -> int:
        return self.base_port + self.gm_ids.index(GmId(gm))

    def lm_port(self, lm: str) -> int:
        return self.base_port + 100 + self.lm_ids.index(LmId(lm))

    def worker_port(self, lm: str) -> int:
        return self.base_port + 200 + self.lm_ids.index(LmId(lm))

    def gm_url(self, gm: str) -> str:
        return f"http://{self.host}:{self.gm_port(gm)}"

    def lm_url(self, lm: str) -> str:
        return f"http://{self.host}:{self.lm_port(lm)}"

    def worker_url(self, lm: str) -> str:
        return f"http://{self.host}:{self.worker_port(lm)}"

    # AMQP names (all under the federation's prefix)
    @property
    def submit_exchange(self) -> str:
        return f"{self.name}.submit"

    @property
    def state_exchange(self) -> str:
        return f"{self.name}.state"

    @property
    def events_exchange(self) -> str:
        return f"{self.name}.events"

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.name}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.name}.dead"

    def user_queue(self, user: str) -> str:
        return f"{self.name}.user.{user}"

    def gm_events_queue(self, gm: str) -> str:
        return f"{self.name}.gm.{gm}.events"

    def validate(self) -> FederationConfig:
        if self.gms < 1 or self.lms < 1 or self.nodes_per_lm < 1:
            raise ConfigError("gms, lms and nodes_per_lm must be at least 1")
        if self.nodes_per_lm < self.gms:
            raise ConfigError("every LM needs at least one node per GM partition")
        if self.heartbeat_s <= 0 or self.worker_timeout_s <= self.heartbeat_s:
            raise ConfigError("need 0 < heartbeat_s < worker_timeout_s")
        if self.queue_type not in ("quorum", "classic"):
            raise ConfigError(f"queue_type must be quorum or classic, not {self.queue_type!r}")
        if not self.secret:
            raise ConfigError("secret must not be empty")
        if not 1 <= self.base_port <= 65535 - 300:
            raise ConfigError("base_port out of range")
        _ = self.user_configs
        from global_master.carbyne import POLICIES

        if self.queue_policy not in POLICIES:
            raise ConfigError(
                f"queue_policy must be one of {', '.join(POLICIES)}, not {self.queue_policy!r}"
            )
        if not 0.0 <= self.p_altruism <= 1.0:
            raise ConfigError("p_altruism must be in [0, 1]")
        from request_generator.workload import profile

        profile(self.profile)
        return self

    def to_toml(self) -> str:
        lines = ["[federation]"]
        for k, v in asdict(self).items():
            if isinstance(v, bool):
                lines.append(f"{k} = {'true' if v else 'false'}")
            elif isinstance(v, int | float):
                lines.append(f"{k} = {v!r}")
            else:
                lines.append(f'{k} = "{v}"')
        return "\n".join(lines) + "\n"


_FIELDS = {f.name: f for f in fields(FederationConfig)}


def parse_config(data: dict[str, Any], *, env: dict[str, str] | None = None) -> FederationConfig:
    table = data.get("federation", data)
    if not isinstance(table, dict):
        raise ConfigError("[federation] must be a table")
    kwargs: dict[str, Any] = {}
    defaults = FederationConfig()
    for key, value in table.items():
        if key not in _FIELDS:
            raise ConfigError(f"unknown config key {key!r} (known: {', '.join(_FIELDS)})")
        want = type(getattr(defaults, key))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ConfigError(f"{key}: expected {want.__name__}, got {value!r}")
        kwargs[key] = value
    cfg = FederationConfig(**kwargs)
    env = dict(os.environ) if env is None else env
    if env.get(BROKER_ENV):
        cfg = replace(cfg, broker_url=env[BROKER_ENV])
    return cfg.validate()


def load_config(path: str | Path | None = None) -> FederationConfig:
    """The config at ``path`` (or $MEGHA_CONFIG); defaults when neither is given."""
    p = path if path is not None else os.environ.get(CONFIG_ENV) or None
    if p is None:
        return parse_config({})
    try:
        with open(p, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: {exc}") from exc
    return parse_config(data)


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a federation, exactly as it is started."""

    name: str
    role: str  # "gm" | "lm" | "worker"
    ident: str
    argv: list[str]
    env: dict[str, str]
    port: int
    url: str


APPS = {
    "gm": "global_master.app:create_app",
    "lm": "local_master.app:create_app",
    "worker": "worker.app:create_app",
}


def process_plan(cfg: FederationConfig, config_path: str) -> list[ProcessSpec]:
    """Every process of the federation: LMs' workers first, then LMs, then GMs.

    ``argv[0]`` is ``python3``; ``megha up`` runs it with the interpreter running megha.
    """
    plan: list[ProcessSpec] = []

    def spec(role: str, ident: str, port: int) -> ProcessSpec:
        argv = [
            "python3",
            "-m",
            "gunicorn",
            APPS[role],
            "--worker-class",
            "aiohttp.GunicornUVLoopWebWorker",
            "--workers",
            "1",
            "--bind",
            f"{cfg.host}:{port}",
            "--graceful-timeout",
            "5",
            "--timeout",
            "60",
            "--no-control-socket",
        ]
        env = {
            CONFIG_ENV: config_path,
            ROLE_ENV: role,
            ID_ENV: ident,
            BROKER_ENV: cfg.broker_url,
        }
        name = f"{ident}-workers" if role == "worker" else ident
        return ProcessSpec(name, role, ident, argv, env, port, f"http://{cfg.host}:{port}")

    for lm in cfg.lm_ids:
        plan.append(spec("worker", lm, cfg.worker_port(lm)))
    for lm in cfg.lm_ids:
        plan.append(spec("lm", lm, cfg.lm_port(lm)))
    for gm in cfg.gm_ids:
        plan.append(spec("gm", gm, cfg.gm_port(gm)))
    return plan
