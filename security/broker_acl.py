"""Broker isolation: one RabbitMQ vhost per federation, one broker user per party.

Guarantees, enforced by RabbitMQ itself once ``provision`` has run:

* guest (and any user not provisioned here) has no access to the vhost;
* nobody but the operator declares, deletes or re-binds the topology: it is
  made once, from the table below, by ``provision`` (services must open it
  passively: ``channel.get_exchange`` / ``get_queue``);
* a user publishes only into its own queue (topic permission on the submit
  exchange: routing key = its name), consumes only its own events queue, and
  declares no queue (each would count against the vhost's ``max-queues``, which one
  user could fill: the LMs' leader queues would find no room, issue 32 item 3);
* a user holds at most ``user_max_connections`` connections and
  ``user_max_channels`` channels (user limits), and its events queue holds at most
  ``max_user_events`` outcomes and ``max_user_events_bytes`` (a policy; the oldest
  dropped: one that never reads them cannot grow the broker until its memory alarm);
* only LMs publish state updates, each under its own routing key; only LMs
  and GMs publish task events, an LM under keys ending ``.<lm>``, a GM only to
  its own users, ending ``.<gm>``; only a user's GM consumes its queue;
* a worker pool's broker user may connect and do nothing (reports go by HTTP).

The topology (``F`` is the federation's name, also its vhost)::

    exchange    type    published by (routing key)                 bound to (key)
    F.submit    topic   user U (U)                                 F.user.U (U)
    F.state     topic   LM L (L)                                   F.gm.G.state (#)
    F.events    topic   LM L (gm.G.L); GM G (user.U.G, sealed      F.gm.G.events (gm.G.#),
                        for U served by G)                         F.user.U.events (user.U.#)
    F.dlx       fanout  GMs (refused jobs); the broker (user       F.dead
                        queues' dead letters)

    queue            consumed by   arguments
    F.user.U         U's GM        durable, x-queue-type, dead-letter F.dlx, max length and
                                   max bytes (reject)
    F.user.U.events  U             durable; policy: max length and max bytes (drop oldest)
    F.gm.G.events    G             durable
    F.gm.G.state     G             durable, message TTL, max length (drop oldest)
    F.dead           operator      durable, max length and max bytes (drop oldest)

Queue arguments are fixed when a queue is first declared: provisioning an existing
vhost again (``import_definitions``) keeps its queues as they are, so new limits
reach a federation once it is purged (``megha down --purge``) and made again.  A
policy (the users' events queues) and user limits apply at once.

Provisioning imports one RabbitMQ definitions document (vhost, users with
salted password hashes and users' limits, permissions, topic permissions,
topology, a queue limit, the users' events policy) with ``rabbitmqctl import_definitions``: one call, no password on a
command line.  The same document is what the management HTTP API accepts at
``POST /api/definitions``.  Passwords are random, kept in a 0600 file
(``BrokerCredentials``), and reused when provisioning again.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from common import broker_names as names
from common.broker_names import (
    epoch_key,
    state_key,
    submit_key,
    user_events_binding,
)
from common.config import FederationConfig
from common.errors import ConfigError
from security.files import read_private, write_private
from security.identity import OPERATOR, Identity, Role, is_valid_name

CREDENTIALS_FILENAME = "broker.json"
CREDENTIALS_ENV = "MEGHA_BROKER_CREDENTIALS"
"""Names the credentials file for services; each takes the URL of its own identity."""
NOTHING = "^$"
"""A permission pattern that matches no resource (the default exchange is ``amq.default``)."""
EVERYTHING = ".*"
_ID_CLASS = "[A-Za-z0-9_-]+"

DEFAULT_MAX_JOB_BYTES = 16 * 1024 * 1024
"""The largest job a GM reads (``FederationConfig.max_body``'s default)."""
USER_QUEUE_JOBS_OF_MAX_SIZE = 16
"""A user's queue holds at most this many jobs of the largest size a GM accepts, in
bytes (``max_user_queue_bytes``): one user cannot grow the broker's storage beyond
that, and a largest job always fits into a queue that is not full of others."""
DEFAULT_MAX_DEAD_LETTERS = 10_000
DEFAULT_MAX_DEAD_LETTER_BYTES = 64 * 1024 * 1024
"""Dead letters kept (``F.dead``), by count and by bytes of body; the oldest go first.
Services dead-letter a body cut to ``runtime.broker.DEAD_LETTER_BODY`` bytes."""


def _only(*names: str) -> str:
    """A pattern matching exactly ``names``."""
    if not names:
        return NOTHING
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


# ----------------------------------------------------------------- layout
@dataclass(frozen=True, slots=True)
class BrokerLayout:
    """The parties of one federation and the knobs of its queues."""

    federation: str
    gms: tuple[str, ...]
    lms: tuple[str, ...]
    users: tuple[tuple[str, str], ...]
    """(user, the GM serving it)."""
    queue_type: str = "classic"
    delivery_limit: int = 5
    max_user_queue: int = 100_000
    """Jobs waiting in one user's queue; more are refused (nack) to the publisher."""
    max_state_queue: int = 10_000
    """State updates kept for a GM that is away (the oldest are dropped: each update is
    superseded by the next, and a GM takes snapshots when it starts)."""
    state_ttl_ms: int = 60_000
    extra_queues: int = 1_024
    """Queues beyond the topology the vhost may hold: the LMs' leader queues and the
    operator's private queues (users may declare none: one could fill them all)."""
    user_max_connections: int = 8
    """Broker connections one user may hold at once (``rabbitmqctl set_user_limits``)."""
    user_max_channels: int = 64
    """Channels one user may hold at once, over all its connections."""
    max_user_events: int = 100_000
    """Outcomes waiting in one user's events queue; past it the oldest are dropped (a
    user that never reads them must not grow the broker until its alarm blocks every
    publisher)."""
    max_user_events_bytes: int = 64 * 1024 * 1024
    max_user_queue_bytes: int = USER_QUEUE_JOBS_OF_MAX_SIZE * DEFAULT_MAX_JOB_BYTES
    """Bytes of jobs waiting in one user's queue; more are refused (nack) too."""
    max_dead_letters: int = DEFAULT_MAX_DEAD_LETTERS
    max_dead_letter_bytes: int = DEFAULT_MAX_DEAD_LETTER_BYTES
    """The dead letters kept, by count and bytes: the newest reasons survive."""

    def __post_init__(self) -> None:
        for kind, parts in (
            ("GM", self.gms),
            ("LM", self.lms),
            ("user", [u for u, _ in self.users]),
        ):
            for n in parts:
                if not is_valid_name(n):
                    raise ConfigError(f"bad {kind} name {n!r}", reason="bad_name")
            if len(set(parts)) != len(parts):
                raise ConfigError(f"a {kind} appears twice", reason="bad_name")
        if not is_valid_name(self.federation):
            raise ConfigError(f"bad federation name {self.federation!r}", reason="bad_name")
        for u, g in self.users:
            if g not in self.gms:
                raise ConfigError(f"user {u!r} is served by unknown GM {g!r}", reason="bad_name")
        if self.queue_type not in ("classic", "quorum"):
            raise ConfigError(f"bad queue_type {self.queue_type!r}", reason="bad_config")
        limits = (self.max_user_queue_bytes, self.max_dead_letters, self.max_dead_letter_bytes)
        if min(limits) < 1:
            raise ConfigError("queue limits must be positive", reason="bad_config")

    @classmethod
    def from_config(cls, cfg: FederationConfig) -> BrokerLayout:
        return cls(
            federation=cfg.name,
            gms=tuple(cfg.gm_ids),
            lms=tuple(cfg.lm_ids),
            users=tuple((u.user, u.gm) for u in cfg.user_configs),
            queue_type=cfg.queue_type,
            delivery_limit=cfg.delivery_limit,
            max_user_queue_bytes=USER_QUEUE_JOBS_OF_MAX_SIZE * cfg.max_body,
        )

    @property
    def vhost(self) -> str:
        return self.federation

    def users_of(self, gm: str) -> list[str]:
        return [u for u, g in self.users if g == gm]

    def identities(self) -> list[Identity]:
        """Every party that gets a broker user."""
        return [
            OPERATOR,
            *(Identity(Role.GM, g) for g in self.gms),
            *(Identity(Role.LM, x) for x in self.lms),
            *(Identity(Role.WORKERS, x) for x in self.lms),
            *(Identity(Role.USER, u) for u, _ in self.users),
        ]

    def broker_user(self, identity: Identity) -> str:
        """RabbitMQ user names are global to the broker: prefixed by the federation."""
        return f"{self.federation}.{identity.role.value}.{identity.name}"

    # names: ``common.broker_names``, under the federation's prefix
    @property
    def submit_exchange(self) -> str:
        return names.submit_exchange(self.federation)

    @property
    def state_exchange(self) -> str:
        return names.state_exchange(self.federation)

    @property
    def events_exchange(self) -> str:
        return names.events_exchange(self.federation)

    @property
    def dead_letter_exchange(self) -> str:
        return names.dead_letter_exchange(self.federation)

    @property
    def dead_letter_queue(self) -> str:
        return names.dead_letter_queue(self.federation)

    def user_queue(self, user: str) -> str:
        return names.user_queue(self.federation, user)

    def user_events_queue(self, user: str) -> str:
        return names.user_events_queue(self.federation, user)

    def gm_events_queue(self, gm: str) -> str:
        return names.gm_events_queue(self.federation, gm)

    def gm_state_queue(self, gm: str) -> str:
        return names.gm_state_queue(self.federation, gm)

    def lm_epoch_queue(self, lm: str) -> str:
        return names.lm_epoch_queue(self.federation, lm)

    def lm_leader_queue(self, lm: str) -> str:
        return names.lm_leader_queue(self.federation, lm)


# --------------------------------------------------------------- topology
@dataclass(frozen=True, slots=True)
class ExchangeSpec:
    name: str
    type: str


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    arguments: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True, slots=True)
class BindingSpec:
    exchange: str
    queue: str
    routing_key: str


