"""Priority classes in a GM's queues, with aging (issue 34 item 3).

A job's ``priority`` (``TaskSpec.priority``, 0 the lowest) is its class.  Every queue
the GM takes tasks from -- a user's queue, a class of its waiting index -- keeps one
queue per class (``ClassedQueue``: FIFO, or the policy's own order such as ``srpt``'s)
and serves the class with the highest **effective class** first:

    effective = class + (now - submitted_at) / aging_s

of the oldest task of each class.  A fresh task goes by its class; one that has waited
``k * aging_s`` competes as ``k`` classes higher (Unix- and HTCondor-style aging), so a
task of class ``c`` goes ahead of one of class ``c' > c`` only after waiting at least
``(c' - c) * aging_s`` -- the **aging bound** -- and no class starves for longer than its
gap to the highest class times ``aging_s`` plus the wait of the tasks equal to it.
Ties go to the higher class.  When the top class wins, its queue's own order picks the
task (FIFO, least remaining work); a lower class that won by aging gives its oldest.

Across users (``ClassedQueues.pop``) the same rule picks the class served, and the users
whose queues serve that class next take turns, round-robin as plain queues do --
*shares apply within a class* (Alg. 2's preemption keeps them,
``global_master.fairness``).  The waiting index offers freed room the same way
(``ClassedWaiting.take``).

No clock: ``now`` is the latest time the GM reported (a task's submission or one of the
hooks), as job-aware policies keep it.  With all tasks of one class, the order is the
one of the queues below, unchanged.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from common.ids import UserId
from common.model import Task, TaskKey
from common.overload import PRIORITY_AGING_S
from global_master.policy.srpt import JobHeap, SrptQueues
from global_master.queues import TaskQueue, UserQueues, WaitClass, WaitingTasks

AGING_S = PRIORITY_AGING_S
"""A task's effective class rises by one per this many seconds waited (the default;
``make_policy(aging_s=...)``, ``megha simulate --priority-aging``, ``priority_aging_s``)."""


class Aging:
    """The time as the GM last reported it, and the aging rate: shared by a GM's
    classed queues."""

    __slots__ = ("aging_s", "now")

    def __init__(self, aging_s: float = AGING_S) -> None:
        self.aging_s = aging_s
        self.now = 0.0

    def saw(self, at: float) -> None:
        if at > self.now:
            self.now = at

    def effective(self, task: Task) -> float:
        """``task``'s class raised by how long it has waited."""
        if math.isinf(self.aging_s):
            return float(task.spec.priority)
        return task.spec.priority + max(0.0, self.now - task.submitted_at) / self.aging_s


class ClassCount:
    """How many queues of a waiting index hold each priority class, and whether any
    class's queue keeps an order of its own (``srpt``'s ``JobHeap``): with one class
    and none such, the index's classes are offered freed room in the order they came,
    asked of no queue (``ClassedWaiting.class_order``)."""

    __slots__ = ("keyed", "queues")

    def __init__(self) -> None:
        self.queues: dict[int, int] = {}
        self.keyed = False

    def made(self, c: int, q: TaskQueue) -> None:
        self.queues[c] = self.queues.get(c, 0) + 1
        if isinstance(q, JobHeap):
            self.keyed = True

    def emptied(self, c: int) -> None:
        left = self.queues[c] - 1
        if left:
            self.queues[c] = left
        else:
            del self.queues[c]


