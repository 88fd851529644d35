"""Federation as a feature of the core: the peer domains, the links to them, what their rooms
bring in, and the subscriptions asked of them.

A domain's only process writes the rooms to peers itself; of a domain on several processes, one
writes them (``cluster.federation_process``), and the others' messages for peers reach it
through their lanes (abroad.py).
"""

from __future__ import annotations

from .. import carrier
from ..carrier import Sender
from ..core import Core
from ..core.core import SHUTDOWN_FLUSH_SECONDS
from ..routing.publisher import Publisher, node_origin
from ..services.registry import domain_registry_address
from ..sessions.session import Session
from .abroad import DirectLinks, Onward, ThroughLanes
from .links import Federation
from .peer_requests import PeerSubscriptions, SubscriptionsThroughLanes
from .peer_traffic import PeerFeeds, PeersPushedElsewhere
from .peers import Peers


class FederationFeature:
    def __init__(self) -> None:
        self.peers: Peers | None = None
        # The links to peers, on the process that writes their rooms (None elsewhere).
        self.links: Federation | None = None
        self.peer_feeds: PeerFeeds | None = None
        # What the subscription manager asks of peers, and tells them when a runtime leaves.
        self.subscriptions: PeerSubscriptions | None = None
        # The node's own messages to peers that do not go through its lanes (answers, its
        # requests): numbered apart from those that do, so each numbering keeps its order.
        self.to_peers: Publisher | None = None

    def attach(self, core: Core) -> None:
        cfg, hooks = core.config, core.hooks
        self._core = core
        self.peers = peers = Peers(cfg.federation, cfg.domain, core.http)
        # Peers reached through the lanes: every process's messages for them, sent on here.
        self._through_lanes = through_lanes = cfg.cluster.enabled
        if cfg.cluster.federates_here:
            self.links = Federation(
                peers,
                core.rooms,
                core.api.bot,
                core.metrics,
                core.stream_limits(),
                core.traffic,
                core.bounce.refused,
                cfg.federation.flow_window_events,
                cfg.federation.flow_max_hold_seconds,
            )
        links = self.links
        hooks.foreign = peers.remote_domain
        if through_lanes:
            if links is not None:
                hooks.send_on = Onward(links, core.monitor, core.metrics)
            hooks.abroad = ThroughLanes(peers)
        else:
            assert links is not None  # a domain's only process federates itself
            hooks.abroad = DirectLinks(links)
            hooks.peer_links = links
        hooks.subscription_changed = self._subscription_changed
        # Before the table forgets them: the runtime's subscriptions in other domains end.
        core.lifecycle.released.insert(0, self._runtime_left)
        hooks.assembled.append(self._assembled)
        hooks.marks_loaded.append(self._marks_loaded)
        hooks.lanes_started.append(self._lanes_started)
        if links is not None:
            hooks.lanes_flushed.append(self._flush_links)

    def _assembled(self) -> None:
        core, links = self._core, self.links
        cfg = core.config
        if links is None:
            assert self.peers is not None and cfg.cluster.federation_process is not None
            self.subscriptions = SubscriptionsThroughLanes(cfg.domain, self.peers, core.publisher)
            elsewhere = PeersPushedElsewhere(self.peers, cfg.cluster.federation_process)
            core.inbound.subscribe("m.room.member", elsewhere)
            core.inbound.subscribe(carrier.BATCH_EVENT, elsewhere)
            return
        to_peers = core.publisher
        if self._through_lanes:
            to_peers = self.to_peers = Publisher(
                core.outboxes,
                Sender(
                    f"{node_origin(core.process)}-peers",
                    domain_registry_address(cfg.domain),
                    core.api.bot.user_id,
                ),
                core.monitor,
            )
        self.subscriptions = self.peer_feeds = feeds = PeerFeeds(
            cfg.domain,
            links,
            core.rooms,
            core.peer_api.bot,
            core.delivery,
            core.settlement,
            core.table,
            core.monitor,
            core.remote_subscriptions,
            core.policy,
            to_peers,
            core.connectors[0],
            core.metrics,
            core.outboxes.for_node() if self._through_lanes else None,
        )
        core.inbound.subscribe("m.room.member", feeds.on_member_events)
        core.inbound.subscribe(carrier.BATCH_EVENT, feeds.on_batch_events)
        core.inbound.subscribe_ephemeral("m.receipt", links.on_receipts)

    async def _subscription_changed(
        self, kind: str, addresses: list[str], runtime: str
    ) -> str | None:
        assert self.subscriptions is not None
        return await self.subscriptions.subscription_changed(kind, addresses, runtime)

    def _runtime_left(self, session: Session) -> None:
        assert self.subscriptions is not None
        self.subscriptions.runtime_left(
            session.runtime_url, self._core.table.subscriptions_of(session.id)
        )

    def _marks_loaded(self, epoch: int, marks: dict[str, int]) -> None:
        if self.to_peers is not None:
            self.to_peers.begin(epoch)
        if self.peer_feeds is not None:
            # What peers' senders left is held to their bounds (it is theirs to mint).
            self.peer_feeds.restore_marks(list(marks))

    async def _lanes_started(self, positions: dict[str, str]) -> None:
        if self.peer_feeds is not None:
            await self.peer_feeds.start(positions)

    async def _flush_links(self) -> None:
        assert self.links is not None
        await self.links.flush(SHUTDOWN_FLUSH_SECONDS)

    async def start(self) -> None:
        """Nothing more: the peers' rooms are read from the lanes' start on."""

    async def stop(self) -> None:
        if self.links is not None:
            await self.links.close()
        if self.peer_feeds is not None:
            await self.peer_feeds.close()
