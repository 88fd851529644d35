"""One hostile runtime among honest ones, through the real Synapse (issue 22): no frame it sends
stops the domain's routing, it reads nobody's traffic and takes nobody's address, and web pages
of other origins cannot open stub connections.

Every test keeps an honest pair routing beside the attacker and checks it still does."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson
import pytest

from adapter.carrier import Routed
from adapter.routing.lanes import Outgoing
from adapter.stub.protocol import MAX_NUMBER

from ..conftest import Databases, NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"
SM = f"domain://msg-node.{D}/sm"


async def _pair(node: Any, name: str) -> tuple[PyRuntime, PyRuntime, str, str]:
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/{name}-alice", acked=True).connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/{name}-bob", acked=True).connect()
    [a] = await alice.allocate(D)
    [b] = await bob.allocate(D)
    return alice, bob, a, b


async def _routes(sender: PyRuntime, receiver: PyRuntime, a: str, b: str, tag: str) -> None:
    """The honest pair's ping arrives (well within the few seconds a stall would exceed)."""
    await sender.send({"id": tag, "type": "ping", "from": a, "to": b, "body": {"tag": tag}})
    got = await receiver.receive(5)
    assert got["body"]["tag"] == tag


def _metric(node: Any, name: str, **labels: str) -> float:
    value = node.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def test_out_of_range_numbers_are_refused_where_they_enter_and_routing_goes_on(
    start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    alice, bob, a, b = await _pair(node, "big")
    mallory = await PyRuntime(stub_url(node), f"runtime://{D}/big-mallory", acked=True).connect()
    [m] = await mallory.allocate(D)
    try:
        await _routes(alice, bob, a, b, "before")
        assert mallory.ws is not None
        for number in (MAX_NUMBER + 1, 2**64 + 1, 0):
            message = orjson.dumps({"id": 1, "type": "ping", "from": m, "to": b}).decode()
            await mallory.ws.send_str(f"[{number},{message}]")
            refusal = await mallory.receive(5)
            assert refusal.get("response") == 400 or refusal["body"]["code"] == 400, refusal
        # A delivery acknowledgement beyond the bounds is ignored, not stored.
        await mallory.ws.send_str('{"cmd":"ack","received":%d}' % 2**70)
        # The largest valid number still routes.
        text = orjson.dumps({"id": 2, "type": "ping", "from": m, "to": b, "body": {"tag": "max"}})
        await mallory.ws.send_str(f"[{MAX_NUMBER},{text.decode()}]")
        assert (await bob.receive(5))["body"]["tag"] == "max"
        for i in range(3):
            await _routes(alice, bob, a, b, f"after-{i}")
        # Its mark is checkpointed like any other (no overflow in either database).
        await node.settlement.checkpoint()
        assert _metric(node, "rethink_mn_checkpoints_total", outcome="failed") == 0
    finally:
        for runtime in (alice, bob, mallory):
            await runtime.close()


async def test_a_message_the_homeserver_refuses_is_answered_and_the_lane_goes_on(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Whatever slips past the checks at the door, a lane never waits on one item for ever:
    here a message numbered beyond what Synapse takes is put straight onto the lane."""
    node = await start_node(await databases.migrated_sqlite())
    alice, bob, a, b = await _pair(node, "poison")
    try:
        session = node.sessions.by_runtime(alice.runtime_url)
        assert session is not None and node.lanes is not None
        lane = node.lanes.for_session(session)
        refused_before = _metric(
            node, "rethink_mn_homeserver_refused_items_total", stream=f"lane-{lane.index}"
        )
        text = orjson.dumps({"id": "poison", "type": "ping", "from": a, "to": b}).decode()
        poison = Routed(text, (b,), session.sender(f"{session.key}.poison"), MAX_NUMBER + 1)
        lane.push(Outgoing(poison, session.id))
        # Synapse refuses it (M_BAD_JSON); its sender is told, the next messages flow.
        answer = await alice.receive(10)
        assert answer["id"] == "poison" and answer["body"]["code"] == 400, answer
        assert "homeserver refused" in answer["body"]["desc"]
        await _routes(alice, bob, a, b, "after-poison")
        refused = _metric(
            node, "rethink_mn_homeserver_refused_items_total", stream=f"lane-{lane.index}"
        )
        assert refused == refused_before + 1
    finally:
        await alice.close()
        await bob.close()


async def test_nobody_subscribes_to_another_runtimes_own_addresses(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice, bob, a, b = await _pair(node, "sub")
    mallory = await PyRuntime(stub_url(node), f"runtime://{D}/sub-mallory", acked=True).connect()
    try:
        [obj] = await bob.allocate(D, scheme="comm", endpoint="object-address-allocation")
        for target in (b, bob.runtime_url, f"{bob.runtime_url}/sm", obj):
            for body in ({"resources": [target]}, {"subscribe": target}):
                reply = await mallory.request(SM, "subscribe", body)
                assert reply["body"]["code"] == 403, (target, reply)
        # The phase-1 form of another's object: its streams only, not the object itself.
        reply = await mallory.request(SM, "subscribe", {"resource": obj})
        assert reply["body"]["code"] == 200
        # Streams stay open to everyone (reTHINK's observers, registration status).
        reply = await mallory.request(
            SM, "subscribe", {"resources": [f"{obj}/changes", f"{b}/registration"]}
        )
        assert reply["body"]["code"] == 200
        await alice.send({"id": "d1", "type": "ping", "from": a, "to": b})
        await alice.send({"id": "d2", "type": "read", "from": a, "to": obj})
        await bob.send({"id": "u1", "type": "update", "from": obj, "to": f"{obj}/changes"})
        assert [m["id"] for m in await bob.receive_n(2, 5)] == ["d1", "d2"]
        assert (await mallory.receive(5))["id"] == "u1"
        # A stub's URL nobody holds may be subscribed first; once a runtime speaks from it, it
        # is that runtime's, and what is sent to it no longer reaches the early subscriber.
        claimed = f"hyperty-runtime://{D}/protostub/sub-bob"
        reply = await mallory.request(SM, "subscribe", {"resources": [claimed]})
        assert reply["body"]["code"] == 200
        await bob.send({"id": "hello", "type": "ping", "from": claimed, "to": a})
        assert (await alice.receive(5))["id"] == "hello"
        await alice.send({"id": "d3", "type": "ping", "from": a, "to": claimed})
        assert (await bob.receive(5))["id"] == "d3"
        assert await mallory.nothing_within(1.0)
    finally:
        for runtime in (alice, bob, mallory):
            await runtime.close()


async def test_a_learned_address_stays_with_the_runtime_that_learned_it(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice, bob, a, _b = await _pair(node, "learn")
    mallory = await PyRuntime(stub_url(node), f"runtime://{D}/learn-mallory", acked=True).connect()
    user = "hyperty://elsewhere.example/learn-bob"
    try:
        await bob.send({"id": "b1", "type": "ping", "from": user, "to": a})
        assert (await alice.receive(5))["id"] == "b1"
        await mallory.send({"id": "m1", "type": "ping", "from": user, "to": a})
        refusal = await mallory.receive(5)
        assert refusal["id"] == "m1" and refusal["body"]["code"] == 403, refusal
        assert await alice.nothing_within(0.5)
        await alice.send({"id": "a1", "type": "ping", "from": a, "to": user})
        assert (await bob.receive(5))["id"] == "a1"
        assert await mallory.nothing_within(1.0)
        # Once its holder's session ends, the address is free.
        await bob.disconnect()
        await mallory.send({"id": "m2", "type": "ping", "from": user, "to": a})
        assert (await alice.receive(5))["id"] == "m2"
        await alice.send({"id": "a2", "type": "ping", "from": a, "to": user})
        assert (await mallory.receive(5))["id"] == "a2"
    finally:
        for runtime in (alice, bob, mallory):
            await runtime.close()


async def _upgrade_status(url: str, origin: str | None) -> int:
    headers = {"Origin": origin} if origin is not None else {}
    runtime_id = re.sub(r"\W", "-", str(origin))
    async with aiohttp.ClientSession() as http:
        try:
            ws = await http.ws_connect(
                url,
                params={"runtimeURL": f"runtime://{D}/origin-{runtime_id}"},
                headers=headers,
            )
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status
        await ws.close()
        return 101


async def test_only_allowed_web_origins_open_stub_connections(
    start_node: NodeFactory, databases: Databases
) -> None:
    url = await databases.migrated_sqlite()
    node = await start_node(url)
    stub = stub_url(node)
    own = f"http://127.0.0.1:{node.stub_port}"
    assert await _upgrade_status(stub, None) == 101  # Node.js runtimes send no Origin
    assert await _upgrade_status(stub, own) == 101
    assert await _upgrade_status(stub, "http://localhost:5173") == 101  # a page on loopback
    assert await _upgrade_status(stub, "https://evil.example") == 403
    assert await _upgrade_status(stub, "null") == 403
    await node.stop()

    node = await start_node(url, **{"stub.allowed_origins": ["https://app.example.org"]})
    stub = stub_url(node)
    assert await _upgrade_status(stub, "https://app.example.org") == 101
    assert await _upgrade_status(stub, "https://app.example.org:443") == 101
    assert await _upgrade_status(stub, f"http://127.0.0.1:{node.stub_port}") == 101
    assert await _upgrade_status(stub, "http://localhost:5173") == 403
    assert await _upgrade_status(stub, "https://evil.example") == 403


async def test_a_name_rebound_to_the_node_reaches_no_listener(
    start_node: NodeFactory, databases: Databases
) -> None:
    """DNS rebinding: a page on evil.example whose name now points at the node. Its requests
    name evil.example in Host and Origin; neither may be compared with the other. Every
    listener refuses the name (421); the stub refuses the origin even under a Host it knows."""
    node = await start_node(await databases.migrated_sqlite(), **{"stub.public_hosts": ["mn.test"]})
    evil = f"http://evil.example:{node.stub_port}"
    async with aiohttp.ClientSession() as http:
        for port, path in (
            (node.stub_port, "/stub/protostub.js"),
            (node.stub_port, "/demo"),
            (node.appservice_port, "/health"),
            (node.appservice_port, "/metrics"),
            (node.appservice_port, "/dashboard/data.json"),
        ):
            async with http.get(
                f"http://127.0.0.1:{port}{path}", headers={"Host": f"evil.example:{port}"}
            ) as refused:
                assert refused.status == 421, (path, refused.status)
            async with http.get(f"http://127.0.0.1:{port}{path}") as known:
                assert known.status != 421, path
        with pytest.raises(aiohttp.WSServerHandshakeError) as upgrade:
            await http.ws_connect(
                stub_url(node),
                params={"runtimeURL": f"runtime://{D}/rebound"},
                headers={"Host": f"evil.example:{node.stub_port}", "Origin": evil},
            )
        assert upgrade.value.status == 421
    # A Host the node knows, an Origin it does not: the page is still not the node's.
    assert await _upgrade_status(stub_url(node), evil) == 403
    assert await _upgrade_status(stub_url(node), f"http://mn.test:{node.stub_port}") == 101
