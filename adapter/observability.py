"""Structured logging, Prometheus metrics and the `/health` and `/metrics` endpoints."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from .config import LoggingConfig


def configure_logging(config: LoggingConfig) -> None:
    """Route stdlib and structlog records through one renderer (JSON lines or console)."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if config.format == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.level)
    # aiohttp logs every request at INFO; the node's own records say what matters.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


LAG_PROBE_SECONDS = 0.1


async def watch_event_loop(
    lag: Histogram, every: float = LAG_PROBE_SECONDS, beat: Callable[[], None] = lambda: None
) -> None:
    """Observe, forever, how much later than asked the loop wakes a sleeper; `beat` is called
    at every wake-up (the stall watch's heartbeat)."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time() + every
        await asyncio.sleep(every)
        beat()
        lag.observe(max(0.0, loop.time() - asked))


def watch_garbage_collector(
    pause: Histogram, collected: Callable[[int, float], None] = lambda _gen, _s: None
) -> Callable[[], None]:
    """Observe every collection's pause by generation, and tell `collected` (generation,
    seconds) once it ended; returns what stops observing."""
    started: list[float] = [0.0]

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            took = time.perf_counter() - started[0]
            pause.labels(str(info["generation"])).observe(took)
            collected(info["generation"], took)

    gc.callbacks.append(on_collection)
    return lambda: gc.callbacks.remove(on_collection)


class NodeMetrics:
    """The reTHINK side's metrics; the Matrix side registers its own on the same registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._add_connection_metrics(registry)
        self._add_event_loop_metrics(registry)
        self._add_message_metrics(registry)
        self._add_homeserver_metrics(registry)
        self._add_peer_metrics(registry)
        self.health_check_seconds = Gauge(
            "rethink_mn_health_check_seconds",
            "Duration of the last health probe, by component.",
            ["component"],
            registry=registry,
        )

    def _add_connection_metrics(self, registry: CollectorRegistry) -> None:
        """Stub sockets, sessions and what bounds them."""
        # "attached": sockets bound to a session; "handshaking": open sockets that have not
        # completed their handshake yet (closed after stub.handshake_seconds).
        self.stub_connections = Gauge(
            "rethink_mn_stub_connections",
            "Open stub WebSocket connections, by state.",
            ["state"],
            registry=registry,
        )
        self.handshake_timeouts = Counter(
            "rethink_mn_stub_handshake_timeouts_total",
            "Stub sockets closed for not completing their handshake in time.",
            registry=registry,
        )
        self.connect_seconds = Histogram(
            "rethink_mn_stub_connect_seconds",
            "From a runtime's connect reaching the node (the WebSocket upgrade request, or the "
            "connect frame of the v1 handshake) to the node's answer, by session (new or "
            "resumed).",
            ["session"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.bound_refusals = Counter(
            "rethink_mn_bound_refusals_total",
            "Requests refused because a client (scope 'client') or the node (scope 'total') "
            "holds its most of a resource (adapter/bounds.py).",
            ["resource", "scope"],
            registry=registry,
        )
        self.paced_seconds = Counter(
            "rethink_mn_stub_paced_seconds_total",
            "Seconds stub sockets were not read because their senders exceeded their rates.",
            registry=registry,
        )
        self.sessions = Gauge(
            "rethink_mn_sessions",
            "Runtime sessions the node holds (attached or detached).",
            registry=registry,
        )
        self.sessions_evicted = Counter(
            "rethink_mn_sessions_evicted_total",
            "Detached sessions released before their lifetime ended: too many were detached.",
            registry=registry,
        )
        self.quota_refusals = Counter(
            "rethink_mn_quota_refusals_total",
            "Requests refused, or deliveries dropped, because a session reached a quota.",
            ["quota"],
            registry=registry,
        )

    def _add_event_loop_metrics(self, registry: CollectorRegistry) -> None:
        """What holds the event loop (and so every delivery)."""
        self.tasks = Gauge(
            "rethink_mn_event_loop_tasks",
            "Tasks alive on the node's event loop (read at scrape time): a count that only "
            "grows is a leak.",
            registry=registry,
        )
        self.background_failures = Counter(
            "rethink_mn_background_task_failures_total",
            "Background tasks that ended in an exception, by whose they were (each is logged "
            "as `background task failed` with its traceback): a bug, or an outage not retried.",
            ["tasks"],
            registry=registry,
        )
        self.loop_lag = Histogram(
            "rethink_mn_event_loop_lag_seconds",
            "How late the event loop woke a timer (sampled 10 times a second): whatever holds "
            "the loop delays every delivery and reconnect by as much.",
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )
        self.loop_stalls = Counter(
            "rethink_mn_event_loop_stalls_total",
            "Times the event loop was held past logging.report_loop_stalls_over_ms; each is "
            "logged with the stack that held it (adapter/stalls.py).",
            registry=registry,
        )
        self.gc_pause = Histogram(
            "rethink_mn_gc_pause_seconds",
            "Python's garbage collections by generation: each holds the event loop for as long.",
            ["generation"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
        )

    def _add_message_metrics(self, registry: CollectorRegistry) -> None:
        """reTHINK messages in and out, end to end."""
        self.messages_in = Counter(
            "rethink_mn_messages_received_total",
            "reTHINK messages received from stubs, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.messages_out = Counter(
            "rethink_mn_messages_delivered_total",
            "reTHINK messages delivered to stubs, by path (live or queued for a detached runtime).",
            ["path"],
            registry=registry,
        )
        self.duplicates = Counter(
            "rethink_mn_duplicates_dropped_total",
            "Messages not routed again: resends of what the node had already taken, by where "
            "they were recognised.",
            ["where"],
            registry=registry,
        )
        self.failed_items = Counter(
            "rethink_mn_failed_items_total",
            "Messages that failed inside the node on a path that carries many together (a lane "
            "event's delivery, a peer's event), by path: each was answered to its sender with "
            "an error, or skipped and logged, and the others went on.",
            ["path"],
            registry=registry,
        )
        self.route_seconds = Histogram(
            "rethink_mn_route_seconds",
            "From a message's arrival at the node to its delivery to the destination stub.",
            registry=registry,
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )

    def _add_homeserver_metrics(self, registry: CollectorRegistry) -> None:
        """The node's own room events, checkpoints and background streams."""
        self.matrix_events_out = Counter(
            "rethink_mn_matrix_events_sent_total",
            "Room events the node sent to carry reTHINK messages, by carrier.",
            ["carrier"],
            registry=registry,
        )
        self.matrix_events_in = Counter(
            "rethink_mn_matrix_events_received_total",
            "Room events handled, by outcome: delivered (a lane event once the homeserver "
            "persisted it, a peer's event from the push), undecodable, ignored, retried (a "
            "consumer failed: the transaction comes again), failed (given up after retries).",
            ["outcome"],
            registry=registry,
        )
        self.lane_waits = Counter(
            "rethink_mn_lane_waits_total",
            "Lane events of another node process of the domain held until the lanes they name "
            "were read here (a runtime moved between processes: its earlier messages first).",
            registry=registry,
        )
        self.send_seconds = Histogram(
            "rethink_mn_homeserver_send_seconds",
            "From taking a batch to the homeserver's answer that it persisted the event.",
            registry=registry,
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.checkpoints = Counter(
            "rethink_mn_checkpoints_total",
            "Checkpoints written (kept deliveries, lane positions, sender marks), by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.kept_deliveries = Counter(
            "rethink_mn_kept_deliveries_total",
            "Deliveries written to the database for a runtime that was away or slow to "
            "acknowledge.",
            registry=registry,
        )
        self.refused_items = Counter(
            "rethink_mn_homeserver_refused_items_total",
            "Items (messages, journal entries) the homeserver refused to carry for good, by "
            "stream; each routed one was answered to its sender with an error.",
            ["stream"],
            registry=registry,
        )
        self.stream_dropped = Counter(
            "rethink_mn_stream_items_dropped_total",
            "Background items (journal entries) not kept because their stream's queue was full "
            "while the homeserver was away.",
            ["stream"],
            registry=registry,
        )
        self.dashboard_dropped = Counter(
            "rethink_mn_dashboard_events_dropped_total",
            "Room events the dashboard's figures miss: not kept for its worker because the "
            "buffer or the spool was full (a stuck disk, a worker that is not consuming).",
            ["reason"],
            registry=registry,
        )

    def _add_peer_metrics(self, registry: CollectorRegistry) -> None:
        """Other reTHINK domains' nodes (federation and flow control)."""
        self.peer_events = Counter(
            "rethink_mn_peer_events_total",
            "Peer domains' events not handled in order, by what happened: not_held (beyond the "
            "bounds of held events, read again later), lost (a gap never filled), skipped (could "
            "not be handled), ignored (in a room the peer may not write).",
            ["outcome"],
            registry=registry,
        )
        self.peer_paced = Counter(
            "rethink_mn_peer_paced_total",
            "Times the next event to a peer domain waited because its node had not confirmed "
            "the events in flight (flow control), by how the wait ended: confirmed, or max_hold "
            "(it left without a confirmation).",
            ["peer", "outcome"],
            registry=registry,
        )
        self.peer_confirm_seconds = Histogram(
            "rethink_mn_peer_confirm_seconds",
            "From an event to a peer domain being persisted here to its node's confirmation "
            "(read receipt) arriving: the round trip flow control waits on.",
            registry=registry,
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10),
        )
        self.peer_event_age_seconds = Histogram(
            "rethink_mn_peer_event_age_seconds",
            "From a peer domain's event being stamped by its homeserver (origin_server_ts) to "
            "this node handling it: how far behind federation and this node's reading of the "
            "peer's room are (the two servers' clocks both in it).",
            registry=registry,
            buckets=(0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30),
        )
        self.peer_behind = Gauge(
            "rethink_mn_peer_behind",
            "1 while flow control holds what is sent to a peer domain to a window of events "
            "(its node confirms too slowly to keep up, or the traffic to it is heavy); 0 while "
            "every event leaves at once.",
            ["peer"],
            registry=registry,
        )
        self.peer_fell_behind = Counter(
            "rethink_mn_peer_fell_behind_total",
            "Times a peer domain's node was found behind (flow control's window came into "
            "force), by what showed it: round_trip (confirmations slower than BEHIND times "
            "their floor), overdue (an event unconfirmed for too long) or load (an event "
            "carried many messages: traffic too heavy to leave unpaced).",
            ["peer", "reason"],
            registry=registry,
        )
        self.peer_unconfirmed = Gauge(
            "rethink_mn_peer_unconfirmed_events",
            "Events sent to a peer domain that its node has not yet confirmed handling.",
            ["peer"],
            registry=registry,
        )

    def bound_refused(self, resource: str, scope: str) -> None:
        """A client (scope "client") or the node ("total") held its most of ``resource``."""
        self.bound_refusals.labels(resource, scope).inc()


HealthProbe = Callable[[], Awaitable[dict[str, Any]]]


class HealthEndpoints:
    """`GET /health` runs every probe concurrently and reports each one's details; 200 only when
    all are healthy, 503 otherwise (what load balancers and orchestrators expect)."""

    def __init__(self, probes: dict[str, HealthProbe], metrics: NodeMetrics, timeout: float = 5.0):
        self._probes = probes
        self._metrics = metrics
        self._timeout = timeout

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self.on_health)
        app.router.add_get("/metrics", self.on_metrics)

    async def _run(self, name: str, probe: HealthProbe) -> dict[str, Any]:
        started = time.monotonic()
        try:
            details = await asyncio.wait_for(probe(), self._timeout)
            result = {"ok": True, **details}
        except TimeoutError:
            result = {"ok": False, "error": f"no answer within {self._timeout:.0f}s"}
        except Exception as exc:  # noqa: BLE001 - a failing probe is the report
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        elapsed = time.monotonic() - started
        self._metrics.health_check_seconds.labels(name).set(elapsed)
        result["latency_ms"] = round(elapsed * 1000, 1)
        return result

    async def on_health(self, _request: web.Request) -> web.Response:
        names = list(self._probes)
        results = await asyncio.gather(*(self._run(n, self._probes[n]) for n in names))
        checks = dict(zip(names, results, strict=True))
        healthy = all(r["ok"] for r in results)
        return web.json_response(
            {"status": "ok" if healthy else "unhealthy", "checks": checks},
            status=200 if healthy else 503,
        )

    async def on_metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
