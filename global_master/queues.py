"""A GM's user queues: which task to decide on next (paper §IV-C).

Each user has one FIFO queue; the GM serves its queues round-robin.  A task that
could not be placed goes to the back of its queue (§IV-B5), a preempted one to the
front.  To avoid spinning on a cluster that has nothing free, a queue whose
``patience`` consecutive tasks failed since the GM's view last changed is *parked*
until the view changes again (a new epoch); a GM whose queues are all parked or
empty has no work.  This is the only departure from the paper's busy loop, and it
changes no placement: a parked queue's tasks could not have been placed either.

``UserQueues`` is the seam the job-aware policies plug into (``global_master.policy``):
the GM calls these methods, never the other way round.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from common.dag import DagJob, DagProgress
from common.ids import JobId, TaskId, UserId
from common.model import Resources, Task

if TYPE_CHECKING:
    from global_master.view import LmView

NodeChooser = Callable[["LmView", Any, Resources], int]
"""(view, eligible bit-vector, demand) -> node index or -1; None means first fit."""


class TaskQueue(Protocol):
    """What the user queues and the waiting index keep tasks in: a ``deque`` (arrival
    order), or a policy's own order (``global_master.policy.srpt.JobHeap``)."""

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Task]: ...
    def __contains__(self, task: object) -> bool: ...
    def append(self, task: Task) -> None: ...
    def appendleft(self, task: Task) -> None: ...
    def popleft(self) -> Task: ...
    def remove(self, task: Task) -> None: ...


QueueKind = Literal["fifo", "job_aware"]
"""What a policy does with a task that found no room: ``fifo`` hands it to the GM's
waiting index (``WaitingTasks``) until resources free; ``job_aware`` keeps it itself
(its ``push_back`` parks it until the next epoch)."""


class UserQueues:
    """Round-robin over FIFO user queues, with per-epoch parking."""

    kind: ClassVar[QueueKind] = "fifo"
    """Declared by each policy (``global_master.policy.jobs.JobQueues``: job_aware)."""
    choose_node: NodeChooser | None = None
    """A policy's node choice (Carbyne: packing score); None: the GM's first fit."""

    def __init__(self, users: Iterable[UserId], *, patience: int = 8) -> None:
        self.queues: dict[UserId, TaskQueue] = {u: self.new_queue() for u in users}
        self._order: list[UserId] = list(self.queues)
        self._next = 0
        self.patience = patience
        self._failures: dict[UserId, int] = {}
        self._size = 0
        self._dags: dict[JobId, DagProgress] = {}
        self.waiting = WaitingTasks()
        """Tasks that found no room, out of the round-robin until resources free (the
        GM's waiting index; job-aware policies keep such tasks themselves)."""

    def __len__(self) -> int:
        """Every task held, ready or waiting."""
        return self._size + len(self.waiting)

    def __iter__(self) -> Iterator[Task]:
        """Every task held: the ready ones in queue order, then the waiting ones."""
        for q in self.queues.values():
            yield from q
        yield from self.waiting

    def __contains__(self, user: object) -> bool:
        return user in self.queues

    def new_queue(self) -> TaskQueue:
        """A user's queue: FIFO (a policy may keep its own order)."""
        return deque()

    def push_back(self, task: Task) -> None:
        self.queues[task.spec.user].append(task)
        self._size += 1

    def push_front(self, task: Task) -> None:
        user = task.spec.user
        self.queues[user].appendleft(task)
        self._size += 1
        self._failures.pop(user, None)

    def new_epoch(self) -> None:
        """The view changed: parked queues may be able to place again."""
        self._failures.clear()

    def ahead_of(self, task: Task) -> list[str]:
        """Why ``task`` waits behind tasks of other priority classes, in words, for
        ``megha why`` (``global_master.policy.classes``; plain queues: nothing)."""
        del task
        return []

    def parked(self, user: UserId) -> bool:
        return self._failures.get(user, 0) >= min(self.patience, len(self.queues[user]))

    def failed(self, user: UserId) -> None:
        """A task of ``user`` could not be placed in the current epoch."""
        self._failures[user] = self._failures.get(user, 0) + 1

    def placed(self, user: UserId) -> None:
        self._failures.pop(user, None)

    def has_work(self) -> bool:
        if not self._size:
            return False
        return any(q and not self.parked(u) for u, q in self.queues.items())

    def pop(self) -> Task | None:
        """The next task, round-robin over queues that are neither empty nor parked."""
        n = len(self._order)
        for k in range(n):
            user = self._order[(self._next + k) % n]
            q = self.queues[user]
            if q and not self.parked(user):
                self._next = (self._next + k + 1) % n
                self._size -= 1
                return q.popleft()
        return None

    # Hooks for policies that track jobs (Carbyne); plain FIFO queues need none.
    def may_preempt_for(self, task: Task) -> bool:
        """May the GM preempt other users' tasks to place ``task`` (fairness, Alg. 2)?
        FIFO queues: unless the task is ALTRUISTIC (it uses only what is free)."""
        return not task.altruistic

    def set_cluster(
        self,
        capacity: Sequence[int],
        node_capacities: Collection[Resources],
        node_classes: Collection[tuple[int, Resources]] = (),
    ) -> None:
        """The federation's total capacity, its distinct node capacities and its nodes'
        distinct (constraint mask, capacity) (the GM calls this whenever its view of the
        clusters is rebuilt from a snapshot)."""

    def on_dispatched(self, task: Task, now: float) -> None:
        """A task left its queue for an LM."""

    def on_finished(self, task: Task, now: float) -> None:
        """A task of these queues finished (its children may become runnable)."""
        if self._dags:  # (no DAG job held: no child to release)
            self.release_children(task, now)

    def add_job(self, job: DagJob, now: float, started: Collection[TaskId] = ()) -> None:
        """A DAG job: root stages are queued now, others when their parent stages finish;
        never the tasks ``started`` already (a redelivered job's, see ``DagProgress``)."""
        progress = DagProgress(job, started)
        self._dags[job.job_id] = progress
        for t in progress.roots():
            t.submit(now)
            self.push_back(t)

    def held_back(self, task: Task) -> bool:
        """``task`` waits for its DAG's parent stages (it is in no queue yet)."""
        progress = self._dags.get(task.job_id)
        return progress is not None and progress.waiting(task.task_id)

    def abandon(self, task: Task, now: float) -> list[Task]:
        """``task`` failed for good: the not yet released tasks of its DAG that
        depended on it, which the GM must fail explicitly."""
        del now
        progress = self._dags.get(task.job_id)
        if progress is None:
            return []
        lost = progress.abandon(task.task_id)
        if progress.done:
            del self._dags[task.job_id]
        return lost

    def release_children(self, task: Task, now: float) -> list[Task]:
        """Queue the tasks of the stages that ``task``'s completion makes runnable."""
        progress = self._dags.get(task.job_id)
        if progress is None:
            return []
        released = progress.finish(task.task_id)
        for t in released:
            t.submit(now)
            self.push_back(t)
        if progress.done:
            del self._dags[task.job_id]
        return released

    def on_returned(self, task: Task, now: float) -> None:
        """A dispatched/placed task came back (preempted, refused, worker lost)."""

    def remove(self, task: Task) -> bool:
        try:
            self.queues[task.user].remove(task)
        except ValueError:
            return self.waiting.remove(task)
        self._size -= 1
        return True


