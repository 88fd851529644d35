"""Traffic between reTHINK domains: the trapezoid runtime A → node A → Matrix federation →
node B → runtime B, through rooms both domains' homeservers keep.

Each node writes what it sends to a peer domain into a room of its own for that peer (created
once, the peer's node invited; federated), and reads what the peer writes into the peer's room
for it. One writer per room: the room's order is the writer's order, so each runtime's messages
keep their order across, and nothing is set up per message. Outbound, a ``PeerLink`` batches
like a lane and acknowledges a runtime's message once this node's homeserver has persisted the
event (federation then carries it, retrying, to the peer). Each event carries its writer's
consecutive number ``n``, so the reader can put events in order and see what is missing.
Inbound is peer_feed.py (one peer's room, in order) and peer_traffic.py (what a peer's messages
may do here). docs/matrix-mapping.md has the design and its reasons.

Only this node's bot may send events in the rooms it writes (rooms.py sets their power levels).
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from appservice.api import MatrixError
from appservice.intent import Intent

from .. import carrier
from ..carrier import LaneEncoder
from ..observability import NodeMetrics
from ..retry import Backoff, retry
from ..routing.flow import PeerPace
from ..routing.lanes import Outgoing, StreamOutbox
from ..routing.numbering import RoomNumbering, event_number
from ..routing.rooms import RoomDirectory
from ..routing.stream import BatchStream, OnRefused, StreamLimits, Traffic
from ..tasks import BackgroundTasks
from .peers import Peer, Peers

log = structlog.get_logger(__name__)

# How long a new room to a peer holds its first events while the peer's node joins it.
PEER_JOIN_WAIT_SECONDS = 10.0


# -- outbound -----------------------------------------------------------------------------------


class PeerLink(StreamOutbox):
    """This node's stream to one peer domain's node."""

    def __init__(
        self,
        peer: Peer,
        rooms: RoomDirectory,
        bot: Intent,
        metrics: NodeMetrics,
        limits: StreamLimits,
        traffic: Traffic,
        pace: PeerPace,
        on_refused: OnRefused | None = None,
    ) -> None:
        self.peer = peer
        self._rooms = rooms
        self._bot = bot
        self.ready = asyncio.Event()
        self._numbers = RoomNumbering()
        self.pace = pace
        self.room_id: str | None = None  # this node's room for the peer, once known
        self.stream: BatchStream[Outgoing] = BatchStream(
            f"to-{peer.domain}",
            LaneEncoder(),
            self._header,
            self._target,
            metrics,
            limits,
            on_sent=self._on_sent,
            traffic=traffic,
            ready=self.ready,
            on_refused=on_refused,
            pace=pace.pace,
        )

    def _header(self) -> dict[str, Any]:
        return {"n": self._numbers.next, **self.pace.asks()}

    async def _target(self, refresh: bool) -> tuple[Intent, str]:
        intent, self.room_id = await self._rooms.to_peer(self.peer.domain, self.peer.bot, refresh)
        return intent, self.room_id

    def _on_sent(self, batch: list[Outgoing], event_id: str) -> None:
        # Persisted on this node's homeserver: federation takes it from here, retrying.
        self.pace.sent(self._numbers.persisted(), event_id, len(batch))
        for item in batch:
            item.done()

    async def start(self) -> None:
        """Find (or create) the room and continue its numbering, then open for sending."""

        async def open_room() -> None:
            _intent, room_id = await self._target(False)
            await self._rooms.writer_only(room_id)
            page = await self._bot.messages(
                room_id,
                direction="b",
                limit=1,
                event_filter={"types": [carrier.BATCH_EVENT], "senders": [self._bot.user_id]},
            )
            last = max((event_number(e.get("content")) for e in page["chunk"]), default=0)
            self._numbers.continue_from(last)
            self.pace.start_at(last)

        def not_ready(exc: Exception, _delay: float) -> None:
            # The homeserver may not be up yet.
            log.warning("peer link not ready; retrying", peer=self.peer.domain, error=str(exc))

        await retry(open_room, Backoff(0.25, 2.0), on_retry=not_ready)
        await self._await_peer_join()
        self.ready.set()
        log.info("peer link ready", peer=self.peer.domain, last_event=self._numbers.last)

    async def _await_peer_join(self) -> None:
        """Hold the first events until the peer's bot has joined (at once for a room it is
        in). What a room receives before a server joins reaches that server only as history
        it must fetch, never in the homeserver's push: sending after the join keeps the push
        the path of every event. Bounded, for a peer whose node is away: then its node finds
        those events reading the room when it joins."""
        deadline = asyncio.get_running_loop().time() + PEER_JOIN_WAIT_SECONDS
        backoff = Backoff(0.05, 1.0)
        while asyncio.get_running_loop().time() < deadline:
            try:
                _intent, room_id = await self._target(False)
                if self.peer.bot in await self._bot.joined_members(room_id):
                    return
            except MatrixError as exc:
                log.warning("peer membership unknown", peer=self.peer.domain, error=str(exc))
            await backoff.wait()
        log.warning("peer has not joined yet; sending anyway", peer=self.peer.domain)


class Federation:
    """The links to peer domains, made on first use."""

    def __init__(
        self,
        peers: Peers,
        rooms: RoomDirectory,
        bot: Intent,
        metrics: NodeMetrics,
        limits: StreamLimits,
        traffic: Traffic,
        on_refused: OnRefused | None = None,
        flow_window: int = 0,
        flow_max_hold: float = 1.0,
    ) -> None:
        self.peers = peers
        self._rooms = rooms
        self._bot = bot
        self._metrics = metrics
        self._limits = limits
        self._traffic = traffic
        self._on_refused = on_refused
        self._flow = (flow_window, flow_max_hold)
        self._links: dict[str, PeerLink] = {}
        self._starting = BackgroundTasks(
            "peer_links", metrics.background_failures.labels("peer_links").inc
        )

    async def link(self, domain: str) -> PeerLink:
        """The stream to ``domain``; raises PeerRefused (403, 404, 504)."""
        link = self._links.get(domain)
        if link is None:
            peer = await self.peers.resolve(domain)
            link = self._links.get(domain)
            if link is None:
                link = self._links[domain] = PeerLink(
                    peer,
                    self._rooms,
                    self._bot,
                    self._metrics,
                    self._limits,
                    self._traffic,
                    PeerPace(domain, *self._flow, self._metrics),
                    self._on_refused,
                )
                self._starting.spawn(link.start(), name=f"peer-link-{domain}")
        return link

    @property
    def flow_control(self) -> bool:
        """Whether this node paces its links and confirms what peers send it (flow.py): a
        node with flow control off neither waits for confirmations nor sends them."""
        return self._flow[0] > 0

    async def on_receipts(self, _txn_id: str, events: list[dict[str, Any]]) -> None:
        """Read receipts pushed by the homeserver: a peer node's, in this node's room for it,
        confirm the events it has handled (flow.py). Every other receipt is none of ours."""
        for event in events:
            content = event.get("content")
            link = self._link_in(event.get("room_id"))
            if link is None or not isinstance(content, dict):
                continue
            for event_id, kinds in content.items():
                readers = kinds.get("m.read") if isinstance(kinds, dict) else None
                if isinstance(readers, dict) and link.peer.bot in readers:
                    link.pace.confirmed(event_id)

    def _link_in(self, room_id: object) -> PeerLink | None:
        return next((link for link in self._links.values() if link.room_id == room_id), None)

    async def flush(self, timeout: float) -> None:
        await asyncio.gather(*(link.stream.flush(timeout) for link in self._links.values()))

    async def close(self) -> None:
        await self._starting.stop()
        for link in self._links.values():
            await link.stream.close()
