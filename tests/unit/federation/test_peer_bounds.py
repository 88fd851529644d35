"""What a hostile peer domain's node can make this one hold or do (issue 41, rows 10-13): its
subscriptions are checked and taken in one step against its quota, an unsubscription costs what
it names, its sender marks are bounded and forgotten with its senders, its rooms are bounded
and its media waits have one deadline across retries.

The peer's requests come in as ``PeerFeeds`` takes them from a feed; the parts of the node they
do not reach are left out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, cast

import orjson
import pytest_asyncio
from prometheus_client import CollectorRegistry

from adapter.access import AccessMonitor
from adapter.config import PolicyConfig
from adapter.envelope import parse
from adapter.federation.peer_traffic import PeerFeeds
from adapter.federation.peers import Peer
from adapter.observability import NodeMetrics
from adapter.routing.marks import SenderMarks
from adapter.routing.policy import MessageGate
from adapter.routing_table import RoutingTable
from adapter.storage.database import Database
from adapter.storage.models import Base
from adapter.storage.remote import RemoteSubscriptionStore

A, B = "a.example", "b.example"
PEER = Peer(B, "hs.b.example", "@_rethink_bot:hs.b.example", max_subscriptions=20)


@pytest_asyncio.fixture(loop_scope="session")
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    # A file, not :memory:: the database's worker threads then run the writes side by side
    # with the loop, as the node's do.
    database = Database(f"sqlite:///{tmp_path / 'node.sqlite'}")
    await database.run(lambda conn: Base.metadata.create_all(conn))
    yield database
    await database.dispose()


def feeds(db: Database, table: RoutingTable, registry: CollectorRegistry) -> PeerFeeds:
    nothing = cast(Any, None)  # parts of the node a subscription request never reaches
    return PeerFeeds(
        A,
        nothing,
        nothing,
        nothing,
        nothing,
        nothing,
        table,
        AccessMonitor(A, table, (B,)),
        RemoteSubscriptionStore(db),
        MessageGate(PolicyConfig()),
        nothing,
        nothing,
        NodeMetrics(registry),
    )


def request(kind: str, body: dict[str, Any], n: int) -> Any:
    return parse(
        orjson.dumps(
            {
                "id": f"sub-{n}",
                "type": kind,
                "from": f"domain://msg-node.{B}/sm",
                "to": f"domain://msg-node.{A}/sm",
                "body": body,
            }
        ).decode()
    )


def refusals(registry: CollectorRegistry) -> float:
    found = registry.get_sample_value(
        "rethink_mn_quota_refusals_total", {"quota": "peer_subscriptions"}
    )
    return found or 0.0


async def test_a_batch_of_subscriptions_never_exceeds_the_peers_quota(db: Database) -> None:
    """Row 10: one batch of 30 requests x 5 streams against a quota of 20, all running side by
    side as a batch's requests do: 4 are granted, 26 refused (429, counted), 20 held, in the
    table and in the database alike."""
    table, registry = RoutingTable(), CollectorRegistry()
    peer_feeds = feeds(db, table, registry)
    requests = [
        request(
            "subscribe",
            {
                "resources": [f"comm://{A}/o{i}-{k}/changes" for k in range(5)],
                "source": f"runtime://{B}/r{i}",
            },
            i,
        )
        for i in range(30)
    ]
    answers = await asyncio.gather(*(peer_feeds._take_subscription(PEER, m) for m in requests))
    codes = [code for code, _reason in answers]
    assert codes.count(200) == 4 and codes.count(429) == 26, codes
    assert refusals(registry) == 26
    stored = await RemoteSubscriptionStore(db).all()
    assert len(stored) == 20
    assert table.remote_held(B) == 20
    # What it holds again is not counted twice; what it lets go makes room.
    again = request("subscribe", {"resources": [stored[0][0]], "source": stored[0][2]}, 99)
    assert (await peer_feeds._take_subscription(PEER, again))[0] == 200
    left = request("unsubscribe", {"source": stored[0][2]}, 100)
    assert (await peer_feeds._take_subscription(PEER, left))[0] == 200
    assert table.remote_held(B) == 15
    assert len(await RemoteSubscriptionStore(db).all()) == 15


class _NoWalk(dict[str, Any]):
    """The table's streams, which no request of one peer runtime may walk."""

    def __iter__(self) -> Any:
        raise AssertionError("a request walked every remote subscription")

    def keys(self) -> Any:
        raise AssertionError("a request walked every remote subscription")


