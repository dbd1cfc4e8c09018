"""A GM's bound on each user's job deliveries held before they are read.

Invariants: ``waiting(user)`` is the bytes of the user's deliveries taken and not yet
done; a delivery that would take a user past ``limit`` is shed (``user_backlog``) unless
the user has no delivery held (one job of up to ``max_body`` is always read) or it is
redelivered (it was admitted before: its tasks may run, so it is never shed).
"""

from __future__ import annotations

from common.ids import UserId


class UnreadJobs:
    """Bytes of each user's job deliveries this GM holds before reading them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._waiting: dict[UserId, tuple[int, int]] = {}
        """Per user with deliveries held: (bytes, deliveries)."""
        self.peak = 0
        """The most bytes of one user's deliveries held at once, since the start."""

    def take(self, user: UserId, size: int, *, redelivered: bool) -> str | None:
        """Hold a delivery of ``size`` bytes until ``done``; or, if it would pass the
        user's bound, hold nothing and say why (the dead-letter's detail)."""
        waiting, held = self._waiting.get(user, (0, 0))
        if held and waiting + size > self.limit and not redelivered:
            return (
                f"{waiting} bytes of {user}'s jobs are waiting here to be read; this one's "
                f"{size} would pass {self.limit}"
            )
        self._waiting[user] = (waiting + size, held + 1)
        self.peak = max(self.peak, waiting + size)
        return None

    def done(self, user: UserId, size: int) -> None:
        """A delivery taken with ``take`` is read (admitted or refused)."""
        waiting, held = self._waiting[user]
        if held > 1:
            self._waiting[user] = (waiting - size, held - 1)
        else:
            del self._waiting[user]

    def waiting(self, user: UserId) -> int:
        return self._waiting.get(user, (0, 0))[0]

    def total(self) -> int:
        return sum(w for w, _ in self._waiting.values())
