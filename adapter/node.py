"""The composition root: builds the node's parts from its configuration, wires them together
and runs their listeners. Nothing here decides anything about messages.

The walk of one routed message, for a reader finding their way:
  stub/endpoint.py (frame in) → routing/ingress.py (decided) → routing/lanes.py (leaves for
  Matrix; the homeserver persists the event) → routing/delivery.py → sessions/mailbox.py (to the
  destination's socket, or kept for its resume).
Events other nodes' runtimes send (federation) come in through appservice/server.py →
routing/inbound.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from appservice.api import HomeserverClient
from appservice.intent import AppserviceAPI
from appservice.metrics import AppserviceMetrics
from appservice.server import AppserviceServer, TransactionHandler

from . import carrier
from .access import AccessMonitor, Refusal
from .bounds import Bound
from .carrier import Sender
from .clients import ClientKeys
from .cluster.membership import Membership
from .cluster.shared_routes import SharedRoutes, application_name
from .cluster.sibling_lanes import SiblingLanes
from .cluster.takeover import TakeOver
from .config import NodeConfig
from .heap import Collector
from .identity.authenticator import Authenticator
from .identity.matrix import MatrixTokenVerifier
from .identity.model import Identity
from .identity.oidc import OidcVerifier
from .namespace import NamespaceQueries
from .observability import (
    LAG_PROBE_SECONDS,
    HealthEndpoints,
    NodeMetrics,
    watch_event_loop,
    watch_garbage_collector,
)
from .ops.layout import DashboardLayout
from .ops.live_dashboard import LiveDashboard
from .ops.tap import EventTap, TappedTransactions
from .ops.worker import DashboardWorker
from .policies.api import PolicyApi
from .policies.engine import RuleEngine
from .policies.store import PolicyStore
from .retry import Backoff, retry
from .routing.abroad import Abroad, DirectLinks, Onward, ThroughLanes
from .routing.bounce import Bounce
from .routing.delivery import Delivery
from .routing.federation import Federation
from .routing.inbound import InboundEvents
from .routing.ingress import Ingress, ServiceDirectory
from .routing.journal import Journal
from .routing.lanes import Lane, Lanes, Outboxes
from .routing.peer_requests import PeerSubscriptions, SubscriptionsThroughLanes
from .routing.peer_traffic import PeerFeeds, PeersPushedElsewhere
from .routing.peers import Peers
from .routing.policy import MessageGate
from .routing.publisher import Publisher, node_origin
from .routing.recovery import LaneRecovery
from .routing.rooms import RoomDirectory
from .routing.settlement import Settlement
from .routing.stream import BatchStream, StreamLimits, Traffic
from .routing_table import RoutingTable
from .services.allocation import ENDPOINTS, AllocationService
from .services.connectors import build_connectors
from .services.idm import IdmService
from .services.registry import domain_registry_address
from .services.registry_builtin import BuiltinRegistry, build_builtin_registry
from .services.subscriptions import SubscriptionService
from .sessions.mailbox import Waiting
from .sessions.registry import Lifecycle, SessionRegistry
from .sessions.session import AskedRequests, Session
from .sessions.tokens import SessionTokens
from .stalls import StallWatch
from .storage.checkpoints import CheckpointStore
from .storage.clock import utcnow
from .storage.database import Database
from .storage.pending import PendingStore
from .storage.processes import ProcessStore
from .storage.remote import RemoteSubscriptionStore
from .storage.rooms import RoomStore
from .storage.routes import RouteStore
from .storage.secrets import SecretStore
from .storage.sessions import SessionStore
from .storage.transactions import SqlTransactionStore
from .stub.acks import AckSender
from .stub.endpoint import StubEndpoint
from .stub_files import StubFiles
from .tasks import BackgroundTasks
from .web_endpoints import WebPages
from .web_hosts import KnownHosts, url_host

log = structlog.get_logger(__name__)

TRANSACTION_RETENTION = timedelta(days=7)
MAINTENANCE_INTERVAL = 3600.0
KEPT_PAYLOAD_GRACE = timedelta(minutes=10)
EXPIRY_INTERVAL = 60.0
SHUTDOWN_FLUSH_SECONDS = 10.0
# After the lanes are flushed at shutdown, how long live stubs get to acknowledge the last
# deliveries before what they have not acknowledged is stored for their resume.
SHUTDOWN_ACK_SECONDS = 1.0
# Pending connections the kernel queues per listener (capped by net.core.somaxconn).
LISTEN_BACKLOG = 4096
# How long what is kept per origin stays after the origin is retired.
RETIRED_ORIGIN_SECONDS = 60.0
# The journal is for audit and analytics, not for latency: at most four events a second.
JOURNAL_INTERVAL = 0.25
# A lane sends what fits one event (inline or packed) until this much waits, about two events'
# worth; beyond, the backlog leaves in one media event (stream.py says why).
LANE_MEDIA_BACKLOG = 128 * 1024
# The exit status of a process another one took for gone (EX_TEMPFAIL: start it again).
EXIT_STRUCK = 75

# Builds the outbound seam from the delivery side; the default is the lanes through Matrix.
OutboxesFactory = Callable[[Delivery], Outboxes]


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
        # Another process of the domain took this one for gone and holds its sessions: it
        # must not serve them a moment longer. Crash-only: the process ends at once and its
        # supervisor starts it again, new and holding nothing.
        self._on_struck = on_struck or _exit_at_once
        cfg = config
        collector = metrics_registry or CollectorRegistry()
        self.metrics = NodeMetrics(collector)
        self.as_metrics = AppserviceMetrics(collector)

        # Storage.
        process = cfg.cluster.process
        self.db = Database(
            cfg.database.url,
            echo=cfg.database.echo,
            synchronous_commit=cfg.database.synchronous_commit,
            application_name=application_name(process) if process is not None else None,
        )
        self._session_rows = SessionStore(self.db, holder=process)
        self._pending = PendingStore(self.db)
        self._checkpoints = CheckpointStore(self.db, process or "")
        self._secrets = SecretStore(self.db)
        self._transactions = SqlTransactionStore(self.db)
        self.routes = RouteStore(self.db)

        # The homeserver, through one pooled HTTP session for every request. Peers' rooms
        # (joining, reading, their media, confirmations) go through a pool of their own: a peer
        # whose media hangs holds its own connections, never this domain's.
        self._http, self.api = self._homeserver_api(cfg, 64)
        self._peer_http, self.peer_api = self._homeserver_api(cfg, cfg.federation.peer_connections)
        self.rooms = RoomDirectory(
            self.api,
            RoomStore(self.db),
            cfg.appservice.user_prefix,
            cfg.appservice.alias_prefix,
            persisters=cfg.homeserver.event_persisters,
            process=process,
        )

        # Routing state and sessions.
        self.table = RoutingTable()
        # The reference monitor: every "may this runtime use this address" is its decision.
        self.monitor = AccessMonitor(cfg.domain, self.table, cfg.federation.peers, self._asked_by)
        # The operator's rules, managed at run time through the policy API (stored).
        self.rules = RuleEngine()
        self._rule_store = PolicyStore(self.db, self.rules)
        self.policy = MessageGate(cfg.policy, self.rules)
        self.settlement = Settlement(self._checkpoints, self.metrics)
        self._acks = AckSender()
        self._background = BackgroundTasks(
            "node", self.metrics.background_failures.labels("node").inc
        )
        self._tokens = SessionTokens(cfg.stub.session_secret, cfg.stub.session_ttl_seconds)
        lifecycle = Lifecycle(
            added=[lambda s: self.table.add_runtime(s.id, s.runtime_url)],
            released=[
                lambda s: self.table.remove_session(s.id),
                lambda s: self.policy.forget(s.id),
            ],
            retired=[self._retire_origin],
        )
        self.sessions = SessionRegistry(
            self._session_rows,
            self._pending,
            self._tokens,
            self.rooms.virtual_user,
            self.metrics.stub_connections.labels("attached"),
            cfg.stub.session_ttl_seconds,
            lifecycle,
            self.settlement.mailbox_dirty,
            self._acks.mark,
            cfg.stub.max_detached_sessions,
            self.metrics.sessions_evicted.inc,
            lambda parcels: self._spawn(self.delivery.unreceived(parcels)),
            process,
            self._take_sessions_of if process is not None else None,
            self._claim_in_use,
            Bound(
                "sessions",
                cfg.stub.max_sessions_per_client,
                cfg.stub.max_sessions,
                self.metrics.bound_refused,
            ),
        )
        self.metrics.sessions.set_function(lambda: len(self.sessions))
        self.metrics.tasks.set_function(lambda: len(asyncio.all_tasks()))

        # The message walk: journal, delivery, lanes (the outbound seam), ingress.
        self._traffic = Traffic()
        self.journal = Journal(self._journal_stream() if cfg.routing.journal else None)
        self._bounce = Bounce(self.sessions, self.journal)
        # Other reTHINK domains, through Matrix federation (none unless configured). Of a
        # domain on several processes, one writes the rooms to peers (routing/abroad.py).
        self.peers: Peers | None = None
        self.federation: Federation | None = None
        if cfg.federation.enabled:
            self.peers = Peers(cfg.federation, cfg.domain, self._http)
            if cfg.cluster.federates_here:
                self.federation = Federation(
                    self.peers,
                    self.rooms,
                    self.api.bot,
                    self.metrics,
                    self._stream_limits(),
                    self._traffic,
                    self._bounce.refused,
                    cfg.federation.flow_window_events,
                    cfg.federation.flow_max_hold_seconds,
                )
        # Peers reached through the lanes: every process's messages for them, sent on here.
        through_lanes = self.peers is not None and cfg.cluster.enabled
        self.delivery = Delivery(
            self.monitor,
            self.sessions,
            self.journal,
            self.metrics,
            {},
            cfg.quotas.waiting_bytes,
            self.peers.remote_domain if self.peers is not None else None,
            Onward(self.federation, self.monitor, self.metrics)
            if through_lanes and self.federation is not None
            else None,
        )
        self.lanes: Lanes | None = None
        if outboxes is None:
            self.lanes = self._build_lanes()
            self.outboxes: Outboxes = self.lanes
        else:
            self.outboxes = outboxes(self.delivery)
        self._abroad: Abroad | None = None
        if through_lanes and self.peers is not None:
            self._abroad = ThroughLanes(self.peers)
        elif self.federation is not None:
            self._abroad = DirectLinks(self.federation)
        self.publisher = Publisher(
            self.outboxes,
            Sender(node_origin(process), domain_registry_address(cfg.domain), self.api.bot.user_id),
            self.monitor,
            None if through_lanes else self.federation,
        )
        # The domain registry, answered from the node's database unless one is configured.
        self.registry: BuiltinRegistry | None = build_builtin_registry(
            cfg.registry,
            self.db,
            self.publisher.registration_status,
            monitor=self.monitor,
            claim=lambda who, address: self.allocation.claim(who, address),
        )
        if self.registry is not None:
            self._follow_presence(lifecycle, self.registry)
        self._connectors = build_connectors(
            cfg, self._http, self.registry.service if self.registry is not None else None
        )
        self.peer_feeds: PeerFeeds | None = None
        self._remote_subscriptions = RemoteSubscriptionStore(self.db)
        # What the subscription manager asks of peers, and tells them when a runtime leaves.
        self._peer_subscriptions: PeerSubscriptions | None = None
        # The node's own messages to peers that do not go through its lanes (answers, its
        # requests): numbered apart from those that do, so each numbering keeps its order.
        self._to_peers: Publisher | None = None
        if self.federation is not None:
            to_peers = self.publisher
            if through_lanes:
                to_peers = self._to_peers = Publisher(
                    self.outboxes,
                    Sender(
                        f"{node_origin(process)}-peers",
                        domain_registry_address(cfg.domain),
                        self.api.bot.user_id,
                    ),
                    self.monitor,
                )
            self._peer_subscriptions = self.peer_feeds = PeerFeeds(
                cfg.domain,
                self.federation,
                self.rooms,
                self.peer_api.bot,
                self.delivery,
                self.settlement,
                self.table,
                self.monitor,
                self._remote_subscriptions,
                self.policy,
                to_peers,
                self._connectors[0],
                self.metrics,
                self.outboxes.for_node() if through_lanes else None,
            )
        elif self.peers is not None:
            self._peer_subscriptions = SubscriptionsThroughLanes(
                cfg.domain, self.peers, self.publisher
            )
        if self._peer_subscriptions is not None:
            # Before the table forgets them: the runtime's subscriptions in other domains end.
            peer_subscriptions = self._peer_subscriptions
            lifecycle.released.insert(
                0,
                lambda s: peer_subscriptions.runtime_left(
                    s.runtime_url, self.table.subscriptions_of(s.id)
                ),
            )
        # The domain's other node processes, when it runs several: their lanes are read here,
        # and what they change in the routing state reaches this process's table.
        self.siblings: SiblingLanes | None = None
        self._processes: ProcessStore | None = None
        self._shared_routes: SharedRoutes | None = None
        self.membership: Membership | None = None
        self._take_over: TakeOver | None = None
        # Sessions whose handover to this process was not finished when it stopped (start-up).
        self._unfinished: list[tuple[Session, str]] = []
        if process is not None:
            assert self.rooms.lane_reader is not None
            self.siblings = SiblingLanes(
                self.api.bot,
                self.rooms.lane_reader,
                self.delivery,
                self.settlement,
                self.metrics,
                self._own_lane_delivered,
            )
            self._processes = ProcessStore(self.db)
            self._shared_routes = SharedRoutes(
                self.db,
                process,
                self.table,
                self._reload_shared_routes,
                self._processes_changed,
                self._hand_over,
            )
            self._take_over = TakeOver(
                self._session_rows,
                self._processes,
                self._checkpoints,
                self._pending,
                self.sessions,
                self.monitor,
                self.api.bot,
                self.siblings,
                cfg.cluster.gone_after_seconds,
                process,
                lambda: list(self.lanes or []),
            )
        self.ingress = Ingress(
            self.table,
            self.monitor,
            self._services(),
            self.outboxes,
            self.journal,
            self.routes,
            self.policy,
            self.delivery.routed_through,
            self.metrics,
            cfg.quotas,
            self._waiting_bytes,
            cfg.routing.backpressure_seconds,
            self._abroad,
            self._shared_routes.caught_up if self._shared_routes is not None else None,
            claim=self.allocation.claim,
        )
        self.inbound = InboundEvents(self.metrics)
        if self.peer_feeds is not None:
            self.inbound.subscribe("m.room.member", self.peer_feeds.on_member_events)
            self.inbound.subscribe(carrier.BATCH_EVENT, self.peer_feeds.on_batch_events)
        if self.federation is not None:
            self.inbound.subscribe_ephemeral("m.receipt", self.federation.on_receipts)
        elif self.peers is not None:
            assert cfg.cluster.federation_process is not None
            elsewhere = PeersPushedElsewhere(self.peers, cfg.cluster.federation_process)
            self.inbound.subscribe("m.room.member", elsewhere)
            self.inbound.subscribe(carrier.BATCH_EVENT, elsewhere)
        self.stub_endpoint = StubEndpoint(
            cfg.stub,
            cfg.domain,
            self.sessions,
            self.ingress,
            self._authenticator(),
            self.journal,
            self._acks,
            self.metrics,
            cfg.routing.max_backlog_bytes_per_connection,
        )

        # Operations: the live dashboard, and the worker process that keeps its figures current.
        self.dashboard: LiveDashboard | None = None
        self._dashboard_worker: DashboardWorker | None = None
        self._dashboard_tap: EventTap | None = None
        if cfg.dashboard.enabled:
            layout = DashboardLayout(Path(cfg.dashboard.state_dir))
            self.dashboard = LiveDashboard(
                cfg.dashboard,
                cfg.domain,
                layout,
                lambda: self.stub_endpoint.open_connections,
                ClientKeys(cfg.stub.trusted_proxies),
            )
            if cfg.dashboard.worker:
                self._dashboard_worker = DashboardWorker(cfg, layout)
                self._dashboard_tap = EventTap(
                    layout.spool_dir, self.metrics, keep_seconds=60 * cfg.dashboard.window_minutes
                )

        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._unwatch_gc: Callable[[], None] = lambda: None
        self._stall_watch = StallWatch(
            config.logging.report_loop_stalls_over_ms / 1000,
            LAG_PROBE_SECONDS,
            lambda _stack: self.metrics.loop_stalls.inc(),
        )
        self.running = False
        self.appservice_port: int | None = None
        self.stub_port: int | None = None

    # -- parts --------------------------------------------------------------------------------

    def _stream_limits(self, min_interval: float = 0.0, one_event_below: int = 0) -> StreamLimits:
        r = self.config.routing
        return StreamLimits(
            max_batch_bytes=r.max_batch_bytes,
            max_queued_bytes=r.max_queued_bytes_per_lane,
            min_interval=min_interval,
            one_event_below_bytes=one_event_below,
        )

    def _journal_stream(self) -> BatchStream[bytes]:
        return BatchStream(
            "journal",
            carrier.JournalEncoder(),
            dict,
            self.rooms.journal,
            self.metrics,
            self._stream_limits(JOURNAL_INTERVAL),
            traffic=self._traffic,
            background=True,
            # What took effect is always recorded: the stubs wait for room (Journal.room).
            drop_when_full=False,
        )

    def _build_lanes(self) -> Lanes:
        return Lanes(
            [
                Lane(
                    index,
                    self.rooms.lane,
                    self.delivery,
                    self.settlement.ledger,
                    self.metrics,
                    self._stream_limits(one_event_below=LANE_MEDIA_BACKLOG),
                    self._traffic,
                    self._bounce.refused,
                )
                for index in range(self.config.routing.lanes)
            ]
        )

    def _services(self) -> ServiceDirectory:
        cfg = self.config
        services = ServiceDirectory(cfg.domain)
        on_quota = self._quota_refused
        self.allocation = allocation = AllocationService(
            cfg.domain,
            self.table,
            self.monitor,
            self.routes,
            cfg.routing.max_allocation_block,
            cfg.quotas.addresses,
            on_quota,
            cfg.registry.builtin.names_released_for_seconds,
            Bound(
                "addresses",
                cfg.quotas.addresses_per_client,
                cfg.quotas.addresses_total,
                self.metrics.bound_refused,
            ),
            self._client_of,
        )
        self.table.on_allocations_removed = allocation.let_go
        for endpoint in ENDPOINTS:
            services.add_endpoint(endpoint, allocation)
        services.add_endpoint(
            "sm",
            SubscriptionService(
                self.table,
                self.monitor,
                self.routes,
                cfg.quotas.subscriptions,
                on_quota,
                self._peer_subscriptions.subscription_changed
                if self._peer_subscriptions is not None
                else None,
                lambda r, address: self.policy.check_subscription(
                    r.runtime_url, r.identity, address
                ),
                allocation.claim,
            ),
        )
        registry, global_registry, unknown = self._connectors
        services.set_connectors(registry, global_registry, IdmService(self._identity_of), unknown)
        return services

    def _own_lane_delivered(self, room_id: str) -> int | None:
        """The number of the last event of this process's lane ``room_id`` delivered, or None
        when the room is not one of its lanes."""
        for lane in self.lanes or ():
            if lane.room_id == room_id:
                return lane.delivered_number
        return None

    async def _claim_in_use(self, claim: str) -> bool:
        """Whether anything is still registered under a runtime credential's claim (only the
        built-in registry's entries are known to this node)."""
        return self.registry is not None and await self.registry.backend.claim_in_use(claim)

    def _asked_by(self, session_id: int) -> AskedRequests | None:
        session = self.sessions.get(session_id)
        return session.asked if session is not None else None

    def _quota_refused(self, quota: str) -> None:
        self.metrics.quota_refusals.labels(quota).inc()

    def _client_of(self, session_id: int) -> str:
        session = self.sessions.get(session_id)
        return session.client if session is not None else ""

    def _waiting_bytes(self, session_id: int, sender: str) -> Waiting:
        session = self.sessions.get(session_id)
        if session is None:
            return Waiting(0, 0)
        mailbox, tally = session.mailbox, self.sessions.tally
        return Waiting(
            mailbox.waiting_bytes,
            mailbox.waiting_from(sender),
            tally.of(session.client),
            tally.total,
        )

    async def _policy_changed(self, action: str, rule_id: str | None, rule: Any) -> None:
        self.journal.policy(action, rule_id, rule)
        log.info("policy changed", action=action, rule=rule_id)

    def _authenticator(self) -> Authenticator:
        auth = self.config.auth
        oidc = None
        if auth.oidc is not None:
            oidc = OidcVerifier(
                self._http,
                issuer=auth.oidc.issuer,
                audience=auth.oidc.audience,
                jwks_uri=auth.oidc.jwks_uri,
                algorithms=auth.oidc.algorithms,
            )
        return Authenticator(
            auth.mode, MatrixTokenVerifier(self._http, self.config.homeserver.url), oidc
        )

    async def _identity_of(self, origin: str) -> Identity | None:
        """The identity the runtime behind ``origin`` (its runtime URL or an address it owns)
        proved, for the IdM's assertion checks."""
        owner = self.monitor.holder(origin)
        session = self.sessions.get(owner) if owner is not None else None
        return session.identity if session is not None else None

    def _follow_presence(self, lifecycle: Lifecycle, registry: BuiltinRegistry) -> None:
        """Registrations follow their runtime's connection. A stop of the node itself is not
        the runtimes going away: they reconnect to the next run."""
        presence = registry.presence

        def when_running(hook: Callable[[str], Coroutine[Any, Any, None]]) -> Any:
            return lambda s: self._spawn(hook(s.claim)) if self.running else None

        lifecycle.detached.append(when_running(presence.runtime_away))
        lifecycle.attached.append(when_running(presence.runtime_back))
        lifecycle.released.append(when_running(presence.runtime_away))

    def _retire_origin(self, origin: str) -> None:
        """What is kept per origin goes once the origin's last messages are through (a lane
        delivers within seconds; a replay after a crash reads the marks from the database)."""
        asyncio.get_running_loop().call_later(RETIRED_ORIGIN_SECONDS, self._forget_origin, origin)

    def _forget_origin(self, origin: str) -> None:
        self.delivery.forget(origin)
        self.settlement.forget(origin)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._background.spawn(coro)

    # -- lifecycle --------------------------------------------------------------------------

    def _homeserver_api(
        self, cfg: NodeConfig, connections: int
    ) -> tuple[aiohttp.ClientSession, AppserviceAPI]:
        """An HTTP session of ``connections`` pooled connections and the API client over it."""
        http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, ttl_dns_cache=300)
        )
        client = HomeserverClient(
            cfg.homeserver.url,
            cfg.appservice.as_token,
            http,
            metrics=self.as_metrics,
            max_retries=cfg.homeserver.max_retries,
            request_timeout=cfg.homeserver.request_timeout_seconds,
        )
        return http, AppserviceAPI(
            client, cfg.homeserver.server_name, cfg.appservice.sender_localpart
        )

    async def start(self) -> None:
        cfg = self.config
        if self._shared_routes is not None:
            assert self._processes is not None
            await self._processes.install_announcements()
            # Listening before the state is read: no change falls between the two.
            self._shared_routes.start()
            async with asyncio.timeout(cfg.homeserver.request_timeout_seconds):
                await self._shared_routes.listening.wait()
        await self._load_state()

        as_hosts = KnownHosts(
            [*cfg.appservice.public_hosts, url_host(cfg.appservice.url)],
            "appservice.public_hosts",
        )
        as_app = web.Application(
            client_max_size=cfg.appservice.max_body_bytes, middlewares=[as_hosts.middleware]
        )
        queries = NamespaceQueries(self.api, self._session_rows, cfg.appservice.user_prefix)
        handler: TransactionHandler = self.inbound
        if self._dashboard_tap is not None:
            handler = TappedTransactions(self.inbound, self._dashboard_tap)
        AppserviceServer(
            cfg.appservice.hs_token, handler, self._transactions, queries, self.as_metrics
        ).add_routes(as_app)
        HealthEndpoints(
            {"homeserver": self._probe_homeserver, "database": self._probe_database}, self.metrics
        ).add_routes(as_app)
        if self.dashboard is not None:
            self.dashboard.add_routes(as_app)
        if self.registry is not None:
            if self.registry.rest_api is not None:
                self.registry.rest_api.add_routes(as_app)
            self.registry.start()
        if cfg.policy_api.token is not None:
            as_app.add_routes(
                PolicyApi(self._rule_store, cfg.policy_api.token, self._policy_changed).routes()
            )
        self.appservice_port = await self._listen(
            as_app, cfg.appservice.listen.host, cfg.appservice.listen.port
        )

        self.running = True
        self._tasks += [
            asyncio.create_task(self._ping_homeserver(), name="hs-ping"),
            asyncio.create_task(self._maintenance(), name="maintenance"),
            asyncio.create_task(self._expire_sessions(), name="session-expiry"),
            asyncio.create_task(self.settlement.run(), name="checkpoints"),
            asyncio.create_task(
                watch_event_loop(self.metrics.loop_lag, beat=self._stall_watch.beat),
                name="loop-lag",
            ),
        ]
        self._unwatch_gc = watch_garbage_collector(
            self.metrics.gc_pause, self._stall_watch.collected
        )
        if cfg.logging.report_loop_stalls_over_ms:
            self._stall_watch.start()
        gc_config = self.config.gc
        if gc_config.paced:
            collector = Collector(gc_config.thresholds, gc_config.min_interval_seconds)
            self._tasks.append(asyncio.create_task(collector.run(), name="gc"))
        positions = await self._checkpoints.positions()
        if self.lanes is not None:
            recovery = LaneRecovery(
                self.api.bot, positions, self.rooms.adopted, self._checkpoints.save_position
            )
            self._tasks += [
                asyncio.create_task(lane.start(recovery), name=f"lane-{lane.index}-start")
                for lane in self.lanes
            ]
        if self.peer_feeds is not None:
            await self.peer_feeds.start(positions)
        if self.siblings is not None:
            # Runtimes only once the other processes' lanes are read from here: a lane read
            # from its end (a process new to the domain) must not start after a message for
            # a runtime this process already took.
            await self._join_cluster(positions)
            assert self._take_over is not None
            await self._take_over.finish_unfinished(self._unfinished)
            self._unfinished = []
        stub_app = web.Application(
            middlewares=[KnownHosts(cfg.stub.known_hosts, "stub.public_hosts").middleware]
        )
        WebPages(cfg.domain, StubFiles(), cfg.stub.public_url).add_routes(stub_app)
        self.stub_endpoint.add_routes(stub_app)
        self.stub_port = await self._listen(stub_app, cfg.stub.listen.host, cfg.stub.listen.port)
        if self.dashboard is not None:
            self.dashboard.start()
        if self._dashboard_worker is not None:
            self._dashboard_worker.start()
        if self._dashboard_tap is not None:
            self._dashboard_tap.start()
        log.info(
            "node started",
            appservice=f"http://{cfg.appservice.listen.host}:{self.appservice_port}",
            stub=f"ws://{cfg.stub.listen.host}:{self.stub_port}/stub/connect",
            homeserver=cfg.homeserver.url,
            sessions=len(self.sessions),
        )

    async def _load_state(self) -> None:
        """Sessions (all detached), the routing table and the senders' marks as the database
        left them. Every start is counted: its number is the high part of the numbers the node
        hands out, so they never repeat across restarts."""
        if self.config.stub.session_secret is None:
            # Tokens must outlive a restart: a protected session is resumed only with one.
            self._tokens.secret = await self._secrets.get_or_create(
                "session-tokens", lambda: secrets.token_urlsafe(32)
            )
        # Addresses of numbered requests are named by it: the same across restarts.
        self.allocation.secret = bytes.fromhex(
            await self._secrets.get_or_create("allocation-names", lambda: secrets.token_hex(32))
        )
        epoch = await self._checkpoints.next_start()
        self.publisher.begin(epoch)
        if self._to_peers is not None:
            self._to_peers.begin(epoch)
        marks = await self._checkpoints.marks()
        self.settlement.restore(marks)
        self.delivery.restore(marks)
        if self.peer_feeds is not None:
            # What peers' senders left is held to their bounds (it is theirs to mint).
            self.peer_feeds.restore_marks(list(marks))
        await self._rule_store.load()
        await self.sessions.load(epoch, await self._pending.stored())
        if self._take_over is not None:
            self._unfinished = await self._take_over.hold_unfinished()
        await self._load_routes(lambda _session_id: True)
        for address, domain, runtime in await self._remote_subscriptions.all():
            self.table.subscribe_domain(domain, runtime, [address])

    async def _load_routes(self, include: Callable[[int], bool]) -> None:
        """The routes of the sessions ``include`` admits, as the database has them: every
        session's, the other processes' too (their runtimes are addresses here)."""
        if self.config.cluster.enabled:
            for session_id, runtime_url in await self._session_rows.runtimes():
                if include(session_id) and self.sessions.get(session_id) is None:
                    self.table.add_runtime(session_id, runtime_url)
        by_key: dict[tuple[int, str | None], list[str]] = {}
        for row in await self.routes.allocations():
            if include(row.session_id):
                by_key.setdefault((row.session_id, row.allocation_key), []).append(row.address)
        for (session_id, key), addresses in by_key.items():
            self.table.add_allocations(session_id, addresses, key)
        # What an older node stored under looser rules is left out: the monitor judges each
        # of this process's sessions' subscriptions and learned routes again.
        dropped = 0
        for address, session_id in await self.routes.subscriptions():
            session = self.sessions.get(session_id)
            if not include(session_id):
                continue
            if session is not None and self.monitor.subscribe_to(session, address) is not None:
                dropped += 1
                continue
            self.table.subscribe(session_id, [address])
        for address, session_id in await self.routes.learned():
            session = self.sessions.get(session_id)
            if not include(session_id):
                continue
            if session is not None and isinstance(
                self.monitor.speak_from(session, address), Refusal
            ):
                dropped += 1
                continue
            self.table.learn(session_id, address)
        if dropped:
            log.warning("routes the ownership rules refuse were not loaded", routes=dropped)

    async def _reload_shared_routes(self) -> None:
        """The other processes' part of the routing table, read again whole (what they
        changed while this process did not listen was not heard)."""

        def elsewhere(session_id: int) -> bool:
            return self.sessions.get(session_id) is None

        for session_id in self.table.sessions():
            if elsewhere(session_id):
                self.table.remove_session(session_id)
        await self._load_routes(elsewhere)

    async def _take_sessions_of(self, holder: str, runtime_url: str) -> bool:
        """Until this process has joined, its lanes are not listed with the others, and the
        reading again of a take-over would miss them: the runtime connects again later."""
        assert self._take_over is not None
        return self.membership is not None and await self._take_over(holder, runtime_url)

    async def _take_from_the_gone(self, holder: str) -> None:
        assert self._take_over is not None
        await self._take_over.gone(holder)

    def _hand_over(self, runtime_url: str, to: str) -> None:
        assert self._take_over is not None
        if self.running:
            self._spawn(self._take_over.give(runtime_url, to))

    async def _processes_changed(self) -> None:
        if self.membership is not None:
            await self.membership.refresh()

    async def _join_cluster(self, positions: dict[str, str]) -> None:
        """Once this process's lanes are ready: announce them, and read the others'."""
        assert self.lanes is not None and self.siblings is not None
        cluster = self.config.cluster
        assert self._processes is not None and cluster.process is not None
        lanes = list(self.lanes)
        for lane in lanes:
            await lane.ready.wait()
        membership = Membership(
            self._processes,
            cluster.process,
            self.siblings,
            positions,
            cluster.heartbeat_seconds,
            cluster.gone_after_seconds,
            self._take_from_the_gone,
            self._on_struck,
            sends_on=self.peers is not None and self.federation is not None,
        )
        await retry(  # the database or homeserver may be away
            lambda: membership.join([(lane.room_id or "", lane.last_number) for lane in lanes]),
            Backoff(0.25, 5.0),
            on_retry=lambda exc, _delay: log.warning(
                "joining the domain's processes failed; retrying", error=repr(exc)
            ),
        )
        self.membership = membership

    async def _listen(self, app: web.Application, host: str, port: int) -> int:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        # A crowd of runtimes connects at once (a node restart, a page of hundreds of stubs):
        # a short listen queue drops connections, which then wait for TCP's retry (1 s, 3 s).
        # A domain's processes on one machine share the ports: the kernel spreads connections.
        site = web.TCPSite(
            runner,
            host,
            port,
            reuse_address=True,
            reuse_port=self.config.cluster.enabled,
            backlog=LISTEN_BACKLOG,
        )
        await site.start()
        self._runners.append(runner)
        # The bound port, which differs from the configured one when that was 0.
        return int(runner.addresses[-1][1])

    async def stop(self) -> None:
        """Stop without losing anything: read no more frames, send what the lanes hold and
        deliver it, give live stubs a moment to acknowledge, store the rest, then close."""
        if not self.running:
            return
        self.running = False
        self._unwatch_gc()
        self._stall_watch.stop()
        if self.dashboard is not None:
            await self.dashboard.stop()
        if self._dashboard_worker is not None:
            await self._dashboard_worker.stop()
        await self.stub_endpoint.stop_reading(SHUTDOWN_FLUSH_SECONDS)
        if self.lanes is not None:
            await self._flush_lanes()
            if self.federation is not None:
                await self.federation.flush(SHUTDOWN_FLUSH_SECONDS)
            await self._acks.flush()
            await self._await_acknowledgements(SHUTDOWN_ACK_SECONDS)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        try:
            await self.settlement.checkpoint(final=True)
        except Exception:
            log.exception("final checkpoint failed; the next start recovers from the last one")
        await self.stub_endpoint.close_all()
        for runner in reversed(self._runners):
            await runner.shutdown()
        if self.journal.stream is not None:
            await self.journal.stream.flush(SHUTDOWN_FLUSH_SECONDS)
            await self.journal.stream.close()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self._dashboard_tap is not None:
            await self._dashboard_tap.stop()
        if self.registry is not None:
            await self.registry.stop()
        if self.federation is not None:
            await self.federation.close()
        if self.peer_feeds is not None:
            await self.peer_feeds.close()
        if self.membership is not None:
            await self.membership.close()
        if self.siblings is not None:
            await self.siblings.close()
        if self._take_over is not None:
            await self._take_over.close()
        if self._shared_routes is not None:
            await self._shared_routes.close()
        await self._background.stop(cancel=False)
        await self._http.close()
        await self._peer_http.close()
        await self.db.dispose()
        log.info("node stopped")

    async def _flush_lanes(self) -> None:
        assert self.lanes is not None
        lanes = list(self.lanes)
        flushed = await asyncio.gather(*(lane.flush(SHUTDOWN_FLUSH_SECONDS) for lane in lanes))
        for lane, done in zip(lanes, flushed, strict=True):
            left = await lane.close()
            if not done or left:
                # Not lost: their stubs (if they number messages) send them again to the next
                # run; a plain stub's are gone, as the README says.
                log.warning(
                    "messages not sent to the homeserver before shutdown",
                    lane=lane.index,
                    unsent=left,
                )

    async def _await_acknowledgements(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.settlement.awaiting_acknowledgements():  # noqa: ASYNC110 - polled
                    await asyncio.sleep(0.02)

    # -- background work --------------------------------------------------------------------

    async def _ping_homeserver(self) -> None:
        """Tell the homeserver we are up: it then retries its queued transactions at once
        instead of waiting out its back-off (up to minutes after an outage of the node)."""
        duration = await retry(  # kept trying; /health shows the state meanwhile
            lambda: self.api.ping(self.config.appservice.id),
            Backoff(1.0, 60.0),
            on_retry=lambda exc, delay: log.warning(
                "homeserver ping failed; retrying", error=str(exc), retry_in=delay
            ),
        )
        log.info("homeserver ping answered", round_trip_ms=duration)

    async def _maintenance(self) -> None:
        keep_marks = max(
            TRANSACTION_RETENTION, timedelta(seconds=2 * self.config.stub.session_ttl_seconds)
        )
        while True:
            try:
                pruned = await self._transactions.prune(TRANSACTION_RETENTION)
                forgotten = await self._checkpoints.prune_marks(keep_marks)
                named = timedelta(seconds=self.config.registry.builtin.names_released_for_seconds)
                released = await self.routes.forget_released(utcnow() - named)
                # Shared texts of kept deliveries nobody waits for any more; one written in
                # the last minutes may belong to a checkpoint still being committed.
                swept = await self._pending.sweep(utcnow() - KEPT_PAYLOAD_GRACE)
                if pruned or forgotten or released or swept:
                    log.info(
                        "pruned",
                        transactions=pruned,
                        sender_marks=forgotten,
                        released_addresses=released,
                        kept_payloads=swept,
                    )
            except Exception:
                log.exception("maintenance failed")
            await asyncio.sleep(MAINTENANCE_INTERVAL)

    async def _expire_sessions(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_INTERVAL)
            try:
                await self.sessions.expire()
            except Exception:
                log.exception("session expiry failed")

    # -- health probes ----------------------------------------------------------------------

    async def _probe_homeserver(self) -> dict[str, Any]:
        versions = await self.api.versions()
        return {"url": self.config.homeserver.url, "versions": versions.get("versions", [])[-3:]}

    async def _probe_database(self) -> dict[str, Any]:
        await self.db.run(lambda conn: conn.execute(text("SELECT 1")))
        return {"backend": self.db.dialect}
