"""Identifiers, as distinct types so mypy catches a swapped GM and LM id."""

from typing import NewType

GmId = NewType("GmId", str)
"""A Global Master, e.g. ``gm0``."""
LmId = NewType("LmId", str)
"""A Local Master (one per cluster), e.g. ``lm3``."""
UserId = NewType("UserId", str)
"""A user; each user owns exactly one queue, served by exactly one GM."""
JobId = NewType("JobId", str)
TaskId = NewType("TaskId", str)
"""Unique across the federation; launches are idempotent by task id."""
NodeIndex = NewType("NodeIndex", int)
"""A worker node's position inside its LM's cluster (0..n-1); bit i of every vector."""
