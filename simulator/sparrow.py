"""Sparrow, the distributed-sampling baseline (Ousterhout et al., SOSP'13).

Not Megha code, and not a second copy of it: a different scheduler, held to the
same workload, cluster and network model so its tails compare with Megha's.

* **Batch sampling**: a job of m tasks places ``probe_ratio * m`` reservations on
  distinct workers chosen at random.  Tasks with placement constraints are probed
  per task, ``probe_ratio`` workers among those meeting the task's constraints
  (Sparrow's per-task constraint handling).
* **Late binding**: a worker with free resources takes its oldest reservation and
  asks the job's scheduler for a task; the scheduler answers with an unlaunched
  task the worker can run, or a no-op once all have been launched.  If the job's
  task needs more than the worker has free (multi-resource profiles: some free, not
  enough), the reservation stays at the head of the worker's queue until a task ends
  there, as a reservation waits for a slot.  A job whose reservations are all spent
  with tasks left (fewer workers than probes) probes again.  A task that no worker
  could ever run (constraints or capacity) fails explicitly.
* **FIFO worker queues**; no processing costs (as in the Sparrow and Eagle
  simulators), one network delay per message.

Allocation-time split of a task: communication = probe + request + reply;
worker queueing = how long the winning reservation waited at its worker.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from bitarray import bitarray

from common.cluster import ClusterSpec
from common.metrics import Counters
from common.model import N_CONSTRAINTS, Phase, Task, fits, new_task, satisfies
from simulator.engine import EventLoop
from simulator.jobs import JobBook
from simulator.megha_sim import SimResult
from simulator.records import RunRecords
from workload.jobs import Job


@dataclass(slots=True)
class SparrowCounters(Counters):
    probes: int = 0
    noops: int = 0
    get_task: int = 0
    resamples: int = 0
    held: int = 0
    """Reservations that found too little free at their worker and waited there."""


@dataclass
class SparrowConfig:
    network_delay_s: float = 0.0005
    probe_ratio: int = 2


class _JobState:
    __slots__ = ("arrival", "job_id", "pending", "probes_out", "unconstrained")

    def __init__(self, job: Job, now: float) -> None:
        self.job_id = job.job_id
        self.arrival = job.arrival
        tasks = [new_task(spec, now) for spec in job.tasks]
        # Most constrained first: a worker binds the hardest task it can run.
        self.pending: deque[Task] = deque(sorted(tasks, key=lambda t: -t.constraints.bit_count()))
        self.unconstrained = all(t.constraints == 0 for t in tasks)
        self.probes_out = 0


class _Worker:
    __slots__ = ("asking", "capacity", "free", "held", "mask", "queue")

    def __init__(self, capacity: tuple[int, ...], mask: int) -> None:
        self.capacity = capacity
        self.free = list(capacity)
        self.mask = mask
        self.queue: deque[tuple[_JobState, float]] = deque()
        self.asking = False
        self.held = False
        """The head reservation's job has no task that fits what is free: wait for a
        task of this worker to end."""


class SparrowSimulation:
    """Sparrow over the same workers the Megha run uses (LM boundaries ignored)."""

    def __init__(
        self,
        clusters: Sequence[ClusterSpec],
        config: SparrowConfig | None = None,
        rng: random.Random | None = None,
        *,
        records: RunRecords | None = None,
        keep_tasks: bool = True,
    ) -> None:
        """``records``, ``keep_tasks``: as ``MeghaSimulation``'s."""
        self.cfg = config or SparrowConfig()
        self.rng = rng or random.Random(0)
        self.loop = EventLoop()
        self.workers = [_Worker(n.capacity, n.constraints) for c in clusters for n in c.nodes]
        n = len(self.workers)
        self._vectors = []
        for c in range(N_CONSTRAINTS):
            v = bitarray(n, endian="little")
            v.setall(0)
            for i, w in enumerate(self.workers):
                if w.mask >> c & 1:
                    v[i] = 1
            self._vectors.append(v)
        self._eligible: dict[int, list[int]] = {}
        self._feasible: dict[tuple[int, tuple[int, ...]], bool] = {}
        self.book = JobBook(records, keep=keep_tasks)
        self.counters = SparrowCounters()
        self._stream: Iterator[Job] = iter(())
        self._streamed = 0

    def _eligible_workers(self, mask: int) -> list[int]:
        lst = self._eligible.get(mask)
        if lst is None:
            v = bitarray(len(self.workers), endian="little")
            v.setall(1)
            for c in range(N_CONSTRAINTS):
                if mask >> c & 1:
                    v &= self._vectors[c]
            lst = self._eligible[mask] = list(v.search(1))
        return lst

    def _feasible_task(self, task: Task) -> bool:
        """Some worker meets ``task``'s constraints and has the capacity it asks for."""
        key = (task.constraints, task.demand)
        ok = self._feasible.get(key)
        if ok is None:
            ok = self._feasible[key] = any(
                fits(self.workers[w].capacity, task.demand)
                for w in self._eligible_workers(task.constraints)
            )
        return ok

    def add_jobs(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self.book.add(job)
            self.loop.at(job.arrival, self._arrive, job)

    def stream_jobs(self, jobs: Iterable[Job]) -> None:
        """Jobs taken from ``jobs`` one at a time, each when the one before it arrives
        (``MeghaSimulation.stream_jobs``: the same run as ``add_jobs``); in arrival
        order."""
        self._stream = iter(jobs)
        self._streamed = 0
        self._take_streamed()

    def _take_streamed(self) -> None:
        job = next(self._stream, None)
        if job is not None:
            self.book.add(job)
            self.loop.arrival(job.arrival, self._streamed, self._arrive_streamed, job)
            self._streamed += 1

    def _arrive_streamed(self, job: Job) -> None:
        self._take_streamed()
        self._arrive(job)

    def _arrive(self, job: Job) -> None:
        now = self.loop.now
        self._sample(_JobState(job, now), now)

    def _sample(self, state: _JobState, now: float) -> None:
        """Place ``probe_ratio`` reservations per pending task of the job."""
        d = self.cfg.probe_ratio
        n = len(self.workers)
        for t in [t for t in state.pending if not self._feasible_task(t)]:
            state.pending.remove(t)
            self.book.done(t, now, "infeasible: no worker meets the constraints and demand")
        if not state.pending:
            return
        if state.unconstrained:
            targets = self.rng.sample(range(n), min(n, d * len(state.pending)))
        else:
            targets = []
            for t in state.pending:
                elig = self._eligible_workers(t.constraints)
                targets.extend(self.rng.sample(elig, min(d, len(elig))))
        self.counters.probes += len(targets)
        state.probes_out += len(targets)
        at = now + self.cfg.network_delay_s
        for w in targets:
            self.loop.at(at, self._probe, w, state)

    def _probe(self, w: int, state: _JobState) -> None:
        worker = self.workers[w]
        worker.queue.append((state, self.loop.now))
        self._pull(w)

    def _pull(self, w: int) -> None:
        """A worker with room and no request outstanding asks for its next reservation."""
        worker = self.workers[w]
        if worker.asking or worker.held or not worker.queue or not all(x > 0 for x in worker.free):
            return
        state, reserved_at = worker.queue.popleft()
        worker.asking = True
        self.counters.get_task += 1
        now = self.loop.now
        self.loop.at(now + self.cfg.network_delay_s, self._get_task, w, state, reserved_at, now)

    def _get_task(self, w: int, state: _JobState, reserved_at: float, asked_at: float) -> None:
        """At the scheduler: late binding of an unlaunched task to the asking worker."""
        worker = self.workers[w]
        state.probes_out -= 1
        task: Task | None = None
        no_room = False
        if state.unconstrained:
            if state.pending:
                if fits(worker.free, state.pending[0].demand):
                    task = state.pending.popleft()
                else:
                    no_room = fits(worker.capacity, state.pending[0].demand)
        else:
            for t in state.pending:
                if satisfies(worker.mask, t.constraints):
                    if fits(worker.free, t.demand):
                        task = t
                        break
                    no_room = no_room or fits(worker.capacity, t.demand)
            if task is not None:
                state.pending.remove(task)
        at = self.loop.now + self.cfg.network_delay_s
        if task is None and no_room:
            # not enough free here for the job's task: the reservation waits at the head
            # of the worker's queue until a task of the worker ends (as for a slot)
            state.probes_out += 1
            worker.queue.appendleft((state, reserved_at))
            worker.held = True
            self.counters.held += 1
            self.loop.at(at, self._noop, w)
            return
        if state.pending and state.probes_out == 0:
            # every reservation of the job is spent and tasks remain (more tasks than
            # workers to probe): probe again
            self.counters.resamples += 1
            self._sample(state, self.loop.now)
        if task is None:
            self.counters.noops += 1
            self.loop.at(at, self._noop, w)
            return
        # waiting for a probe, the probe on the wire, the reservation queued at the
        # worker, then the request and the task on the wire
        task.mark(Phase.COMMUNICATION, reserved_at - self.cfg.network_delay_s)
        task.mark(Phase.WORKER_QUEUEING, reserved_at)
        task.mark(Phase.COMMUNICATION, asked_at)
        for r, x in enumerate(task.demand):
            worker.free[r] -= x
        task.attempt += 1  # launched (once: Sparrow never re-places a task), as Megha counts
        self.loop.at(at, self._start, w, task)

    def _noop(self, w: int) -> None:
        self.workers[w].asking = False
        self._pull(w)

    def _start(self, w: int, task: Task) -> None:
        now = self.loop.now
        task.start(now)
        worker = self.workers[w]
        worker.asking = False
        self.loop.at(now + task.duration, self._finish, w, task)
        self._pull(w)

    def _finish(self, w: int, task: Task) -> None:
        worker = self.workers[w]
        for r, x in enumerate(task.demand):
            worker.free[r] += x
        worker.held = False
        self.book.done(task, self.loop.now)
        self._pull(w)

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Run to the end; ``progress(virtual time)`` is called every so many events."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        self.loop.run(progress=progress)
        book = self.book
        stuck = book.outstanding  # none by design; if ever, counted, never silent
        book.finish()
        return SimResult(
            records=book.records,
            counters=self.counters.as_dict(),
            makespan_s=book.makespan,
            kept=book.kept(),
            stuck=stuck,
            events=self.loop.events,
            virtual_s=self.loop.now,
            wall_s=time.perf_counter() - wall0,
            cpu_s=time.process_time() - cpu0,
        )
