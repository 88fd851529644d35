"""One client never crowds out the rest (issue 41 rows 3, 4, 5, 7), through the real Synapse.

Each test configures small bounds, lets one client go at them, and checks that it is refused
with a coded answer and counted, and that an honest runtime beside it keeps its session, its
messages and its place. The test process is every client's host; a hostile host is told apart
through a trusted proxy's X-Forwarded-For, as a deployment behind a proxy would."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from adapter.core import core as core_module
from adapter.storage.checkpoints import CheckpointStore
from adapter.storage.database import Database

from ..conftest import Databases, NodeFactory
from ..support.runtime import PyRuntime, stub_url

pytestmark = [pytest.mark.integration]
D = "mn.test"
SM = f"domain://msg-node.{D}/sm"
ALLOCATION = f"domain://msg-node.{D}/hyperty-address-allocation"
ELSEWHERE = {"X-Forwarded-For": "10.9.9.9"}


def _metric(node: Any, name: str, **labels: str) -> float:
    value = node.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


async def _until(check: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


def _runtime(node: Any, name: str, headers: dict[str, str] | None = None) -> PyRuntime:
    runtime = PyRuntime(stub_url(node), f"runtime://{D}/{name}", acked=True)
    runtime.headers = dict(headers or {})
    return runtime


def _answered(runtime: PyRuntime) -> int | None:
    answer = runtime.connect_answer
    return answer.get("response") if answer is not None else None


async def _ping(sender: PyRuntime, receiver: PyRuntime, a: str, b: str, tag: str) -> None:
    await sender.send({"id": tag, "type": "ping", "from": a, "to": b, "body": {"tag": tag}})
    got = await receiver.receive(10)
    assert got["body"]["tag"] == tag, got


def _from_host(runtime: PyRuntime, address: str) -> PyRuntime:
    """The runtime connects from ``address`` (another loopback address: another host to the
    node, with no proxy and no setting involved)."""
    runtime.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))
    return runtime


async def test_one_host_cannot_pin_addresses_beyond_its_share_with_the_defaults(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 3 as it happened, with the default configuration: one host opens sessions and
    allocates in each up to the per-session quota. Every limit was per session, so the next
    session of the same host got as many again; now the host holds at most its share
    (quotas.addresses_per_client, 100,000), refused 429 beyond, while another host allocates
    and routes as before."""
    node = await start_node(await databases.migrated_sqlite())
    flood = [_from_host(_runtime(node, f"pin-{i}"), "127.0.0.2") for i in range(2)]
    alice, bob = _runtime(node, "alice"), _runtime(node, "bob")
    try:
        for runtime in flood:
            await runtime.connect()
        assert [_answered(r) for r in flood] == [200, 200]
        for _ in range(100):  # the whole per-session quota, in the largest blocks
            await flood[0].allocate(D, number=1000)
        answer = await flood[1].request(
            ALLOCATION, "create", {"scheme": "hyperty", "value": {"number": 1000}}
        )
        assert answer["body"]["code"] == 429, answer
        await alice.connect()
        await bob.connect()
        [a] = await alice.allocate(D, number=1)
        [b] = await bob.allocate(D, number=1)
        await _ping(alice, bob, a, b, "honest")
        refused = _metric(
            node, "rethink_mn_bound_refusals_total", resource="addresses", scope="client"
        )
        assert refused == 1
    finally:
        for runtime in (*flood, alice, bob):
            await runtime.close()


