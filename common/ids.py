"""Identifiers, as distinct types so mypy catches a swapped GM and LM id.

On the wire an id is 1..``MAX_ID_LEN`` characters of ``[A-Za-z0-9._:@+-]`` and a node
index is ``>= 0``: the constraint is part of the type, so every message field of an id
type carries it (``common.schema``).  msgspec checks an id's length in C as it decodes
the field; its characters are checked once per message, all ids at once
(``common.schema.ids_ok``, ``is_id_text``): a regex per field (``Meta(pattern=...)``)
cost a Python call and a match object for each, 0.25 us per id.  ``ID_PATTERN`` is what
an id is, for the JSON Schema and for the explaining path.
"""

import string
from typing import Annotated, NewType

from msgspec import Meta

MAX_ID_LEN = 200
ID_CHARS = "A-Za-z0-9._:@+-"
ID_PATTERN = rf"^[{ID_CHARS}]+(?!\n)$"
"""An id, as ``re.search`` takes it (``(?!\\n)``: Python's ``$`` would also match before
a trailing newline)."""
_ID_BYTES = (string.ascii_letters + string.digits + "._:@+-").encode()
_ID = Meta(
    min_length=1,
    max_length=MAX_ID_LEN,
    extra={"kind": "id"},
    extra_json_schema={"pattern": ID_PATTERN},
)


def is_id_text(text: str) -> bool:
    """Every character of ``text`` may be in an id (True for ``""``): with the length
    checked apart, what ``ID_PATTERN`` accepts; run over several ids joined, it accepts
    exactly when each does."""
    return text.isascii() and not text.encode().translate(None, _ID_BYTES)


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
