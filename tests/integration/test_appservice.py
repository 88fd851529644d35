"""The appservice API against a real Synapse and a real database."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from adapter.node import Node

from ..conftest import Homeserver, NodeFactory

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

EVENT_TYPE = "eu.rethink-project.test.ping"


class Recorder:
    """Collects what the node's inbound side hands to consumers of one event type."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.calls = 0
        self.arrived = asyncio.Event()

    async def __call__(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        self.calls += 1
        self.events.extend(events)
        self.arrived.set()

    async def wait(self, n: int, timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.events) < n:
                self.arrived.clear()
                await self.arrived.wait()


async def exploding(_txn: str, _events: list[dict[str, Any]]) -> None:
    """A consumer with a bug: fails on whatever it is given."""
    raise ValueError("a consumer bug")


def as_url(node: Node, path: str) -> str:
    return f"http://127.0.0.1:{node.appservice_port}{path}"


async def put_txn(
    session: aiohttp.ClientSession, node: Node, txn_id: str, body: Any, token: str | None
) -> aiohttp.ClientResponse:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) else None
    json_body = None if isinstance(body, bytes) else body
    async with session.put(
        as_url(node, f"/_matrix/app/v1/transactions/{txn_id}"),
        headers=headers,
        data=data,
        json=json_body,
    ) as resp:
        await resp.read()
        return resp


