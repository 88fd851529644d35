"""What a node killed (as by SIGKILL) promises once it is started again, for what it had
delivered before the kill but not yet checkpointed: the lanes are read again from their stored
positions, and what was delivered from them before must neither reach a runtime a second time
(even a reloaded one) nor be answered to its sender as undeliverable (issue 43, found by the
domain model).

Checkpoints are held off from the first message on, so the positions stay before every message
of the test: what a kill within one checkpoint interval leaves, made certain."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from adapter.node import Node

from ..conftest import Databases, NodeFactory
from ..support.node_faults import kill
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"


def ping(i: int, frm: str, to: str) -> dict[str, Any]:
    return {"id": f"m{i}", "type": "ping", "from": frm, "to": to, "body": {"n": i}}


async def _no_checkpoints(node: Node) -> None:
    """From now on the node writes no checkpoint (its lanes' positions stay where they are)."""

    async def nothing(final: bool = False) -> None:
        return None

    settlement = node.core.settlement
    await settlement.checkpoint()  # what came before (the allocations) is settled
    settlement.checkpoint = nothing  # type: ignore[method-assign]


async def _settled(node: Node, rt: PyRuntime) -> None:
    """Wait until ``rt`` has acknowledged everything delivered to it, and the node has every
    message ``rt`` sent."""
    session = node.sessions.by_runtime(rt.runtime_url)
    assert session is not None
    async with asyncio.timeout(20):
        while session.mailbox.in_flight or rt.unacked:
            await asyncio.sleep(0.02)


async def _recovered(node: Node) -> None:
    """Wait until the node's lanes have read their rooms again (and delivered what they read)."""
    assert node.core.lanes is not None
    async with asyncio.timeout(30):
        for lane in node.core.lanes:
            await lane.ready.wait()


def _reloaded(old: PyRuntime, url: str) -> PyRuntime:
    """A new stub instance for ``old``'s runtime (a page reload), with what the stub keeps
    across one (docs/stub-protocol.md, "A runtime that reloads")."""
    rt = PyRuntime(url, old.runtime_url, acked=True)
    rt.restore(old.kept())
    return rt


def _handed(rt: PyRuntime) -> list[dict[str, Any]]:
    """Every reTHINK message the node sent ``rt``, in order (whether or not a test read it)."""
    out = []
    for frame in rt.frames:
        parsed = orjson.loads(frame)
        message = parsed[3] if isinstance(parsed, list) else parsed
        if isinstance(message, dict) and "type" in message:
            out.append(message)
    return out


@dataclass
class _Pair:
    """A node on a fresh database, alice and bob each holding an address, checkpoints held off."""

    url: str
    node: Node
    alice: PyRuntime
    bob: PyRuntime
    a: str
    b: str


async def _pair(start_node: NodeFactory, databases: Databases, name: str) -> _Pair:
    url = await databases.migrated_sqlite()
    node = await start_node(url)
    alice = PyRuntime(stub_url(node), f"runtime://{D}/{name}-a", acked=True)
    bob = PyRuntime(stub_url(node), f"runtime://{D}/{name}-b", acked=True)
    try:
        await alice.connect()
        await bob.connect()
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        await _no_checkpoints(node)
    except BaseException:
        await alice.close()
        await bob.close()
        raise
    return _Pair(url, node, alice, bob, a, b)


async def _killed_and_started(pair: _Pair, start_node: NodeFactory) -> Node:
    """The pair's node killed and started again on its database, its lanes read again, and
    alice connected to it again (the same stub instance: she resumes)."""
    await kill(pair.node)
    pair.node = await start_node(pair.url)
    await _recovered(pair.node)
    await pair.alice.drop()
    pair.alice.stub_url = stub_url(pair.node)
    await pair.alice.connect()
    return pair.node


async def _pings_until(rt: PyRuntime, last: int) -> list[int]:
    out: list[int] = []
    while not out or out[-1] != last:
        out += await _pings(rt, 1)
    return out


async def _pings(rt: PyRuntime, n: int) -> list[int]:
    return [m["body"]["n"] for m in await rt.receive_n(n) if m.get("type") == "ping"]


@pytest.mark.parametrize("when", ["reloaded-after-the-kill", "reloaded-before-the-kill"])
async def test_a_reloaded_runtime_is_not_handed_again_what_it_had_before_a_kill(
    start_node: NodeFactory, databases: Databases, when: str
) -> None:
    pair = await _pair(start_node, databases, "kr")
    node, alice, bob, a, b = pair.node, pair.alice, pair.bob, pair.a, pair.b
    try:
        for i in range(5):
            await alice.send(ping(i, a, b))
        assert await _pings(bob, 5) == list(range(5))
        await _settled(node, bob)
        await _settled(node, alice)
        if when == "reloaded-before-the-kill":
            await bob.close()
            bob = await _reloaded(bob, stub_url(node)).connect()
            for i in range(5, 8):
                await alice.send(ping(i, a, b))
            assert await _pings(bob, 3) == list(range(5, 8))
            await _settled(node, bob)
        sent = 8 if when == "reloaded-before-the-kill" else 5

        node = await _killed_and_started(pair, start_node)
        await bob.close()
        bob = await _reloaded(bob, stub_url(node)).connect()
        assert (bob.connect_answer or {})["data"]["session"] == "resumed"
        # Something new after it: what bob is handed before it is what he was handed again.
        await alice.send(ping(100, a, b))
        again = await _pings_until(bob, 100)
        assert again == [100], f"bob (reloaded) was handed again {again[:-1]} of 0..{sent - 1}"
        assert await bob.nothing_within(0.5)
    finally:
        await alice.close()
        await bob.close()


@pytest.mark.parametrize(
    ("how", "to"),
    [
        ("disconnect", "hyperty"),
        ("disconnect", "runtime"),
        ("address-released", "hyperty"),
    ],
)
async def test_a_message_delivered_before_a_kill_is_never_answered_undeliverable_after_it(
    start_node: NodeFactory, databases: Databases, how: str, to: str
) -> None:
    """Bob got alice's messages and then went (a clean `disconnect`, or he let the address
    go); the node is killed before its next checkpoint. Read again at the start, the messages
    have no destination any more: their sender must not be told they were not delivered."""
    pair = await _pair(start_node, databases, "k404")
    node, alice, bob, a, b = pair.node, pair.alice, pair.bob, pair.a, pair.b
    try:
        for i in range(3):
            await alice.send(ping(i, a, b if to == "hyperty" else bob.runtime_url))
        assert await _pings(bob, 3) == [0, 1, 2]
        await _settled(node, bob)
        await _settled(node, alice)
        if how == "disconnect":
            await bob.disconnect()
        else:
            answer = await bob.request(
                f"domain://msg-node.{D}/hyperty-address-allocation", "delete", {"resource": b}
            )
            assert answer["body"]["code"] == 200, answer
            await _settled(node, bob)

        node = await _killed_and_started(pair, start_node)
        # A request after the replay: its answer comes after any answer the replay gave.
        answer = await alice.request(
            f"domain://msg-node.{D}/hyperty-address-allocation",
            "create",
            {"scheme": "hyperty", "value": {"number": 1}},
        )
        assert answer["body"]["code"] == 200, answer
        answers = [m for m in _handed(alice) if m.get("type") == "response"]
        refused = [m for m in answers if str(m["id"]).startswith("m")]
        assert not refused, f"alice was told her delivered messages were not: {refused}"
    finally:
        await alice.close()
        await bob.close()
