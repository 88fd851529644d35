"""The composition root: builds the node's parts from its configuration, wires them together
and runs their listeners. Nothing here decides anything about messages.

Message path, for a reader finding their way:
  stub frame → stub/endpoint.py → routing/ingress.py (decide) → routing/stream.py (outbox, to
  Matrix) … homeserver … appservice/server.py → inbound.py → routing/delivery.py → sessions.py
  (socket, or kept for resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import weakref
from datetime import timedelta
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from appservice.api import HomeserverClient
from appservice.intent import AppserviceAPI
from appservice.metrics import AppserviceMetrics
from appservice.server import AppserviceServer

from .config import NodeConfig
from .inbound import InboundEvents
from .namespace import NamespaceQueries
from .observability import HealthEndpoints, NodeMetrics
from .policy import PolicyEngine
from .routing import carrier
from .routing.delivery import Delivery
from .routing.ingress import Ingress, ServiceDirectory
from .routing.journal import Journal
from .routing.rooms import RoomDirectory
from .routing.stream import BatchStream, StreamLimits, Traffic
from .routing.table import RoutingTable
from .services.allocation import ENDPOINTS, AllocationService
from .services.connectors import build_connectors
from .services.subscriptions import SubscriptionService
from .sessions import Session, SessionManager
from .storage.database import Database
from .storage.pending import PendingStore
from .storage.rooms import RoomStore
from .storage.routes import RouteStore
from .storage.sessions import SessionStore
from .storage.transactions import SqlTransactionStore
from .stub.endpoint import StubEndpoint
from .stub.tokens import SessionTokens
from .web_endpoints import WebPages

log = structlog.get_logger(__name__)

TRANSACTION_RETENTION = timedelta(days=7)
MAINTENANCE_INTERVAL = 3600.0
EXPIRY_INTERVAL = 60.0
SHUTDOWN_FLUSH_SECONDS = 10.0
# The journal is for audit and analytics, not for latency: at most four events a second.
JOURNAL_INTERVAL = 0.25


class Node:
    def __init__(self, config: NodeConfig, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.registry = registry or CollectorRegistry()
        self.metrics = NodeMetrics(self.registry)
        self.as_metrics = AppserviceMetrics(self.registry)
        self.db = Database(config.database.url, echo=config.database.echo)
        self.transactions = SqlTransactionStore(self.db)
        self.session_store = SessionStore(self.db)
        self.routes = RouteStore(self.db)
        self.table = RoutingTable()
        self.policy = PolicyEngine(config.policy, self.table)
        self.inbound = InboundEvents(self.metrics)
        self._http: aiohttp.ClientSession | None = None
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[Any]] = []
        # Streams still sending; a released runtime's outbox drops out once drained.
        self._streams: weakref.WeakSet[BatchStream[Any]] = weakref.WeakSet()
        self._message_encoder = carrier.MessageEncoder()
        self._traffic = Traffic()
        self.api: AppserviceAPI | None = None
        self.sessions: SessionManager | None = None
        self.rooms: RoomDirectory | None = None
        self.journal: Journal | None = None
        self.running = False
        self.appservice_port: int | None = None
        self.stub_port: int | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        self.api = self._build_homeserver_client()
        self.rooms = RoomDirectory(
            self.api,
            RoomStore(self.db),
            cfg.appservice.user_prefix,
            cfg.appservice.alias_prefix,
        )
        self.sessions = SessionManager(
            self.session_store,
            PendingStore(self.db),
            self.table,
            SessionTokens(cfg.stub.session_secret, cfg.stub.session_ttl_seconds),
            self.rooms.virtual_user,
            self.metrics,
            cfg.stub.session_ttl_seconds,
            on_release=self.policy.forget,
        )
        await self._load_state()
        self.journal = Journal(self._journal_stream() if cfg.routing.journal else None)
        ingress = self._build_ingress()
        delivery = Delivery(self.api, self.table, self.sessions, self.journal, self.metrics)
        self.inbound.subscribe(carrier.BATCH_EVENT, delivery.on_batch_events)

        as_app = web.Application(client_max_size=cfg.appservice.max_body_bytes)
        queries = NamespaceQueries(self.api, self.session_store, cfg.appservice.user_prefix)
        AppserviceServer(
            cfg.appservice.hs_token, self.inbound, self.transactions, queries, self.as_metrics
        ).add_routes(as_app)
        HealthEndpoints(
            {"homeserver": self._probe_homeserver, "database": self._probe_database}, self.metrics
        ).add_routes(as_app)
        self.appservice_port = await self._listen(
            as_app, cfg.appservice.listen.host, cfg.appservice.listen.port
        )

        stub_app = web.Application()
        WebPages(cfg.domain).add_routes(stub_app)
        StubEndpoint(
            cfg.stub,
            cfg.domain,
            self.sessions,
            ingress,
            self.metrics,
            cfg.routing.max_backlog_bytes_per_connection,
        ).add_routes(stub_app)
        self.stub_port = await self._listen(stub_app, cfg.stub.listen.host, cfg.stub.listen.port)

        self.running = True
        self._tasks += [
            asyncio.create_task(self._ping_homeserver(), name="hs-ping"),
            asyncio.create_task(self._maintenance(), name="maintenance"),
            asyncio.create_task(self._expire_sessions(), name="session-expiry"),
        ]
        log.info(
            "node started",
            appservice=f"http://{cfg.appservice.listen.host}:{self.appservice_port}",
            stub=f"ws://{cfg.stub.listen.host}:{self.stub_port}/stub/connect",
            homeserver=cfg.homeserver.url,
            sessions=len(self.sessions),
        )

    def _build_homeserver_client(self) -> AppserviceAPI:
        cfg = self.config
        # One pooled session for every virtual user; keep-alive connections to the homeserver.
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, ttl_dns_cache=300)
        )
        client = HomeserverClient(
            cfg.homeserver.url,
            cfg.appservice.as_token,
            self._http,
            metrics=self.as_metrics,
            max_retries=cfg.homeserver.max_retries,
            request_timeout=cfg.homeserver.request_timeout_seconds,
        )
        return AppserviceAPI(client, cfg.homeserver.server_name, cfg.appservice.sender_localpart)

    async def _load_state(self) -> None:
        """The routing table as the database left it: sessions detached, routes intact."""
        assert self.sessions is not None
        await self.sessions.load()
        by_key: dict[tuple[int, str | None], list[str]] = {}
        for row in await self.routes.allocations():
            by_key.setdefault((row.session_id, row.allocation_key), []).append(row.address)
        for (session_id, key), addresses in by_key.items():
            self.table.add_allocations(session_id, addresses, key)
        for address, session_id in await self.routes.subscriptions():
            self.table.subscribe(session_id, [address])
        for address, session_id in await self.routes.learned():
            self.table.learn(session_id, address)

    def _stream_limits(self, min_interval: float = 0.0) -> StreamLimits:
        r = self.config.routing
        return StreamLimits(
            max_batch_bytes=r.max_batch_bytes,
            max_queued_bytes=r.max_queued_bytes_per_runtime,
            min_interval=min_interval,
        )

    def _journal_stream(self) -> BatchStream[bytes]:
        assert self.rooms is not None
        stream: BatchStream[bytes] = BatchStream(
            "journal",
            carrier.JournalEncoder(),
            dict,
            self.rooms.journal,
            self.metrics,
            self._stream_limits(JOURNAL_INTERVAL),
            traffic=self._traffic,
            background=True,
        )
        self._streams.add(stream)
        return stream

    def outbox_for(self, session: Session) -> BatchStream[carrier.Outgoing]:
        """The runtime's outbox: its messages, in order, into its room (created on first use)."""
        if session.outbox is None:
            rooms = self.rooms
            assert rooms is not None
            url, session_id = session.runtime_url, session.id
            seq = itertools.count(1)
            session.outbox = BatchStream(
                f"outbox-{session_id}",
                self._message_encoder,
                lambda: {"runtime": url, "seq": next(seq)},
                lambda refresh: rooms.outbox(url, session_id, refresh),
                self.metrics,
                self._stream_limits(),
                traffic=self._traffic,
            )
            self._streams.add(session.outbox)
        return session.outbox

    def _build_ingress(self) -> Ingress:
        cfg = self.config
        assert self.journal is not None and self._http is not None
        services = ServiceDirectory(cfg.domain)
        allocation = AllocationService(
            cfg.domain, self.table, self.routes, cfg.routing.max_allocation_block
        )
        for endpoint in ENDPOINTS:
            services.add_endpoint(endpoint, allocation)
        services.add_endpoint("sm", SubscriptionService(self.table, self.routes))
        services.set_connectors(*build_connectors(cfg, self._http))
        return Ingress(
            self.table,
            services,
            self.outbox_for,
            self.journal,
            self.routes,
            self.policy,
            self.metrics,
            cfg.routing.backpressure_seconds,
        )

    async def _listen(self, app: web.Application, host: str, port: int) -> int:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        self._runners.append(runner)
        # The bound port, which differs from the configured one when that was 0.
        return int(runner.addresses[-1][1])

    async def stop(self) -> None:
        if not self.running:
            return
        self.running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        # Stubs first (close 1001: reconnect later), then give queued messages a chance to
        # reach the homeserver before the HTTP client goes away.
        for runner in reversed(self._runners):
            await runner.shutdown()
        await self._flush_streams()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        if self.sessions is not None:
            await self.sessions.persist_pending()
        if self._http is not None:
            await self._http.close()
            self._http = None
        await self.db.dispose()
        log.info("node stopped")

    async def _flush_streams(self) -> None:
        streams = list(self._streams)
        flushed = await asyncio.gather(*(s.flush(SHUTDOWN_FLUSH_SECONDS) for s in streams))
        for stream, done in zip(streams, flushed, strict=True):
            left = await stream.close()
            if not done or left:
                log.error(
                    "messages not sent to the homeserver before shutdown",
                    stream=stream.name,
                    unsent=left,
                )

    # -- background work --------------------------------------------------------------------

    async def _ping_homeserver(self) -> None:
        """Tell the homeserver we are up: it then retries its queued transactions at once
        instead of waiting out its back-off (up to minutes after an outage of the node)."""
        assert self.api is not None
        delay = 1.0
        while True:
            try:
                duration = await self.api.ping(self.config.appservice.id)
                log.info("homeserver ping answered", round_trip_ms=duration)
                return
            except Exception as exc:  # noqa: BLE001 - keep trying; /health shows the state
                log.warning("homeserver ping failed; retrying", error=str(exc), retry_in=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)

    async def _maintenance(self) -> None:
        while True:
            try:
                pruned = await self.transactions.prune(TRANSACTION_RETENTION)
                if pruned:
                    log.info("pruned processed transactions", count=pruned)
            except Exception:
                log.exception("maintenance failed")
            await asyncio.sleep(MAINTENANCE_INTERVAL)

    async def _expire_sessions(self) -> None:
        assert self.sessions is not None
        while True:
            await asyncio.sleep(EXPIRY_INTERVAL)
            try:
                await self.sessions.expire()
            except Exception:
                log.exception("session expiry failed")

    # -- health probes ----------------------------------------------------------------------

    async def _probe_homeserver(self) -> dict[str, Any]:
        assert self.api is not None
        versions = await self.api.versions()
        return {"url": self.config.homeserver.url, "versions": versions.get("versions", [])[-3:]}

    async def _probe_database(self) -> dict[str, Any]:
        await self.db.run(lambda conn: conn.execute(text("SELECT 1")))
        return {"backend": self.db.dialect}
