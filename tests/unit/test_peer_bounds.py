"""What a hostile peer domain's node can make this one hold or do (issue 41, rows 10-13): its
subscriptions are checked and taken in one step against its quota, an unsubscription costs what
it names, its sender marks are bounded and forgotten with its senders, its rooms are bounded
and its media waits have one deadline across retries.

The peer's requests come in as ``PeerFeeds`` takes them from a feed; the parts of the node they
do not reach are left out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import orjson
import pytest_asyncio
from prometheus_client import CollectorRegistry

from adapter.access import AccessMonitor
from adapter.config import PolicyConfig
from adapter.envelope import parse
from adapter.observability import NodeMetrics
from adapter.routing.peer_traffic import PeerFeeds
from adapter.routing.peers import Peer
from adapter.routing.policy import PolicyEngine
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
        PolicyEngine(PolicyConfig()),
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