WaitClass = tuple[int, Resources]
"""What a waiting task needs: its constraint mask and its demand."""


class WaitingTasks:
    """Tasks that found no room, indexed by what they need (a FIFO per class and user).

    A task here is not examined again until the GM's view shows freed resources that
    could fit its class (``take``), or its user's preemption grace period is over
    (``take_user``).  Order within a class and user is the order of arrival here, so
    a woken task keeps its place ahead of later ones of its user.
    """

    def __init__(self) -> None:
        self.by_class: dict[WaitClass, dict[UserId, TaskQueue]] = {}
        self._size = 0
        self._per_user: dict[UserId, int] = {}
        self.all_positive = True
        """Every demand ever indexed asks for some of every resource (so a node with
        none of one resource free fits no waiting task)."""

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Task]:
        for users in self.by_class.values():
            for q in users.values():
                yield from q

    def new_queue(self) -> TaskQueue:
        """A class's queue of one user: oldest first (a policy may keep its own order)."""
        return deque()

    def class_order(self) -> list[WaitClass]:
        """The classes in the order freed room is offered to them: the order they came
        (a policy may rank them by the task each would serve next)."""
        return list(self.by_class)

    def count(self, user: UserId) -> int:
        return self._per_user.get(user, 0)

    def add(self, task: Task) -> None:
        spec = task.spec
        user, demand = spec.user, spec.demand
        cls = (spec.constraints, demand)
        users = self.by_class.get(cls)
        if users is None:
            users = self.by_class[cls] = {}
            if not all(demand):
                self.all_positive = False
        q = users.get(user)
        if q is None:
            q = users[user] = self.new_queue()
        q.append(task)
        self._size += 1
        per_user = self._per_user
        per_user[user] = per_user.get(user, 0) + 1

    def _took(self, cls: WaitClass, user: UserId, n: int) -> None:
        users = self.by_class[cls]
        if not users[user]:
            del users[user]
            if not users:
                del self.by_class[cls]
        self._size -= n
        left = self._per_user[user] - n
        if left:
            self._per_user[user] = left
        else:
            del self._per_user[user]

    def take(self, cls: WaitClass, n: int, order: Sequence[UserId]) -> list[Task]:
        """Up to ``n`` tasks of ``cls``, one per user in turn (``order`` first, then the
        others), each user's oldest first."""
        users = self.by_class.get(cls)
        if users is None or n <= 0:
            return []
        if len(users) == 1:  # one user: its oldest, as many as fit (no turns to take)
            ((user, q),) = users.items()
            popleft = q.popleft
            out = [popleft() for _ in range(min(n, len(q)))]
            self._took(cls, user, len(out))
            return out
        ranked = [u for u in order if u in users]
        ranked += [u for u in users if u not in ranked]
        out = []
        taken: dict[UserId, int] = {}
        while len(out) < n and ranked:
            for u in list(ranked):
                q = users[u]
                out.append(q.popleft())
                taken[u] = taken.get(u, 0) + 1
                if not q:
                    ranked.remove(u)
                if len(out) >= n:
                    break
        for u, k in taken.items():
            self._took(cls, u, k)
        return out

    def take_user(self, user: UserId, n: int) -> list[Task]:
        """Up to ``n`` of ``user``'s waiting tasks, the oldest of each class first."""
        out: list[Task] = []
        for cls in list(self.by_class):
            q = self.by_class[cls].get(user)
            k = 0
            while q and len(out) < n:
                out.append(q.popleft())
                k += 1
            if k:
                self._took(cls, user, k)
            if len(out) >= n:
                break
        return out

    def remove(self, task: Task) -> bool:
        cls = (task.constraints, task.demand)
        q = self.by_class.get(cls, {}).get(task.user)
        if not q or task not in q:
            return False
        q.remove(task)
        self._took(cls, task.user, 1)
        return True
