"""What of an LM outlives every process of its host: its journal's records, folded.

A durable LM writes, before anything of a message leaves it (``common.effects.Record``),
each change of its active task list and of its list of preempted attempts whose stop
is unconfirmed (``JournalHeld``, ``JournalDropped``), each end it learnt and each keep or
let-go of a job's ends (``JournalEnded``, ``JournalKeep``), and each gang hold as it
changes and its end (``JournalHold``, ``JournalHoldGone``).  A new incarnation folds
them back (``fold``) in the order written: the last word on an attempt wins; ends and
keeps are replayed in order by the core, as they happened.

Invariants: an attempt is held at most once per task (a newer ``JournalHeld`` replaces
it; a ``JournalDropped`` removes it only if it names that attempt); a task has at
most one hold (the last ``JournalHold`` of it, unless a ``JournalHoldGone`` came after); nothing here decides
or looks at a node.  Owned here only; it returns values.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from common.messages import (
    JournalDropped,
    JournalEnded,
    JournalHeld,
    JournalHold,
    JournalHoldGone,
    JournalKeep,
    JournalRestored,
)
from common.model import TaskKey


@dataclass(slots=True)
class Restored:
    """A journal, folded: what was held, what was stopping, the ends and keeps in order,
    the gang holds."""

    held: dict[TaskKey, JournalHeld] = field(default_factory=dict)
    stopping: dict[tuple[TaskKey, int], JournalHeld] = field(default_factory=dict)
    ends: list[JournalEnded | JournalKeep | JournalRestored] = field(default_factory=list)
    holds: dict[TaskKey, JournalHold] = field(default_factory=dict)


def fold(records: Iterable[object]) -> Restored:
    """Fold an LM journal's records, oldest first (other records are not an LM's)."""
    out = Restored()
    held, stopping = out.held, out.stopping
    for r in records:
        if isinstance(r, JournalHeld):
            key = (r.start.spec.user, r.start.spec.task_id)
            if r.stopping:
                stopping[(key, r.start.attempt)] = r
            else:
                held[key] = r
        elif isinstance(r, JournalDropped):
            key = (r.user, r.task_id)
            if r.stopping:
                stopping.pop((key, r.attempt), None)
            elif key in held and held[key].start.attempt == r.attempt:
                del held[key]
        elif isinstance(r, JournalEnded | JournalKeep | JournalRestored):
            out.ends.append(r)
        elif isinstance(r, JournalHold):
            out.holds[(r.placement.spec.user, r.placement.spec.task_id)] = r
        elif isinstance(r, JournalHoldGone):
            out.holds.pop((r.user, r.task_id), None)
    return out
