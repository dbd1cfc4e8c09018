"""Revoked tokens, looked for by a GM service (``global_master.app``) at most once a
second, on an input that comes anyway: every LM sends a state update a second, so the
look costs an idle GM no wake-up of its own; a timer looks only ``IDLE_S`` after the
last look, when no such input comes."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from common.ids import UserId
from common.messages import UserAccess
from global_master.core import GlobalMaster
from security.tokens import TokenStore

EVERY_S = 1.0
"""Revoked tokens are looked for this often (on inputs: ``TokenWatch.look``) ..."""
IDLE_S = 5.0
"""... or by a timer of its own this long after the last look, without such inputs."""


class TokenWatch:
    """Users of a GM whose token was revoked (``megha user revoke``) or issued again
    since the last look go to its core, which ends a revoked user's tasks
    (``global_master.revocation``)."""

    def __init__(
        self, tokens: TokenStore, core: GlobalMaster, feed: Callable[[object], None]
    ) -> None:
        self.tokens, self.core, self.feed = tokens, core, feed
        self.told: dict[str, bool] = {}
        """Whether each user was last told to the core as revoked."""
        self.looked_at = -math.inf

    def look(self, now: float) -> None:
        """Look, unless looked within ``EVERY_S`` of ``now`` (monotonic)."""
        if now - self.looked_at < EVERY_S:
            return
        self.looked_at = now
        self.tokens.refresh(time.time())
        for rec in self.tokens.users():
            if rec.user in self.core.queues and self.told.get(rec.user, False) != rec.revoked:
                self.told[rec.user] = rec.revoked
                self.feed(UserAccess(user=UserId(rec.user), revoked=rec.revoked))

    async def forever(self) -> None:
        while True:
            self.look(time.monotonic())
            await asyncio.sleep(IDLE_S)
