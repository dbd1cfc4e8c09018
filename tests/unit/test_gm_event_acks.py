"""The GM's task-event deliveries are acknowledged by the flush that publishes the last
of their outcomes: the consumer returns at once (no task per delivery waits for the
flush, none is woken by every flush), a delivery is acked only once everything made of
it is on the broker, and never when a publication of its outcomes failed (the broker
delivers it again).  No broker: the service is built, its core a stub."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from common import codec
from common.config import FederationConfig
from common.effects import ToUser
from common.ids import GmId, JobId, LmId, NodeIndex, TaskId, UserId
from common.messages import Decide, EventKind, TaskEvent, TaskEvents, TaskOutcome, TaskOutcomes
from common.model import Task, TaskSpec
from global_master.app import GmService
from security import sealing
from security.access import Access
from security.identity import gm, lm
from security.secret import Secret
from security.tokens import TokenStore

CFG = FederationConfig().validate()
SECRET = Secret.from_text("0123456789abcdef0123456789abcdef-test", "test")
U0 = UserId("u0")
LM0, GM0 = lm("lm0"), gm("gm0")


class Delivery:
    def __init__(self, body: bytes, headers: dict[str, Any], message_id: str) -> None:
        self.body, self.headers, self.message_id = body, headers, message_id
        self.redelivered = False
        self.acks = 0

    async def ack(self) -> None:
        self.acks += 1


def batch(seq: int, n: int = 2) -> Delivery:
    evs = tuple(
        TaskEvent(
            kind=EventKind.FINISHED,
            lm=LmId("lm0"),
            gm=GmId("gm0"),
            user=U0,
            task_id=TaskId(f"t{seq}.{i}"),
            attempt=1,
            node=NodeIndex(0),
            node_free=(1,),
            node_version=1,
            at=time.time(),
        )
        for i in range(n)
    )
    body = codec.encode(TaskEvents(lm=LmId("lm0"), epoch=1, events=evs))
    key = {GM0: sealing.sealing_key(SECRET, LM0, GM0)}
    return Delivery(body, dict(sealing.seal(body, LM0, 1, seq, key, stream="events.gm0")),
                    f"lm0.1.{seq}")  # fmt: skip


class Stub:
    """A core answering each event with its task's outcome."""

    def handle(self, msg: object, now: float) -> list[Any]:
        if not isinstance(msg, TaskEvents):
            return []
        out = []
        for ev in msg.events:
            spec = TaskSpec(task_id=ev.task_id, job_id=JobId("j"), user=U0, demand=(1, 1),
                            duration=1.0)  # fmt: skip
            out.append(ToUser(user=U0, msg=TaskOutcome(task=Task(spec=spec), finished=True)))
        return out


