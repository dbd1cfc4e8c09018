"""Users whose token was revoked (``megha user revoke``): none of their tasks runs on.

The GM's driver sees the token store change and feeds ``UserAccess``.  Its queued and
waiting tasks, and those decided but held back by the outbox (never sent), end at once
with ``user_revoked``; every LM is told to stop the attempts this GM placed there for
the user (``StopUserTasks``), which come back ``PREEMPTED`` and, placed again, end
``user_revoked`` instead.  A launch the LM took after the stop
(it crossed it) is stopped again when its acceptance arrives.  The broker login goes
with the token (``federation.users.revoke_user``), so nothing new comes in.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.effects import Effect, ToLm
from common.ids import GmId, LmId, UserId
from common.messages import StopUserTasks
from common.model import Task
from global_master.queues import UserQueues

USER_REVOKED = "user_revoked"
"""The reason a revoked user's tasks end with (``TaskOutcome.reason``)."""


class Revocations:
    """The users of this GM whose token is revoked now."""

    def __init__(self) -> None:
        self.users: set[UserId] = set()

    def __contains__(self, user: object) -> bool:
        return user in self.users

    def revoke(self, user: UserId, queues: UserQueues) -> list[Task] | None:
        """``user`` is revoked: its queued and waiting tasks, taken out of ``queues``
        (None if it was revoked already)."""
        if user in self.users:
            return None
        self.users.add(user)
        mine = [t for t in queues if t.user == user]
        return [t for t in mine if queues.remove(t)]

    def restore(self, user: UserId) -> None:
        """``user`` holds a token again (``megha user add``)."""
        self.users.discard(user)

    @staticmethod
    def stops(gm: GmId, user: UserId, lms: Iterable[LmId]) -> list[Effect]:
        """Ask every LM to stop what ``gm`` placed there for ``user``."""
        return [ToLm(lm, StopUserTasks(gm=gm, lm=lm, user=user)) for lm in lms]
