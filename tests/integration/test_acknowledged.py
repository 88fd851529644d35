"""The acknowledged stub protocol through the real node and Synapse: numbered messages, durable
acknowledgements, numbered deliveries, and what each fault does to them (nothing lost, nothing
twice, order kept)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapter.storage.pending import PendingStore

from ..conftest import Databases, Homeserver, NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"


def update(i: int, frm: str, to: str) -> dict[str, Any]:
    return {"id": i, "type": "update", "from": frm, "to": to, "body": {"n": i}}


async def numbers(rt: PyRuntime, n: int, timeout: float = 30) -> list[int]:
    return [m["body"]["n"] for m in await rt.receive_n(n, timeout)]


async def test_numbered_messages_are_acknowledged_cumulatively_and_delivered_numbered(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/ack-a", acked=True).connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/ack-b", acked=True).connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        total = 300
        for i in range(total):
            await alice.send(update(i, a, b))
        assert await numbers(bob, total) == list(range(total))
        async with asyncio.timeout(10):
            while alice.unacked:
                await asyncio.sleep(0.02)
        # Cumulative and batched: far fewer acknowledgement frames than messages.
        assert alice.node_acks[-1] == total + 1  # the allocation request was message 1
        assert len(alice.node_acks) < total / 3, f"{len(alice.node_acks)} ack frames"
        # Deliveries carry their origin (the sender's numbering) and its number.
        delivered = [f for f in bob.frames if f.startswith("[")]
        assert len(delivered) == total + 1  # the allocation answer, then the updates
        assert delivered[1].split(",", 3)[2] == "2"  # alice's message 2 is update 0
        assert bob.duplicates == 0 and bob.delivered_twice == 0
        # Everything bob acknowledged is settled: nothing waits in the database for him.
        session = node.sessions.by_runtime(bob.runtime_url)
        assert session is not None
        async with asyncio.timeout(5):
            while await PendingStore(node.db).count(session.id):
                await asyncio.sleep(0.1)
    finally:
        await alice.close()
        await bob.close()


async def test_a_receiver_that_drops_gets_exactly_what_it_missed(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/drop-a", acked=True).connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/drop-b", acked=True).connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        bob.hold_acks = True  # received, never acknowledged: the node must keep them
        for i in range(50):
            await alice.send(update(i, a, b))
        assert await numbers(bob, 50) == list(range(50))
        await bob.drop()
        for i in range(50, 120):
            await alice.send(update(i, a, b))
        await asyncio.sleep(0.5)
        bob.hold_acks = False
        await bob.connect()  # says which deliveries it has: the node continues after them
        assert await numbers(bob, 70) == list(range(50, 120))
        assert await bob.nothing_within(0.5)
        assert bob.duplicates == 0 and bob.delivered_twice == 0
    finally:
        await alice.close()
        await bob.close()


async def test_a_sender_resends_what_was_not_acknowledged_and_nothing_is_routed_twice(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/resend-a", acked=True).connect()
    # A plain receiver has no duplicate filter: anything routed twice would reach it twice.
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/resend-b").connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        for i in range(100):
            await alice.send(update(i, a, b))
        await alice.drop()  # before most acknowledgements arrived
        assert alice.unacked, "the test needs messages the node had not acknowledged yet"
        await alice.connect()  # sends every unacknowledged message again
        async with asyncio.timeout(15):
            while alice.unacked:
                await asyncio.sleep(0.02)
        assert await numbers(bob, 100) == list(range(100))
        assert await bob.nothing_within(1.0)
        assert bob.delivered_twice == 0
        dropped = node.metrics.duplicates.labels("stub")._value.get()
        assert dropped > 0
    finally:
        await alice.close()
        await bob.close()


@pytest.mark.parametrize("receiver_acks", [True, False], ids=["acked-receiver", "plain-receiver"])
async def test_a_graceful_restart_of_the_node_loses_nothing_and_routes_nothing_twice(
    start_node: NodeFactory, databases: Databases, receiver_acks: bool
) -> None:
    url = await databases.migrated_sqlite()
    node = await start_node(url)
    alice = PyRuntime(stub_url(node), f"runtime://{D}/grace-a", acked=True)
    bob = PyRuntime(stub_url(node), f"runtime://{D}/grace-b", acked=receiver_acks)
    await alice.connect()
    await bob.connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        total = 600
        got: list[int] = []

        async def stream() -> None:
            for i in range(total):
                await alice.send(update(i, a, b))
                if i % 50 == 0:
                    await asyncio.sleep(0.01)

        sending = asyncio.create_task(stream())
        got += await numbers(bob, 100)
        await node.stop()  # mid-stream, as SIGTERM does
        await sending  # the rest is kept by alice, unacknowledged
        got += [m["body"]["n"] for m in _drain(bob)]

        node = await start_node(url)
        alice.stub_url = bob.stub_url = stub_url(node)
        await alice.connect()
        await bob.connect()
        got += await numbers(bob, total - len(got), timeout=60)
        assert got == list(range(total))
        assert await bob.nothing_within(1.0)
        # Nothing twice: none handed to bob again, and none even sent him again (a graceful
        # stop settles what it delivered before it closes).
        assert bob.delivered_twice == 0 and bob.duplicates == 0
    finally:
        await alice.close()
        await bob.close()


async def test_a_request_answered_just_before_a_graceful_stop_is_not_executed_again(
    start_node: NodeFactory, databases: Databases
) -> None:
    """The stop waits for the frame being decided and still takes the stubs' acknowledgements,
    so the answered request's acknowledgement reaches its stub before the socket closes."""
    url = await databases.migrated_sqlite()
    node = await start_node(url)
    rt = PyRuntime(stub_url(node), f"runtime://{D}/last-word", acked=True)
    await rt.connect()
    try:
        [address] = await rt.allocate(D)
        await node.stop()  # at once: the acknowledgement is not due for another 20 ms
        assert rt.unacked == [], "the stop closed the socket before acknowledging the request"
        node = await start_node(url)
        rt.stub_url = stub_url(node)
        await rt.connect()
        assert await rt.nothing_within(1.0), "the request was executed a second time"
        assert node.monitor.holder(address) is not None
    finally:
        await rt.close()