def service(home: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[GmService, list[Any]]:
    monkeypatch.setenv("MEGHA_RUN_DIR", str(home / "run"))
    store = TokenStore.in_home(home)
    store.add("u0", gm="gm0", share=1.0, now=0.0)
    svc = GmService(CFG, GmId("gm0"), Access(GM0, CFG, SECRET, users_file=store.path))
    svc.driver.core = Stub()
    return svc, []


def test_an_event_delivery_is_acked_once_its_outcomes_are_published_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, published = service(tmp_path, monkeypatch)
    gate = asyncio.Event()

    async def publish(exchange: str, key: str, body: Any, **_: Any) -> None:
        await gate.wait()
        published.append(codec.decode(body.body, expect=TaskOutcomes))

    svc.broker.publish = publish  # type: ignore[method-assign]

    async def run() -> None:
        async with svc.sup:
            first, second = batch(1), batch(2)
            # the consumer returns at once: nothing waits on the flush per delivery
            await asyncio.wait_for(svc._on_events(first), 1.0)
            await asyncio.wait_for(svc._on_events(second), 1.0)
            for _ in range(5):
                await asyncio.sleep(0)
            assert (first.acks, second.acks) == (0, 0)  # outcomes not on the broker yet
            gate.set()
            for _ in range(50):
                await asyncio.sleep(0)
                if first.acks and second.acks:
                    break
            assert (first.acks, second.acks) == (1, 1)
            assert sum(len(p.outcomes) for p in published) == 4

    asyncio.run(run())


def test_a_delivery_whose_outcomes_failed_to_publish_is_never_acked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later flush that succeeds acks its own deliveries, not those of the failed one
    (a count of items sent would have covered them)."""
    svc, published = service(tmp_path, monkeypatch)
    calls = 0

    async def publish(exchange: str, key: str, body: Any, **_: Any) -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        if calls == 1:
            raise RuntimeError("the broker refused it")
        published.append(body)

    svc.broker.publish = publish  # type: ignore[method-assign]

    async def run() -> None:
        async with svc.sup:
            lost = batch(1)
            await svc._on_events(lost)
            for _ in range(20):
                await asyncio.sleep(0)
            assert calls == 1
            later = batch(2)
            await svc._on_events(later)
            for _ in range(50):
                await asyncio.sleep(0)
                if later.acks:
                    break
            assert later.acks == 1
            assert lost.acks == 0
            assert svc.sup.failures == 1

    asyncio.run(run())


def test_a_delivery_whose_handling_raised_is_not_acked_by_the_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The core made an outcome of it, then raised: the consumer's guard settles the
    delivery (put back); the flush publishing that outcome does not ack it as well."""
    svc, published = service(tmp_path, monkeypatch)
    stub = svc.driver.core

    class Raises:
        def handle(self, msg: object, now: float) -> list[Any]:
            effects = stub.handle(msg, now)  # type: ignore[attr-defined]
            svc.driver.carry_out(effects)
            raise RuntimeError("a bug after the outcomes")

    async def publish(exchange: str, key: str, body: Any, **_: Any) -> None:
        published.append(body)

    svc.broker.publish = publish  # type: ignore[method-assign]
    svc.driver.core = Raises()

    async def run() -> None:
        async with svc.sup:
            d = batch(1)
            with pytest.raises(RuntimeError):
                await svc._on_events(d)
            for _ in range(20):
                await asyncio.sleep(0)
            assert published  # the outcomes went (at least once)
            assert d.acks == 0

    asyncio.run(run())


def test_the_decide_loop_makes_no_timer_per_wake_up_ticks_while_tasks_wait_and_not_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Woken by every input, the decide loop makes no timer per wake-up; while tasks are
    queued it is woken every ``DECIDE_TICK_S`` (work that became decidable without an
    input is decided then); with none queued no timer is left: an idle GM sleeps."""
    import global_master.app as app

    monkeypatch.setattr(app, "DECIDE_TICK_S", 0.05, raising=False)
    svc, _ = service(tmp_path, monkeypatch)
    queued: list[int] = []
    decidable = [False]
    decided = [0]

    class Core:
        ready = True
        queues = queued

        def has_work(self) -> bool:
            return decidable[0] and bool(queued)

    def feed(msg: object) -> None:
        if isinstance(msg, Decide):
            decided[0] += 1
            queued.pop()

    svc.core = Core()  # type: ignore[assignment]
    svc.driver.feed = feed  # type: ignore[method-assign,assignment]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        timers = [0]
        call_later = loop.call_later

        def counted(delay: float, cb: Any, *args: Any) -> asyncio.TimerHandle:
            if getattr(cb, "__self__", None) in (svc, svc._wake):  # the service's timers
                timers[0] += 1
            return call_later(delay, cb, *args)

        loop.call_later = counted  # type: ignore[method-assign]
        async with svc.sup:
            svc.sup.run_forever(svc._decide_loop(), "decide loop")
            await asyncio.sleep(0)
            queued.extend([1, 2, 3])  # queued, not decidable yet (say, parked)
            for _ in range(200):  # inputs, each waking the loop
                svc.feed(object())
                await asyncio.sleep(0)
            assert timers[0] <= 1
            decidable[0] = True  # without an input: decided at the next tick
            for _ in range(100):
                await asyncio.sleep(0.01)
                if decided[0] == 3:
                    break
            assert decided[0] == 3
            await asyncio.sleep(0.1)  # the tick that finds nothing queued stops
            before = timers[0]
            await asyncio.sleep(0.3)
            assert timers[0] == before  # idle: no timer, no wake-up

    asyncio.run(run())  # leaving the supervisor cancels its loops


def test_a_core_timer_s_message_wakes_the_decide_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``After`` comes back through the service's ``feed``: what it puts in the queues
    (a large job's next slice) is decided at once, not at the next tick."""
    from common.effects import After

    svc, _ = service(tmp_path, monkeypatch)
    fed: list[object] = []
    svc.driver.feed = fed.append  # type: ignore[method-assign,assignment]
    later = object()

    async def run() -> None:
        svc.driver.carry_out([After(0.0, later)])
        await asyncio.sleep(0.01)

    asyncio.run(run())
    assert fed == [later]
    assert svc._wake.is_set()


def test_a_state_update_looks_for_revoked_tokens_at_most_once_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token revoked is found on the next LM state update (they come every second
    anyway), not by a timer waking an idle GM each second for it; and looked for at
    most once a second."""
    from common.messages import StateDelta, StateUpdated, UserAccess

    svc, _ = service(tmp_path, monkeypatch)
    fed: list[object] = []
    svc.driver.feed = fed.append  # type: ignore[method-assign,assignment]
    svc.consuming = True
    svc.tokens.check_every_s = 0.0
    sealer = sealing.Sealer(LM0, {GM0: sealing.sealing_key(SECRET, LM0, GM0)}, 1)

    def update(version: int) -> Delivery:
        delta = StateDelta(lm=LmId("lm0"), version=version, base_version=version - 1,
                           nodes=(), free=(), node_versions=())  # fmt: skip
        body = codec.encode(StateUpdated(delta=delta))
        return Delivery(body, dict(sealer.seal(body, "state")), f"s{version}")

    async def run() -> None:
        await svc._on_state(update(1))  # type: ignore[arg-type]
        assert [m for m in fed if isinstance(m, UserAccess)] == []
        TokenStore(svc.tokens.path).revoke("u0", now=1.0)
        svc.token_watch.looked_at -= 1.0  # a second went by
        await svc._on_state(update(2))  # type: ignore[arg-type]
        assert [m for m in fed if isinstance(m, UserAccess)] == [UserAccess(user=U0, revoked=True)]
        looked = svc.token_watch.looked_at
        await svc._on_state(update(3))  # type: ignore[arg-type]
        assert svc.token_watch.looked_at == looked  # not again within the second

    asyncio.run(run())
