"""Bounded memory of message ids already handled: one de-duplication for every consumer.

A broker delivers at least once (a redelivery after a consumer or connection
failure); publishers stamp each message with an id (``<sender>.<epoch>.<seq>``) and
consumers drop an id they have seen.  The memory is bounded: the oldest ids go first.
"""

from __future__ import annotations

from collections import OrderedDict


class Dedup:
    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.dropped = 0

    def first_time(self, message_id: str | None) -> bool:
        """True the first time ``message_id`` is seen (and always for messages without one)."""
        if not message_id:
            return True
        if message_id in self._seen:
            self.dropped += 1
            return False
        self._seen[message_id] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True

    def forget(self, message_id: str | None) -> None:
        """``message_id`` was not handled after all (it goes back to its queue)."""
        if message_id:
            self._seen.pop(message_id, None)

    def __len__(self) -> int:
        return len(self._seen)
