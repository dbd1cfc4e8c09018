"""A federation's names on the broker: exchanges, queues, routing keys and bindings.

The one table the services, the request generator and the broker permissions
(``security.broker_acl``) share; ``f`` is the federation's name.  Every name part
(user, GM, LM) is an identity name (``[A-Za-z0-9_-]``): no dots, so routing keys
split where they should.

    exchange     type     routing key (published by)              bound queue (binding key)
    f.submit     topic    U (user U; GM of U, returned tasks)      f.user.U (U)
    f.state      topic    lm.L (LM L), epoch.L (LM L)              f.gm.G.state (lm.*), f.lm.L.epoch (epoch.L)
    f.events     topic    gm.G.L (LM L), user.U.S (LM or GM S)     f.gm.G.events (gm.G.#), f.user.U.events (user.U.#)
    f.dlx        fanout   (GMs, and the broker)                    f.dead
"""

from __future__ import annotations


def submit_exchange(f: str) -> str:
    return f"{f}.submit"


def state_exchange(f: str) -> str:
    return f"{f}.state"


def events_exchange(f: str) -> str:
    return f"{f}.events"


def dead_letter_exchange(f: str) -> str:
    return f"{f}.dlx"


def dead_letter_queue(f: str) -> str:
    return f"{f}.dead"


def user_queue(f: str, user: str) -> str:
    """A user's submissions (consumed by its GM)."""
    return f"{f}.user.{user}"


def user_events_queue(f: str, user: str) -> str:
    """A user's task outcomes (consumed by the user)."""
    return f"{f}.user.{user}.events"


def gm_events_queue(f: str, gm: str) -> str:
    """Task events from every LM to the GM that placed the tasks."""
    return f"{f}.gm.{gm}.events"


def gm_state_queue(f: str, gm: str) -> str:
    """Every LM's state updates, for one GM."""
    return f"{f}.gm.{gm}.state"


def lm_epoch_queue(f: str, lm: str) -> str:
    """The latest epoch any incarnation of ``lm`` took."""
    return f"{f}.lm.{lm}.epoch"


def lm_leader_queue(f: str, lm: str) -> str:
    """Held, exclusively, by the active process of an LM that has a standby."""
    return f"{f}.lm.{lm}.leader"


# routing and binding keys
def submit_key(user: str) -> str:
    return user


def state_key(lm: str) -> str:
    return f"lm.{lm}"


STATE_BINDING = "lm.*"


def epoch_key(lm: str) -> str:
    return f"epoch.{lm}"


def gm_event_key(gm: str, lm: str) -> str:
    """A task event for the GM that placed the task, from LM ``lm``."""
    return f"gm.{gm}.{lm}"


def gm_events_binding(gm: str) -> str:
    return f"gm.{gm}.#"


def user_event_key(user: str, source: str) -> str:
    """Task outcomes for ``user``, from GM (or LM) ``source``."""
    return f"user.{user}.{source}"


def user_events_binding(user: str) -> str:
    """The only key ``user`` may bind a queue of its own with."""
    return f"user.{user}.#"