async def test_an_unsubscription_costs_what_it_names_not_the_whole_table(db: Database) -> None:
    """Row 11: an unsubscription that names only its runtime ends that runtime's subscriptions
    without walking everyone's (which blocked the loop for seconds at 100,000); the others
    stay."""
    table = RoutingTable()
    for i in range(2000):
        table.subscribe_domain(B, f"runtime://{B}/other{i % 50}", [f"comm://{A}/s{i}/changes"])
    mine = [f"comm://{A}/mine{k}/changes" for k in range(3)]
    table.subscribe_domain(B, f"runtime://{B}/leaver", mine)
    table._remote = _NoWalk(table._remote)
    peer_feeds = feeds(db, table, CollectorRegistry())
    for n in range(100):  # most of a hostile batch names runtimes that hold nothing
        gone = request("unsubscribe", {"source": f"runtime://{B}/ghost{n}"}, n)
        assert (await peer_feeds._take_subscription(PEER, gone))[0] == 200
    leaver = request("unsubscribe", {"source": f"runtime://{B}/leaver"}, 1000)
    assert (await peer_feeds._take_subscription(PEER, leaver))[0] == 200
    assert all(not list(table.remote_domains(address)) for address in mine)
    assert list(table.remote_domains(f"comm://{A}/s7/changes")) == [B]


# -- rooms and media (row 13) ------------------------------------------------------------------


