"""A higher priority class preempts lower ones (issue 34 item 3): which LM to ask.

When no node in the GM's view has room for a task of class ``c > 0``, the GM asks an
LM to stop tasks of *any* user in a class below ``c`` (``PreemptRequest.lower_only``);
the LM verifies on its true state and takes the lowest class first, then the least
work thrown away (``local_master.victims``).  The existing preemption path's rules
hold but one: after ``OverloadPolicy.class_preempt_grace_s`` of the task's wait
(completions may free room first), least work thrown away, and each LM asked at most
once per task per ``preempt_period_s`` -- and **not** Alg. 2's rate limit (``preempt_per_lm`` per
``preempt_period_s``): a class preemption neither waits for that budget nor spends it.

Why the rate limit is not needed here, and what bounds class preemptions instead.  The
budget stops preemption *storms*: under Alg. 2 a victim's user falls below its share
and may preempt back, on views that lag, round after round.  A class preemption cannot
be answered in kind: its victims are of a strictly lower class than the task asking
(the LM checks on its true state), a class is never raised for preemption (aging orders
queues only), so a victim can never preempt its preemptor and the running classes only
rise.  The number of class preemptions is bounded by the work that asks: at most one
request per LM per higher-class task that found no room (``tried``) per
``again_s`` (the GM's ``preempt_period_s``) while it waits -- its refusals send it back to
its queue, and every change of the views decides it again: without the memory of whom
it asked, each decision asked every LM again (a task waiting behind work of its own
class sent 91,441 requests in a 400-task run) -- each stopping at most that task's demand
of lower-class work.  Lower-class work that starts after an LM said no (another GM's)
is asked for again ``again_s`` later.  Under the shared budget the top class
waited for Alg. 2's refills (at 150% load on 1,000 workers, 1,097 class preemptions
refused by the limit, the top class's allocation p99 67 s against 3.7 ms at 50%).

The GM knows where its own lower-class tasks run; other GMs' only their LMs know, so
the LMs holding this GM's lower-class tasks are asked first (most such tasks first),
then the others in order.  Shares apply within a class: Alg. 2 (``fairness``) preempts
only tasks of the same class or lower.

Pure: values in, an LM (or None) out; it holds the LMs asked per task.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from common.ids import LmId
from common.model import Task, TaskKey


class ClassPreemption:
    """The LMs asked to preempt lower classes, per task, and when."""

    def __init__(self, grace_s: float = 0.0, again_s: float = math.inf) -> None:
        self.grace_s = grace_s
        self.again_s = again_s
        """An LM asked for a task is asked again for it only this long after (0 or
        less: never again while the task waits)."""
        self.tried: dict[TaskKey, dict[LmId, float]] = {}
        """When each LM was asked, per task (read-only outside: empty means none held).
        Kept while the task waits (a refusal sends it back to its queue); forgotten
        when it is placed or ends."""

    def lm_for(
        self, task: Task, now: float, lms: Sequence[LmId], placed: Iterable[Task]
    ) -> LmId | None:
        """The LM to ask to preempt lower classes for ``task``; None: its class is the
        lowest, its grace is not over, or every LM was asked within ``again_s``."""
        cls = task.spec.priority
        if cls == 0 or now - task.submitted_at < self.grace_s:
            return None
        tried = self.tried.setdefault(task.key, {})
        again = self.again_s if self.again_s > 0 else math.inf
        open_lms = [lm for lm in lms if now - tried.get(lm, -math.inf) >= again]
        if not open_lms:
            return None
        lower: dict[LmId, int] = {}
        for t in placed:
            if t.lm is not None and t.spec.priority < cls:
                lower[t.lm] = lower.get(t.lm, 0) + 1
        order = {lm: k for k, lm in enumerate(lms)}
        lm = min(open_lms, key=lambda x: (-lower.get(x, 0), order[x]))
        tried[lm] = now
        return lm

    def forget(self, key: TaskKey) -> None:
        """Task ``key`` was placed or ended: a later wait asks every LM afresh."""
        self.tried.pop(key, None)
