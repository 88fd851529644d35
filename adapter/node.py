"""The composition root: chooses the node's features from its configuration, attaches them to
the core and hands over to it. Nothing here decides anything about messages; core/ says where
a message walks.

The core (core/core.py) is what every domain's node has; each feature (federation/, cluster/,
ops/, the built-in registry) attaches through the core's named hooks (core/hooks.py). Their
order below is their place in the start and the stop.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from appservice.intent import AppserviceAPI

from .access import AccessMonitor
from .builtin_registry import RegistryFeature
from .cluster.feature import ClusterFeature
from .cluster.membership import Membership
from .cluster.sibling_lanes import SiblingLanes
from .config import NodeConfig
from .core import Core, Feature, OutboxesFactory
from .federation.feature import FederationFeature
from .federation.links import Federation
from .federation.peer_traffic import PeerFeeds
from .observability import NodeMetrics
from .ops.feature import OpsFeature
from .ops.tap import EventTap
from .routing.delivery import Delivery
from .routing.inbound import InboundEvents
from .routing.ingress import Ingress
from .routing.journal import Journal
from .routing.lanes import Lanes
from .routing.rooms import RoomDirectory
from .routing.settlement import Settlement
from .routing_table import RoutingTable
from .sessions.registry import SessionRegistry
from .storage.database import Database
from .storage.routes import RouteStore

# The exit status of a process another one took for gone (EX_TEMPFAIL: start it again).
EXIT_STRUCK = 75

__all__ = ["EXIT_STRUCK", "Node", "OutboxesFactory"]


def _exit_at_once() -> None:
    os._exit(EXIT_STRUCK)


class Node:
    def __init__(
        self,
        config: NodeConfig,
        metrics_registry: CollectorRegistry | None = None,
        outboxes: OutboxesFactory | None = None,
        on_struck: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.core = core = Core(config, metrics_registry, outboxes)
        self.ops = OpsFeature() if config.dashboard.enabled else None
        self.builtin_registry = RegistryFeature() if config.registry.uses_builtin else None
        self.federation_feature = FederationFeature() if config.federation.enabled else None
        # Another process of the domain took this one for gone and holds its sessions: it
        # must not serve them a moment longer. Crash-only: the process ends at once and its
        # supervisor starts it again, new and holding nothing.
        self.cluster = (
            ClusterFeature(on_struck or _exit_at_once) if config.cluster.enabled else None
        )
        features: list[Feature | None] = [
            self.ops,
            self.builtin_registry,
            self.federation_feature,
            self.cluster,
        ]
        for feature in features:
            if feature is not None:
                core.attach(feature)
        core.assemble()

    async def start(self) -> None:
        await self.core.start()

    async def stop(self) -> None:
        await self.core.stop()

    # -- the parts tests and tools look at ----------------------------------------------------

    @property
    def appservice_port(self) -> int | None:
        return self.core.appservice_port

    @property
    def stub_port(self) -> int | None:
        return self.core.stub_port

    @property
    def db(self) -> Database:
        return self.core.db

    @property
    def api(self) -> AppserviceAPI:
        return self.core.api

    @property
    def sessions(self) -> SessionRegistry:
        return self.core.sessions

    @property
    def metrics(self) -> NodeMetrics:
        return self.core.metrics

    @property
    def journal(self) -> Journal:
        return self.core.journal

    @property
    def inbound(self) -> InboundEvents:
        return self.core.inbound

    @property
    def ingress(self) -> Ingress:
        return self.core.ingress

    @property
    def lanes(self) -> Lanes | None:
        return self.core.lanes

    @property
    def table(self) -> RoutingTable:
        return self.core.table

    @property
    def monitor(self) -> AccessMonitor:
        return self.core.monitor

    @property
    def routes(self) -> RouteStore:
        return self.core.routes

    @property
    def rooms(self) -> RoomDirectory:
        return self.core.rooms

    @property
    def settlement(self) -> Settlement:
        return self.core.settlement

    @property
    def delivery(self) -> Delivery:
        return self.core.delivery

    @property
    def federation(self) -> Federation | None:
        return self.federation_feature.links if self.federation_feature is not None else None

    @property
    def peer_feeds(self) -> PeerFeeds | None:
        feature = self.federation_feature
        return feature.peer_feeds if feature is not None else None

    @property
    def siblings(self) -> SiblingLanes | None:
        return self.cluster.siblings if self.cluster is not None else None

    @property
    def membership(self) -> Membership | None:
        return self.cluster.membership if self.cluster is not None else None

    @property
    def dashboard_tap(self) -> EventTap | None:
        return self.ops.tap if self.ops is not None else None