async def test_a_request_sent_again_after_the_node_went_down_gets_the_same_answer(
    start_node: NodeFactory, databases: Databases
) -> None:
    """The node allocated, answered, and went down before its stub heard the request
    acknowledged (a SIGKILL, or a socket cut first): the stub sends the request again to the
    next run, which must not allocate a second block (issue 23, item 7)."""
    url = await databases.migrated_sqlite()
    node = await start_node(url)
    rt = PyRuntime(stub_url(node), f"runtime://{D}/killed-mid-request", acked=True)
    await rt.connect()
    try:
        rt.hold_acks = True  # the answer unsettled: the request is not acknowledged yet
        first = await rt.request(
            f"domain://msg-node.{D}/hyperty-address-allocation", "create", {"value": {"number": 2}}
        )
        assert first["body"]["code"] == 200, first
        assert rt.unacked, "the request was acknowledged before its answer was settled"
        await rt.drop()  # the acknowledgement can no longer reach the stub
        await node.stop()
        node = await start_node(url)
        rt.stub_url = stub_url(node)
        rt.hold_acks = False
        # The request, sent again, is answered again: the same answer reaches the runtime a
        # second time (its first one had settled the request there), and only that.
        rt.twice_allowed = True
        await rt.connect()  # sends the request again
        again = await rt.receive(10)
        assert again["id"] == first["id"] and again["body"]["code"] == 200, again
        assert again["body"]["value"] == first["body"]["value"]
        assert rt.delivered_twice == 1 and rt.twice_sample == [again]
        session = node.sessions.by_runtime(rt.runtime_url)
        assert session is not None
        assert node.table.holdings(session.id).addresses == 2
    finally:
        await rt.close()


async def test_homeserver_restart_mid_stream_loses_nothing(
    homeserver: Homeserver, start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/hsr-a", acked=True).connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/hsr-b", acked=True).connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        total = 400

        async def stream() -> None:
            for i in range(total):
                await alice.send(update(i, a, b))
                await asyncio.sleep(0.005)

        sending = asyncio.create_task(stream())
        first = await numbers(bob, 50)
        await homeserver.process.stop_async()
        await asyncio.sleep(1.0)
        homeserver.process.start()
        await homeserver.process.wait_ready()
        # How soon routing resumes is the fault suite's measure (bench/faults.py,
        # synapse-sigterm and synapse-sigkill: recovery_s), not a threshold here.
        resumed = await numbers(bob, 1, timeout=60)
        await sending
        rest = await numbers(bob, total - 51, timeout=60)
        assert first + resumed + rest == list(range(total))
        assert await bob.nothing_within(1.0)
        assert bob.duplicates == 0 and bob.delivered_twice == 0
    finally:
        await alice.close()
        await bob.close()


def _drain(rt: PyRuntime) -> list[Any]:
    items = []
    while not rt.inbox.empty():
        items.append(rt.inbox.get_nowait())
    return items