class _Bot:
    """The homeserver as a peer's rooms reach it: joins and declines recorded; its media never
    arrives (a content URI the peer never uploaded); its rooms read empty."""

    user_id = "@_rethink_bot:hs.a.example"

    def __init__(self) -> None:
        self.joined: list[str] = []
        self.declined: list[str] = []
        self.downloads = 0

    async def join(self, room_id: str) -> str:
        self.joined.append(room_id)
        return room_id

    async def leave_and_forget(self, room_id: str) -> None:
        self.declined.append(room_id)

    async def messages(self, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        return {"chunk": [], "end": None}

    async def download(self, _uri: str) -> bytes:
        self.downloads += 1
        await asyncio.Event().wait()  # hangs, as a federated fetch of missing media may
        raise AssertionError("unreachable")


class _Rooms:
    def __init__(self) -> None:
        self.joined: list[str] = []

    async def joined_from_peer(self, room_id: str, _domain: str) -> None:
        self.joined.append(room_id)

    async def writes_in(self, _room_id: str) -> bool:
        return False

    async def left_from_peer(self, room_id: str) -> None:
        self.joined.remove(room_id)


class _Federation:
    flow_control = False

    def __init__(self, peer: Peer) -> None:
        self.peers = self
        self._peer = peer

    def by_bot(self, user_id: str) -> Peer | None:
        return self._peer if user_id == self._peer.bot else None


def room_feeds(peer: Peer, bot: _Bot, registry: CollectorRegistry) -> PeerFeeds:
    table = RoutingTable()
    nothing = cast(Any, None)
    return PeerFeeds(
        A,
        cast(Any, _Federation(peer)),
        cast(Any, _Rooms()),
        cast(Any, bot),
        nothing,
        nothing,
        table,
        AccessMonitor(A, table, (B,)),
        nothing,
        MessageGate(PolicyConfig()),
        nothing,
        nothing,
        NodeMetrics(registry),
    )


async def test_a_peer_opens_no_more_rooms_here_than_its_bound() -> None:
    """Row 13: B invites A's bot into 20 rooms (one push, and again): A follows 3, declines
    the rest, counts each refusal, and a room it follows is not joined twice."""
    peer = Peer(B, "hs.b.example", "@_rethink_bot:hs.b.example", max_rooms=3)
    bot, registry = _Bot(), CollectorRegistry()
    peer_feeds = room_feeds(peer, bot, registry)
    invites = [
        {
            "type": "m.room.member",
            "room_id": f"!r{i}:hs.b.example",
            "sender": peer.bot,
            "state_key": bot.user_id,
            "content": {"membership": "invite"},
        }
        for i in range(20)
    ]
    try:
        await peer_feeds.on_member_events("t1", invites)
        await peer_feeds.on_member_events("t2", invites[:5])
        async with asyncio.timeout(10):
            while len(bot.joined) < 3 or len(bot.declined) < 19:
                await asyncio.sleep(0.01)
        assert bot.joined == ["!r0:hs.b.example", "!r1:hs.b.example", "!r2:hs.b.example"]
        assert sorted(set(bot.declined)) == sorted(r["room_id"] for r in invites[3:])
        refused = registry.get_sample_value(
            "rethink_mn_quota_refusals_total", {"quota": "peer_rooms"}
        )
        assert refused == 19
        # A room's event found in the push (not joined through an invitation) counts too.
        stray = {"room_id": "!stray:hs.b.example", "sender": peer.bot, "content": {"n": 1}}
        assert not await peer_feeds._adopt("!stray:hs.b.example", stray)
    finally:
        await peer_feeds.close()


def _member(peer: Peer, room: str, member: str, membership: str) -> dict[str, Any]:
    return {
        "type": "m.room.member",
        "room_id": room,
        "sender": peer.bot,
        "state_key": member,
        "content": {"membership": membership},
    }


async def test_a_room_the_peer_leaves_no_longer_counts_and_is_left() -> None:
    """Rooms a peer opened were never given back: a peer done with three rooms (max_rooms 3)
    was refused a fourth for good. Now a room counts while the peer's node is in it: when it
    leaves, or puts this node's bot out, this node leaves too and the room is free."""
    peer = Peer(B, "hs.b.example", "@_rethink_bot:hs.b.example", max_rooms=3)
    bot, registry = _Bot(), CollectorRegistry()
    peer_feeds = room_feeds(peer, bot, registry)
    rooms: Any = peer_feeds._rooms
    room = [f"!r{i}:hs.b.example" for i in range(6)]

    async def settle(joined: int, left: int) -> None:
        async with asyncio.timeout(10):
            while len(bot.joined) < joined or len(bot.declined) < left:
                await asyncio.sleep(0.01)

    try:
        await peer_feeds.on_member_events(
            "t1", [_member(peer, r, bot.user_id, "invite") for r in room[:4]]
        )
        await settle(3, 1)
        assert bot.declined == [room[3]]
        # B's node leaves r0; B puts A's bot out of r1.
        await peer_feeds.on_member_events(
            "t2",
            [
                _member(peer, room[0], peer.bot, "leave"),
                _member(peer, room[1], bot.user_id, "leave"),
            ],
        )
        await settle(3, 3)
        assert sorted(bot.declined[1:]) == [room[0], room[1]]
        assert room[0] not in rooms.joined and room[0] not in peer_feeds._feeds
        # Two rooms free: two new invitations are taken, a third is refused.
        await peer_feeds.on_member_events(
            "t3", [_member(peer, r, bot.user_id, "invite") for r in room[3:6]]
        )
        await settle(5, 4)
        assert bot.joined[3:] == [room[3], room[4]] and bot.declined[-1] == room[5]
        # Someone else leaving a peer's room (or a room not the peer's) gives nothing back.
        stranger = _member(peer, room[2], "@someone:hs.b.example", "leave")
        await peer_feeds.on_member_events("t4", [stranger])
        assert peer_feeds._rooms_of[B] == {room[2], room[3], room[4]}
    finally:
        await peer_feeds.close()


async def test_a_peers_missing_media_holds_its_room_no_longer_than_one_deadline(
    monkeypatch: Any,
) -> None:
    """Row 13: a peer's event names media that never arrives (the fetch hangs, retried inside
    one handling attempt by the homeserver client): the event is skipped at the deadline that
    holds across all attempts, counted, and the feed goes on."""
    from adapter import carrier
    from adapter.federation import peer_feed

    monkeypatch.setattr(peer_feed, "EVENT_RETRY_SECONDS", 1.0)
    peer = Peer(B, "hs.b.example", "@_rethink_bot:hs.b.example")
    bot, registry = _Bot(), CollectorRegistry()
    peer_feeds = room_feeds(peer, bot, registry)
    feed = peer_feeds._feed("!media:hs.b.example", peer, None)
    event = {
        "event_id": "$m1",
        "room_id": "!media:hs.b.example",
        "sender": peer.bot,
        "content": {
            "v": carrier.LANE_FORMAT,
            "n": 1,
            "count": 1,
            "media": {"uri": "mxc://hs.b.example/never", "encoding": carrier.FRAMES},
        },
    }
    try:
        # Far beyond the deadline: without one, the fetch would hang here for ever.
        async with asyncio.timeout(30):
            await feed._handle_with_retry(event)
        assert bot.downloads >= 1
        skipped = registry.get_sample_value("rethink_mn_peer_events_total", {"outcome": "skipped"})
        assert skipped == 1
    finally:
        await peer_feeds.close()


def test_peer_rooms_use_a_pool_of_their_own(tmp_path: Path) -> None:
    """Row 13: what peers' rooms need goes through its own bounded pool of connections, not
    the one carrying this domain's traffic."""
    from adapter.config import parse_config
    from adapter.node import Node

    async def build() -> None:
        config = parse_config(
            {
                "domain": A,
                "homeserver": {"url": "http://127.0.0.1:9", "server_name": "hs.a.example"},
                "appservice": {"as_token": "a" * 20, "hs_token": "h" * 20},
                "database": {"url": f"sqlite:///{tmp_path / 'n.sqlite'}"},
                "federation": {"peers": {B: {"server_name": "hs.b.example"}}},
                "dashboard": {"worker": False},
            },
            "test",
            environ={},
        )
        node = Node(config)
        try:
            assert node.peer_feeds is not None
            peer_client = node.peer_feeds._bot._as.client
            assert peer_client._session is not node.api.client._session
            limit = peer_client._session.connector.limit
            assert limit == config.federation.peer_connections
        finally:
            await node.core.http.close()
            await node.core.peer_http.close()
            await node.db.dispose()

    asyncio.run(build())


# -- sender marks (row 12) ---------------------------------------------------------------------


class _Delivery:
    """Delivery as far as marks go: each message's origin marked, in the event's ticket too."""

    def __init__(self, marks: SenderMarks) -> None:
        self.sender_marks = marks

    @property
    def marks(self) -> Mapping[str, int]:
        return self.sender_marks.routed

    async def deliver(self, routed: Any, ticket: Any, admit: Any = None) -> None:
        for message in routed:
            self.sender_marks.route(message.sender.origin, message.oseq, ticket)
        ticket.seal()


def minted(n: int, first: int) -> dict[str, Any]:
    """A lane batch of B's node in which each message has a sender id of its own."""
    from adapter import carrier

    origins = [f"mint{first + i}" for i in range(800)]
    text = orjson.dumps(
        {
            "id": 1,
            "type": "update",
            "from": f"hyperty://{B}/m",
            "to": f"hyperty://{A}/h/registration",
        }
    ).decode()
    return {
        "v": carrier.LANE_FORMAT,
        "n": n,
        "count": len(origins),
        "senders": [[o, f"runtime://{B}/{o}", "@_rethink_bot:hs.b.example"] for o in origins],
        "messages": [[i, 1, [f"hyperty://{A}/h/registration"], text] for i in range(len(origins))],
    }


async def test_a_peers_minted_sender_ids_are_bounded_and_forgotten(db: Database) -> None:
    """Row 12: B mints a sender id per message, 800 per event: A keeps the marks of at most
    ``max_origins`` of them, in memory and in ``sender_marks``; at a restart, what the table
    holds beyond the bound (and a former peer's) is let go too."""
    from adapter.federation.peer_traffic import peer_origin
    from adapter.routing.settlement import Settlement
    from adapter.storage.checkpoints import CheckpointStore

    peer = Peer(B, "hs.b.example", "@_rethink_bot:hs.b.example", max_origins=100)
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry)
    store = CheckpointStore(db)
    sender_marks = SenderMarks()
    settlement = Settlement(store, metrics, sender_marks)
    delivery = _Delivery(sender_marks)
    table = RoutingTable()
    nothing = cast(Any, None)
    federation = cast(Any, _Federation(peer))
    federation.configured = lambda: [peer]
    peer_feeds = PeerFeeds(
        A,
        federation,
        nothing,
        cast(Any, _Bot()),
        cast(Any, delivery),
        settlement,
        table,
        AccessMonitor(A, table, (B,)),
        nothing,
        MessageGate(PolicyConfig()),
        nothing,
        nothing,
        metrics,
    )
    room = "!b:hs.b.example"
    assert peer_feeds._take_room(peer, room)  # followed, as on B's invitation
    for n in range(1, 4):
        event = {"event_id": f"$e{n}", "room_id": room, "content": minted(n, 1000 * n)}
        await peer_feeds._deliver(peer, room, event, asyncio.get_running_loop().time() + 30)
        await settlement.checkpoint()
    peer_marks = [o for o in delivery.marks if o.startswith("peer:")]
    assert len(peer_marks) == 100
    assert len(sender_marks.settled) <= 100
    assert len(await store.marks()) <= 100
    # The newest stay (the longest idle went first).
    assert peer_origin(B, "mint3799") in delivery.marks
    refused = registry.get_sample_value(
        "rethink_mn_quota_refusals_total", {"quota": "peer_origins"}
    )
    assert refused == 2300
    # A restart over a table an older node filled: held to the bound again, and a former
    # peer's marks go.
    restarted = {peer_origin(B, f"old{i}"): 1 for i in range(500)}
    restarted[peer_origin("gone.example", "x")] = 1
    restarted["k1.local-stub"] = 7
    await store.commit([], [], {}, restarted)
    sender_marks = SenderMarks()
    settlement = Settlement(store, metrics, sender_marks)
    loaded = await store.marks()
    sender_marks.restore(loaded)
    delivery.sender_marks = sender_marks
    peer_feeds._settlement = settlement
    peer_feeds.restore_marks(list(loaded))
    await settlement.checkpoint()
    left = await store.marks()
    assert len([o for o in left if o.startswith("peer:")]) == 100
    assert peer_origin("gone.example", "x") not in left
    assert left["k1.local-stub"] == 7  # a local runtime's mark is not the peers' to spend
    assert len([o for o in delivery.marks if o.startswith("peer:")]) == 100
