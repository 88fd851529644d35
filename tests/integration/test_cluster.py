"""One domain on two node processes (`cluster.process`): one PostgreSQL database, one
homeserver, each process with its own lanes. Runtimes held by different processes reach each
other; a runtime is held by one process at a time; a process restarted delivers what its
runtimes were sent meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from adapter.node import Node
from adapter.storage import migrate

from ..conftest import Databases, Homeserver
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"

StartProcess = Callable[[str], Awaitable[Node]]


@pytest_asyncio.fixture(loop_scope="session")
async def processes(
    homeserver: Homeserver, databases: Databases
) -> AsyncIterator[tuple[StartProcess, dict[str, Node]]]:
    """Start node processes of one domain by name; all are stopped after the test."""
    url = await databases.postgres()
    await migrate.upgrade(url)
    running: dict[str, Node] = {}

    async def start(name: str) -> Node:
        # The homeserver pushes to the first process's port; the others take none (they read
        # the lanes they need with /sync).
        port = homeserver.appservice_port if name == "p1" else 0
        node = Node(
            homeserver.node_config(
                url,
                **{
                    "cluster.process": name,
                    "cluster.heartbeat_seconds": 0.5,
                    "cluster.gone_after_seconds": 3,
                    "appservice.listen.port": port,
                },
            )
        )
        await node.start()
        running[name] = node
        await _joined(node)
        return node

    yield start, running
    for node in running.values():
        await node.stop()


async def _joined(node: Node) -> None:
    async with asyncio.timeout(30):
        while node.membership is None:
            await asyncio.sleep(0.05)


async def _runtime(node: Node, name: str, acked: bool = True) -> PyRuntime:
    runtime = await PyRuntime(stub_url(node), f"runtime://{D}/{name}", acked=acked).connect()
    assert runtime.connect_answer is None or runtime.connect_answer["response"] == 200, (
        runtime.connect_answer
    )
    return runtime


def _message(n: int, sender: str, to: str) -> dict[str, Any]:
    return {"id": n, "type": "create", "from": sender, "to": to, "body": {"n": n}}


async def _reading(node: Node, rooms: int) -> None:
    """Until ``node`` reads ``rooms`` lanes of other processes."""
    assert node.siblings is not None
    async with asyncio.timeout(30):
        while len(node.siblings.rooms) < rooms:
            await asyncio.sleep(0.05)


async def test_runtimes_on_two_processes_reach_each_other_in_order(
    processes: tuple[StartProcess, dict[str, Node]],
) -> None:
    start, _running = processes
    p1, p2 = await start("p1"), await start("p2")
    await _reading(p1, 1)
    await _reading(p2, 1)
    alice, bob = await _runtime(p1, "alice"), await _runtime(p2, "bob")
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        # Each process knows the other's runtime's address (the database announced it).
        async with asyncio.timeout(10):
            while p1.table.owner(b) is None or p2.table.owner(a) is None:
                await asyncio.sleep(0.02)
        for n in range(1, 51):
            await alice.send(_message(n, a, b))
            await bob.send(_message(n, b, a))
        to_bob = await bob.receive_n(50)
        to_alice = await alice.receive_n(50)
        assert [m["body"]["n"] for m in to_bob] == list(range(1, 51))
        assert [m["body"]["n"] for m in to_alice] == list(range(1, 51))
        assert {m["from"] for m in to_bob} == {a}
        # Each message came once.
        assert await bob.nothing_within(0.5) and bob.duplicates == 0
    finally:
        await alice.close()
        await bob.close()


async def test_a_runtime_is_held_by_one_process_at_a_time(
    processes: tuple[StartProcess, dict[str, Node]],
) -> None:
    start, _running = processes
    p1, p2 = await start("p1"), await start("p2")
    carol = await _runtime(p1, "carol", acked=False)
    async with asyncio.timeout(10):
        while p1.sessions.by_runtime(carol.runtime_url) is None:
            await asyncio.sleep(0.02)
    try:
        # Held by p1: p2 sends the stub back to the load balancer, with a reason.
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(stub_url(p2), params={"runtimeURL": f"runtime://{D}/carol"})
        assert refused.value.status == 503
        # A v1 handshake is answered 503 on the socket, which is then closed.
        v1 = await PyRuntime(stub_url(p2), f"runtime://{D}/carol").connect(handshake="v1")
        assert v1.connect_answer is not None and v1.connect_answer["response"] == 503
        assert "held by node process p1" in v1.connect_answer["desc"], v1.connect_answer
        await v1.close()
        # Released (`disconnect`), the runtime may connect to either.
        await carol.disconnect()
        again = await _runtime(p2, "carol", acked=False)
        await again.close()
    finally:
        await carol.close()


async def test_a_process_restarted_delivers_what_its_runtimes_were_sent_meanwhile(
    processes: tuple[StartProcess, dict[str, Node]],
) -> None:
    start, running = processes
    p1, p2 = await start("p1"), await start("p2")
    await _reading(p2, 1)
    dave, erin = await _runtime(p1, "dave"), await _runtime(p2, "erin")
    try:
        [d] = await dave.allocate(D)
        [e] = await erin.allocate(D)
        async with asyncio.timeout(10):
            while p1.table.owner(e) is None:
                await asyncio.sleep(0.02)
        await dave.send(_message(1, d, e))
        assert (await erin.receive())["body"]["n"] == 1
        # p2 goes away; erin's session stays p2's, detached. What dave sends meanwhile waits
        # in p1's lane for p2.
        await erin.drop()
        await p2.stop()
        del running["p2"]
        for n in range(2, 31):
            await dave.send(_message(n, d, e))
        async with asyncio.timeout(10):
            while dave.unacked:
                await asyncio.sleep(0.02)
        p2 = await start("p2")
        erin.stub_url = stub_url(p2)
        await erin.connect()
        got = await erin.receive_n(29)
        assert [m["body"]["n"] for m in got] == list(range(2, 31))
        assert await erin.nothing_within(0.5)
    finally:
        await dave.close()
        await erin.close()
