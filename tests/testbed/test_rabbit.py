"""testbed.rabbit: private nodes survive kill -9 with their persistent messages; a 3-node
cluster keeps a quorum queue serving with one node stopped, and the node rejoins."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from testbed._sys import marked_pids
from testbed.netns import Testbed
from testbed.rabbit import RabbitCluster, RabbitNode, RabbitSandbox, epmd_names, sweep

pytestmark = [pytest.mark.rabbit, pytest.mark.netns]
PERSISTENT = aio_pika.DeliveryMode.PERSISTENT


@pytest.fixture(scope="module")
def sandbox() -> Iterator[RabbitSandbox]:
    with RabbitSandbox() as box:
        yield box


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    with Testbed(["client"]) as tb:
        yield tb


@pytest.fixture(scope="module")
def solo(sandbox: RabbitSandbox, bed: Testbed) -> RabbitNode:
    node = sandbox.node("solo", listen_ip=bed.gateway)
    node.start()
    return node


@pytest.fixture(scope="module")
def cluster(sandbox: RabbitSandbox) -> RabbitCluster:
    members = sandbox.cluster(3)
    members.start()
    return members


async def publish(
    url: str, queue: str, bodies: list[bytes], *, quorum: bool = False, persistent: bool = True
) -> None:
    """Declare ``queue`` durable and publish ``bodies`` to it, each confirmed."""
    connection = await aio_pika.connect(url, timeout=10)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        arguments = {"x-queue-type": "quorum"} if quorum else None
        await channel.declare_queue(queue, durable=True, arguments=arguments)
        for body in bodies:
            message = aio_pika.Message(body, delivery_mode=PERSISTENT if persistent else None)
            await channel.default_exchange.publish(
                message, routing_key=queue, mandatory=True, timeout=15
            )


async def publish_until_confirmed(url: str, queue: str, body: bytes, within: float) -> float:
    """Publish one message until the broker confirms it; the seconds that took.

    Right after a member dies, a quorum queue whose leader was there nacks publishes
    until a new leader is elected: a producer has to retry, as this does.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        try:
            await publish(url, queue, [body], quorum=True)
        except aio_pika.exceptions.DeliveryError:
            if loop.time() - start > within:
                raise
            await asyncio.sleep(0.2)
        else:
            return loop.time() - start


async def drain(url: str, queue: str) -> list[bytes]:
    """Get and ack every message ``queue`` holds now."""
    connection = await aio_pika.connect(url, timeout=10)
    got: list[bytes] = []
    async with connection:
        channel = await connection.channel()
        q = await channel.get_queue(queue, ensure=True)
        while (message := await q.get(fail=False, timeout=10)) is not None:
            got.append(message.body)
            await message.ack()
    return got


PUBLISH_FROM_HOST = textwrap.dedent(
    """
    import asyncio, sys
    import aio_pika

    async def main(url, queue):
        connection = await aio_pika.connect(url, timeout=10)
        async with connection:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await channel.declare_queue(queue, durable=True)
            persistent = aio_pika.Message(b"persistent", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await channel.default_exchange.publish(persistent, routing_key=queue, mandatory=True, timeout=10)
            transient = aio_pika.Message(b"transient")
            await channel.default_exchange.publish(transient, routing_key=queue, mandatory=True, timeout=10)
        print("confirmed")

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def test_persistent_message_survives_kill9_and_restart(solo: RabbitNode, bed: Testbed) -> None:
    # published from a test-bed host, over the bridge, to the node on the bridge address
    out = bed.run("client", [sys.executable, "-c", PUBLISH_FROM_HOST, solo.url, "keep"], timeout=30)
    assert out.stdout.strip() == "confirmed"
    assert solo.queues() == {"keep": 2}
    beam = solo.beam_pid
    assert beam is not None
    solo.kill()
    assert not solo.running
    assert solo.name not in epmd_names(solo.sandbox.epmd_port)
    solo.start()
    assert solo.beam_pid not in (None, beam)
    assert asyncio.run(drain(solo.url, "keep")) == [b"persistent"]  # the transient one is gone


def test_a_paused_node_answers_nothing_until_resumed(solo: RabbitNode) -> None:
    solo.pause()
    try:
        with pytest.raises((asyncio.TimeoutError, aio_pika.exceptions.AMQPConnectionError)):
            asyncio.run(asyncio.wait_for(aio_pika.connect(solo.url, timeout=1), 2))
    finally:
        solo.resume()
    asyncio.run(publish(solo.url, "paused", [b"p"]))
    assert asyncio.run(drain(solo.url, "paused")) == [b"p"]


def test_graceful_stop_and_restart_keep_a_durable_queue(solo: RabbitNode) -> None:
    asyncio.run(publish(solo.url, "graceful", [b"1", b"2"]))
    solo.stop()
    assert not solo.running
    solo.start()
    assert asyncio.run(drain(solo.url, "graceful")) == [b"1", b"2"]


def test_quorum_queue_serves_with_one_node_stopped_and_the_node_rejoins(
    cluster: RabbitCluster,
) -> None:
    first, second, third = cluster.nodes
    assert len(cluster.running_nodes()) == 3
    # declared through the first node, so its leader is there: stopping it forces an election
    asyncio.run(publish(first.url, "qq", [b"a", b"b"], quorum=True))
    assert cluster.leader("qq") is first
    first.stop()
    assert first.nodename not in cluster.running_nodes(via=second)
    asyncio.run(publish(second.url, "qq", [b"c", b"d"], quorum=True))
    assert asyncio.run(drain(third.url, "qq")) == [b"a", b"b", b"c", b"d"]
    asyncio.run(publish(third.url, "qq", [b"e"], quorum=True))
    first.start()
    cluster.wait_running(3, timeout=30)
    assert asyncio.run(drain(first.url, "qq")) == [b"e"]


def test_cluster_survives_a_member_killed_with_sigkill(cluster: RabbitCluster) -> None:
    asyncio.run(publish(cluster.nodes[1].url, "qq-kill", [b"x"], quorum=True))
    leader = cluster.leader("qq-kill")
    beam = leader.beam_pid
    leader.kill()
    assert not leader.running
    others = [n for n in cluster.nodes if n is not leader]
    took = asyncio.run(publish_until_confirmed(others[0].url, "qq-kill", b"y", within=20.0))
    print(f"publish confirmed {took:.2f} s after the leader's node was killed")
    assert cluster.leader("qq-kill") is not leader
    assert asyncio.run(drain(others[1].url, "qq-kill")) == [b"x", b"y"]
    leader.start()
    assert leader.beam_pid not in (None, beam)
    cluster.wait_running(3, timeout=30)
    assert len(leader.queue_info("qq-kill")["online"]) == 3


CRASH = textwrap.dedent(
    """
    import os, signal
    from testbed.rabbit import RabbitSandbox
    box = RabbitSandbox(prefix="mtbrmqcrash").open()
    print(box.dir, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_sweep_removes_a_dead_sandbox_and_its_processes(sandbox: RabbitSandbox) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CRASH],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    ) as crashed:
        assert crashed.stdout is not None
        leftover = Path(crashed.stdout.readline().strip())
        assert crashed.wait(timeout=30) == -signal.SIGKILL
    assert leftover.is_dir()
    assert marked_pids(leftover.name)  # its epmd
    removed = sweep("mtbrmqcrash")  # its own prefix: parallel runs' sweeps leave it to us
    assert str(leftover) in removed
    assert not leftover.exists()
    assert marked_pids(leftover.name) == []
    assert sandbox.dir.is_dir()  # the live sandbox is spared
