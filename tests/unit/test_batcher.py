"""The runtime's Batcher: one message at a time per destination, in order; with
``linger_s``, a busy destination's items travel together.  Checked by what each flush
carried, never by how long anything took."""

from __future__ import annotations

import asyncio

from runtime.driver import Batcher
from runtime.supervisor import Supervisor


async def _run(
    linger_s: float, traffic: dict[str, int] | None = None, headroom: int | None = None
) -> list[list[int]]:
    flushed: list[list[int]] = []
    gate = asyncio.Event()

    async def flush(_: str, items: list[int]) -> None:
        flushed.append(list(items))
        if len(flushed) == 1:
            await gate.wait()  # the first message is slow to leave

    async with Supervisor("test") as sup:
        # every flush closes a rate window: the second one already finds it busy
        b: Batcher[str, int] = Batcher(
            sup, flush, "test", linger_s=linger_s, rate_window_s=0,
            headroom=None if headroom is None else lambda: headroom,
        )  # fmt: skip
        t1 = b.add("k", 1)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert flushed == [[1]]  # an idle destination: at once
        b.add("k", 2)
        b.add("k", 3)  # while the first is in flight: they wait for it, together
        gate.set()
        await b.sent({"k": t1 + 2})
        b.add("k", 4)  # right after a flush began: with linger, it waits for company
        for _ in range(5):
            await asyncio.sleep(0)  # long enough for a flush without linger
        b.add("k", 5)
        await b.sent({"k": t1 + 4})
        if traffic is not None:
            traffic.update(b.traffic())
    return flushed


def test_one_message_at_a_time_in_order() -> None:
    flushed = asyncio.run(_run(0.0))
    assert [x for f in flushed for x in f] == [1, 2, 3, 4, 5]
    assert flushed == [[1], [2, 3], [4], [5]]


def test_linger_gathers_a_busy_destination_s_items() -> None:
    flushed = asyncio.run(_run(0.05))
    assert flushed == [[1], [2, 3], [4, 5]]


def test_linger_is_cut_as_free_slots_run_out() -> None:
    # plenty of free slots: lingering holds nothing anyone needs
    assert asyncio.run(_run(0.05, headroom=10**9)) == [[1], [2, 3], [4, 5]]
    # none free: an end's report is what frees the next slot, it leaves at once
    assert asyncio.run(_run(0.05, headroom=0)) == [[1], [2, 3], [4], [5]]


def test_traffic_counts_messages_and_the_items_they_carried() -> None:
    traffic: dict[str, int] = {}
    flushed = asyncio.run(_run(0.05, traffic))
    assert traffic == {"messages": len(flushed), "items": 5}


def _recording(
    sup: Supervisor, linger_s: float, rate_window_s: float
) -> tuple[Batcher[str, int], list[list[int]]]:
    """A batcher of 4 items a linger at least when busy, and what its flushes carried."""
    flushed: list[list[int]] = []

    async def flush(_: str, items: list[int]) -> None:
        flushed.append(list(items))

    b: Batcher[str, int] = Batcher(
        sup, flush, "test", linger_s=linger_s, min_batch=4, rate_window_s=rate_window_s
    )
    return b, flushed


def test_a_quiet_destination_never_waits_for_company() -> None:
    async def run() -> list[list[int]]:
        async with Supervisor("test") as sup:
            b, flushed = _recording(sup, linger_s=0.05, rate_window_s=0.01)
            for i in range(3):
                b.add("k", i)
                for _ in range(3):
                    await asyncio.sleep(0)
                assert flushed[-1] == [i]  # gone at once: ~50 items/s x 0.05 s < 4
                await asyncio.sleep(0.02)  # (a slower machine only makes it quieter)
        return flushed

    assert asyncio.run(run()) == [[0], [1], [2]]