@dataclass(frozen=True, slots=True)
class Topology:
    """Everything the operator declares; all durable, none auto-deleted."""

    exchanges: tuple[ExchangeSpec, ...]
    queues: tuple[QueueSpec, ...]
    bindings: tuple[BindingSpec, ...]


def topology(layout: BrokerLayout) -> Topology:
    """The declarative table of the module docstring, for ``layout``."""
    lay = layout
    exchanges = (
        ExchangeSpec(lay.submit_exchange, "topic"),
        ExchangeSpec(lay.state_exchange, "topic"),
        ExchangeSpec(lay.events_exchange, "topic"),
        ExchangeSpec(lay.dead_letter_exchange, "fanout"),
    )
    user_q: list[tuple[str, str | int]] = [
        ("x-queue-type", lay.queue_type),
        ("x-dead-letter-exchange", lay.dead_letter_exchange),
        ("x-max-length", lay.max_user_queue),
        ("x-max-length-bytes", lay.max_user_queue_bytes),
        ("x-overflow", "reject-publish"),
    ]
    if lay.queue_type == "quorum":
        user_q.append(("x-delivery-limit", lay.delivery_limit))
    typed: tuple[tuple[str, str | int], ...] = (("x-queue-type", lay.queue_type),)
    # state updates are transient and superseded by the next: the newest few are kept
    state_q: tuple[tuple[str, str | int], ...] = (
        *typed,  # replicated too: a GM must find it on any node of a cluster
        ("x-message-ttl", lay.state_ttl_ms),
        ("x-max-length", lay.max_state_queue),
        ("x-overflow", "drop-head"),
    )
    # the newest dead letters are kept, within bounds: a user publishing large garbage
    # into its own queue must not grow the broker's storage without end
    dead_q: tuple[tuple[str, str | int], ...] = (
        *typed,
        ("x-max-length", lay.max_dead_letters),
        ("x-max-length-bytes", lay.max_dead_letter_bytes),
        ("x-overflow", "drop-head"),
    )
    queues: list[QueueSpec] = [QueueSpec(lay.dead_letter_queue, dead_q)]
    bindings: list[BindingSpec] = [BindingSpec(lay.dead_letter_exchange, lay.dead_letter_queue, "")]
    for u, _ in lay.users:
        # outcomes are never dropped: they wait, durable, until the user reads them
        queues += [
            QueueSpec(lay.user_queue(u), tuple(user_q)),
            QueueSpec(lay.user_events_queue(u), typed),
        ]
        bindings += [
            BindingSpec(lay.submit_exchange, lay.user_queue(u), submit_key(u)),
            BindingSpec(lay.events_exchange, lay.user_events_queue(u), user_events_binding(u)),
        ]
    for g in lay.gms:
        queues += [
            QueueSpec(lay.gm_events_queue(g), typed),
            QueueSpec(lay.gm_state_queue(g), state_q),
        ]
        bindings += [
            BindingSpec(lay.events_exchange, lay.gm_events_queue(g), names.gm_events_binding(g)),
            BindingSpec(lay.state_exchange, lay.gm_state_queue(g), names.STATE_BINDING),
        ]
    for x in lay.lms:
        queues.append(QueueSpec(lay.lm_epoch_queue(x), typed))
        bindings.append(BindingSpec(lay.state_exchange, lay.lm_epoch_queue(x), epoch_key(x)))
    return Topology(exchanges, tuple(queues), tuple(bindings))


