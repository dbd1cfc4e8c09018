"""Bounds and kinds shared by the messages."""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated

from msgspec import Meta

from common.schema import in_range

Version = Annotated[int, in_range(-1, None)]
"""An LM state version (``-1``: nothing known yet)."""
MAX_JOB_TASKS = 100_000
MAX_STAGES = 10_000
OUTPUT_BYTES = 64 * 1024
"""Of a task's stdout and of its stderr, the last this many bytes travel with its end."""
Output = Annotated[bytes, Meta(max_length=OUTPUT_BYTES)]
"""What a task's command wrote (commands on), cut to its last ``OUTPUT_BYTES``."""
ExitCode = Annotated[int, in_range(0, 255)] | None
"""A command's exit status (None: a synthetic task, or a command ended by a signal)."""


class EventKind(IntEnum):
    """What became of a task at its LM (``TaskEvent.kind``)."""

    STARTED = 0
    FINISHED = 1
    FAILED = 2
    PREEMPTED = 3  # stopped to make room: back to the front of its queue
    REQUEUED = 4  # its worker died and no node of its partition could take it
    RELAUNCHED = 5  # its worker died; the LM started a new attempt on another node


class ReportKind(IntEnum):
    """What a worker says about a task (``WorkerReport.kind``)."""

    STARTED = 0
    FINISHED = 1
    FAILED = 2
    LOST = 3  # the pool stopped it itself: it lost touch with its LM (its lease expired)
    STOPPED = 4  # the pool stopped it on its LM's order (preempted), or no longer ran it
