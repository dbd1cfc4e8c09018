"""Altruistic DAG scheduling on a GM's user queues (seed §3, Pseudocode 1).

At every plan (job arrival, task completion, a task coming back):

1. **inter-job**: weighted DRF gives each job its allocation ``A_k`` (``drf``);
2. **intra-job**: forward packing within ``A_k`` gives ``T_k``, reverse packing from
   ``T_k`` the runnable tasks that must start now -- DEFAULT, admitted within ``A_k``
   and served least remaining work first (where the DEFAULT asks of all jobs exceed
   what is free, those of the jobs closest to completion run: the RM's JCT heuristic,
   seed §4.2); every other runnable task is ALTRUISTIC (``altruism``);
3. **leftover**: the entitled capacity minus what runs minus the DEFAULT tasks goes
   to ALTRUISTIC tasks, SRTF or packing first (``leftover``).

With probability ``1 - p_altruism`` (drawn per job per plan from the injected
``random.Random``) a job is not altruistic: all its runnable tasks within ``A_k`` are
DEFAULT and it gets no leftover; ``p_altruism = 0`` is exactly ``drf``.  ALTRUISTIC
tasks never trigger a fairness preemption (GM core) and are the first victims of one
(LM core).  Nodes are chosen by packing score.
"""

from __future__ import annotations

import random
from itertools import islice
from typing import Any

from common.errors import ConfigError
from common.ids import JobId, TaskId
from common.model import Task
from global_master.policy.altruism import job_finish, must_start
from global_master.policy.drf import job_allocations, room_left
from global_master.policy.jobs import (
    PLAN_WINDOW,
    Ask,
    JobQueues,
    JobState,
    admit,
    breadth_first,
    breadth_first_asks,
    job_asks,
    round_robin,
)
from global_master.policy.leftover import schedule_leftover
from global_master.policy.packing import packing_node
from global_master.policy.vectors import EPS, Vec, dominant, take


