"""Federation configuration: one TOML table, sane defaults, and the process plan.

``megha up``, docker compose and the tests all learn which processes make a
federation (their commands, environment and ports) from ``process_plan``: one
function, so the three cannot drift apart.
"""

from __future__ import annotations

import json
import os
import random
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from common import broker_names as names
from common.cluster import ClusterSpec, make_federation, parse_users, profile
from common.errors import ConfigError
from common.ids import GmId, LmId
from common.model import UserConfig
from common.overload import OVERLOAD_DEFAULTS, PRIORITY_AGING_S, SRPT_HALF_LIFE_S, OverloadPolicy
from common.taskenv import check_allow

DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_SECRET = "megha-dev-secret-change-me"
"""Not a secret: it means "none given" (``megha up`` makes a random one)."""
CONFIG_ENV = "MEGHA_CONFIG"
ROLE_ENV = "MEGHA_ROLE"
ID_ENV = "MEGHA_ID"
BROKER_ENV = "MEGHA_BROKER_URL"
STATE_ENV = "MEGHA_STATE_DIR"
"""Where an LM and a worker pool keep their journals (a directory per process name under
it); unset: they keep none (nothing they hold outlives their process)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

SANDBOX_UID_FIRST = 1_000_000_000
SANDBOX_UIDS_PER_POOL = 1024
"""Task uids (``[federation.sandbox]`` ``uid_first``, ``uids_per_pool``): the pool of
LM j leases ``uid_first + j * uids_per_pool`` onwards, one uid per running task; high,
above the accounts and the container uid ranges (subuids) hosts usually give out."""
_LAST_UID = 2**32 - 2
_NOBODY = 65534

QUEUE_POLICIES = ("fifo", "drf", "drf-wc", "tetris", "sjf", "carbyne", "carbyne-pack", "srpt")
"""How a GM may order its user queues (``global_master.policy`` implements each)."""


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
    """GM i listens on base_port+i, LM j on base_port+100+j, LM j's workers on +200+j,
    LM j's standby on +300+j."""
    addresses: dict[str, str] = field(default_factory=dict)
    """``[federation.addresses]``: process name (``gm0``, ``lm1``, ``lm1-workers``) ->
    ``"host:port"``, for federations spread over hosts; unlisted processes use
    ``host`` and the ``base_port`` layout."""
    listen: str = ""
    """Interface every process binds; empty: the host of its own address
    (``0.0.0.0`` in containers, where the address is a service name)."""
    tls: str = "auto"
    """Internal HTTP over TLS, under the federation's own CA (``security.tls``):
    "on", "off", or "auto": on when any process or the broker is on another host
    than the loopback.  With it on, a broker off the loopback must be ``amqps://``."""
    broker_url: str = DEFAULT_BROKER_URL
    """The broker's AMQP URL; for a RabbitMQ cluster, every node's URL, comma-separated
    (a process fails over to the next node that answers)."""
    lm_standby: bool = False
    """Run a standby process beside every LM (``lmJ-standby``): it takes over, under a
    newer epoch, when the active one dies or loses the broker."""
    heartbeat_s: float = 1.0
    """LM state updates to all GMs, and worker heartbeats to their LM."""
    worker_timeout_s: float = 5.0
    """A node silent this long is dead: nothing more is placed on it."""
    node_lost_after_s: float = 30.0
    """A dead node silent this long is given up: its tasks run again elsewhere.  Until
    then they stay held, since a node only cut off may have finished one unheard; its
    pool's word (or a restarted pool's registration) settles them at once.  A cut
    longer than this runs such a task twice: set it above the partitions you expect
    (0: give up at ``worker_timeout_s``)."""
    secret: str = DEFAULT_SECRET
    """The federation secret, if the operator names one (it must be strong); by default
    ``megha up`` makes a random one in ``$MEGHA_HOME/secret``.  Every key derives from
    it; it is never written to the recorded config."""
    queue_type: str = "classic"
    """User queues: "classic" (durable, persistent messages; the lower latency: p50 6.1 vs
    12.5 ms at 50% load in benchmarks/bench_live.py) or "quorum" (adds a broker-side
    delivery limit that dead-letters a job which keeps a GM from acknowledging it)."""
    prefetch: int = 2000
    delivery_limit: int = 5
    decide_batch: int = 64
    linger_s: float = 0.05
    """The completion path's batching (worker reports to an LM, outcomes to a user; an
    LM's task events to a GM follow each pool report at once, as the report's answer
    waits for them): to a *busy* destination -- one whose items arrive fast enough
    that waiting gathers 4 or more -- a message leaves no sooner than this after the
    previous one, so it gets fewer, larger messages; a quiet one's items leave at once,
    and placements never wait.  At 1,000 tasks/s (3 x 3 x 120, 20 ms tasks) 0.05 cut
    CPU per task 2.1 -> 1.5 ms.  Reports and events free slots, so their wait is also
    cut to what their LM's (or pool's) idle nodes can spare: idle / (2 x their rate),
    by Little's law (``runtime.driver.Batcher``); without that, 2,000 tasks/s held
    more slots in waiting reports than the cluster has (0: never wait)."""
    journal: bool = True
    """Whether LMs and worker pools keep journals in ``$MEGHA_STATE_DIR`` (``megha up``
    and compose always give one).  Without them a whole-federation restart loses the
    tasks LMs had taken and ends not yet reported; off only to measure what they cost
    (``benchmarks/bench_live.py --set journal=false``)."""
    journal_sync_s: float = 1.0
    """How often an LM and a worker pool ``fdatasync`` their journals (``runtime.journal``:
    what they held, ended and had not reported, in ``$MEGHA_STATE_DIR``).  A record is in
    the kernel's page cache before anything of its message leaves the process, so the
    death of every process at once (SIGKILL, ``megha down``, ``docker compose down``)
    loses nothing; this bounds what a host losing power may lose.  0: sync before every
    answer (one fdatasync each, ~5 ms on this project's test disks: launches wait on it)."""
    max_body: int = 16 * 1024 * 1024
    """Largest HTTP body or broker message any service reads (bytes); read whole."""
    max_task_duration_s: float = 7 * 24 * 3600.0
    """Longest task a GM admits (a longer one is refused with ``duration_too_long``)."""
    max_user_tasks: int = 1_000_000
    """Tasks one user may have on a GM at once (queued, in flight or running); a job that
    would pass it is refused (``user_task_limit``).  About 1 KB of GM memory each.
    0: no limit."""
    job_history_s: float = 3600.0
    """How long a GM keeps a user's ended job for ``megha job``/``jobs``/``logs`` and the
    front door (``global_master.lifecycle``); journaled in the GM's state directory, so
    it outlives a GM restart (``global_master.history``)."""
    job_history_per_user: int = 1000
    """At most this many of one user's ended jobs are kept (the oldest go first)."""
    task_commands: bool = False
    """Whether workers run a task's ``command`` (off: every task holds its resources for
    its duration, as in the paper's prototype), sandboxed as ``sandbox`` says."""
    task_env_allow: list[str] = field(default_factory=list)
    """The environment variables a task's command may be given (``env`` in job files):
    names or shell patterns (``["LANG", "MEGHA_*"]``); a job naming another is refused
    (``env_not_allowed``), and pools pass no other (``common.taskenv``).  Empty: none."""
    sandbox: dict[str, Any] = field(default_factory=dict)
    """``[sandbox]``: how commands run (``security.sandbox.SandboxPolicy``: the
    allow-list of executables, the range of task uids, scratch sizes, the network,
    rlimits, timeout).  The uid range of every pool is checked here; the rest, and
    the pool's own uid and the host's accounts, by each pool when it starts."""
    seed: int = 1
    queue_policy: str = "fifo"
    """How each GM orders its user queues: fifo (Megha), drf, tetris, sjf, carbyne, ..."""
    p_altruism: float = 1.0
    """Carbyne's P(altruism) on every GM (0: plain DRF)."""
    wait_index: bool = OVERLOAD_DEFAULTS.wait_index
    """Overload (docs/overload.md): a task that found no room waits until freed
    resources could fit it, instead of going round its queue."""
    preempt_grace_s: float = OVERLOAD_DEFAULTS.preempt_grace_s
    """A user below its share preempts only after waiting this long below it."""
    preempt_below: float = OVERLOAD_DEFAULTS.preempt_below
    """...and only while it holds less than this fraction of its share."""
    victims_younger_than_wait: bool = OVERLOAD_DEFAULTS.victims_younger_than_wait
    """LMs preempt only tasks that ran for less time than the requester waited."""
    preempt_per_lm: int = OVERLOAD_DEFAULTS.preempt_per_lm
    """Preemption requests a GM sends one LM per ``preempt_period_s`` (0: no limit)."""
    preempt_period_s: float = OVERLOAD_DEFAULTS.preempt_period_s
    repartition_batching: bool = OVERLOAD_DEFAULTS.repartition_batching
    """One repartition request per LM unanswered; the ones decided meanwhile share the next."""
    repartition_period_s: float = OVERLOAD_DEFAULTS.repartition_period_s
    launch_window: int = OVERLOAD_DEFAULTS.launch_window
    """Launch requests a GM keeps unanswered per LM (0: no limit); the rest wait and share
    the next request."""
    launch_full_batch: int = OVERLOAD_DEFAULTS.launch_full_batch
    """Held placements for one LM that leave at once, in one request beyond the window
    (0: never)."""
    reroute_at_lm: bool = OVERLOAD_DEFAULTS.reroute_at_lm
    """An LM places a task whose node has no room on another that fits, not refusing it."""
    class_preempt_grace_s: float = OVERLOAD_DEFAULTS.class_preempt_grace_s
    """A task of a priority class above 0 preempts lower classes after waiting this long."""
    priority_aging_s: float = PRIORITY_AGING_S
    """Seconds of waiting that raise a task's priority class by one (fifo, srpt)."""
    srpt_half_life_s: float = SRPT_HALF_LIFE_S
    """``srpt``: a waiting job's remaining work counts half per this many seconds since it
    arrived, so a job k times larger goes first after log2(k) half-lives (``inf``: plain
    SRPT, which can starve a large job)."""

    # ------------------------------------------------------------ derived
    @property
    def overload(self) -> OverloadPolicy:
        """The GMs' overload policy (one record for the live services and the simulator)."""
        return OverloadPolicy(
            wait_index=self.wait_index,
            preempt_grace_s=self.preempt_grace_s,
            preempt_below=self.preempt_below,
            victims_younger_than_wait=self.victims_younger_than_wait,
            preempt_per_lm=self.preempt_per_lm,
            preempt_period_s=self.preempt_period_s,
            repartition_batching=self.repartition_batching,
            repartition_period_s=self.repartition_period_s,
            launch_window=self.launch_window,
            launch_full_batch=self.launch_full_batch,
            reroute_at_lm=self.reroute_at_lm,
            class_preempt_grace_s=self.class_preempt_grace_s,
        )

    @cached_property
    def gm_ids(self) -> list[GmId]:
        return [GmId(f"gm{i}") for i in range(self.gms)]

    @cached_property
    def lm_ids(self) -> list[LmId]:
        return [LmId(f"lm{j}") for j in range(self.lms)]

    @cached_property
    def user_configs(self) -> list[UserConfig]:
        return parse_users(self.users, self.gm_ids)

    @cached_property
    def clusters(self) -> list[ClusterSpec]:
        """The clusters (nodes, constraints, homes): every process derives the same ones."""
        return make_federation(
            self.nodes_per_lm * self.lms,
            self.gm_ids,
            self.lms,
            profile(self.profile),
            self.constraints,
            random.Random(self.seed),
        )

    @property
    def broker_urls(self) -> list[str]:
        """Every broker node's URL, in the order a process tries them."""
        return [u.strip() for u in self.broker_url.split(",") if u.strip()]

    def address(self, name: str) -> tuple[str, int]:
        """Where process ``name`` (``gm0``, ``lm1``, ``lm1-workers``) listens."""
        given = self.addresses.get(name)
        if given is not None:
            host, _, port = given.rpartition(":")
            return host, int(port)
        if name.endswith("-workers"):
            return self.host, self.base_port + 200 + self.lm_ids.index(LmId(name[:-8]))
        if name.endswith("-standby"):
            return self.host, self.base_port + 300 + self.lm_ids.index(LmId(name[:-8]))
        if name in self.gm_ids:
            return self.host, self.base_port + self.gm_ids.index(GmId(name))
        return self.host, self.base_port + 100 + self.lm_ids.index(LmId(name))

    def url(self, name: str) -> str:
        host, port = self.address(name)
        return f"{'https' if self.tls_on else 'http'}://{host}:{port}"

    @property
    def hosts(self) -> set[str]:
        """Every host a process or a broker node of the federation is on."""
        hosts = {self.address(n)[0] for n in self.process_names}
        return hosts | {_url_host(u) for u in self.broker_urls}

    @property
    def tls_on(self) -> bool:
        """``tls``: on, off, or (auto) on unless everything is on the loopback."""
        if self.tls == "auto":
            return not self.hosts <= set(LOOPBACK)
        return self.tls == "on"

    def _check_tls(self) -> None:
        if self.tls not in ("auto", "on", "off"):
            raise ConfigError(f"tls must be auto, on or off, not {self.tls!r}")
        if not self.tls_on:
            return
        plain = [u for u in self.broker_urls if not u.startswith("amqps://")]
        if any(_url_host(u) not in LOOPBACK for u in plain):
            raise ConfigError(
                "tls is on and the broker is on another host: give its TLS listener "
                '(amqps://HOST:5671/), or set tls = "off"',
                reason="plain_broker",
            )

    def gm_port(self, gm: str) -> int:
        return self.address(gm)[1]

    def lm_port(self, lm: str) -> int:
        return self.address(lm)[1]

    def worker_port(self, lm: str) -> int:
        return self.address(f"{lm}-workers")[1]

    def gm_url(self, gm: str) -> str:
        return self.url(gm)

    def lm_url(self, lm: str) -> str:
        return self.url(lm)

    def lm_urls(self, lm: str) -> list[str]:
        """Where LM ``lm`` may answer: its process, then its standby's (if any)."""
        return [self.url(lm), self.url(f"{lm}-standby")] if self.lm_standby else [self.url(lm)]

    def worker_url(self, lm: str) -> str:
        return self.url(f"{lm}-workers")

    @property
    def process_names(self) -> list[str]:
        standbys = [f"{lm}-standby" for lm in self.lm_ids] if self.lm_standby else []
        return [*(f"{lm}-workers" for lm in self.lm_ids), *self.lm_ids, *standbys, *self.gm_ids]

    # AMQP names (all under the federation's prefix: ``common.broker_names``)
    @property
    def submit_exchange(self) -> str:
        return names.submit_exchange(self.name)

    @property
    def state_exchange(self) -> str:
        return names.state_exchange(self.name)

    @property
    def events_exchange(self) -> str:
        return names.events_exchange(self.name)

    @property
    def dead_letter_exchange(self) -> str:
        return names.dead_letter_exchange(self.name)

    @property
    def dead_letter_queue(self) -> str:
        return names.dead_letter_queue(self.name)

    def user_queue(self, user: str) -> str:
        return names.user_queue(self.name, user)

    def user_events_queue(self, user: str) -> str:
        """Where a user's task outcomes wait for it (durable: none is lost while the
        user's client is away)."""
        return names.user_events_queue(self.name, user)

    def gm_events_queue(self, gm: str) -> str:
        return names.gm_events_queue(self.name, gm)

    def gm_state_queue(self, gm: str) -> str:
        return names.gm_state_queue(self.name, gm)

    def lm_leader_queue(self, lm: str) -> str:
        return names.lm_leader_queue(self.name, lm)

    def lm_epoch_queue(self, lm: str) -> str:
        return names.lm_epoch_queue(self.name, lm)

    def validate(self) -> FederationConfig:
        if not _NAME.fullmatch(self.name):
            raise ConfigError(
                f"federation name {self.name!r}: 1-64 of [A-Za-z0-9_-] (it prefixes broker "
                "queues and names the broker vhost and users)",
                reason="bad_config",
            )
        if self.gms < 1 or self.lms < 1 or self.nodes_per_lm < 1:
            raise ConfigError("gms, lms and nodes_per_lm must be at least 1")
        if self.nodes_per_lm < self.gms:
            raise ConfigError("every LM needs at least one node per GM partition")
        if self.heartbeat_s <= 0 or self.worker_timeout_s <= self.heartbeat_s:
            raise ConfigError("need 0 < heartbeat_s < worker_timeout_s")
        if not 0 <= self.linger_s <= 1:
            raise ConfigError("linger_s must be within [0, 1] s")
        if not 0 <= self.journal_sync_s <= 60:
            raise ConfigError("journal_sync_s must be within [0, 60] s")
        if self.node_lost_after_s < 0:
            raise ConfigError("node_lost_after_s must be >= 0")
        if min(self.launch_window, self.launch_full_batch) < 0:
            raise ConfigError("launch_window, launch_full_batch must be >= 0 (0: no limit, never)")
        if self.max_user_tasks < 0:
            raise ConfigError("max_user_tasks must be >= 0 (0: no limit)")
        if self.queue_type not in ("quorum", "classic"):
            raise ConfigError(f"queue_type must be quorum or classic, not {self.queue_type!r}")
        self._check_tls()
        if not self.secret:
            raise ConfigError("secret must not be empty")
        if not 1 <= self.base_port <= 65535 - 400:
            raise ConfigError("base_port out of range")
        names = set(self.process_names)
        for name, addr in self.addresses.items():
            if name not in names:
                raise ConfigError(
                    f"addresses: {name!r} is not a process of this federation "
                    f"({', '.join(sorted(names))})"
                )
            host, _, port = addr.rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise ConfigError(f"addresses.{name}: expected 'host:port', got {addr!r}")
        _ = self.user_configs
        if self.queue_policy not in QUEUE_POLICIES:
            raise ConfigError(
                f"queue_policy must be one of {', '.join(QUEUE_POLICIES)}, "
                f"not {self.queue_policy!r}"
            )
        if not (self.priority_aging_s > 0 and self.srpt_half_life_s > 0) or (
            self.class_preempt_grace_s < 0
        ):
            raise ConfigError(
                "priority_aging_s and srpt_half_life_s (inf: no aging) must be > 0, "
                "class_preempt_grace_s >= 0",
                reason="bad_config",
            )
        if not 0.0 <= self.p_altruism <= 1.0:
            raise ConfigError("p_altruism must be in [0, 1]")
        profile(self.profile)
        self._check_task_uids()
        check_allow(self.task_env_allow)
        return self

    def _check_task_uids(self) -> None:
        """Every pool's slice of the task uids: never root, nobody, or past the last uid."""
        box = self.sandbox
        first = box.get("uid_first", SANDBOX_UID_FIRST)
        per_pool = box.get("uids_per_pool", SANDBOX_UIDS_PER_POOL)
        gone = sorted({"uid", "gid", "dedicated_uid"} & set(box))
        if gone:
            raise ConfigError(
                f"sandbox.{', sandbox.'.join(gone)}: gone; each task runs as a uid of its "
                "own from sandbox.uid_first and sandbox.uids_per_pool",
                reason="bad_sandbox",
            )
        for key, value in (("uid_first", first), ("uids_per_pool", per_pool)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"sandbox.{key}: an integer, not {value!r}", reason="bad_sandbox")
        if first < 1:
            raise ConfigError(
                "sandbox.uid_first: the task uids include root (0); commands never run as root",
                reason="root_uid",
            )
        last = first + self.lms * per_pool - 1
        if per_pool < 1 or last > _LAST_UID or first <= _NOBODY <= last:
            raise ConfigError(
                f"sandbox: task uids {first}-{last} ({self.lms} pools of uids_per_pool "
                f"{per_pool}): at least one uid a pool, none past {_LAST_UID}, and not "
                f"nobody ({_NOBODY}), which many programs share",
                reason="bad_sandbox",
            )

    def to_toml(self) -> str:
        """The config as a TOML file, without the secret (which lives in its own file)."""
        lines = ["[federation]"]
        for k, v in asdict(self).items():
            if isinstance(v, dict) or k == "secret":
                continue
            lines.append(f"{k} = {_toml_value(v)}")
        for table in ("addresses", "sandbox"):
            values: dict[str, Any] = getattr(self, table)
            if values:
                lines.append(f"\n[federation.{table}]")
                lines.extend(
                    f"{json.dumps(k)} = {_toml_value(v)}" for k, v in sorted(values.items())
                )
        return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))  # a TOML basic string: JSON's escapes are TOML's


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
        if key == "addresses" and not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f"{key}: every value must be a string")
        kwargs[key] = value
    cfg = FederationConfig(**kwargs)
    env = dict(os.environ) if env is None else env
    if env.get(BROKER_ENV):
        cfg = replace(cfg, broker_url=env[BROKER_ENV])
    return cfg.validate()


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _url_host(url: str) -> str:
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    if rest.startswith("["):
        return rest[1 : rest.index("]")]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


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