async def test_virtual_user_event_is_pushed_to_the_appservice(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    recorder = Recorder()
    node.inbound.subscribe(EVENT_TYPE, recorder)
    assert node.api is not None

    intent = node.api.intent(node.api.user_id("_rethink_pushtest"))
    await intent.ensure_registered()
    await intent.ensure_registered()  # idempotent: M_USER_IN_USE is fine
    room_id = await intent.create_room(alias_localpart="_rethink_pushtest_room")
    event_id = await intent.send_event(room_id, EVENT_TYPE, {"n": 1, "text": "héllo"})

    await recorder.wait(1)
    event = next(e for e in recorder.events if e["event_id"] == event_id)
    assert event["room_id"] == room_id
    assert event["sender"] == intent.user_id
    assert event["content"] == {"n": 1, "text": "héllo"}

    # Creating the same aliased room again yields the existing room, not an error.
    assert await intent.create_room(alias_localpart="_rethink_pushtest_room") == room_id


async def test_replayed_transaction_is_not_processed_twice_even_after_restart(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    recorder = Recorder()
    node.inbound.subscribe(EVENT_TYPE, recorder)
    txn = {"events": [{"type": EVENT_TYPE, "event_id": "$replay1", "content": {}}]}
    async with aiohttp.ClientSession() as session:
        first = await put_txn(session, node, "replay-1", txn, homeserver.hs_token)
        second = await put_txn(session, node, "replay-1", txn, homeserver.hs_token)
        assert (first.status, second.status) == (200, 200)
        assert recorder.calls == 1

        await node.stop()
        restarted = await start_node(database_url)
        recorder_after = Recorder()
        restarted.inbound.subscribe(EVENT_TYPE, recorder_after)
        third = await put_txn(session, restarted, "replay-1", txn, homeserver.hs_token)
        assert third.status == 200
        assert recorder_after.calls == 0

        # A new transaction id is processed normally by the restarted node.
        fourth = await put_txn(session, restarted, "replay-2", txn, homeserver.hs_token)
        assert fourth.status == 200
        assert recorder_after.calls == 1

        # Synapse on SQLite reuses transaction ids after its own restart: the same id with
        # other events is a new transaction, not a retry.
        reused = {"events": [{"type": EVENT_TYPE, "event_id": "$replay2", "content": {}}]}
        fifth = await put_txn(session, restarted, "replay-1", reused, homeserver.hs_token)
        assert fifth.status == 200
        assert recorder_after.calls == 2
        assert [e["event_id"] for e in recorder_after.events] == ["$replay1", "$replay2"]


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_concurrent_retry_waits_for_the_first_attempt(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    release = asyncio.Event()
    calls = 0

    async def slow(_txn_id: str, _events: list[dict[str, Any]]) -> None:
        nonlocal calls
        calls += 1
        await release.wait()

    node.inbound.subscribe(EVENT_TYPE, slow)
    txn = {"events": [{"type": EVENT_TYPE, "event_id": "$slow", "content": {}}]}
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(put_txn(session, node, "slow-1", txn, homeserver.hs_token))
        await asyncio.sleep(0.2)
        retry = asyncio.create_task(put_txn(session, node, "slow-1", txn, homeserver.hs_token))
        await asyncio.sleep(0.2)
        assert not retry.done()
        release.set()
        assert (await first).status == 200
        assert (await retry).status == 200
    assert calls == 1


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_authentication_and_errors(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url, **{"appservice.max_body_bytes": 4096})
    recorder = Recorder()
    node.inbound.subscribe(EVENT_TYPE, recorder)
    txn = {"events": [{"type": EVENT_TYPE, "event_id": "$auth", "content": {}}]}
    async with aiohttp.ClientSession() as session:
        missing = await put_txn(session, node, "auth-1", txn, None)
        assert missing.status == 401
        wrong = await put_txn(session, node, "auth-2", txn, "not-the-token")
        assert wrong.status == 403
        async with session.put(
            as_url(node, "/_matrix/app/v1/transactions/auth-3"),
            json=txn,
            headers={"Authorization": "Bearer wrong"},
        ) as resp:
            assert (await resp.json())["errcode"] == "M_FORBIDDEN"
        assert recorder.calls == 0

        # The legacy query-parameter form is accepted.
        async with session.put(
            as_url(node, "/_matrix/app/v1/transactions/auth-4"),
            params={"access_token": homeserver.hs_token},
            json=txn,
        ) as resp:
            assert resp.status == 200
        assert recorder.calls == 1

        async with session.get(as_url(node, "/_matrix/app/v1/nonsense")) as resp:
            assert resp.status == 404
            assert (await resp.json())["errcode"] == "M_UNRECOGNIZED"
        async with session.get(as_url(node, "/_matrix/app/unstable/thirdparty/protocol/x")) as resp:
            assert (await resp.json())["errcode"] == "M_UNRECOGNIZED"

        big = {"events": [{"type": EVENT_TYPE, "content": {"x": "y" * 8000}}]}
        too_big = await put_txn(session, node, "auth-5", big, homeserver.hs_token)
        assert too_big.status == 413

        async with session.post(
            as_url(node, "/_matrix/app/v1/ping"),
            json={"transaction_id": "t"},
            headers={"Authorization": f"Bearer {homeserver.hs_token}"},
        ) as resp:
            assert resp.status == 200 and await resp.json() == {}


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_garbage_transactions_do_not_take_the_node_down(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    recorder = Recorder()
    node.inbound.subscribe(EVENT_TYPE, recorder)

    node.inbound.subscribe("eu.rethink-project.test.explode", exploding)
    token = homeserver.hs_token
    async with aiohttp.ClientSession() as session:
        assert (await put_txn(session, node, "g1", b"{not json", token)).status == 400
        assert (await put_txn(session, node, "g2", b"[1,2,3]", token)).status == 400
        assert (await put_txn(session, node, "g3", {"events": "nope"}, token)).status == 400
        mixed = {
            "events": [
                "a string",
                42,
                {"no": "type"},
                {"type": "eu.rethink-project.test.explode", "content": {}},
                {"type": EVENT_TYPE, "event_id": "$ok", "content": {}},
            ]
        }
        # A consumer that fails fails the transaction (the homeserver sends it again) a few
        # times, then its events are given up: the good event is processed once in the end
        # even though others are malformed or make a consumer fail every time.
        statuses = [(await put_txn(session, node, "g4", mixed, token)).status for _ in range(3)]
        assert statuses == [500, 500, 200]
        assert [e["event_id"] for e in recorder.events] == ["$ok"]

        async with session.get(as_url(node, "/health")) as resp:
            assert resp.status == 200


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_ephemeral_events_are_taken_without_storing_the_transaction(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    receipts = Recorder()
    node.inbound.subscribe_ephemeral("m.receipt", receipts)
    pings = Recorder()
    node.inbound.subscribe(EVENT_TYPE, pings)

    node.inbound.subscribe_ephemeral("m.typing", exploding)
    token = homeserver.hs_token
    receipt = {"type": "m.receipt", "room_id": "!r:x", "content": {"$e": {"m.read": {}}}}
    typing = {"type": "m.typing", "room_id": "!r:x", "content": {"user_ids": []}}
    async with aiohttp.ClientSession() as session:
        # The stable name and MSC2409's unstable one; a consumer that fails fails nothing.
        only = {"events": [], "ephemeral": [receipt, typing, "junk"]}
        assert (await put_txn(session, node, "e1", only, token)).status == 200
        unstable = {"de.sorunome.msc2409.ephemeral": [receipt]}
        assert (await put_txn(session, node, "e2", unstable, token)).status == 200
        # Ephemeral-only transactions are not stored: the same id again is taken again
        # (a receipt twice is a receipt once).
        assert (await put_txn(session, node, "e1", only, token)).status == 200
        assert receipts.calls == 3
        # Beside events: the events are deduplicated as ever.
        both = {
            "events": [{"type": EVENT_TYPE, "event_id": "$with-receipt", "content": {}}],
            "ephemeral": [receipt],
        }
        assert (await put_txn(session, node, "e3", both, token)).status == 200
        assert (await put_txn(session, node, "e3", both, token)).status == 200
        assert pings.calls == 1
        assert receipts.calls == 5
        bad = {"events": [], "ephemeral": {"not": "a list"}}
        assert (await put_txn(session, node, "e4", bad, token)).status == 400


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_user_and_room_queries(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    headers = {"Authorization": f"Bearer {homeserver.hs_token}"}
    async with aiohttp.ClientSession() as session:
        for path in (
            f"/_matrix/app/v1/users/@_rethink_unknown:{homeserver.server_name}",
            f"/_matrix/app/v1/users/@someone:{homeserver.server_name}",
            f"/_matrix/app/v1/rooms/%23_rethink_nothing:{homeserver.server_name}",
        ):
            async with session.get(as_url(node, path), headers=headers) as resp:
                assert resp.status == 404, path
                assert (await resp.json())["errcode"] == "M_NOT_FOUND"


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_health_reports_homeserver_and_database(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    node = await start_node(database_url)
    async with aiohttp.ClientSession() as session:
        async with session.get(as_url(node, "/health")) as resp:
            report = await resp.json()
            assert resp.status == 200
        assert report["checks"]["homeserver"]["ok"] is True
        assert report["checks"]["database"]["ok"] is True
        # The start-up ping runs in the background; its outcome shows in the metrics.
        ping = 'rethink_mn_homeserver_request_seconds_count{endpoint="ping",status="200"}'
        async with asyncio.timeout(15):
            while True:
                async with session.get(as_url(node, "/metrics")) as resp:
                    text = await resp.text()
                if ping in text:
                    break
                await asyncio.sleep(0.1)
        answered = next(line for line in text.splitlines() if line.startswith(ping))
        assert float(answered.rsplit(" ", 1)[1]) >= 1


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_health_is_503_when_the_homeserver_is_unreachable(
    homeserver: Homeserver, start_node: NodeFactory, database_url: str
) -> None:
    from adapter.localstack.synapse import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    node = await start_node(database_url, **{"homeserver.url": dead})
    async with aiohttp.ClientSession() as session, session.get(as_url(node, "/health")) as resp:
        report = await resp.json()
        assert resp.status == 503
    assert report["status"] == "unhealthy"
    assert report["checks"]["homeserver"]["ok"] is False
    assert "error" in report["checks"]["homeserver"]
    assert report["checks"]["database"]["ok"] is True


async def test_reading_forward_from_an_events_context_misses_no_event(
    start_node: NodeFactory, database_url: str
) -> None:
    """Recovery reads a room from its position: the context's `end` must point just after the
    event, not after the events that follow it (Synapse's default context would skip five)."""
    node = await start_node(database_url)
    bot = node.api.bot
    room_id = await bot.create_room(name="context test")
    sent = [await bot.send_event(room_id, EVENT_TYPE, {"n": n}) for n in range(1, 9)]
    found = await bot.context(room_id, sent[0])
    assert found is not None
    page = await bot.messages(
        room_id, start=found["end"], direction="f", limit=20, event_filter={"types": [EVENT_TYPE]}
    )
    assert [e["content"]["n"] for e in page["chunk"]] == list(range(2, 9))
