"""Whether a message is for this LM at all, and a GM request well formed: the checks
before any placement in it is judged against the node table.

Invariants:

* One address guard for every message a GM or a worker pool sends, in one order: the
  wrong LM (``wrong_lm``), then an LM whose pool has not registered yet (the sender's
  own reason: ``not_ready``, ask again later, for a GM; ``register_first`` for a pool),
  then a GM not of the federation (``unknown_gm``).
* A GM request is refused whole when a task in it has the wrong number of resource
  amounts (``wrong_resources``) or comes twice (``duplicate_task_id``); otherwise each
  placement is judged alone.
* A GM places only its own users' tasks: a placement or preemption for a user whose GM
  is another (or unknown) is refused, ``foreign_user``, before anything held is looked
  at, so one GM cannot supersede, stop or impersonate another GM's user's task.
* Reasons are the wire's (``runtime.http`` maps them to statuses, the worker pool
  registers on ``register_first``): never renamed here.

``Address`` owns the LM's identity and registration; the rest are pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from common.ids import GmId, LmId, UserId
from common.messages import Refused
from common.model import TaskKey, TaskSpec
from common.reasons import RequestReason

ASK_LATER = (RequestReason.NOT_READY, "awaits its workers")
"""A GM's request before the pool registered: the LM may hold the task without knowing
yet, so the GM asks again later (503)."""
REGISTER_FIRST = (RequestReason.REGISTER_FIRST, "restarted")
"""A pool's message before it registered: it tells this incarnation what runs first."""


class Address:
    """Who this LM is, the GMs whose requests it takes, and whether its pool has
    registered: the one address guard (``refuse``)."""

    __slots__ = ("first_check", "gms", "lm", "pool_given_up", "registered")

    def __init__(self, lm: LmId, gms: frozenset[GmId], *, registered: bool) -> None:
        self.lm = lm
        self.gms = gms
        self.registered = registered
        self.first_check = -1.0
        self.pool_given_up = False
        """The pool has not registered and has been silent past ``lost_after`` since
        this LM's first check (what its nodes held given up): this LM's state is then
        what it says -- every node dead, nothing held -- so it takes GMs' requests
        again instead of asking them to wait: a snapshot (a GM that starts needs a view
        of every LM before it takes jobs), a launch or reservation (refused node by
        node: its tasks go elsewhere).  Before, a pool gone for good left every GM that
        started afterwards without jobs, and a launch in flight asked for ever."""

    def checked(self, now: float, lost_after: float) -> None:
        """A liveness check at ``now``: a pool that has not registered since this LM's
        first check more than ``lost_after`` ago is given up (``pool_given_up``; its
        silence counts from then: a restored node's last word is from before)."""
        if self.first_check < 0:
            self.first_check = now
        if not self.registered and now - self.first_check > lost_after:
            self.pool_given_up = True

    def register(self) -> None:
        """The pool has told this incarnation what runs: messages that waited for it are
        taken from now on."""
        self.registered = True

    def refuse(
        self, to: LmId, gm: GmId | None = None, unready: tuple[RequestReason, str] | None = None
    ) -> Refused | None:
        """Why a message sent to LM ``to`` (by GM ``gm``, if a GM sent it) is not for this
        LM now, or None.  ``unready``: the refusal while the pool has not registered
        (None: taken before)."""
        if to != self.lm:
            return Refused(reason=RequestReason.WRONG_LM, detail=f"this is {self.lm}, not {to}")
        given_up = self.pool_given_up and unready is ASK_LATER  # GMs need wait no more
        if unready is not None and not self.registered and not given_up:
            return Refused(reason=unready[0], detail=f"{self.lm} {unready[1]}")
        if gm is not None and gm not in self.gms:
            return Refused(
                reason=RequestReason.UNKNOWN_GM, detail=f"{gm} is not a GM of this federation"
            )
        return None


FOREIGN_USER = "foreign_user"
USER_REVOKED = "user_revoked"


def refused_user(owners: Mapping[UserId, GmId | None] | None, user: UserId, gm: GmId) -> str | None:
    """Why GM ``gm`` may not launch for ``user``, or None: ``user_revoked`` (its token
    is revoked: ``owners`` maps it to None; an LM started after the revocation refuses it
    too), ``foreign_user`` (not ``gm``'s).  ``owners``: every user's GM; None: not
    checked, as in the simulator, where every GM is the federation's own code."""
    if owners is None:
        return None
    if user in owners and owners[user] is None:
        return USER_REVOKED
    return FOREIGN_USER if owners.get(user) != gm else None


def refuse_request(specs: Iterable[TaskSpec], n_resources: int) -> Refused | None:
    """Why a GM request of these tasks is refused whole, or None."""
    seen: set[TaskKey] = set()
    for spec in specs:
        if len(spec.demand) != n_resources:
            return Refused(
                reason=RequestReason.WRONG_RESOURCES,
                detail=f"task {spec.task_id}: {len(spec.demand)} resource amounts, "
                f"this cluster has {n_resources}",
            )
        key = (spec.user, spec.task_id)
        if key in seen:
            return Refused(
                reason=RequestReason.DUPLICATE_TASK_ID,
                detail=f"task {spec.task_id} twice in one request",
            )
        seen.add(key)
    return None


def unknown_node(node: int) -> Refused:
    """A pool's message about a node this LM does not have."""
    return Refused(reason=RequestReason.UNKNOWN_NODE, detail=f"node {node} is not here")
