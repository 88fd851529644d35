"""Where a message for other reTHINK domains leaves this process.

A domain's only process writes the rooms to peer domains itself: the ingress puts a message for a
peer domain on the link to it (links.py). A domain on several processes has one writer per
room to a peer, its federation process (`cluster.federation_process`): every process puts its
runtimes' messages for peers in its own lane, like any other message, and the federation process
sends them on as it delivers the lanes it reads (``Onward``). A runtime's messages therefore
reach a peer in the order its lanes carried them, across moves between processes too (the lanes'
``after``, cluster/sibling_lanes.py), and a message is acknowledged to its stub once a lane
holds it, as within the domain.
"""

from __future__ import annotations

from typing import Protocol

import structlog

from ..access import AccessMonitor
from ..carrier import Routed
from ..observability import NodeMetrics
from ..routing.lanes import Outbox, Outgoing
from ..routing.settlement import Ticket
from ..routing.way_abroad import PEER_ORIGIN_PREFIX, remote_domains
from .links import Federation
from .peers import PeerRefused, Peers

log = structlog.get_logger(__name__)

# How long sending on waits for room on a link before it pushes anyway (the lane it reads
# waits meanwhile: the back-pressure reaches the senders through their own lanes).
ROOM_WAIT_SECONDS = 30.0


class DirectLinks:
    """A domain's only process: its own links to peer domains."""

    def __init__(self, federation: Federation) -> None:
        self.peers = federation.peers
        self._federation = federation

    async def outbox(self, domain: str) -> Outbox | None:
        return await self._federation.link(domain)


class ThroughLanes:
    """A process of a domain on several: the lane carries the message, the federation process
    sends it on. The peer is resolved here all the same, so that a domain that is no peer is
    refused to the sender at once."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    async def outbox(self, domain: str) -> Outbox | None:
        await self.peers.resolve(domain)
        return None


class Links(Protocol):
    """The federation process's links to peer domains (links.py ``Federation``)."""

    peers: Peers

    async def link(self, domain: str) -> Outbox:
        """The stream to ``domain``; raises PeerRefused."""
        ...


class Onward:
    """The federation process of a domain on several: each message of a lane it delivers (its
    own or another process's) goes on to the peer domains it is for. The lane event's ticket
    stays unsettled until the peer's room holds the message, so the lane is read again from
    before it if this process stops first (the peer drops by number what it already had)."""

    def __init__(self, federation: Links, monitor: AccessMonitor, metrics: NodeMetrics) -> None:
        self._federation = federation
        self._monitor = monitor
        self._refused = metrics.messages_out.labels("peer_refused")

    async def __call__(self, routed: Routed, ticket: Ticket | None) -> None:
        if routed.sender.origin.startswith(PEER_ORIGIN_PREFIX):
            return  # a peer's message this process relayed to the domain's lanes
        monitor = self._monitor
        subscribed = monitor.receivers(routed.to, None).domains
        domains = remote_domains(self._federation.peers, monitor, routed.to, None, subscribed)
        for domain in sorted(domains):
            try:
                link = await self._federation.link(domain)
            except PeerRefused as refused:
                # Resolved by the sender's process a moment ago: a peer that went away since.
                log.warning("message not sent on to a peer", peer=domain, reason=refused.reason)
                self._refused.inc()
                continue
            size = len(routed.text)
            if not link.has_room_for(size):
                await link.wait_for_room(size, ROOM_WAIT_SECONDS)
            if ticket is not None:
                ticket.hold()
            link.push(Outgoing(routed, 0, settles=ticket))