class ClassedQueue:
    """One queue per priority class (made by ``make``); behaves as a ``TaskQueue``."""

    __slots__ = ("aging", "arrivals", "by_class", "count", "make", "plain", "seq", "size", "where")

    def __init__(
        self, make: Callable[[], TaskQueue], aging: Aging, count: ClassCount | None = None
    ) -> None:
        """``count``: the waiting index's tally of classes held (None: not kept)."""
        self.make = make
        self.aging = aging
        self.count = count
        self.by_class: dict[int, TaskQueue] = {}
        self.arrivals: dict[int, deque[tuple[int, Task]]] = {}
        """Per class, the tasks in the order they came (to find the oldest; an entry
        is stale once its task left or came again: ``where`` says)."""
        self.where: dict[TaskKey, int] = {}
        self.seq = 0
        self.size = 0
        self.plain = isinstance(make(), deque)
        """Its class queues are deques (FIFO): each class's oldest task is its queue's
        first, and no arrivals are kept (nor ``where``).  (Every change to a class
        queue is made here, in the same order to the queue and to its arrivals: the
        live entries of a class's arrivals are its deque's tasks, in order.)"""

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def __iter__(self) -> Iterator[Task]:
        for c in sorted(self.by_class, reverse=True):
            yield from self.by_class[c]

    def __contains__(self, task: object) -> bool:
        if not isinstance(task, Task):
            return False
        q = self.by_class.get(task.spec.priority)
        return q is not None and task in q

    def _class(self, task: Task) -> TaskQueue:
        spec = task.spec
        c = spec.priority
        q = self.by_class.get(c)
        if q is None:
            q = self.by_class[c] = self.make()
            self.arrivals[c] = deque()
            if self.count is not None:
                self.count.made(c, q)
        if not self.plain:
            seq = self.seq = self.seq + 1
            self.where[(spec.user, spec.task_id)] = seq
        self.size += 1
        aging, at = self.aging, task.submitted_at
        if at > aging.now:  # (``Aging.saw``, inline)
            aging.now = at
        return q

    def append(self, task: Task) -> None:
        self._class(task).append(task)
        if not self.plain:
            self.arrivals[task.spec.priority].append((self.seq, task))

    def appendleft(self, task: Task) -> None:
        self._class(task).appendleft(task)
        if not self.plain:
            self.arrivals[task.spec.priority].appendleft((self.seq, task))

    def oldest(self, c: int) -> Task:
        """The task of class ``c`` that came first (stale entries dropped)."""
        if self.plain:
            return cast("deque[Task]", self.by_class[c])[0]
        arr, where = self.arrivals[c], self.where
        while where.get(arr[0][1].key) != arr[0][0]:
            arr.popleft()
        while arr and where.get(arr[-1][1].key) != arr[-1][0]:
            arr.pop()
        self._bound(c)
        return self.arrivals[c][0][1]

    def _bound(self, c: int) -> None:
        """Keep class ``c``'s arrivals within twice its tasks (stale entries dropped)."""
        arr, where = self.arrivals[c], self.where
        if len(arr) > 2 * len(self.by_class[c]) + 64:
            self.arrivals[c] = deque(e for e in arr if where.get(e[1].key) == e[0])

    def best(self) -> tuple[float, int]:
        """(effective class, class) of the class served next; (-inf, -1) if empty."""
        if len(self.by_class) == 1:  # one class (the usual case): nothing to sort
            c = next(iter(self.by_class))
            return self.aging.effective(self.oldest(c)), c
        top, cls = -math.inf, -1
        for c in sorted(self.by_class, reverse=True):
            eff = self.aging.effective(self.oldest(c))
            if eff > top:
                top, cls = eff, c
        return top, cls

    def head_key(self) -> tuple[float, ...]:
        """How soon this queue's next task goes, smaller first: (-effective class,
        -class, then the class's own queue's key if it has one: ``srpt``'s)."""
        eff, c = self.best()
        inner = self.by_class.get(c)
        rest = inner.head_key() if isinstance(inner, JobHeap) else ()
        return (-eff, -c, *rest)

    def popleft(self) -> Task:
        """The next task: of the class with the highest effective class."""
        if not self.size:
            raise IndexError("pop from an empty ClassedQueue")
        by_class = self.by_class
        if len(by_class) == 1:  # one class: its queue's own order, no aging to weigh
            ((c, q),) = by_class.items()
            task = q.popleft()
            self.size -= 1
            if not self.plain:
                spec = task.spec  # (``_gone``, inline)
                del self.where[(spec.user, spec.task_id)]
            if q:
                if not self.plain:
                    self._bound(c)
            else:
                del by_class[c], self.arrivals[c]
                if self.count is not None:
                    self.count.emptied(c)
            return task
        _, c = self.best()
        q = self.by_class[c]
        if c == max(self.by_class):
            task = q.popleft()
        else:  # a lower class won by aging: its oldest task
            task = self.oldest(c)
            q.remove(task)
        self._gone(task, c)
        return task

    def remove(self, task: Task) -> None:
        c = task.spec.priority
        q = self.by_class.get(c)
        if q is None:
            raise ValueError("task not in queue")
        q.remove(task)
        self._gone(task, c)

    def _gone(self, task: Task, c: int) -> None:
        if not self.plain:
            del self.where[task.key]
        self.size -= 1
        if not self.by_class[c]:
            del self.by_class[c], self.arrivals[c]
            if self.count is not None:
                self.count.emptied(c)


class ClassedWaiting(WaitingTasks):
    """The GM's waiting index with classed queues: freed room goes to the user whose
    waiting task of that class has the highest effective class first."""

    def __init__(self, make: Callable[[], TaskQueue], aging: Aging) -> None:
        super().__init__()
        self.make, self.aging = make, aging
        self.held = ClassCount()

    def new_queue(self) -> TaskQueue:
        return ClassedQueue(self.make, self.aging, self.held)

    def class_order(self) -> list[WaitClass]:
        """Classes whose next task is of the highest effective priority class first
        (then, under ``srpt``, the least remaining work); ties as they came.  With one
        priority class waiting, the order of the queues below (plain FIFO: as they came)."""
        held = self.held
        if len(held.queues) <= 1 and not held.keyed:  # one class, no order of its own
            return list(self.by_class)
        keys: dict[WaitClass, tuple[float, ...]] = {}
        for c, users in self.by_class.items():
            heads = [q.head_key() for q in users.values() if isinstance(q, ClassedQueue)]
            keys[c] = min(heads, default=(math.inf,))
        if len({k[1] for k in keys.values() if len(k) > 1}) <= 1:  # one class: no aging
            return sorted(self.by_class, key=lambda c: keys[c][2:])
        return sorted(self.by_class, key=keys.__getitem__)

    def take(self, cls: WaitClass, n: int, order: Sequence[UserId]) -> list[Task]:
        """Up to ``n`` tasks of ``cls``: each of the class served next (``pick``), its
        users one in turn (``order`` first, then the others), as plain queues take."""
        if len(self.held.queues) <= 1:  # one priority class: ``pick`` is the first user
            return super().take(cls, n, order)  # in turn that holds a task, as there
        users = self.by_class.get(cls)
        if users is None or n <= 0:
            return []
        ranked = [u for u in order if u in users]
        ranked += [u for u in users if u not in ranked]
        out: list[Task] = []
        while len(out) < n and cls in self.by_class:
            user = pick(ranked, self.by_class[cls].get)
            if user is None:
                break
            out.append(self.by_class[cls][user].popleft())
            self._took(cls, user, 1)
            ranked.remove(user)  # the next turn starts after it
            ranked.append(user)
        return out


