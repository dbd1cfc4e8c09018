"""Identifiers, as distinct types so mypy catches a swapped GM and LM id.

On the wire an id is 1..``MAX_ID_LEN`` characters of ``[A-Za-z0-9._:@+-]`` and a node
index is ``>= 0``: the constraint is part of the type, so every message field of an id
type carries it (``common.schema``).
"""

from typing import Annotated, NewType

from msgspec import Meta

MAX_ID_LEN = 200
ID_CHARS = "A-Za-z0-9._:@+-"
_ID = Meta(
    min_length=1,
    max_length=MAX_ID_LEN,
    # ``(?!\n)``: Python's ``$`` would also match before a trailing newline
    pattern=rf"^[{ID_CHARS}]+(?!\n)$",
)

GmId = NewType("GmId", Annotated[str, _ID])
"""A Global Master, e.g. ``gm0``."""
LmId = NewType("LmId", Annotated[str, _ID])
"""A Local Master (one per cluster), e.g. ``lm3``."""
UserId = NewType("UserId", Annotated[str, _ID])
"""A user; each user owns exactly one queue, served by exactly one GM."""
JobId = NewType("JobId", Annotated[str, _ID])
TaskId = NewType("TaskId", Annotated[str, _ID])
"""Unique across the federation; launches are idempotent by task id."""
NodeIndex = NewType("NodeIndex", Annotated[int, Meta(ge=0)])
"""A worker node's position inside its LM's cluster (0..n-1); bit i of every vector."""