TLS_DIRNAME = "tls"
"""Beside the recorded config: the federation's CA and certificates (``security.tls``)."""
TLS_CA_ENV = "MEGHA_TLS_CA"

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

    def spec(role: str, ident: str, name: str) -> ProcessSpec:
        host, port = cfg.address(name)
        argv = [
            "python3",
            "-m",
            "gunicorn",
            APPS[role],
            # aiohttp's uvloop worker, with the JSON refusal of requests aiohttp's
            # parser cannot read (runtime.http.ServiceRunner)
            "--worker-class",
            "runtime.gunicorn_worker.Worker",
            "--workers",
            "1",
            "--bind",
            f"{cfg.listen or host}:{port}",
            "--graceful-timeout",
            "5",
            "--timeout",
            "60",
            # peers post every few hundred ms at most: keep their connections open
            "--keep-alive",
            "300",
            "--no-control-socket",
        ]
        env = {
            CONFIG_ENV: config_path,
            ROLE_ENV: role,
            ID_ENV: ident,
            BROKER_ENV: cfg.broker_url,
        }
        if cfg.tls_on:  # its certificate, and the CA it trusts (security.tls)
            tls = Path(config_path).parent / TLS_DIRNAME
            argv += ["--certfile", str(tls / f"{name}.pem"), "--keyfile", str(tls / f"{name}.key")]
            env[TLS_CA_ENV] = str(tls / "ca.pem")
        return ProcessSpec(name, role, ident, argv, env, port, cfg.url(name))

    for lm in cfg.lm_ids:
        plan.append(spec("worker", lm, f"{lm}-workers"))
    for lm in cfg.lm_ids:
        plan.append(spec("lm", lm, lm))
        if cfg.lm_standby:
            plan.append(spec("lm", lm, f"{lm}-standby"))
    for gm in cfg.gm_ids:
        plan.append(spec("gm", gm, gm))
    return plan