# ----------------------------------------------------------- permissions
@dataclass(frozen=True, slots=True)
class TopicGrant:
    """Routing keys a party may publish with (write) and bind with (read) on ``exchange``."""

    exchange: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class Grant:
    """RabbitMQ's configure / write / read patterns over resource names, and topic grants.

    A topic exchange a party may touch always has a ``TopicGrant``: RabbitMQ lets
    any routing key through where none is set."""

    configure: str
    write: str
    read: str
    topics: tuple[TopicGrant, ...] = ()


def grants(layout: BrokerLayout) -> dict[Identity, Grant]:
    """Who may do what, for every party of ``layout``: the permission table."""
    lay = layout
    out: dict[Identity, Grant] = {OPERATOR: Grant(EVERYTHING, EVERYTHING, EVERYTHING)}
    for g in lay.gms:
        served = lay.users_of(g)
        alt = "|".join(re.escape(u) for u in served)
        outcome_keys = f"^user\\.({alt})\\.{re.escape(g)}$" if served else NOTHING
        out[Identity(Role.GM, g)] = Grant(
            configure=NOTHING,
            # it returns tasks of acknowledged jobs to its users' queues (durable)
            write=_only(lay.submit_exchange, lay.events_exchange, lay.dead_letter_exchange),
            read=_only(
                *(lay.user_queue(u) for u in served), lay.gm_events_queue(g), lay.gm_state_queue(g)
            ),
            topics=(
                TopicGrant(lay.events_exchange, outcome_keys, NOTHING),
                TopicGrant(lay.submit_exchange, _only(*(submit_key(u) for u in served)), NOTHING),
            ),
        )
    gm_alt = "|".join(re.escape(g) for g in lay.gms)
    for x in lay.lms:
        out[Identity(Role.LM, x)] = Grant(
            # an LM with a standby holds its leader queue (exclusive, its own connection)
            configure=_only(lay.lm_leader_queue(x)),
            write=_only(lay.state_exchange, lay.events_exchange),
            read=_only(lay.lm_epoch_queue(x), lay.lm_leader_queue(x)),
            topics=(
                TopicGrant(lay.state_exchange, _only(state_key(x), epoch_key(x)), NOTHING),
                # events to the GMs only: a user's outcomes are its GM's word (sealed)
                TopicGrant(lay.events_exchange, f"^gm\\.({gm_alt})\\.{re.escape(x)}$", NOTHING),
            ),
        )
        out[Identity(Role.WORKERS, x)] = Grant(NOTHING, NOTHING, NOTHING)
    for u, _ in lay.users:
        # no queue of its own making: each counts against the vhost's max-queues, which
        # one user could fill (and with it the LMs' leader election), and each would
        # hold a copy of every outcome bound to it; it reads its events queue
        out[Identity(Role.USER, u)] = Grant(
            configure=NOTHING,
            write=_only(lay.submit_exchange),
            read=_only(lay.user_events_queue(u)),
            topics=(
                TopicGrant(lay.submit_exchange, _only(submit_key(u)), NOTHING),
                TopicGrant(lay.events_exchange, NOTHING, "^user\\." + re.escape(u) + "\\."),
            ),
        )
    return out


