"""What a domain on several processes sends on to peer domains (federation/abroad.py): the
federation process sends on each lane message to the domains it is for, once, holding the lane
event until the peer's room has it; a peer's relayed message is never sent on."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from adapter.access import AccessMonitor
from adapter.carrier import Routed, Sender
from adapter.config import FederationConfig, PeerConfig
from adapter.federation.abroad import Onward, ThroughLanes
from adapter.federation.peers import PeerRefused, Peers
from adapter.observability import NodeMetrics
from adapter.routing.lanes import Outbox, Outgoing
from adapter.routing.settlement import Ticket
from adapter.routing_table import RoutingTable

ALICE = Sender("k1.stub", "runtime://a.example/alice", "@_rethink_alice:a")
FROM_B = Sender("peer:b.example:k2.stub", "runtime://b.example/bob", "@_rethink_bob:b")
OBJECT = "comm://a.example/obj"


class Link:
    def __init__(self) -> None:
        self.items: list[Outgoing] = []

    def has_room_for(self, size: int) -> bool:
        return True

    async def wait_for_room(self, size: int, timeout: float) -> bool:
        return True

    def push(self, item: Outgoing) -> None:
        self.items.append(item)


class Links:
    def __init__(self, peers: Peers) -> None:
        self.peers = peers
        self.links: dict[str, Link] = {}

    async def link(self, domain: str) -> Outbox:
        await self.peers.resolve(domain)
        return self.links.setdefault(domain, Link())


def peers(http: aiohttp.ClientSession) -> Peers:
    config = FederationConfig(
        peers={d: PeerConfig(server_name=d) for d in ("b.example", "c.example")}
    )
    return Peers(config, "a.example", http)


def table() -> RoutingTable:
    t = RoutingTable()
    t.add_runtime(1, ALICE.runtime)
    t.add_allocations(1, ["hyperty://a.example/alice", OBJECT], None)
    t.subscribe_domain("c.example", "runtime://c.example/carol", [f"{OBJECT}/changes"])
    return t


def routed(oseq: int, *to: str, sender: Sender = ALICE) -> Routed:
    return Routed(f'{{"id":{oseq}}}', to, sender, oseq)


@pytest.mark.asyncio(loop_scope="session")
async def test_each_lane_message_goes_on_to_the_domains_it_is_for_and_settles_after() -> None:
    async with aiohttp.ClientSession() as http:
        links = Links(peers(http))
        registry = CollectorRegistry()
        onward = Onward(links, AccessMonitor("a.example", table()), NodeMetrics(registry))
        ticket = Ticket("$e1")
        # To an address of b; to one of a's own (no peer); to a stream c subscribed to; to b
        # and a stream of c at once; from a peer's runtime (relayed here: never sent on); to
        # a domain that is no peer (the sender's process refused it; not sent on here).
        for message in (
            routed(1, "hyperty://b.example/bob"),
            routed(2, "hyperty://a.example/alice"),
            routed(3, f"{OBJECT}/changes"),
            routed(4, "hyperty://b.example/bob", f"{OBJECT}/changes"),
            routed(5, "hyperty://a.example/alice", sender=FROM_B),
            routed(6, "hyperty://elsewhere.example/x"),
        ):
            await onward(message, ticket)
        ticket.seal()
        sent = {domain: [i.routed.oseq for i in link.items] for domain, link in links.links.items()}
        assert sent == {"b.example": [1, 4], "c.example": [3, 4]}
        refused = registry.get_sample_value(
            "rethink_mn_messages_delivered_total", {"path": "peer_refused"}
        )
        assert refused == 1
        # The lane event settles once every copy is in its peer's room, not before.
        items = [i for link in links.links.values() for i in link.items]
        for item in items[:-1]:
            item.done()
        assert not ticket.settled
        items[-1].done()
        items[-1].done()  # done twice (a refusal after a send) releases once
        assert ticket.settled and ticket.pending == 0


@pytest.mark.asyncio(loop_scope="session")
async def test_a_process_that_does_not_federate_refuses_a_domain_that_is_no_peer_at_once() -> None:
    async with aiohttp.ClientSession() as http:
        through = ThroughLanes(peers(http))
        assert await through.outbox("b.example") is None  # its lane carries it
        with pytest.raises(PeerRefused) as refused:
            await through.outbox("elsewhere.example")
        assert refused.value.code == 403
