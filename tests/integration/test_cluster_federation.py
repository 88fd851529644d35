"""A domain on several node processes that federates: domain A on two processes (p1 its
federation process, p2 not), domain B on one, each with its own Synapse, federating on loopback.
Runtimes held by either process of A reach B's and are reached from there, in order and once;
subscriptions across domains work from either; a runtime moving between A's processes keeps its
order to B; the federation process stopped and started again loses nothing either way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import text

from adapter.node import Node
from adapter.storage import migrate

from ..conftest import Databases, Federation
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
A, B = "a.mn.test", "b.mn.test"

StartA = Callable[[str], Awaitable[Node]]


@pytest_asyncio.fixture(loop_scope="session")
async def domains(
    federation: Federation, databases: Databases
) -> AsyncIterator[tuple[StartA, dict[str, Node], Node]]:
    """Start A's processes by name (the homeserver pushes to p1, its federation process);
    B's only node is running. All are stopped after the test."""
    a_url = await databases.postgres()
    await migrate.upgrade(a_url)
    b_url = databases.sqlite()
    await migrate.upgrade(b_url)
    b = Node(
        federation.b.node_config(
            b_url, **{"federation.peers": {A: {"server_name": federation.a.server_name}}}
        )
    )
    await b.start()
    running: dict[str, Node] = {}

    async def start(name: str) -> Node:
        node = Node(
            federation.a.node_config(
                a_url,
                **{
                    "federation.peers": {B: {"server_name": federation.b.server_name}},
                    "cluster.process": name,
                    "cluster.federation_process": "p1",
                    "cluster.heartbeat_seconds": 0.5,
                    "cluster.gone_after_seconds": 30,
                    "appservice.listen.port": federation.a.appservice_port if name == "p1" else 0,
                },
            ),
            on_struck=lambda: pytest.fail(f"process {name} was taken for gone"),
        )
        await node.start()
        running[name] = node
        async with asyncio.timeout(30):
            while node.membership is None:
                await asyncio.sleep(0.05)
        return node

    try:
        yield start, running, b
    finally:
        for node in running.values():
            await node.stop()
        await b.stop()


async def _both(start: StartA) -> tuple[Node, Node]:
    p1, p2 = await start("p1"), await start("p2")
    async with asyncio.timeout(30):
        for node in (p1, p2):
            assert node.siblings is not None
            while len(node.siblings.rooms) < 1:
                await asyncio.sleep(0.05)
    return p1, p2


async def _runtime(node: Node, name: str, domain: str = A) -> PyRuntime:
    runtime = await PyRuntime(stub_url(node), f"runtime://{domain}/{name}", acked=True).connect()
    assert runtime.connect_answer is None or runtime.connect_answer["response"] == 200
    return runtime


def _ping(n: Any, frm: str, to: str) -> dict[str, Any]:
    return {"id": n, "type": "ping", "from": frm, "to": to, "body": {"n": n}}


async def _acknowledged(runtime: PyRuntime) -> None:
    async with asyncio.timeout(30):
        while runtime.unacked:
            await asyncio.sleep(0.05)


async def test_runtimes_of_either_process_reach_a_peer_domain_and_are_answered(
    domains: tuple[StartA, dict[str, Node], Node],
) -> None:
    start, _running, b = domains
    p1, p2 = await _both(start)
    alice, carol = await _runtime(p2, "cf-alice"), await _runtime(p1, "cf-carol")
    bob = await _runtime(b, "cf-bob", B)
    try:
        [a] = await alice.allocate(A)
        [c] = await carol.allocate(A)
        [bo] = await bob.allocate(B)
        for n in range(1, 41):
            await alice.send(_ping(f"a{n}", a, bo))
            await carol.send(_ping(f"c{n}", c, bo))
        got = await bob.receive_n(80, 60)
        assert [m["id"] for m in got if m["from"] == a] == [f"a{n}" for n in range(1, 41)]
        assert [m["id"] for m in got if m["from"] == c] == [f"c{n}" for n in range(1, 41)]
        # Answers from B reach each wherever it is held: p1 relays what peers send to the lanes.
        for n in range(1, 21):
            await bob.send(_ping(f"b{n}", bo, a))
            await bob.send(_ping(f"d{n}", bo, c))
        assert [m["id"] for m in await alice.receive_n(20, 60)] == [f"b{n}" for n in range(1, 21)]
        assert [m["id"] for m in await carol.receive_n(20, 60)] == [f"d{n}" for n in range(1, 21)]
        for runtime in (alice, carol, bob):
            assert await runtime.nothing_within(0.5) and runtime.duplicates == 0
        # A domain that is no peer is refused by the process that holds the sender, at once.
        await alice.send(_ping("elsewhere", a, "hyperty://c.mn.test/someone"))
        refused = await alice.receive(10)
        assert refused["id"] == "elsewhere" and refused["body"]["code"] == 403
        # And an unknown address in B is answered 404 from B, to the runtime on p2.
        await alice.send(_ping("nobody", a, f"hyperty://{B}/nobody-here"))
        answer = await alice.receive(30)
        assert answer["id"] == "nobody" and answer["body"]["code"] == 404
    finally:
        for runtime in (alice, carol, bob):
            await runtime.close()