class CarbyneQueues(JobQueues):
    """Altruistic DAG scheduling (Pseudocode 1) on a GM's user queues."""

    name = "carbyne"

    def __init__(
        self,
        *args: Any,
        p_altruism: float = 1.0,
        packing_first: bool = False,
        rng: random.Random | None = None,
        trace_yields: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.yields: list[tuple[float, dict[JobId, Vec]]] | None = [] if trace_yields else None
        """With ``trace_yields``: (time, per-job yield) of every plan (tests, small runs)."""
        if not 0.0 <= p_altruism <= 1.0:
            raise ConfigError(
                f"p_altruism must be in [0, 1], got {p_altruism}", reason="bad_policy"
            )
        self.p_altruism = p_altruism
        self.packing_first = packing_first
        self.rng = rng if rng is not None else random.Random(0)
        self.choose_node = packing_node
        self.last_leftover: Vec = []
        self.last_yield: dict[JobId, Vec] = {}
        """Per altruistic job at the last plan: A_k minus what runs minus its DEFAULT tasks."""
        self._yield_rate = 0.0
        self._yield_since = 0.0
        self._alt_asks: dict[TaskId, Ask] = {}
        """The last plan's ALTRUISTIC asks, by task (``_altruistic_asks``)."""

    def _is_altruistic(self) -> bool:
        p = self.p_altruism
        return p >= 1.0 or (p > 0.0 and self.rng.random() < p)

    def _must_start_now(
        self, job: JobState, alloc: Vec, now: float, cap: list[float]
    ) -> list[Task]:
        """Intra-job: the runnable tasks whose latest start (reverse packing from T_k,
        T_k by forward packing within ``alloc``) is now.  The plan of a job is absolute
        in time: it is kept (``JobState.memo``) until one of the job's tasks ends (a
        large job's: every ``JobState.stride`` ends) or arrives or comes back, or its
        allocation changes (a task starting as planned changes neither).  ``T_k`` never
        moves later than a previous plan put it unless a job arrived since."""
        key = tuple([round(x * 1000 / c) for x, c in zip(alloc, cap, strict=True)])
        packed = job.memo("packed", across_starts=True)
        if packed is None or packed[0] != key:
            t_k = job_finish(now, alloc, cap, job)
            # T_k is a promise until a new job arrives (seed Theorem 3.1): a job that
            # waited because it was altruistic is not promised a later completion for it
            # (else the longest jobs wait forever)
            if job.deadline is not None and job.deadline[1] == self.arrivals:
                t_k = min(t_k, job.deadline[0])
            job.deadline = (t_k, self.arrivals)
            # reverse packing gives latest starts of runnable tasks only: with none, none
            latest = []
            if job.queued:
                latest = must_start(
                    now, t_k, alloc, cap, job.stages, job.running_list(), set(job.queued),
                    job.live_parents(), job,
                )  # fmt: skip
            packed = (key, latest)
            job.keep("packed", packed)
        queued, due = job.queued, now + EPS
        now_due: list[Task] = []
        for start, t in packed[1]:  # earliest latest start first
            if start > due or len(now_due) == PLAN_WINDOW:
                break
            if t.task_id in queued:
                now_due.append(t)
        return now_due

    @staticmethod
    def _by_latest_start(job: JobState) -> list[Task]:
        """The job's runnable tasks, latest start (reverse packing) earliest first, then
        any the packing did not place in their order: the plan's window of them."""
        hit = job.cached.get("packed")  # the packing this plan made or kept
        packed: list[tuple[float, Task]] = hit[3][1] if hit else []
        # a function of that packing and of ``queued``: kept while both are the same
        kept = job.kept("by_latest_start")
        if kept is not None and kept[0] is packed:
            return kept[1]  # type: ignore[no-any-return]
        queued = job.queued
        out = list(islice((t for _, t in packed if t.task_id in queued), PLAN_WINDOW))
        if len(out) < PLAN_WINDOW and len(out) < len(queued):
            placed = {t.task_id for _, t in packed}
            rest = (t for t in queued.values() if t.task_id not in placed)
            out += islice(rest, PLAN_WINDOW - len(out))
        job.keep_for_stamp("by_latest_start", (packed, out))
        return out

    @staticmethod
    def _asks(job: JobState, tasks: list[Task]) -> list[Ask]:
        """``job_asks(job, tasks)``, the list of the previous plan if ``tasks`` and the
        job are the same (an ask is never changed once made)."""
        kept = job.kept("due_asks")
        if (
            kept is not None
            and len(kept[0]) == len(tasks)
            and all(a is b for a, b in zip(kept[0], tasks, strict=True))
        ):
            return kept[1]  # type: ignore[no-any-return]
        asks = job_asks(job, tasks)
        job.keep_for_stamp("due_asks", (tasks, asks))
        return asks

    def plan(self, now: float, cap: list[float]) -> tuple[list[Ask], dict[JobId, Vec]]:
        # leftover yielded, in dominant share x seconds, since the previous plan
        self.counters["leftover_yielded"] += self._yield_rate * max(0.0, now - self._yield_since)
        self._yield_since = now
        self.last_yield = {}
        rate = 0.0
        jobs = self.active()
        allocs = job_allocations(jobs, cap, self.shares)
        pools: dict[JobId, Vec] = {}
        leftover = self.free(cap, jobs)
        urgent: list[tuple[float, float, list[Ask]]] = []  # altruistic jobs' DEFAULT asks
        fair: list[list[Ask]] = []  # the asks of jobs not altruistic this time: DRF's
        candidates: list[tuple[JobState, list[Task]]] = []
        for j, a in zip(jobs, allocs, strict=True):
            room = room_left(j, a)
            pools[j.job_id] = list(room)
            altruistic = self._is_altruistic()
            tasks = self._must_start_now(j, a, now, cap) if altruistic else breadth_first(j)
            chosen = admit(tasks, room, force_first=not j.running)
            for t in chosen:
                take(leftover, t.spec.demand)
            if not altruistic:
                fair.append(breadth_first_asks(j))  # = job_asks(j, tasks)
                continue
            self.last_yield[j.job_id] = [max(0.0, x) for x in room]
            rate += dominant(self.last_yield[j.job_id], cap)
            if not j.queued:
                continue  # no ask, no candidate: where it would sort changes no order
            urgent.append((j.remaining_work(now, cap), j.arrival, self._asks(j, tasks)))
            window = self._by_latest_start(j)  # (kept between plans: not changed here)
            if chosen:
                picked = {t.task_id for t in chosen}
                window = [t for t in window if t.task_id not in picked]
            candidates.append((j, window))
        self._yield_rate = rate
        if self.yields is not None:
            self.yields.append((now, dict(self.last_yield)))
        self.last_leftover = [max(0.0, f) for f in leftover]
        alt = schedule_leftover(
            candidates, list(self.last_leftover), cap, now, packing_first=self.packing_first
        )
        # DEFAULT asks first, least remaining work first: where they cannot all run,
        # those of the jobs closest to completion do (the RM's JCT heuristic, seed §4.2)
        urgent.sort(key=lambda u: (u[0], u[1]))
        defaults = [a for _, _, asks in urgent for a in asks] + round_robin(fair)
        return defaults + self._altruistic_asks(alt), pools

    def _altruistic_asks(self, tasks: list[Task]) -> list[Ask]:
        """An ALTRUISTIC ask per task, the previous plan's where it had one for the same
        task (an ask is never changed once made): a deep backlog's thousands of asks
        are not made again at every plan."""
        kept, made = self._alt_asks, {}
        out = []
        for t in tasks:
            tid = t.spec.task_id
            a = kept.get(tid)
            if a is None or a.task is not t:
                a = Ask(t, altruistic=True)
            made[tid] = a
            out.append(a)
        self._alt_asks = made
        return out
