"""Routing properties through the real Synapse: durability, order, exactness, limits, bad input."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from typing import Any

import aiohttp
import orjson
import pytest

from adapter import carrier

from ..conftest import Databases, Homeserver, NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"
MN = f"domain://msg-node.{D}"


async def test_restart_between_allocation_and_messaging_still_routes(
    start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/r-alice").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/r-bob").connect()
    [a] = await alice.allocate(D)
    [b] = await bob.allocate(D)
    await alice.close()
    await bob.close()
    await node.stop()

    node = await start_node(database_url)
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/r-alice").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/r-bob").connect()
    try:
        await alice.send({"id": 1, "type": "ping", "from": a, "to": b})
        got = await bob.receive(15)
        assert got["from"] == a and got["to"] == b
    finally:
        await alice.close()
        await bob.close()


async def test_detached_runtime_gets_everything_in_order_on_reconnect(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    sender = await PyRuntime(stub_url(node), f"runtime://{D}/q-sender").connect()
    receiver = await PyRuntime(stub_url(node), f"runtime://{D}/q-receiver").connect()
    [s] = await sender.allocate(D)
    [r] = await receiver.allocate(D)
    await receiver.drop()  # no `disconnect`: the session stays
    try:
        total = 120
        for i in range(total):
            await sender.send({"id": i, "type": "update", "from": s, "to": r, "body": {"n": i}})
        # Wait until all went through Matrix and were kept.
        assert node.sessions is not None
        session = node.sessions.by_runtime(receiver.runtime_url)
        assert session is not None
        from adapter.storage.pending import PendingStore

        pending = PendingStore(node.db)
        async with asyncio.timeout(30):
            while await pending.count(session.id) < total:
                await asyncio.sleep(0.1)
        back = await PyRuntime(stub_url(node), receiver.runtime_url).connect()
        got = await back.receive_n(total)
        assert [m["body"]["n"] for m in got] == list(range(total))
        # Live traffic continues after the replay, still in order.
        await sender.send({"id": "late", "type": "update", "from": s, "to": r, "body": {"n": -1}})
        assert (await back.receive(15))["body"]["n"] == -1
        assert await pending.count(session.id) == 0
        await back.close()
    finally:
        await sender.close()


async def test_messages_are_room_events_readable_with_a_matrix_client(
    homeserver: Homeserver, start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/m-alice").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/m-bob").connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        texts = [
            orjson.dumps({"id": i, "type": "ping", "from": a, "to": b}).decode() for i in range(3)
        ]
        for t in texts:
            await alice.send(t)
        await bob.receive_n(3)
        session = node.sessions.by_runtime(alice.runtime_url)
        assert session is not None and node.lanes is not None
        room_id = node.lanes.for_session(session).room_id
        user = node.rooms.virtual_user(alice.runtime_url)
        headers = {"Authorization": f"Bearer {homeserver.as_token}"}
        async with (
            aiohttp.ClientSession(headers=headers) as http,
            http.get(
                f"{homeserver.url}/_matrix/client/v3/rooms/{room_id}/messages",
                params={"dir": "b", "limit": "500"},
            ) as resp,
        ):
            chunk = (await resp.json())["chunk"]
        batches = [e for e in reversed(chunk) if e["type"] == carrier.BATCH_EVENT]
        carried = []
        for event in batches:
            if "senders" not in event["content"]:
                continue  # another test's burst, carried through the media repository
            senders = event["content"]["senders"]
            for sender, _seq, to, text in event["content"]["messages"]:
                # Which runtime sent what: its runtimeURL and its Matrix user, per message (the
                # lanes are shared by every test of the session: this session's own origin).
                origin, runtime, matrix_user = senders[sender][:3]
                if origin.startswith(session.key):
                    assert (runtime, matrix_user) == (alice.runtime_url, user)
                    assert to == [b]
                    carried.append(text)
        assert carried == texts
    finally:
        await alice.close()
        await bob.close()


async def test_any_json_round_trips_exactly(start_node: NodeFactory, databases: Databases) -> None:
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/j-alice").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/j-bob").connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        deep: Any = "bottom"
        for _ in range(60):
            deep = {"d": [deep]}
        frames = [
            # floats, integers beyond 2^53 and 2^64, exponents, unicode escapes and raw unicode,
            # null, deep nesting, unusual whitespace and key order.
            '{"id":1,"type":"update","from":"%s","to":"%s","body":{"f":0.1,"g":1e-7,'
            '"big":9007199254740993,"huge":123456789012345678901234567890,"neg":-0.0}}' % (a, b),
            '{ "to" : "%s", "body": {"s":"h\\u00e9llo \\ud83d\\ude00 ✓ \\"q\\"","n":null},'
            '\n "from":"%s","type":"update","id":"two"}' % (b, a),
            json.dumps({"id": 3, "type": "update", "from": a, "to": b, "body": deep}),
        ]
        for f in frames:
            await alice.send(f)
        await bob.receive_n(len(frames))
        assert bob.frames[-len(frames) :] == frames
    finally:
        await alice.close()
        await bob.close()


async def test_large_messages_travel_packed_or_through_the_media_repository(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Too big for an event as JSON: packed (deflated) in the event when that fits, through
    the media repository when it does not (random text hardly deflates)."""
    node = await start_node(
        await databases.migrated_sqlite(), **{"stub.max_frame_bytes": 512 * 1024}
    )
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/big-alice").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/big-bob").connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        sent = node.metrics.matrix_events_out
        big = orjson.dumps(
            {"id": 1, "type": "update", "from": a, "to": b, "body": {"blob": "x" * 200_000}}
        ).decode()
        await alice.send(big)
        await bob.receive(15)
        assert bob.frames[-1] == big
        assert sent.labels("packed")._value.get() >= 1
        assert sent.labels("media")._value.get() == 0
        noise = base64.b64encode(os.urandom(150_000)).decode()
        random_big = orjson.dumps(
            {"id": 4, "type": "update", "from": a, "to": b, "body": {"blob": noise}}
        ).decode()
        await alice.send(random_big)
        await bob.receive(15)
        assert bob.frames[-1] == random_big
        assert sent.labels("media")._value.get() >= 1

        too_big = orjson.dumps(
            {"id": 2, "type": "update", "from": a, "to": b, "body": {"blob": "y" * 600_000}}
        ).decode()
        await alice.send(too_big)
        answer = await alice.receive(10)
        assert answer["body"]["code"] == 413 and answer["id"] == 2
        # Still usable afterwards.
        await alice.send({"id": 3, "type": "ping", "from": a, "to": b})
        assert (await bob.receive(15))["id"] == 3
    finally:
        await alice.close()
        await bob.close()