def test_a_destination_turning_busy_lingers_before_its_window_is_over() -> None:
    async def run() -> tuple[list[list[int]], list[list[int]]]:
        async with Supervisor("test") as sup:
            # busy: 4 items a linger, over a window of 100 s (400 items)
            b, flushed = _recording(sup, linger_s=1.0, rate_window_s=100.0)
            for i in range(401):  # one at a time: each leaves at once while quiet
                b.add("k", i)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
            warm = list(flushed)
            flushed.clear()
            b.add("k", -1)  # 400 items so far in this window: busy, it lingers
            for _ in range(5):
                await asyncio.sleep(0)
            lingering = list(flushed)
        return warm, lingering

    warm, lingering = asyncio.run(run())
    assert warm == [[i] for i in range(401)]  # the first one's items count in no window
    assert lingering == []


async def _handed_order(*, in_flight: bool) -> list[str]:
    """A flush that writes from a task of its own (as an aiohttp client does) and then
    waits for its answer; a caller that waits for ``handed`` and then answers."""
    log: list[str] = []
    release = asyncio.Event()

    async def flush(_: str, items: list[int]) -> None:
        async def write() -> None:
            log.append(f"write {items}")

        writer = asyncio.get_running_loop().create_task(write())
        if items == [0]:
            await release.wait()  # the first flush's answer is slow to come
        else:
            await asyncio.sleep(0)
        await writer

    async with Supervisor("test") as sup:
        b: Batcher[str, int] = Batcher(sup, flush, "test")
        if in_flight:
            b.add("k", 0)
            for _ in range(4):
                await asyncio.sleep(0)
            assert log == ["write [0]"]
        t = b.add("k", 1)
        await b.handed("k")
        log.append("answer")
        release.set()
        await b.sent({"k": t})
    return log


def test_handed_returns_once_the_items_were_written() -> None:
    assert asyncio.run(_handed_order(in_flight=False)) == ["write [1]", "answer"]


def test_handed_does_not_wait_behind_an_earlier_flush() -> None:
    # the earlier flush waits for its answer: the new item could not leave before it
    assert asyncio.run(_handed_order(in_flight=True)) == ["write [0]", "answer", "write [1]"]


def test_handed_returns_at_once_with_nothing_queued_or_a_linger() -> None:
    async def run(linger_s: float, queue: bool) -> bool:
        async def flush(_: str, items: list[int]) -> None:
            pass

        async with Supervisor("test") as sup:
            b: Batcher[str, int] = Batcher(sup, flush, "test", linger_s=linger_s)
            if queue:
                b.add("k", 1)
            waiter = asyncio.ensure_future(b.handed("k"))
            await asyncio.sleep(0)
            return waiter.done()

    assert asyncio.run(run(0.0, queue=False))
    assert asyncio.run(run(0.05, queue=True))
    assert not asyncio.run(run(0.0, queue=True))  # queued, no linger: it waits


def test_sent_wakes_each_waiter_once_its_own_tickets_are_flushed() -> None:
    """Waiters on several keys wake as the last of their tickets is flushed, not before;
    a waiter that was cancelled is dropped, and the others still wake."""

    async def run() -> list[str]:
        gates = {"a": asyncio.Event(), "b": asyncio.Event()}
        woke: list[str] = []

        async def flush(key: str, _: list[int]) -> None:
            await gates[key].wait()

        async def wait(name: str, tickets: dict[str, int]) -> None:
            await b.sent(tickets)
            woke.append(name)

        async with Supervisor("test") as sup:
            b: Batcher[str, int] = Batcher(sup, flush, "test")
            ta, tb = b.add("a", 1), b.add("b", 2)
            both = asyncio.create_task(wait("both", {"a": ta, "b": tb}))
            only_a = asyncio.create_task(wait("a", {"a": ta}))
            gone = asyncio.create_task(wait("gone", {"a": ta}))
            for _ in range(3):
                await asyncio.sleep(0)
            gone.cancel()
            gates["a"].set()
            await only_a
            assert woke == ["a"]  # "both" still waits for b's flush
            gates["b"].set()
            await both
            assert woke == ["a", "both"]
            assert b._waiters == []
            await b.sent({"a": ta, "b": tb})  # all flushed: at once
        return woke

    assert asyncio.run(run()) == ["a", "both"]
