"""Where routed messages leave the node for runtimes: the batch events the homeserver pushes.

For each event, in the order the homeserver sends them: read the batch (inline or from the media
repository), find each message's destinations in the routing table as it is now, and hand the
exact text to every destination session: to its socket if connected, else kept in the database
for its resume. Receipts of how many runtimes each message reached go to the journal. Kept
messages are written before the transaction is acknowledged.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import structlog

from appservice.api import HomeserverUnreachable, MatrixError
from appservice.intent import AppserviceAPI

from ..inbound import RetryTransaction
from ..observability import NodeMetrics
from ..sessions import SessionManager
from . import carrier
from .journal import Journal
from .table import RoutingTable

log = structlog.get_logger(__name__)


class Delivery:
    def __init__(
        self,
        api: AppserviceAPI,
        table: RoutingTable,
        sessions: SessionManager,
        journal: Journal,
        metrics: NodeMetrics,
    ) -> None:
        self._api = api
        self._table = table
        self._sessions = sessions
        self._journal = journal
        self._metrics = metrics

    async def on_batch_events(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        for event in events:
            await self._deliver_event(event)
        # Kept messages must be durable before the homeserver considers them delivered.
        await self._sessions.persist_pending()

    async def _fetch(self, uri: str) -> bytes:
        try:
            return await self._api.bot.download(uri)
        except (HomeserverUnreachable, MatrixError) as exc:
            if isinstance(exc, MatrixError) and exc.status == 404:
                raise carrier.CarrierError(f"media {uri} not found") from None
            # Not this event's fault: make the homeserver retry the transaction later.
            raise RetryTransaction(f"media {uri} unavailable: {exc}") from exc

    async def _deliver_event(self, event: dict[str, Any]) -> None:
        event_id = event.get("event_id")
        try:
            messages = await carrier.decode_messages(event.get("content"), self._fetch)
        except carrier.CarrierError as exc:
            log.warning("undecodable batch event skipped", event_id=event_id, error=str(exc))
            self._metrics.matrix_events_in.labels("undecodable").inc()
            return
        sender = self._sessions.by_user(str(event.get("sender", "")))
        sender_id = sender.id if sender is not None else None
        sent_at = event.get("origin_server_ts")
        delivered: list[int] = []
        for text, to in messages:
            delivered.append(await self.deliver_text(text, sender_id, event_id, to))
        self._metrics.matrix_events_in.labels("delivered").inc()
        if isinstance(sent_at, int):
            self._metrics.route_seconds.observe(max(time.time() - sent_at / 1000, 0.0))
        if isinstance(event_id, str):
            self._journal.receipt(event_id, delivered)

    async def deliver_text(
        self,
        text: Any,
        sender_id: int | None,
        event_id: Any,
        to: tuple[str, ...] | None = None,
    ) -> int:
        """Hand one message text to every session its `to` names (read from the text unless the
        carrier brought it along); returns how many."""
        if not isinstance(text, str):
            self._metrics.messages_out.labels("malformed").inc()
            return 0
        targets = to if to is not None else _targets(text)
        if targets is None:
            self._metrics.messages_out.labels("malformed").inc()
            return 0
        sessions = self._table.destinations(targets, sender_id).sessions
        if not sessions:
            self._metrics.messages_out.labels("no_destination").inc()
            return 0
        payload = text.encode() if len(sessions) > 1 else None
        live = queued = 0
        for session_id in sessions:
            outcome = await self._sessions.deliver(session_id, text, event_id, payload)
            if outcome == "live":
                live += 1
            elif outcome == "queued":
                queued += 1
        if live:
            self._metrics.messages_out.labels("live").inc(live)
        if queued:
            self._metrics.messages_out.labels("queued").inc(queued)
        count = live + queued
        return count


def _targets(text: str) -> tuple[str, ...] | None:
    try:
        to = orjson.loads(text).get("to")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if isinstance(to, str):
        return (to,)
    if isinstance(to, list):
        return tuple(t for t in to if isinstance(t, str))
    return ()