# ------------------------------------------------------------ credentials
@dataclass(frozen=True, slots=True)
class BrokerCredentials:
    """Where the broker is and each party's password; stored in a 0600 file."""

    scheme: str
    host: str
    port: int
    vhost: str
    passwords: Mapping[str, str] = field(repr=False)
    """``str(identity)`` -> password."""
    users: Mapping[str, str] = field(default_factory=dict)
    """``str(identity)`` -> broker user name."""

    def url(self, identity: Identity) -> str:
        """``amqp://user:pass@host:port/vhost`` for ``identity``."""
        key = str(identity)
        if key not in self.passwords:
            raise ConfigError(f"no broker credentials for {identity}", reason="no_credentials")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (
            f"{self.scheme}://{quote(self.users[key], safe='')}:"
            f"{quote(self.passwords[key], safe='')}@{host}:{self.port}/{quote(self.vhost, safe='')}"
        )

    def to_json(self) -> bytes:
        doc = {
            "scheme": self.scheme,
            "host": self.host,
            "port": self.port,
            "vhost": self.vhost,
            "identities": {
                k: {"user": self.users[k], "password": self.passwords[k]}
                for k in sorted(self.passwords)
            },
        }
        return (json.dumps(doc, indent=2) + "\n").encode()

    def save(self, path: Path) -> None:
        write_private(path, self.to_json())

    @classmethod
    def load(cls, path: Path, *, mounted_ok: bool | None = None) -> BrokerCredentials:
        try:
            doc = json.loads(read_private(path, mounted_ok=mounted_ok))
            ids = doc["identities"]
            return cls(
                scheme=str(doc["scheme"]),
                host=str(doc["host"]),
                port=int(doc["port"]),
                vhost=str(doc["vhost"]),
                passwords={k: str(v["password"]) for k, v in ids.items()},
                users={k: str(v["user"]) for k, v in ids.items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConfigError(
                f"{path} is not a broker credentials file", reason="bad_credentials"
            ) from None


def make_credentials(
    layout: BrokerLayout, broker_url: str, existing: BrokerCredentials | None = None
) -> BrokerCredentials:
    """Credentials for every party of ``layout`` on the broker of ``broker_url`` (its
    user and vhost are ignored); parties in ``existing`` keep their passwords."""
    u = urlparse(broker_url)
    if u.scheme not in ("amqp", "amqps") or not u.hostname:
        raise ConfigError(f"not an AMQP URL: {u.scheme}://{u.hostname}", reason="bad_config")
    old = dict(existing.passwords) if existing is not None else {}
    passwords = {str(i): old.get(str(i)) or secrets.token_urlsafe(24) for i in layout.identities()}
    users = {str(i): layout.broker_user(i) for i in layout.identities()}
    port = u.port or (5671 if u.scheme == "amqps" else 5672)
    return BrokerCredentials(u.scheme, u.hostname, port, layout.vhost, passwords, users)


def load_broker_url(
    identity: Identity, path: Path | None = None, *, environ: Mapping[str, str] = os.environ
) -> str:
    """A service's broker URL, from ``path`` or ``$MEGHA_BROKER_CREDENTIALS``."""
    if path is None:
        name = environ.get(CREDENTIALS_ENV)
        if not name:
            raise ConfigError(
                f"no broker credentials: set {CREDENTIALS_ENV}", reason="no_credentials"
            )
        path = Path(name)
    return BrokerCredentials.load(path).url(identity)


# ------------------------------------------------------------ definitions
def rabbit_password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt4 + sha256(salt4 + password))."""
    salt = secrets.token_bytes(4) if salt is None else salt
    if len(salt) != 4:
        raise ValueError("RabbitMQ salts are 4 bytes")
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def definitions(layout: BrokerLayout, creds: BrokerCredentials) -> dict[str, Any]:
    """The RabbitMQ definitions document that provisions ``layout``."""
    return {
        "vhosts": [{"name": layout.vhost}],
        **_accounts(layout, creds),
        **_topology_definitions(layout),
    }


def _accounts(layout: BrokerLayout, creds: BrokerCredentials) -> dict[str, Any]:
    """The definitions' users, their permissions and topic permissions."""
    v = layout.vhost
    table = grants(layout)
    return {
        "users": [
            {
                "name": layout.broker_user(i),
                "password_hash": rabbit_password_hash(creds.passwords[str(i)]),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": "",
                **({"limits": user_limits(layout)} if i.role is Role.USER else {}),
            }
            for i in table
        ],
        "permissions": [
            {
                "user": layout.broker_user(i),
                "vhost": v,
                "configure": g.configure,
                "write": g.write,
                "read": g.read,
            }
            for i, g in table.items()
        ],
        "topic_permissions": [
            {
                "user": layout.broker_user(i),
                "vhost": v,
                "exchange": t.exchange,
                "write": t.write,
                "read": t.read,
            }
            for i, g in table.items()
            for t in g.topics
        ],
    }


def _topology_definitions(layout: BrokerLayout) -> dict[str, Any]:
    """The definitions' exchanges, queues, bindings and the vhost's queue limit."""
    v = layout.vhost
    topo = topology(layout)
    return {
        "exchanges": [
            {
                "name": e.name,
                "vhost": v,
                "type": e.type,
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
            for e in topo.exchanges
        ],
        "queues": [
            {
                "name": q.name,
                "vhost": v,
                "durable": True,
                "auto_delete": False,
                "arguments": dict(q.arguments),
            }
            for q in topo.queues
        ],
        "bindings": [
            {
                "source": b.exchange,
                "vhost": v,
                "destination": b.queue,
                "destination_type": "queue",
                "routing_key": b.routing_key,
                "arguments": {},
            }
            for b in topo.bindings
        ],
        "parameters": [
            {
                "vhost": v,
                "component": "vhost-limits",
                "name": "limits",
                "value": {"max-queues": len(topo.queues) + layout.extra_queues},
            }
        ],
        "policies": [user_events_policy(layout)],
    }


def user_limits(layout: BrokerLayout) -> dict[str, int]:
    """What one user's broker login may hold at once."""
    return {
        "max-connections": layout.user_max_connections,
        "max-channels": layout.user_max_channels,
    }


def user_events_policy(layout: BrokerLayout) -> dict[str, Any]:
    """The users' events queues bounded, the oldest outcomes dropped first (a policy:
    it applies to queues declared before it, unlike queue arguments)."""
    users = "|".join(re.escape(u) for u, _ in layout.users) or "(?!)"
    pattern = f"^{re.escape(layout.federation)}\\.user\\.({users})\\.events$"
    return {
        "vhost": layout.vhost,
        "name": f"{layout.federation}-user-events",
        "pattern": pattern,
        "apply-to": "queues",
        "priority": 0,
        "definition": {
            "max-length": layout.max_user_events,
            "max-length-bytes": layout.max_user_events_bytes,
            "overflow": "drop-head",
        },
    }


# ------------------------------------------------------------ rabbitmqctl
class Rabbitmqctl:
    """Runs ``rabbitmqctl`` (as root or the rabbitmq user, on the broker's host)."""

    def __init__(
        self, command: Sequence[str] = ("rabbitmqctl",), *, timeout_s: float = 60.0
    ) -> None:
        self.command = tuple(command)
        self.timeout_s = timeout_s

    def _argv(self, args: Sequence[str]) -> list[str]:
        return [*self.command, "-q", *args]

    def _check(self, args: Sequence[str], code: int, out: str, absent_ok: bool) -> str:
        if code == 0:
            return out
        if absent_ok and "does not exist" in out:
            return ""
        raise ConfigError(
            f"rabbitmqctl {args[0]} failed: {out.strip()[-500:]}", reason="rabbitmqctl_failed"
        )

    def run(self, *args: str, absent_ok: bool = False) -> str:
        """Run one command; ``ConfigError`` if it fails (unless the object is absent
        and ``absent_ok``)."""
        try:
            proc = subprocess.run(
                self._argv(args),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(
                f"rabbitmqctl {args[0]}: {exc}", reason="rabbitmqctl_failed"
            ) from None
        return self._check(args, proc.returncode, proc.stdout + proc.stderr, absent_ok)

    def run_all(
        self, commands: Sequence[Sequence[str]], *, absent_ok: bool = False, parallel: int = 4
    ) -> None:
        """Run independent commands a few at a time (each ``rabbitmqctl`` is a VM start-up,
        mostly waiting); the first failure is raised once all have ended."""
        failure: ConfigError | None = None
        for i in range(0, len(commands), parallel):
            batch = commands[i : i + parallel]
            procs = []
            for args in batch:
                try:
                    procs.append(
                        subprocess.Popen(
                            self._argv(args),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            text=True,
                        )
                    )
                except OSError as exc:
                    raise ConfigError(f"rabbitmqctl: {exc}", reason="rabbitmqctl_failed") from None
            for args, proc in zip(batch, procs, strict=True):
                try:
                    out, _ = proc.communicate(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, _ = proc.communicate()
                    failure = failure or ConfigError(
                        f"rabbitmqctl {args[0]} timed out", reason="rabbitmqctl_failed"
                    )
                    continue
                try:
                    self._check(args, proc.returncode, out, absent_ok)
                except ConfigError as exc:
                    failure = failure or exc
        if failure is not None:
            raise failure

    def delete_users(self, names: Sequence[str]) -> None:
        """Delete these broker users (one that is absent is skipped), in one VM start-up
        where the broker's own internal-user API answers through ``eval`` (what
        ``delete_user`` calls: permissions go, connections close); else, or if that
        fails part-way, one ``delete_user`` each.  Each ``rabbitmqctl`` costs about a
        CPU-second: a federation's dozen users took 10 s one by one."""
        if not names:
            return
        with contextlib.suppress(ConfigError):
            if self.run("eval", _erlang_delete_users(names)).strip() == "true":
                return
        self.run_all([["delete_user", u] for u in names], absent_ok=True)

    def json(self, *args: str) -> list[dict[str, Any]]:
        out = self.run(*args, "--formatter", "json").strip()
        rows: list[dict[str, Any]] = json.loads(out) if out else []
        return rows

    def vhost_exists(self, vhost: str) -> bool:
        return any(r.get("name") == vhost for r in self.json("list_vhosts", "name"))

    def import_definitions(self, doc: Mapping[str, Any]) -> None:
        with _readable_by_broker() as directory:
            path = directory / "definitions.json"
            write_private(path, json.dumps(doc).encode())
            _give_to_broker(path)
            self.run("import_definitions", str(path))

    def users_with_access(self, vhost: str) -> list[str]:
        return [str(r["user"]) for r in self.json("list_permissions", "-p", vhost)]

    def users(self) -> list[str]:
        """Every user of the broker, by name."""
        return [str(r["user"]) for r in self.json("list_users")]


def _erlang_binary(text: str) -> str:
    """``text`` as an Erlang binary of its UTF-8 bytes, written as numbers: nothing in
    a name can end the literal."""
    return "<<" + ",".join(str(b) for b in text.encode()) + ">>"


def _erlang_delete_users(names: Sequence[str]) -> str:
    """An expression that deletes the users that exist of ``names`` and prints
    ``true`` when each deletion answered ``ok``."""
    users = ", ".join(_erlang_binary(n) for n in names)
    m = "rabbit_auth_backend_internal"
    return (
        f"lists:all(fun(U) -> case {m}:exists(U) of "
        f"true -> {m}:delete_user(U, {_erlang_binary('megha')}) =:= ok; false -> true end "
        f"end, [{users}])."
    )


@contextlib.contextmanager
def _readable_by_broker() -> Iterator[Path]:
    """A private temporary directory the broker's CLI can read (rabbitmqctl run as root
    drops to the rabbitmq user before it opens the file)."""
    directory = Path(tempfile.mkdtemp(prefix="megha-defs-"))
    try:
        _give_to_broker(directory)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _give_to_broker(path: Path) -> None:
    if os.geteuid() != 0:
        return
    try:
        rabbit = pwd.getpwnam("rabbitmq")
    except KeyError:
        return
    os.chown(path, rabbit.pw_uid, rabbit.pw_gid)


def provision(
    layout: BrokerLayout,
    creds: BrokerCredentials,
    ctl: Rabbitmqctl,
    *,
    allow_existing: bool = False,
) -> None:
    """Create the vhost, users, permissions and topology of ``layout``.

    Refuses a vhost that exists already unless ``allow_existing`` (provisioning the
    same federation again: idempotent, passwords from ``creds``).  Afterwards only
    the parties of ``layout`` have access to the vhost."""
    if ctl.vhost_exists(layout.vhost) and not allow_existing:
        raise ConfigError(
            f"RabbitMQ vhost {layout.vhost!r} exists: another federation of that name, or "
            "one not purged (`megha down --purge`)",
            reason="vhost_exists",
        )
    ctl.import_definitions(definitions(layout, creds))
    ours = {layout.broker_user(i) for i in layout.identities()}
    strangers = [u for u in ctl.users_with_access(layout.vhost) if u not in ours]
    # guest, or a party removed since: no access to our vhost
    ctl.run_all(
        [["clear_permissions", "-p", layout.vhost, u] for u in strangers]
        + [["clear_topic_permissions", "-p", layout.vhost, u] for u in strangers],
        absent_ok=True,
    )


def remove_party(layout: BrokerLayout, identity: Identity, ctl: Rabbitmqctl) -> None:
    """Delete one party's broker user (e.g. a revoked user); its connections close."""
    ctl.run("delete_user", layout.broker_user(identity), absent_ok=True)


def is_party_user(federation: str, name: str) -> bool:
    """Is broker user ``name`` one ``provision`` makes for a party of ``federation``
    (``<federation>.<role>.<party>``), whether or not the party is still configured?
    A federation's name has no dot, so no other federation's user is one."""
    parts = name.split(".")
    return (
        len(parts) == 3
        and parts[0] == federation
        and parts[1] in {r.value for r in Role}
        and is_valid_name(parts[2])
    )


def teardown(layout: BrokerLayout, ctl: Rabbitmqctl) -> list[str]:
    """``megha down --purge``: delete the vhost (queues, exchanges, permissions), every
    broker user of ``layout``, and the users of parties of the same federation that
    ``layout`` no longer has (left by an older config: ``provision`` only took their
    access); what is absent already is skipped.  Returns those left-over users."""
    ctl.run("delete_vhost", layout.vhost, absent_ok=True)
    ours = [layout.broker_user(i) for i in layout.identities()]
    left = sorted(u for u in set(ctl.users()) - set(ours) if is_party_user(layout.federation, u))
    ctl.delete_users(ours + left)
    return left
