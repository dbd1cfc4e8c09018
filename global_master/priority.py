"""A higher priority class preempts lower ones (issue 34 item 3): which LM to ask.

When no node in the GM's view has room for a task of class ``c > 0``, the GM asks an
LM to stop tasks of *any* user in a class below ``c`` (``PreemptRequest.lower_only``);
the LM verifies on its true state and takes the lowest class first, then the least
work thrown away (``local_master.victims``).  The existing preemption path's rules
hold: after ``OverloadPolicy.class_preempt_grace_s`` of the task's wait (completions
may free room first), within each LM's preemption budget (``preempt_per_lm`` per
``preempt_period_s``, shared with Alg. 2's preemptions: the core passes the budget in),
and each LM at most once per task.

The GM knows where its own lower-class tasks run; other GMs' only their LMs know, so
the LMs holding this GM's lower-class tasks are asked first (most such tasks first),
then the others in order.  Shares apply within a class: Alg. 2 (``fairness``) preempts
only tasks of the same class or lower.

Pure: values in, an LM (or None) out; it holds the LMs asked per task.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from common.ids import LmId
from common.model import Task, TaskKey

Room = Callable[[LmId, float], int]
"""How many preemption requests an LM may still get now (``Fairness.preempt_room``)."""


class ClassPreemption:
    """The LMs asked to preempt lower classes, per task."""

    def __init__(self, grace_s: float = 0.0) -> None:
        self.grace_s = grace_s
        self.tried: dict[TaskKey, set[LmId]] = {}
        """LMs asked per task (read-only outside: empty means none held)."""

    def lm_for(
        self, task: Task, now: float, lms: Sequence[LmId], placed: Iterable[Task], room: Room
    ) -> LmId | None:
        """The LM to ask to preempt lower classes for ``task``; None: its class is the
        lowest, its grace is not over, or every LM was asked or is out of budget."""
        cls = task.spec.priority
        if cls == 0 or now - task.submitted_at < self.grace_s:
            return None
        tried = self.tried.setdefault(task.key, set())
        open_lms = [lm for lm in lms if lm not in tried and room(lm, now) > 0]
        if not open_lms:
            return None
        lower: dict[LmId, int] = {}
        for t in placed:
            if t.lm is not None and t.spec.priority < cls:
                lower[t.lm] = lower.get(t.lm, 0) + 1
        order = {lm: k for k, lm in enumerate(lms)}
        lm = min(open_lms, key=lambda x: (-lower.get(x, 0), order[x]))
        tried.add(lm)
        return lm

    def forget(self, key: TaskKey) -> None:
        """Task ``key`` was placed, went back to its queue, or ended."""
        self.tried.pop(key, None)