def pick(users: Sequence[UserId], queue_of: Callable[[UserId], Any]) -> UserId | None:
    """The user served next (None: all empty): the class served is the one of the
    highest effective class of all users' queues; among the users whose queue serves
    that class next, the first of ``users`` (round-robin, as plain queues)."""
    held = [(u, q) for u in users if (q := queue_of(u))]
    if not held:
        return None
    if len({c for _, q in held for c in q.by_class}) == 1:  # one class: the first user
        return held[0][0]
    bests = [(u, q.best()) for u, q in held]
    cls = max(b for _, b in bests)[1]
    return next(u for u, b in bests if b[1] == cls)


class ClassedQueues(UserQueues):
    """A policy's user queues and waiting index split by priority class (a mixin: put it
    before the policy, ``ClassedFifo``, ``ClassedSrpt``)."""

    def __init__(
        self,
        users: Iterable[UserId],
        *,
        aging_s: float = AGING_S,
        patience: int = 8,
        **policy: float,
    ) -> None:
        """``policy``: the ordering policy's own settings (``srpt``'s ``half_life_s``)."""
        self.aging = Aging(aging_s)
        super().__init__(users, patience=patience, **policy)
        self.waiting = ClassedWaiting(self.waiting.new_queue, self.aging)

    def new_queue(self) -> TaskQueue:
        return ClassedQueue(super().new_queue, self.aging)

    def pop(self) -> Task | None:
        """The best task of all users' queues (neither empty nor parked); round-robin
        from the user after the last served among those that tie."""
        order, start = self._order, self._next
        queues: dict[UserId, ClassedQueue] = self.queues  # type: ignore[assignment]
        fails, patience = self._failures, self.patience
        n = len(order)
        held: list[tuple[int, ClassedQueue]] = []
        one: int | None = None  # the one class every held queue serves, if so
        mixed = False
        for k in range(n):
            user = order[(start + k) % n]
            q = queues[user]
            size = q.size
            if not size:
                continue
            failed = fails.get(user, 0)
            if failed >= patience or failed >= size:  # ``parked``
                continue
            held.append((k, q))
            if not mixed:
                by_class = q.by_class
                if len(by_class) != 1:
                    mixed = True
                elif one is None:
                    (one,) = by_class
                elif one not in by_class:
                    mixed = True
        if not held:
            return None
        k, q = held[0]  # one class: the first user in turn (``pick``)
        if mixed:
            bests = [(k, q, q.best()) for k, q in held]
            cls = max(b for _, _, b in bests)[1]
            k, q = next((k, q) for k, q, b in bests if b[1] == cls)
        self._next = (start + k + 1) % n
        self._size -= 1
        return q.popleft()

    def ahead_of(self, task: Task) -> list[str]:
        """Why ``task`` waits behind other classes, for ``megha why`` (empty: none do)."""
        mine = self.aging.effective(task)
        higher: dict[int, int] = {}
        waiting = [q for users in self.waiting.by_class.values() for q in users.values()]
        for q in (*self.queues.values(), *waiting):
            if not isinstance(q, ClassedQueue):
                continue
            for c, sub in q.by_class.items():
                if c > task.spec.priority and len(sub):
                    higher[c] = higher.get(c, 0) + len(sub)
        return [
            f"class {c} goes first: {k} of its tasks queued or waiting for room here (this "
            f"task is class {task.spec.priority}, effective {mine:.2f} after aging)"
            for c, k in sorted(higher.items(), reverse=True)
        ]

    def on_dispatched(self, task: Task, now: float) -> None:
        aging = self.aging
        if now > aging.now:  # (``Aging.saw``, inline: every task passes here)
            aging.now = now
        super().on_dispatched(task, now)

    def on_returned(self, task: Task, now: float) -> None:
        aging = self.aging
        if now > aging.now:
            aging.now = now
        super().on_returned(task, now)

    def on_finished(self, task: Task, now: float) -> None:
        aging = self.aging
        if now > aging.now:
            aging.now = now
        super().on_finished(task, now)


class ClassedFifo(ClassedQueues):
    """``fifo`` with priority classes: FIFO within a class and user."""

    name = "fifo"


class ClassedSrpt(ClassedQueues, SrptQueues):
    """``srpt`` with priority classes: least remaining work within a class and user."""

    name = "srpt"
