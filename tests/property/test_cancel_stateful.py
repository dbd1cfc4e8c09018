"""Cancel under the hostile network of ``test_federation_stateful``.

The same federation, rules and invariants, plus a rule that cancels a submitted job
(``CancelJob`` into its GM's core) at any point: queued, in flight, placed, running,
half ended, or cancelled already.  After every step: no launch or preemption request
for a task of a cancelled job leaves a GM after the cancel (one of a large job queued
after the cancel, slice by slice, is dropped when its turn comes).  Each task ends exactly once (one outcome), a task of a cancelled job ends
``finished`` or ``failed`` only if it ended so before its stop took effect, and the
GMs' job books say what the outcomes say.  At the end, with every task ended, no LM
holds an attempt or a stop, and every live node's resources are all free: no slot
leaks.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from common.effects import ToUser
from common.ids import JobId, UserId
from common.messages import CancelJob, LaunchRequest, PreemptRequest
from common.model import TaskKey
from global_master.core_users import CANCELLED
from global_master.lifecycle import JobBook, JobStatus, TaskStatus
from tests.conftest import Envelope
from tests.property.test_federation_stateful import Federation


class CancellingFederation(Federation):
    def __init__(self) -> None:
        super().__init__()
        self.cancelled: dict[tuple[UserId, JobId], list[Envelope]] = {}
        """Cancelled jobs, with the requests that were on the wire when they were."""
        self.ends: dict[TaskKey, set[tuple[bool, str]]] = {}
        self.hooked = False

    def _hook(self) -> None:
        """Every GM keeps a job book, and each outcome it tells is counted."""
        if self.hooked or not self.gms:
            return
        self.hooked = True
        for gm in self.gms.values():
            gm.book = JobBook(per_user=50, keep_s=1e9)
            handle = gm.handle

            def counted(msg: object, now: float, handle: Any = handle) -> Any:
                effects = handle(msg, now)
                for e in effects:
                    if isinstance(e, ToUser):
                        out = e.msg
                        self.ends.setdefault(out.task.key, set()).add((out.finished, out.reason))
                return effects

            gm.handle = counted  # type: ignore[method-assign]

    def _jobs(self) -> list[tuple[UserId, JobId]]:
        return sorted({(t.user, t.job_id) for t in self.tasks.values()})

    @precondition(lambda self: self.tasks)
    @rule(pick=st.integers(0, 10_000))
    def cancel(self, pick: int) -> None:
        self._hook()
        jobs = self._jobs()
        user, job = jobs[pick % len(jobs)]
        gm = self.owner[next(k for k, t in self.tasks.items() if (t.user, t.job_id) == (user, job))]
        self.cancelled.setdefault((user, job), list(self.net.wire))
        now = self.tick()
        self.net.send(self.gms[gm].handle(CancelJob(user=user, job_id=job), now), now, src_gm=gm)

    def _of_cancelled(self, key: TaskKey) -> bool:
        t = self.tasks.get(key)
        return t is not None and (t.user, t.job_id) in self.cancelled

    @invariant()
    def nothing_placed_after_a_cancel(self) -> None:
        self._hook()
        for env in self.net.wire:
            msg = env.msg
            if isinstance(msg, LaunchRequest):
                keys = [(p.spec.user, p.spec.task_id) for p in msg.placements]
            elif isinstance(msg, PreemptRequest):
                keys = [(msg.spec.user, msg.spec.task_id)]
            else:
                continue
            for k in keys:
                if self._of_cancelled(k):
                    t = self.tasks[k]
                    before = self.cancelled[(t.user, t.job_id)]
                    assert any(env is b for b in before), f"{k} sent after its job's cancel"

    @invariant()
    def each_task_ends_once_and_books_agree(self) -> None:
        # told at least once (redelivered events), always as one state
        assert all(len(s) == 1 for s in self.ends.values()), self.ends
        for key, out in self.net.outcomes.items():
            if out.reason == CANCELLED:
                assert self._of_cancelled(key)
        for gm in self.gms.values():
            if gm.book is None:
                continue
            for rec in gm.book.jobs.values():
                for t in rec.tasks.values():
                    out = self.net.outcomes.get((rec.user, t.task_id))
                    if t.state is None or out is None:
                        continue
                    want = (
                        TaskStatus.FINISHED if out.finished
                        else TaskStatus.CANCELLED if out.reason == CANCELLED
                        else TaskStatus.FAILED
                    )  # fmt: skip
                    assert t.state == want, (rec.job_id, t.task_id, t.state, out.reason)
                if any(t.state == TaskStatus.CANCELLED for t in rec.tasks.values()):
                    assert (rec.user, rec.job_id) in self.cancelled
                    if rec.ended:
                        assert gm.book.status(rec) == JobStatus.CANCELLED

    def teardown(self) -> None:
        super().teardown()
        if not self.gms:
            return
        for lm in self.lms.values():  # every task ended: nothing held, nothing leaks
            assert not lm.active, lm.active
            assert not lm.nodes.stopping, lm.nodes.stopping
            for n in range(lm.n_nodes):
                if lm.alive[n]:
                    assert list(lm.free[n]) == list(lm.nodes.capacity[n]), (lm.lm_id, n)


CancellingFederation.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cancel = CancellingFederation.TestCase