async def test_bad_input_is_answered_and_harms_no_one(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    bad = await PyRuntime(stub_url(node), f"runtime://{D}/bad").connect()
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/b-alice").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/b-bob").connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        [x] = await bad.allocate(D)
        cases: list[tuple[str, int]] = [
            ("{not json", 400),
            ("[1,2,3]", 400),
            ('"just a string"', 400),
            ('{"type":"ping","to":"%s"}' % b, 400),  # no from: control frame
        ]
        for frame, code in cases:
            await bad.send(frame)
            answer = await bad.receive(5)
            assert answer == {"cmd": "error", "response": code, "desc": answer["desc"]}, frame
        addressed = [
            ('{"id":1,"from":"%s","to":"%s"}' % (x, b), "type"),
            ('{"id":1,"type":5,"from":"%s","to":"%s"}' % (x, b), "type"),
            ('{"id":1,"type":"ping","from":"%s"}' % x, "to"),
            ('{"id":1,"type":"ping","from":"%s","to":[]}' % x, "to"),
            ('{"id":{"o":1},"type":"ping","from":"%s","to":"%s"}' % (x, b), "id"),
            ('{"id":1,"type":"ping","from":"%s","to":"%s","body":[1]}' % (x, b), "body"),
        ]
        for frame, field in addressed:
            await bad.send(frame)
            answer = await bad.receive(5)
            assert answer["type"] == "response" and answer["to"] == x, frame
            assert answer["body"]["code"] == 400 and field in answer["body"]["desc"], answer
        assert bad.ws is not None
        await bad.ws.send_bytes(b"\x00\x01binary")
        assert (await bad.receive(5))["response"] == 415
        await bad.send('{"cmd":"reboot"}')
        assert (await bad.receive(5)) == {
            "cmd": "reboot",
            "response": 400,
            "desc": "unknown command 'reboot'",
        }
        # Sending from an address allocated to another runtime is refused by policy.
        await bad.send({"id": 9, "type": "ping", "from": a, "to": b})
        assert (await bad.receive(5))["body"]["code"] == 403
        # The bad runtime's connection still works, and the others never noticed.
        await bad.send({"id": 10, "type": "ping", "from": x, "to": b})
        assert (await bob.receive(15))["id"] == 10
        await alice.send({"id": 11, "type": "ping", "from": a, "to": b})
        assert (await bob.receive(15))["id"] == 11
        assert alice.inbox.empty()
    finally:
        for rt in (bad, alice, bob):
            await rt.close()


