"""Where room events pushed by the homeserver enter the reTHINK side.

The appservice server hands every transaction's events here; each event goes to the consumer
registered for its type. One event that fails is logged and counted, never allowed to fail the
transaction (the homeserver would otherwise retry it forever).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from sqlalchemy.exc import OperationalError

from ..observability import NodeMetrics

log = structlog.get_logger(__name__)


class RetryTransaction(Exception):
    """A consumer could not process events for a reason outside them (database down,
    homeserver media unreachable): the transaction must fail so the homeserver retries it."""


EventConsumer = Callable[[str, list[dict[str, Any]]], Awaitable[None]]


class InboundEvents:
    def __init__(self, metrics: NodeMetrics) -> None:
        self._consumers: dict[str, list[EventConsumer]] = {}
        self._metrics = metrics

    def subscribe(self, event_type: str, consumer: EventConsumer) -> None:
        """``consumer(txn_id, events)`` receives, in order, the events of that type in a
        transaction. It should isolate failures per event itself. If it raises RetryTransaction (or
        the database is unreachable) the transaction fails and the homeserver retries it; any other
        exception counts the group as failed and the transaction still succeeds."""
        self._consumers.setdefault(event_type, []).append(consumer)

    async def handle_events(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        groups: dict[str, list[dict[str, Any]]] = {}
        ignored = 0
        for event in events:
            event_type = event.get("type")
            if isinstance(event_type, str) and event_type in self._consumers:
                groups.setdefault(event_type, []).append(event)
            else:
                ignored += 1
        if ignored:
            self._metrics.matrix_events_in.labels("ignored").inc(ignored)
        for event_type, group in groups.items():
            for consumer in self._consumers[event_type]:
                try:
                    await consumer(txn_id, group)
                except (RetryTransaction, OperationalError):
                    raise
                except Exception:
                    log.exception(
                        "event consumer failed",
                        txn_id=txn_id,
                        event_type=event_type,
                        events=len(group),
                    )
                    self._metrics.matrix_events_in.labels("failed").inc(len(group))
