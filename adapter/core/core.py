"""The core: what every domain's node has, built once. Storage, the homeserver API, metrics,
the routing table and its reference monitor, sessions, the message walk (journal, delivery,
lanes, publisher, ingress), inbound events, settlement and the stub endpoint.

Features (federation, the domain's other processes, the dashboard, the built-in registry) attach
between the base parts and the message walk, through the named hooks of hooks.py; the core
imports none of them (a contract of pyproject.toml's import-linter checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import structlog
from prometheus_client import CollectorRegistry

from appservice.api import HomeserverClient
from appservice.intent import AppserviceAPI
from appservice.metrics import AppserviceMetrics

from .. import carrier
from ..access import AccessMonitor
from ..bounds import Bound, SessionShares
from ..carrier import Sender
from ..config import NodeConfig
from ..heap import Collector
from ..identity.authenticator import Authenticator
from ..identity.matrix import MatrixTokenVerifier
from ..identity.model import Identity
from ..identity.oidc import OidcVerifier
from ..observability import (
    LAG_PROBE_SECONDS,
    NodeMetrics,
    watch_event_loop,
    watch_garbage_collector,
)
from ..policies.engine import RuleEngine
from ..policies.store import PolicyStore
from ..routing.bounce import Bounce
from ..routing.delivery import Delivery
from ..routing.inbound import InboundEvents
from ..routing.ingress import Ingress, ServiceDirectory
from ..routing.journal import Journal
from ..routing.lanes import Lane, Lanes, Outboxes
from ..routing.local_origins import LocalOrigins, is_local
from ..routing.marks import SenderMarks
from ..routing.policy import MessageGate
from ..routing.publisher import Publisher, node_origin
from ..routing.recovery import LaneRecovery
from ..routing.rooms import RoomDirectory
from ..routing.settlement import Settlement
from ..routing.stream import BatchStream, StreamLimits, Traffic
from ..routing_table import RoutingTable
from ..services.allocation import ENDPOINTS, AllocationService
from ..services.connectors import build_connectors
from ..services.idm import IdmService
from ..services.registry import domain_registry_address
from ..services.subscriptions import SubscriptionService
from ..sessions.mailbox import Waiting, WaitingBounds
from ..sessions.registry import Lifecycle, SessionRegistry
from ..sessions.session import AskedRequests
from ..sessions.tokens import SessionTokens
from ..stalls import StallWatch
from ..storage.checkpoints import CheckpointStore
from ..storage.database import Database
from ..storage.pending import PendingStore
from ..storage.processes import application_name
from ..storage.remote import RemoteSubscriptionStore
from ..storage.rooms import RoomStore
from ..storage.routes import RouteStore
from ..storage.secrets import SecretStore
from ..storage.sessions import SessionStore
from ..storage.transactions import SqlTransactionStore
from ..stub.acks import AckSender
from ..stub.endpoint import StubEndpoint
from ..tasks import BackgroundTasks
from .hooks import Feature, Hooks
from .listeners import Listeners, appservice_app, stub_app
from .state import load_state
from .upkeep import (
    expire_sessions,
    maintenance,
    ping_homeserver,
)

log = structlog.get_logger(__name__)

SHUTDOWN_FLUSH_SECONDS = 10.0
# After the lanes are flushed at shutdown, how long live stubs get to acknowledge the last
# deliveries before what they have not acknowledged is stored for their resume.
SHUTDOWN_ACK_SECONDS = 1.0
# How long what is kept per origin stays after the origin is retired.
RETIRED_ORIGIN_SECONDS = 60.0
# The journal is for audit and analytics, not for latency: at most four events a second.
JOURNAL_INTERVAL = 0.25
# A lane sends what fits one event (inline or packed) until this much waits, about two events'
# worth; beyond, the backlog leaves in one media event (stream.py says why).
LANE_MEDIA_BACKLOG = 128 * 1024

# Builds the outbound seam from the delivery side; the default is the lanes through Matrix.
OutboxesFactory = Callable[[Delivery], Outboxes]


def homeserver_api(
    cfg: NodeConfig, connections: int, metrics: AppserviceMetrics
) -> tuple[aiohttp.ClientSession, AppserviceAPI]:
    """An HTTP session of ``connections`` pooled connections and the API client over it."""
    http = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, ttl_dns_cache=300)
    )
    client = HomeserverClient(
        cfg.homeserver.url,
        cfg.appservice.as_token,
        http,
        metrics=metrics,
        max_retries=cfg.homeserver.max_retries,
        request_timeout=cfg.homeserver.request_timeout_seconds,
    )
    return http, AppserviceAPI(client, cfg.homeserver.server_name, cfg.appservice.sender_localpart)


class Core:
    """Built in three steps: the base parts (here), the features' ``attach``, then
    ``assemble`` (the message walk, from what the features registered)."""

    def __init__(
        self,
        config: NodeConfig,
        metrics_registry: CollectorRegistry | None = None,
        outboxes: OutboxesFactory | None = None,
    ) -> None:
        self.config = config
        self.hooks = Hooks()
        self.features: list[Feature] = []
        self._outboxes_factory = outboxes
        collector = metrics_registry or CollectorRegistry()
        self.metrics = NodeMetrics(collector)
        self.as_metrics = AppserviceMetrics(collector)
        self._build_storage()
        # The homeserver, through one pooled HTTP session for every request. Peers' rooms
        # (joining, reading, their media, confirmations) go through a pool of their own: a peer
        # whose media hangs holds its own connections, never this domain's.
        self.http, self.api = homeserver_api(config, 64, self.as_metrics)
        self.peer_http, self.peer_api = homeserver_api(
            config, config.federation.peer_connections, self.as_metrics
        )
        self.rooms = RoomDirectory(
            self.api,
            RoomStore(self.db),
            config.appservice.user_prefix,
            config.appservice.alias_prefix,
            persisters=config.homeserver.event_persisters,
            process=self.process,
        )
        self._build_routing_state()
        self.sessions = self._build_sessions()
        self.metrics.sessions.set_function(lambda: len(self.sessions))
        self.metrics.tasks.set_function(lambda: len(asyncio.all_tasks()))
        # The message walk starts here; the rest of it is assembled once the features attached.
        self.traffic = Traffic()
        self.journal = Journal(self._journal_stream() if config.routing.journal else None)
        self.bounce = Bounce(self.sessions, self.journal)
        self.running = False
        self.appservice_port: int | None = None
        self.stub_port: int | None = None
        self.listeners = Listeners(reuse_port=config.cluster.enabled)
        self._tasks: list[asyncio.Task[Any]] = []
        self._unwatch_gc: Callable[[], None] = lambda: None

    @property
    def process(self) -> str | None:
        """This process's name when the domain runs several, else None."""
        return self.config.cluster.process

    def _build_storage(self) -> None:
        cfg, process = self.config, self.process
        self.db = Database(
            cfg.database.url,
            echo=cfg.database.echo,
            synchronous_commit=cfg.database.synchronous_commit,
            application_name=application_name(process) if process is not None else None,
        )
        self.session_rows = SessionStore(self.db, holder=process)
        self.pending = PendingStore(self.db)
        self.checkpoints = CheckpointStore(self.db, process or "")
        self.secrets = SecretStore(self.db)
        self.transactions = SqlTransactionStore(self.db)
        self.routes = RouteStore(self.db)
        self.remote_subscriptions = RemoteSubscriptionStore(self.db)

    def _build_routing_state(self) -> None:
        cfg = self.config
        self.table = RoutingTable()
        # The reference monitor: every "may this runtime use this address" is its decision.
        self.monitor = AccessMonitor(cfg.domain, self.table, cfg.federation.peers, self._asked_by)
        # The operator's rules, managed at run time through the policy API (stored).
        self.rules = RuleEngine()
        self.rule_store = PolicyStore(self.db, self.rules)
        self.policy = MessageGate(cfg.policy, self.rules)
        # Per sender id, the highest number routed and settled: delivery and settlement share it.
        self.sender_marks = SenderMarks()
        # What may wait for a runtime: checked for a message's direct destinations as it comes
        # in (its sender is refused) and for every runtime it reaches as it is delivered.
        self.waiting_bounds = WaitingBounds.of(cfg.quotas)
        self.settlement = Settlement(self.checkpoints, self.metrics, self.sender_marks)
        self.acks = AckSender()
        self._background = BackgroundTasks(
            "node", self.metrics.background_failures.labels("node").inc
        )
        self.tokens = SessionTokens(cfg.stub.session_secret, cfg.stub.session_ttl_seconds)

    def _build_sessions(self) -> SessionRegistry:
        cfg = self.config
        self.lifecycle = Lifecycle(
            added=[lambda s: self.table.add_runtime(s.id, s.runtime_url)],
            released=[
                lambda s: self.table.remove_session(s.id),
                lambda s: self.policy.forget(s.id),
            ],
            retired=[self._retire_origin],
        )
        return SessionRegistry(
            self.session_rows,
            self.pending,
            self.tokens,
            self.rooms.virtual_user,
            self.metrics.stub_connections.labels("attached"),
            cfg.stub.session_ttl_seconds,
            self.lifecycle,
            self.settlement.mailbox_dirty,
            self.acks.mark,
            cfg.stub.max_detached_sessions,
            self.metrics.sessions_evicted.inc,
            lambda parcels: self.spawn(self.delivery.unreceived(parcels)),
            self.process,
            self._take_sessions_of if self.process is not None else None,
            self._claim_in_use,
            Bound(
                "sessions",
                cfg.stub.max_sessions_per_client,
                cfg.stub.max_sessions,
                self.metrics.bound_refused,
            ),
        )

    # -- features -----------------------------------------------------------------------------

    def attach(self, feature: Feature) -> None:
        """Let ``feature`` build its parts and register its hooks (before ``assemble``)."""
        feature.attach(self)
        self.features.append(feature)

    def assemble(self) -> None:
        """The rest of the message walk, from the base parts and the features' hooks."""
        cfg, hooks = self.config, self.hooks
        self.delivery = Delivery(
            self.monitor,
            self.sessions,
            self.journal,
            self.metrics,
            self.sender_marks,
            self.waiting_bounds,
            hooks.foreign,
            hooks.send_on,
        )
        self.local_origins = self._local_origins()
        self.lanes: Lanes | None = None
        if self._outboxes_factory is None:
            self.lanes = self._build_lanes()
            self.outboxes: Outboxes = self.lanes
        else:
            self.outboxes = self._outboxes_factory(self.delivery)
        self.publisher = Publisher(
            self.outboxes,
            Sender(
                node_origin(self.process), domain_registry_address(cfg.domain), self.api.bot.user_id
            ),
            self.monitor,
            hooks.peer_links,
        )
        self.connectors = build_connectors(cfg, self.http, hooks.registry_service)
        self.ingress = self._build_ingress()
        self.inbound = InboundEvents(self.metrics)
        self.stub_endpoint = StubEndpoint(
            cfg.stub,
            cfg.domain,
            self.sessions,
            self.ingress,
            self._authenticator(),
            self.journal,
            self.acks,
            self.metrics,
            cfg.routing.max_backlog_bytes_per_connection,
        )
        self.stall_watch = StallWatch(
            cfg.logging.report_loop_stalls_over_ms / 1000,
            LAG_PROBE_SECONDS,
            lambda _stack: self.metrics.loop_stalls.inc(),
        )
        for built in hooks.assembled:
            built()

    # -- parts --------------------------------------------------------------------------------

    def _local_origins(self) -> LocalOrigins:
        """This domain's runtimes' sender marks, bounded per client and in total: the marks
        tell of each origin's first one."""
        quotas = self.config.quotas
        origins = LocalOrigins(
            self._client_of_origin,
            self._drop_local_origins,
            quotas.marks_per_client,
            quotas.marks_total,
            self.metrics.bound_refused,
        )
        self.sender_marks.on_new_origin = origins.seen
        return origins

    def stream_limits(self, min_interval: float = 0.0, one_event_below: int = 0) -> StreamLimits:
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
            self.stream_limits(JOURNAL_INTERVAL),
            traffic=self.traffic,
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
                    self.stream_limits(one_event_below=LANE_MEDIA_BACKLOG),
                    self.traffic,
                    self.bounce.refused,
                )
                for index in range(self.config.routing.lanes)
            ]
        )

    def _build_ingress(self) -> Ingress:
        cfg = self.config
        return Ingress(
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
            self.waiting_bounds,
            cfg.routing.backpressure_seconds,
            self.hooks.abroad,
            self.hooks.catch_up,
            claim=self.allocation.claim,
            learned=SessionShares(
                Bound(
                    "learned_routes",
                    cfg.quotas.learned_routes_per_client,
                    cfg.quotas.learned_routes_total,
                    self.metrics.bound_refused,
                ),
                self.client_of,
            ),
        )

    def _services(self) -> ServiceDirectory:
        cfg = self.config
        services = ServiceDirectory(cfg.domain)
        self.allocation = allocation = AllocationService(
            cfg.domain,
            self.table,
            self.monitor,
            self.routes,
            cfg.routing.max_allocation_block,
            cfg.quotas.addresses,
            self._quota_refused,
            cfg.registry.builtin.names_released_for_seconds,
            Bound(
                "addresses",
                cfg.quotas.addresses_per_client,
                cfg.quotas.addresses_total,
                self.metrics.bound_refused,
            ),
            self.client_of,
        )
        self.table.on_allocations_removed = allocation.let_go
        for endpoint in ENDPOINTS:
            services.add_endpoint(endpoint, allocation)
        services.add_endpoint("sm", self._subscription_service())
        registry, global_registry, unknown = self.connectors
        services.set_connectors(registry, global_registry, IdmService(self._identity_of), unknown)
        return services

    def _subscription_service(self) -> SubscriptionService:
        """The subscription manager, its subscriptions bounded per session, per client and in
        total (what a start reads back is counted by ``restore``: state.py)."""
        quotas = self.config.quotas
        self.subscription_service = SubscriptionService(
            self.table,
            self.monitor,
            self.routes,
            quotas.subscriptions,
            self._quota_refused,
            self.hooks.subscription_changed,
            lambda r, address: self.policy.check_subscription(r.runtime_url, r.identity, address),
            self.allocation.claim,
            Bound(
                "subscriptions",
                quotas.subscriptions_per_client,
                quotas.subscriptions_total,
                self.metrics.bound_refused,
            ),
            self.client_of,
        )
        return self.subscription_service

    def _authenticator(self) -> Authenticator:
        auth = self.config.auth
        oidc = None
        if auth.oidc is not None:
            oidc = OidcVerifier(
                self.http,
                issuer=auth.oidc.issuer,
                audience=auth.oidc.audience,
                jwks_uri=auth.oidc.jwks_uri,
                algorithms=auth.oidc.algorithms,
            )
        return Authenticator(
            auth.mode, MatrixTokenVerifier(self.http, self.config.homeserver.url), oidc
        )

    # -- what the parts ask of each other -----------------------------------------------------

    async def _take_sessions_of(self, holder: str, runtime_url: str) -> bool:
        take = self.hooks.take_sessions
        return take is not None and await take(holder, runtime_url)

    async def _claim_in_use(self, claim: str) -> bool:
        """Whether anything is still registered under a runtime credential's claim (only the
        built-in registry's entries are known to this node)."""
        in_use = self.hooks.claim_in_use
        return in_use is not None and await in_use(claim)

    def _asked_by(self, session_id: int) -> AskedRequests | None:
        session = self.sessions.get(session_id)
        return session.asked if session is not None else None

    def _quota_refused(self, quota: str) -> None:
        self.metrics.quota_refusals.labels(quota).inc()

    def client_of(self, session_id: int) -> str:
        """The client of the session (its share of the per-client bounds; "" when gone)."""
        session = self.sessions.get(session_id)
        return session.client if session is not None else ""

    def _client_of_origin(self, origin: str) -> str:
        session = self.sessions.by_origin(origin)
        return session.client if session is not None else ""

    def _waiting_bytes(self, session_id: int, sender: str) -> Waiting:
        session = self.sessions.get(session_id)
        return Waiting(0, 0) if session is None else self.sessions.waiting(session, sender)

    async def _identity_of(self, origin: str) -> Identity | None:
        """The identity the runtime behind ``origin`` (its runtime URL or an address it owns)
        proved, for the IdM's assertion checks."""
        owner = self.monitor.holder(origin)
        session = self.sessions.get(owner) if owner is not None else None
        return session.identity if session is not None else None

    def _retire_origin(self, origin: str) -> None:
        """What is kept per origin goes once the origin's last messages are through (a lane
        delivers within seconds; a replay after a crash reads the marks from the database)."""
        asyncio.get_running_loop().call_later(RETIRED_ORIGIN_SECONDS, self._forget_origin, origin)

    def _forget_origin(self, origin: str) -> None:
        self.local_origins.gone([origin])

    def _drop_local_origins(self, origins: list[str]) -> None:
        """Those sender ids' marks go, from memory and (at the next checkpoint) the database."""
        self.settlement.let_go(origins)

    def restore_local_origins(self, marks: dict[str, int]) -> None:
        """The local origins whose marks the database kept, as of a start (once the sessions
        are read back: each counts under its session's client). Marks of sessions that are gone
        go once the lanes have replayed what they carry; with several processes, an origin
        unknown here may be another process's, and stays."""
        self.local_origins.restore(marks)
        if self.config.cluster.enabled:
            return
        stale = [o for o in marks if is_local(o) and self.sessions.by_origin(o) is None]
        if stale:
            asyncio.get_running_loop().call_later(
                RETIRED_ORIGIN_SECONDS, self.local_origins.gone, stale
            )

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background; the stop waits for it."""
        self._background.spawn(coro)

    # -- start and stop -----------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        for step in self.hooks.before_load:
            await step()
        await load_state(self)
        self.appservice_port = await self.listeners.listen(
            appservice_app(self), cfg.appservice.listen.host, cfg.appservice.listen.port
        )
        self.running = True
        self._start_background()
        positions = await self.checkpoints.positions()
        if self.lanes is not None:
            recovery = LaneRecovery(
                self.api.bot, positions, self.rooms.adopted, self.checkpoints.save_position
            )
            self._tasks += [
                asyncio.create_task(lane.start(recovery), name=f"lane-{lane.index}-start")
                for lane in self.lanes
            ]
        for started in self.hooks.lanes_started:
            await started(positions)
        self.stub_port = await self.listeners.listen(
            stub_app(self), cfg.stub.listen.host, cfg.stub.listen.port
        )
        for feature in self.features:
            await feature.start()
        log.info(
            "node started",
            appservice=f"http://{cfg.appservice.listen.host}:{self.appservice_port}",
            stub=f"ws://{cfg.stub.listen.host}:{self.stub_port}/stub/connect",
            homeserver=cfg.homeserver.url,
            sessions=len(self.sessions),
        )

    def _start_background(self) -> None:
        self._tasks += [
            asyncio.create_task(ping_homeserver(self), name="hs-ping"),
            asyncio.create_task(maintenance(self), name="maintenance"),
            asyncio.create_task(expire_sessions(self), name="session-expiry"),
            asyncio.create_task(self.settlement.run(), name="checkpoints"),
            asyncio.create_task(
                watch_event_loop(self.metrics.loop_lag, beat=self.stall_watch.beat),
                name="loop-lag",
            ),
        ]
        self._unwatch_gc = watch_garbage_collector(
            self.metrics.gc_pause, self.stall_watch.collected
        )
        if self.config.logging.report_loop_stalls_over_ms:
            self.stall_watch.start()
        gc_config = self.config.gc
        if gc_config.paced:
            collector = Collector(gc_config.thresholds, gc_config.min_interval_seconds)
            self._tasks.append(asyncio.create_task(collector.run(), name="gc"))

    async def stop(self) -> None:
        """Stop without losing anything: read no more frames, send what the lanes hold and
        deliver it, give live stubs a moment to acknowledge, store the rest, then close."""
        if not self.running:
            return
        self.running = False
        self._unwatch_gc()
        self.stall_watch.stop()
        for step in self.hooks.stopping:
            await step()
        await self.stub_endpoint.stop_reading(SHUTDOWN_FLUSH_SECONDS)
        if self.lanes is not None:
            await self._flush_lanes()
            for flushed in self.hooks.lanes_flushed:
                await flushed()
            await self.acks.flush()
            await self._await_acknowledgements(SHUTDOWN_ACK_SECONDS)
        await self._stop_tasks()
        try:
            await self.settlement.checkpoint(final=True)
        except Exception:
            log.exception("final checkpoint failed; the next start recovers from the last one")
        self.sessions.closing()
        await self.stub_endpoint.close_all()
        # The listeners close; the journal is flushed between their shutdown and cleanup.
        await self.listeners.shutdown()
        if self.journal.stream is not None:
            await self.journal.stream.flush(SHUTDOWN_FLUSH_SECONDS)
            await self.journal.stream.close()
        await self.listeners.cleanup()
        for feature in self.features:
            await feature.stop()
        await self._background.stop(cancel=False)
        await self.http.close()
        await self.peer_http.close()
        await self.sessions.stop_writing_states()
        await self.db.dispose()
        log.info("node stopped")

    async def _stop_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

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
