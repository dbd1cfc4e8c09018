"""A worker pool's task lifecycle: the nodes of one LM hosted by one process.

Pure: ``now`` is passed in and reports are returned; ``worker.runner`` owns the
timers and subprocesses.  A StartTask arriving is stamped WORKER_QUEUEING (the wire
time before it is charged to communication); the task starts when the runner has
it running, which closes its allocation-time ledger.  Every report carries the
worker's copy of the task, so the LM relays the final ledger to the GM.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.codec import TaskReport
from common.ids import LmId, NodeIndex, TaskId
from common.messages import StartTask, StopTask, WorkerReport
from common.model import Phase, Task


@dataclass(slots=True)
class Running:
    task: Task
    node: NodeIndex
    started: bool = False


@dataclass
class WorkerPool:
    """The tasks on the nodes of one LM's cluster hosted by this process."""

    lm: LmId
    n_nodes: int
    running: dict[TaskId, Running] = field(default_factory=dict)
    counters: dict[str, int] = field(
        default_factory=lambda: {"started": 0, "finished": 0, "failed": 0, "stopped": 0}
    )

    def accept(self, msg: StartTask, now: float) -> Task | None:
        """A StartTask arrived; None if the task is already here (a repeated request)."""
        if msg.task.task_id in self.running:
            return None
        if not 0 <= msg.node < self.n_nodes:
            raise ValueError(f"node {msg.node} is not hosted here")
        msg.task.enter(Phase.WORKER_QUEUEING, now)
        self.running[msg.task.task_id] = Running(msg.task, msg.node)
        return msg.task

    def started(self, task_id: TaskId, now: float) -> TaskReport | None:
        r = self.running.get(task_id)
        if r is None or r.started:
            return None
        r.started = True
        r.task.start(now)
        self.counters["started"] += 1
        return self._report(r, "started", now)

    def ended(self, task_id: TaskId, now: float, ok: bool, detail: str = "") -> TaskReport | None:
        r = self.running.pop(task_id, None)
        if r is None:
            return None
        r.task.finished_at = now
        kind = "finished" if ok else "failed"
        self.counters[kind] += 1
        return self._report(r, kind, now, detail)

    def stop(self, msg: StopTask) -> bool:
        """A preempted task: dropped without a report (its LM already released it)."""
        if self.running.pop(msg.task_id, None) is None:
            return False
        self.counters["stopped"] += 1
        return True

    def _report(self, r: Running, kind: str, now: float, detail: str = "") -> TaskReport:
        rep = WorkerReport(
            lm=self.lm, node=r.node, task_id=r.task.task_id, kind=kind, at=now, detail=detail
        )
        return TaskReport(report=rep, task=r.task)