async def test_second_connection_replaces_the_first(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    first = await PyRuntime(stub_url(node), f"runtime://{D}/twice").connect(handshake="v1")
    peer = await PyRuntime(stub_url(node), f"runtime://{D}/twice-peer").connect()
    try:
        [h] = await first.allocate(D)
        [p] = await peer.allocate(D)
        # The same runtime reconnecting before the node noticed its old socket died: it has
        # the session's token (anyone without it is refused, see test_securing.py).
        assert first.connect_answer is not None
        token = first.connect_answer["data"]["token"]
        second = await PyRuntime(stub_url(node), first.runtime_url).connect("v1", token=token)
        assert second.connect_answer is not None
        assert second.connect_answer["data"]["session"] == "resumed"
        assert first._reader is not None
        await asyncio.wait_for(first._reader, 5)
        assert first.close_code == 4409
        # The allocation survived the takeover and now routes to the newer connection.
        await peer.send({"id": 1, "type": "ping", "from": p, "to": h})
        assert (await second.receive(15))["id"] == 1
        await second.close()
    finally:
        await first.close()
        await peer.close()


async def test_session_tokens(start_node: NodeFactory, databases: Databases) -> None:
    node = await start_node(await databases.migrated_sqlite())
    rt = await PyRuntime(stub_url(node), f"runtime://{D}/tok").connect(handshake="v1")
    assert rt.connect_answer is not None
    token = rt.connect_answer["data"]["token"]
    await rt.drop()
    again = await PyRuntime(stub_url(node), rt.runtime_url).connect(handshake="v1", token=token)
    assert again.connect_answer is not None and again.connect_answer["response"] == 200
    await again.drop()
    forged = await PyRuntime(stub_url(node), rt.runtime_url).connect(
        handshake="v1", token=token + "x"
    )
    assert forged.connect_answer is not None and forged.connect_answer["response"] == 401
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(
                stub_url(node), params={"runtimeURL": rt.runtime_url, "token": "garbage"}
            )
        assert info.value.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(stub_url(node), params={"runtimeURL": ""})
        assert info.value.status == 400
    for r in (rt, again, forged):
        await r.close()


async def test_to_as_an_array_reaches_each_destination(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(await databases.migrated_sqlite())
    rts = [await PyRuntime(stub_url(node), f"runtime://{D}/arr-{i}").connect() for i in range(3)]
    try:
        addresses = [(await rt.allocate(D))[0] for rt in rts]
        message = {"id": "multi", "type": "update", "from": addresses[0], "to": addresses[1:]}
        await rts[0].send(message)
        for rt in rts[1:]:
            assert (await rt.receive(15))["id"] == "multi"
        assert await rts[0].nothing_within(0.5)
    finally:
        for rt in rts:
            await rt.close()


async def test_batching_is_adaptive(start_node: NodeFactory, databases: Databases) -> None:
    """A lone message is sent at once in an event of its own; a burst shares few events."""
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/burst-a").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/burst-b").connect()
    events = node.metrics.matrix_events_out

    def sent() -> float:
        return float(events.labels("inline")._value.get() + events.labels("media")._value.get())

    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        await alice.send({"id": "warm", "type": "ping", "from": a, "to": b})
        await bob.receive(15)  # the lane is ready now
        assert node.journal is not None and node.journal.stream is not None
        await node.journal.stream.flush(10)

        before = sent()
        await alice.send({"id": "lone", "type": "ping", "from": a, "to": b})
        await bob.receive(15)
        await node.journal.stream.flush(10)
        assert 1 <= sent() - before <= 2  # its own event (and at most one journal event)

        before = sent()
        burst = 600
        for i in range(burst):
            await alice.send({"id": i, "type": "ping", "from": a, "to": b, "body": {"i": i}})
        got = await bob.receive_n(burst)
        assert [m["id"] for m in got] == list(range(burst))
        await node.journal.stream.flush(10)
        assert sent() - before <= burst / 20, f"{sent() - before} events for {burst} messages"
    finally:
        await alice.close()
        await bob.close()


async def test_routing_continues_after_the_homeserver_restarts(
    homeserver: Homeserver, start_node: NodeFactory, databases: Databases
) -> None:
    """Synapse reuses appservice transaction ids after a restart; the node must not take the
    new transactions for retries of old ones (it did, and routing stalled for good)."""
    node = await start_node(await databases.migrated_sqlite())
    alice = await PyRuntime(stub_url(node), f"runtime://{D}/hs-restart-a").connect()
    bob = await PyRuntime(stub_url(node), f"runtime://{D}/hs-restart-b").connect()
    try:
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        for i in range(3):
            await alice.send({"id": i, "type": "ping", "from": a, "to": b, "body": {"n": i}})
        assert [m["body"]["n"] for m in await bob.receive_n(3)] == [0, 1, 2]

        await homeserver.process.stop_async()
        homeserver.process.start()
        await homeserver.process.wait_ready()

        for i in range(3, 6):
            await alice.send({"id": i, "type": "ping", "from": a, "to": b, "body": {"n": i}})
        assert [m["body"]["n"] for m in await bob.receive_n(3, timeout=30)] == [3, 4, 5]
    finally:
        await alice.close()
        await bob.close()