async def test_idle_handshakes_are_closed_and_leave_room_for_an_honest_runtime(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 4 as it happened, with the default handshake deadline and the node-wide socket
    bound that existed before (stub.max_connections): sockets that never send
    {cmd:'connect'} were kept for ever, so once they filled the node every honest runtime got
    503. Now each is closed (1008) within stub.handshake_seconds (10 s), and the honest
    runtime connects."""
    node = await start_node(await databases.migrated_sqlite(), **{"stub.max_connections": 3})
    http = aiohttp.ClientSession()
    honest = _runtime(node, "honest")
    try:
        idle = [await http.ws_connect(stub_url(node), heartbeat=None) for _ in range(3)]
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(stub_url(node))
        # Full: the node (503), or the host, whose share is cut to the node's whole (429).
        assert refused.value.status in (429, 503)
        for ws in idle:
            closed = await ws.receive(timeout=30)
            assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closed
            assert ws.close_code == 1008, ws.close_code
        await honest.connect()
        assert _answered(honest) == 200
        assert _metric(node, "rethink_mn_stub_handshake_timeouts_total") == 3
    finally:
        await honest.close()
        await http.close()


async def test_sessions_and_addresses_are_bounded_per_client(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 3: one host opening sessions with fresh runtimeURLs and allocating in each is held
    to its bounds (429, counted), whatever address it allocates or claims; an honest runtime of
    another host still connects, allocates and routes."""
    node = await start_node(
        await databases.migrated_sqlite(),
        **{
            "stub.trusted_proxies": ["127.0.0.1"],
            "stub.max_sessions_per_client": 3,
            "quotas.addresses_per_client": 25,
        },
    )
    flood = [_runtime(node, f"flood-{i}", ELSEWHERE) for i in range(4)]
    alice, bob = _runtime(node, "alice"), _runtime(node, "bob")
    try:
        for runtime in flood:
            await runtime.connect()
        assert [_answered(r) for r in flood] == [200, 200, 200, 429]
        refused = ("rethink_mn_bound_refusals_total",)
        assert _metric(node, *refused, resource="sessions", scope="client") == 1
        await flood[0].allocate(D, number=10, key="block")
        await flood[1].allocate(D, number=10)
        await flood[2].allocate(D, number=5)
        answer = await flood[2].request(
            ALLOCATION, "create", {"scheme": "hyperty", "value": {"number": 1}}
        )
        assert answer["body"]["code"] == 429, answer
        # Nor does an address it makes itself get past the bound (services/allocation.py claim).
        guid = f"hyperty://{D}/5d2f0c1e-7a4b-4c3d-8e9f-0a1b2c3d4e5f"
        answer = await flood[2].request(SM, "subscribe", {"resources": [guid]})
        assert answer["body"]["code"] == 429, answer
        assert _metric(node, *refused, resource="addresses", scope="client") == 2
        # What it lets go, it may take again.
        answer = await flood[0].request(ALLOCATION, "delete", {"resource": "block"})
        assert answer["body"]["code"] == 200, answer
        await flood[2].allocate(D, number=10)
        # Another host is not held to that host's bounds.
        await alice.connect()
        await bob.connect()
        assert (_answered(alice), _answered(bob)) == (200, 200)
        [a] = await alice.allocate(D, number=1)
        [b] = await bob.allocate(D, number=1)
        await _ping(alice, bob, a, b, "honest")
    finally:
        for runtime in (*flood, alice, bob):
            await runtime.close()


async def test_a_forwarded_header_is_believed_only_from_a_trusted_proxy(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(
        await databases.migrated_sqlite(), **{"stub.max_sessions_per_client": 2}
    )
    runtimes = [_runtime(node, f"forged-{i}", {"X-Forwarded-For": f"10.0.0.{i}"}) for i in range(3)]
    try:
        for runtime in runtimes:
            await runtime.connect()
        # No proxy is trusted: all three are the test's own host, whatever they claim.
        assert [_answered(r) for r in runtimes] == [200, 200, 429]
    finally:
        for runtime in runtimes:
            await runtime.close()


async def test_a_socket_without_a_handshake_is_closed_and_counted(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 4: sockets that never send {cmd:'connect'} count against their host, show in the
    connection metric, and are closed after stub.handshake_seconds; an honest runtime then
    connects."""
    node = await start_node(
        await databases.migrated_sqlite(),
        **{"stub.handshake_seconds": 1.0, "stub.max_connections_per_client": 3},
    )
    http = aiohttp.ClientSession()
    honest = _runtime(node, "honest")
    try:
        idle = [await http.ws_connect(stub_url(node), heartbeat=None) for _ in range(3)]
        handshaking = ("rethink_mn_stub_connections",)
        assert _metric(node, *handshaking, state="handshaking") == 3
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(stub_url(node))
        assert refused.value.status == 429
        assert _metric(
            node, "rethink_mn_bound_refusals_total", resource="connections", scope="client"
        )
        for ws in idle:
            # Heartbeats are answered, yet the node closes it: no handshake came.
            closed = await ws.receive(timeout=30)
            assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closed
            assert ws.close_code == 1008, ws.close_code
        assert _metric(node, "rethink_mn_stub_handshake_timeouts_total") == 3
        await _until(lambda: _metric(node, *handshaking, state="handshaking") == 0)
        await honest.connect()
        assert _answered(honest) == 200
        assert _metric(node, *handshaking, state="attached") == 1
    finally:
        await honest.close()
        await http.close()


async def test_a_flood_of_new_sessions_never_evicts_a_runtime_briefly_away(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 5: beyond stub.max_detached_sessions the node released the longest detached, i.e.
    the honest runtime away for a moment: its session, its addresses and what was kept for it.
    Now the newest never-used sessions go first."""
    node = await start_node(await databases.migrated_sqlite(), **{"stub.max_detached_sessions": 3})
    honest, alice = _runtime(node, "away"), _runtime(node, "alice")
    flood = [_runtime(node, f"new-{i}") for i in range(6)]
    try:
        await honest.connect()
        await alice.connect()
        [h] = await honest.allocate(D)
        [a] = await alice.allocate(D)
        await _ping(honest, alice, h, a, "before")
        await honest.drop()
        await alice.send({"id": "kept", "type": "ping", "from": a, "to": h, "body": {"tag": "k"}})
        session = node.sessions.by_runtime(honest.runtime_url)
        assert session is not None
        await _until(lambda: session.mailbox.waiting_bytes > 0)
        for runtime in flood:
            await runtime.connect()
            await runtime.drop()
        await _until(lambda: _metric(node, "rethink_mn_sessions_evicted_total") >= 4)
        await honest.connect()
        assert honest.connect_answer is not None
        assert honest.connect_answer["data"]["session"] == "resumed", honest.connect_answer
        assert (await honest.receive(10))["body"]["tag"] == "k"
        await _ping(alice, honest, a, h, "after")
    finally:
        for runtime in (honest, alice, *flood):
            await runtime.close()


async def test_anonymous_sessions_displace_none_when_the_node_is_full(
    start_node: NodeFactory, databases: Databases
) -> None:
    node = await start_node(
        await databases.migrated_sqlite(),
        **{
            "stub.trusted_proxies": ["127.0.0.1"],
            "stub.max_sessions": 3,
            "stub.max_sessions_per_client": 3,
        },
    )
    honest = _runtime(node, "away")
    flood = [_runtime(node, f"anon-{i}", ELSEWHERE) for i in range(3)]
    try:
        await honest.connect()
        await honest.drop()
        for runtime in flood:
            await runtime.connect()
            await runtime.drop()
        assert [_answered(r) for r in flood] == [200, 200, 503]
        assert _metric(node, "rethink_mn_bound_refusals_total", resource="sessions", scope="total")
        await honest.connect()
        assert honest.connect_answer is not None
        assert honest.connect_answer["data"]["session"] == "resumed", honest.connect_answer
    finally:
        for runtime in (honest, *flood):
            await runtime.close()


async def test_one_sender_filling_an_away_runtimes_inbox_leaves_room_for_the_others(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Row 7: one sender used to fill quotas.waiting_bytes of a runtime that is away, and then
    every other sender to it was refused 413. Now each sender has its share."""
    node = await start_node(
        await databases.migrated_sqlite(), **{"quotas.waiting_bytes": 64 * 1024}
    )
    bob, mallory, alice = _runtime(node, "bob"), _runtime(node, "mallory"), _runtime(node, "al")
    try:
        for runtime in (bob, mallory, alice):
            await runtime.connect()
        [b] = await bob.allocate(D)
        [m] = await mallory.allocate(D)
        [a] = await alice.allocate(D)
        await bob.drop()
        session = node.sessions.by_runtime(bob.runtime_url)
        assert session is not None
        refusal = None
        for i in range(40):
            before = session.mailbox.waiting_bytes
            await mallory.send(
                {"id": f"m{i}", "type": "ping", "from": m, "to": b, "body": {"x": "x" * 4000}}
            )
            await _until(
                lambda before=before: (
                    session.mailbox.waiting_bytes > before or not mallory.inbox.empty()
                )
            )
            if not mallory.inbox.empty():
                refusal = await mallory.inbox.get()
                break
        assert refusal is not None and refusal["body"]["code"] == 413, refusal
        assert "sender" in refusal["body"]["desc"], refusal
        await alice.send({"id": "a1", "type": "ping", "from": a, "to": b, "body": {"tag": "al"}})
        await bob.connect()
        received = []
        while not received or received[-1]["body"].get("tag") != "al":
            received.append(await bob.receive(10))
        assert all(r["from"] == m for r in received[:-1])
    finally:
        for runtime in (bob, mallory, alice):
            await runtime.close()


async def test_every_frame_a_runtime_sends_counts_against_its_rate(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Pings and binary frames are paced like messages (the attacker review of issue 41: a
    million pings in ten seconds, answered by the WebSocket layer before any pacing, slowed
    every honest runtime; binary frames were read and answered unpaced)."""
    node = await start_node(
        await databases.migrated_sqlite(),
        **{"stub.messages_per_second": 20.0, "stub.messages_burst": 5},
    )
    runtime = _runtime(node, "pinger")
    paced = "rethink_mn_stub_paced_seconds_total"
    try:
        await runtime.connect()
        ws = runtime.ws
        assert ws is not None
        for kind in ("ping", "binary"):
            before = _metric(node, paced)
            for _ in range(30):  # 25 past the burst: over a second at 20 a second
                if kind == "ping":
                    await ws.ping(b"x")
                else:
                    await ws.send_bytes(b"x")
            # The node holds the socket unread for the frames past the rate.
            await _until(lambda before=before: _metric(node, paced) - before >= 1.0)
    finally:
        await runtime.close()


async def test_the_marks_of_a_sender_that_is_gone_leave_the_database_also_at_a_restart(
    start_node: NodeFactory, databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41, dedupe marks: a runtime's mark ("already routed") is kept in memory and in
    sender_marks. Once its session is released the mark goes, from memory and the table; one
    whose session went while the node was down goes after the next start. Before, the rows
    stayed until they aged out (two session lifetimes), and a start read them all back."""
    monkeypatch.setattr(core_module, "RETIRED_ORIGIN_SECONDS", 0.5)
    url = await databases.migrated_sqlite()
    node = await start_node(url)
    bob = _runtime(node, "bob")
    senders = [_runtime(node, name) for name in ("left-running", "left-stopped", "stays")]
    try:
        await bob.connect()
        [b] = await bob.allocate(D)
        for sender in senders:
            await sender.connect()
            [s] = await sender.allocate(D)
            await _ping(sender, bob, s, b, sender.runtime_url)
        origins = {}
        for sender in senders:
            session = node.sessions.by_runtime(sender.runtime_url)
            assert session is not None and session.upstream is not None
            origins[sender.runtime_url] = session.upstream.origin

        async def stored() -> set[str]:
            return set(await node.core.checkpoints.marks())

        await _until_async(lambda: _all_in(stored, origins.values()))
        # Released while the node runs: its mark leaves the table.
        await senders[0].disconnect()
        await _until_async(lambda: _none_in(stored, [origins[senders[0].runtime_url]]))
        # Released just before the node stops: the row is still there at the stop.
        monkeypatch.setattr(core_module, "RETIRED_ORIGIN_SECONDS", 3600.0)
        await senders[1].disconnect()
        await node.stop()
        db = Database(url)
        try:
            assert origins[senders[1].runtime_url] in await CheckpointStore(db).marks()
        finally:
            await db.dispose()

        monkeypatch.setattr(core_module, "RETIRED_ORIGIN_SECONDS", 0.5)
        node = await start_node(url)
        await _until_async(lambda: _none_in(stored, [origins[senders[1].runtime_url]]))
        assert origins[senders[2].runtime_url] in await stored()
        assert origins[senders[2].runtime_url] in node.delivery.marks
    finally:
        for runtime in (bob, *senders):
            await runtime.close()


async def _until_async(check: Any, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.1)


async def _all_in(found: Any, wanted: Any) -> bool:
    return set(wanted) <= await found()


async def _none_in(found: Any, unwanted: Any) -> bool:
    return not set(unwanted) & await found()


async def test_subscriptions_and_registry_entries_are_bounded_per_client(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Issue 41, every resource bounded per client: one host's runtimes, over all their
    sessions, hold at most their share of subscriptions and of registry entries (429,
    counted); what one lets go another may take; another host is not held to that share."""
    node = await start_node(
        await databases.migrated_sqlite(),
        **{"quotas.subscriptions_per_client": 3, "registry.builtin.entries_per_client": 2},
    )
    flood = [_from_host(_runtime(node, f"many-{i}"), "127.0.0.2") for i in range(2)]
    honest = _runtime(node, "honest")
    registry = f"domain://registry.{D}/"

    def streams(*names: str) -> dict[str, Any]:
        return {"resources": [f"comm://{D}/{name}/changes" for name in names]}

    async def register(runtime: PyRuntime, url: str) -> int:
        value = {
            "url": url,
            "user": f"user://{D}/{runtime.runtime_url.rsplit('/', 1)[-1]}",
            "descriptor": "hyperty-catalogue://c/h",
            "resources": ["chat"],
            "dataSchemes": ["comm"],
            "runtime": runtime.runtime_url,
            "status": "live",
        }
        answer = await runtime.request(registry, "create", {"value": value})
        return int(answer["body"]["code"])

    try:
        for runtime in (*flood, honest):
            await runtime.connect()
        answers = [
            await flood[0].request(SM, "subscribe", streams("a", "b")),
            await flood[1].request(SM, "subscribe", streams("c", "d")),
        ]
        assert [a["body"]["code"] for a in answers] == [200, 429], answers
        answer = await flood[0].request(SM, "unsubscribe", streams("a"))
        assert answer["body"]["code"] == 200, answer
        answer = await flood[1].request(SM, "subscribe", streams("c", "d"))
        assert answer["body"]["code"] == 200, answer
        answer = await honest.request(SM, "subscribe", streams("a", "b", "c"))
        assert answer["body"]["code"] == 200, answer

        hyperties = [await r.allocate(D, number=2) for r in flood]
        [mine] = await honest.allocate(D)
        assert await register(flood[0], hyperties[0][0]) == 200
        assert await register(flood[1], hyperties[1][0]) == 200
        assert await register(flood[1], hyperties[1][1]) == 429
        assert await register(flood[0], hyperties[0][0]) == 200  # its own again
        assert await register(honest, mine) == 200
        for resource in ("subscriptions", "registry_entries"):
            refused = _metric(
                node, "rethink_mn_bound_refusals_total", resource=resource, scope="client"
            )
            assert refused == 1, resource
    finally:
        for runtime in (*flood, honest):
            await runtime.close()


async def test_the_sockets_of_one_client_share_its_rate(
    start_node: NodeFactory, databases: Databases
) -> None:
    """The attacker review of issue 41: 50 sockets of one host, each within its own rate,
    together took the node from every honest runtime. All the sockets of one client now share
    its rate: two connections, each far within its own, are paced once their client's is
    spent, while another client's runtimes connect and route unpaced meanwhile."""
    node = await start_node(
        await databases.migrated_sqlite(),
        **{
            "stub.trusted_proxies": ["127.0.0.1"],
            "stub.client_messages_per_second": 10.0,
            "stub.client_messages_burst": 20,
        },
    )
    flood = [_runtime(node, f"flood-{i}", ELSEWHERE) for i in range(2)]
    alice, bob = _runtime(node, "alice"), _runtime(node, "bob")
    paced = "rethink_mn_stub_paced_seconds_total"
    try:
        for runtime in flood:
            await runtime.connect()
        for runtime in flood:
            ws = runtime.ws
            assert ws is not None
            for _ in range(50):  # each far within its own rate (1,000 a second, 20,000 burst)
                await ws.ping(b"x")
        # Both connections' last frame, a request: answered once the client's rate allows it,
        # some eight seconds after the 104 frames began (84 past the burst, 10 a second).
        last = asyncio.gather(
            *(
                r.request(
                    ALLOCATION, "create", {"scheme": "hyperty", "value": {"number": 1}}, timeout=60
                )
                for r in flood
            )
        )
        await _until(lambda: _metric(node, paced) >= 1.0)
        # Another client (the test's own host) is not held by that client's pace: its runtimes
        # connect, allocate and route while the flood still waits.
        await alice.connect()
        await bob.connect()
        [a] = await alice.allocate(D, number=1)
        [b] = await bob.allocate(D, number=1)
        await _ping(alice, bob, a, b, "honest")
        assert not last.done()
        answers = await last
        assert [answer["body"]["code"] for answer in answers] == [200, 200], answers
    finally:
        for runtime in (*flood, alice, bob):
            await runtime.close()


async def test_connecting_again_gives_a_client_no_fresh_burst(
    start_node: NodeFactory, databases: Databases
) -> None:
    """The attacker review of issue 44: a client's pace went with its last connection, so one
    that sent its burst, disconnected and connected again had a fresh burst each time (142
    times its rate). Its pace now rests until its buckets are full again."""
    node = await start_node(
        await databases.migrated_sqlite(),
        **{
            "stub.trusted_proxies": ["127.0.0.1"],
            "stub.client_messages_per_second": 10.0,
            "stub.client_messages_burst": 20,
        },
    )
    runtime = _runtime(node, "bursts", ELSEWHERE)
    paced = "rethink_mn_stub_paced_seconds_total"
    try:
        for _ in range(2):
            await runtime.connect()
            ws = runtime.ws
            assert ws is not None
            for _ in range(20):  # the client's whole burst
                await ws.ping(b"x")
            # Answered once the node has read every frame before it.
            answer = await runtime.request(
                ALLOCATION, "create", {"scheme": "hyperty", "value": {"number": 1}}, timeout=60
            )
            assert answer["body"]["code"] == 200, answer
            await runtime.drop()
        # The second connection's 21 frames came on a spent burst: about two seconds' worth.
        assert _metric(node, paced) > 1.5, _metric(node, paced)
    finally:
        await runtime.close()


async def test_one_hosts_away_subscribers_never_fill_the_bytes_every_runtime_needs(
    start_node: NodeFactory, databases: Databases
) -> None:
    """Found by the attacker review of issue 44: one host subscribed runtimes of its own to its
    own object and left them away; what it published was kept for each of them up to the
    per-runtime quota only, so a few sessions filled the node's total, and from then on every
    runtime's message to anyone was refused 503, for as long as those sessions lived. What waits
    for a subscriber is now held to the same bounds as what waits for a direct destination: its
    client's share stops the host well before the node's total."""
    node = await start_node(
        await databases.migrated_sqlite(),
        **{
            "quotas.waiting_bytes": 64 * 1024,
            "quotas.waiting_bytes_per_sender": 64 * 1024,
            "quotas.waiting_bytes_per_client": 128 * 1024,
            "quotas.waiting_bytes_total": 256 * 1024,
        },
    )
    publisher = _from_host(_runtime(node, "pub"), "127.0.0.2")
    subscribers = [_from_host(_runtime(node, f"sub-{i}"), "127.0.0.2") for i in range(5)]
    alice, bob = _runtime(node, "alice"), _runtime(node, "bob")
    everyone = (publisher, *subscribers, alice, bob)
    try:
        for runtime in everyone:
            await runtime.connect()
        [obj] = await publisher.allocate(D, scheme="comm", endpoint="object-address-allocation")
        for sub in subscribers:
            answer = await sub.request(SM, "subscribe", {"resources": [f"{obj}/changes"]})
            assert answer["body"]["code"] == 200, answer
            await sub.drop()
        [a] = await alice.allocate(D)
        [b] = await bob.allocate(D)
        # 5 away subscribers x 64 KiB each would be 320 KiB, past the node's 256 KiB.
        body = {"x": "x" * 8000}
        for i in range(45):
            await publisher.send(
                {"id": f"u{i}", "type": "update", "from": obj, "to": f"{obj}/changes", "body": body}
            )
        await _until(
            lambda: _metric(node, "rethink_mn_quota_refusals_total", quota="waiting_bytes") > 0
        )
        tally = node.sessions.tally
        assert tally.of("ip:127.0.0.2") > 64 * 1024  # the host holds its share, and no more:
        assert tally.of("ip:127.0.0.2") <= 128 * 1024 + 9000, tally.of("ip:127.0.0.2")
        assert tally.total <= 128 * 1024 + 9000, tally.total
        await _ping(alice, bob, a, b, "after the flood")
    finally:
        for runtime in everyone:
            await runtime.close()