async def test_a_subscription_across_domains_from_a_process_that_does_not_federate(
    domains: tuple[StartA, dict[str, Node], Node],
) -> None:
    """A runtime on p2 subscribes to a stream of B: p2 asks B through its lane and p1; B's
    updates reach it through p1's relay. When it leaves, B stops sending them."""
    start, _running, b = domains
    _p1, p2 = await _both(start)
    watcher = await _runtime(p2, "cf-watcher")
    reporter = await _runtime(b, "cf-reporter", B)
    try:
        [obj] = await reporter.allocate(B, scheme="comm", endpoint="address-allocation")
        changes = f"{obj}/changes"
        answer = await watcher.request(
            f"domain://msg-node.{A}/sm", "subscribe", {"resources": [changes]}
        )
        assert answer["body"]["code"] == 200
        # Answered before B confirmed (only p1 hears B's answer): wait until B has it.
        async with asyncio.timeout(30):
            while not b.monitor.receivers((changes,), None).domains:
                await asyncio.sleep(0.05)
        for n in range(1, 11):
            await reporter.send({"id": f"u{n}", "type": "update", "from": obj, "to": changes})
        got = await watcher.receive_n(10, 60)
        assert [m["id"] for m in got] == [f"u{n}" for n in range(1, 11)]
        assert watcher.duplicates == 0

        left = await watcher.request(
            f"domain://msg-node.{A}/sm", "unsubscribe", {"resources": [changes]}
        )
        assert left["body"]["code"] == 200
        async with asyncio.timeout(30):
            while b.monitor.receivers((changes,), None).domains:
                await asyncio.sleep(0.05)
    finally:
        await watcher.close()
        await reporter.close()


async def test_a_sender_moving_between_processes_keeps_its_order_to_a_peer(
    domains: tuple[StartA, dict[str, Node], Node],
) -> None:
    """ivan streams to B while his stub reconnects p2 → p1 → p2: B gets everything once, in
    order (each process's lane carries his messages while he is there; p1 sends them on)."""
    start, _running, b = domains
    p1, p2 = await _both(start)
    ivan = await _runtime(p2, "cf-ivan")
    judy = await _runtime(b, "cf-judy", B)
    try:
        [i] = await ivan.allocate(A)
        [j] = await judy.allocate(B)
        total = 150
        sent = 0
        for target in (p1, p2, None):
            for _ in range(total // 3):
                sent += 1
                await ivan.send(_ping(sent, i, j))
                await asyncio.sleep(0.005)
            if target is not None:
                await ivan.drop()
                ivan.stub_url = stub_url(target)
                await ivan.connect()
                assert ivan.connect_answer is not None
                assert ivan.connect_answer["response"] == 200
        got = await judy.receive_n(total, 60)
        assert [m["body"]["n"] for m in got] == list(range(1, total + 1))
        assert await judy.nothing_within(0.5) and judy.duplicates == 0
        await _acknowledged(ivan)
    finally:
        await ivan.close()
        await judy.close()


async def test_the_federation_process_stopped_and_started_again_loses_nothing(
    domains: tuple[StartA, dict[str, Node], Node],
) -> None:
    """While p1 is away, what alice (on p2) sends to B waits in p2's lane, acknowledged; what
    bob sends her waits in A's homeserver's push. Both arrive once p1 is back, in order."""
    start, running, b = domains
    p1, p2 = await _both(start)
    alice = await _runtime(p2, "cf-patient")
    bob = await _runtime(b, "cf-far", B)
    try:
        [a] = await alice.allocate(A)
        [bo] = await bob.allocate(B)
        await alice.send(_ping(0, a, bo))
        assert (await bob.receive(30))["body"]["n"] == 0
        await p1.stop()
        del running["p1"]
        for n in range(1, 31):
            await alice.send(_ping(n, a, bo))
            await bob.send(_ping(n, bo, a))
        # Acknowledged by p2 although nobody sends them on yet: p2's lane holds them.
        await _acknowledged(alice)
        assert await bob.nothing_within(1.0)
        await start("p1")
        to_bob = await bob.receive_n(30, 60)
        to_alice = await alice.receive_n(30, 60)
        assert [m["body"]["n"] for m in to_bob] == list(range(1, 31))
        assert [m["body"]["n"] for m in to_alice] == list(range(1, 31))
        assert await bob.nothing_within(0.5) and bob.duplicates == 0
        assert await alice.nothing_within(0.5) and alice.duplicates == 0
    finally:
        await alice.close()
        await bob.close()


async def test_the_federation_process_struck_off_and_started_again_sends_on_what_waited(
    domains: tuple[StartA, dict[str, Node], Node],
) -> None:
    """p1 goes away before p2's lane carried anything, and p2 strikes it off as gone (its row is
    deleted). What alice (on p2) then sends to B waits in p2's lane. p1, started again, has no
    row and no position in p2's lane: a process new to the domain reads the others' lanes from
    their ends, but the federation process must not, or it never sends those messages on."""
    start, running, b = domains
    p1, p2 = await _both(start)
    await p1.stop()
    del running["p1"]
    # Silent for longer than `gone_after_seconds`, as a killed process is: p2 strikes it.
    await p2.db.run(
        lambda conn: conn.execute(
            text(
                "UPDATE node_processes SET heartbeat_at = now() - interval '1 hour' "
                "WHERE name = 'p1'"
            )
        )
    )
    assert p2.cluster is not None
    take_over, processes = p2.cluster.take_over, p2.cluster.processes
    assert take_over is not None and processes is not None
    await take_over.gone("p1")
    assert [row.name for row in await processes.all()] == ["p2"]
    alice = await _runtime(p2, "cf-struck")
    bob = await _runtime(b, "cf-struck-far", B)
    try:
        [a] = await alice.allocate(A)
        [bo] = await bob.allocate(B)
        for n in range(1, 21):
            await alice.send(_ping(n, a, bo))
        await _acknowledged(alice)
        assert await bob.nothing_within(1.0)
        await start("p1")
        to_bob = await bob.receive_n(20, 60)
        assert [m["body"]["n"] for m in to_bob] == list(range(1, 21))
        assert await bob.nothing_within(0.5) and bob.duplicates == 0
    finally:
        await alice.close()
        await bob.close()
