"""Where room events pushed by the homeserver enter the reTHINK side.

The appservice server hands every transaction's events here; each event goes to the consumer
registered for its type. A consumer that fails for a reason outside the events (RetryTransaction,
the database away) fails the transaction, and the homeserver sends it again until it goes
through. One that fails otherwise (a bug, an event it cannot take) fails it too, so that a
passing fault loses nothing, but only MAX_ATTEMPTS times: then its events are given up, logged
with their ids and counted, so that one poisonous event cannot stop the domain's traffic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from ..observability import NodeMetrics
from ..storage.database import unavailable as database_unavailable

log = structlog.get_logger(__name__)

# How often one transaction is tried when a consumer fails on it with an unexpected error.
MAX_ATTEMPTS = 3
# Transactions whose failed attempts are remembered (the homeserver retries one at a time).
_REMEMBERED = 1024


class RetryTransaction(Exception):
    """A consumer could not process events for a reason outside them (database down,
    homeserver media unreachable): the transaction must fail so the homeserver retries it."""


EventConsumer = Callable[[str, list[dict[str, Any]]], Awaitable[None]]


class InboundEvents:
    def __init__(self, metrics: NodeMetrics) -> None:
        self._consumers: dict[str, list[EventConsumer]] = {}
        self._ephemeral: dict[str, EventConsumer] = {}
        self._metrics = metrics
        self._failed_attempts: OrderedDict[str, int] = OrderedDict()

    def subscribe(self, event_type: str, consumer: EventConsumer) -> None:
        """``consumer(txn_id, events)`` receives, in order, the events of that type in a
        transaction, and may get them again (a retried transaction): it must take an event twice
        as once. It should isolate failures per event itself. If it raises RetryTransaction (or the
        database is unreachable) the transaction fails and the homeserver retries it; any other
        exception does the same MAX_ATTEMPTS times, then the group is given up."""
        self._consumers.setdefault(event_type, []).append(consumer)

    def subscribe_ephemeral(self, event_type: str, consumer: EventConsumer) -> None:
        """``consumer(txn_id, events)`` receives the ephemeral events of that type (receipts,
        typing: nothing is stored or retried for them; a failure is only logged)."""
        self._ephemeral[event_type] = consumer

    async def handle_ephemeral(self, txn_id: str, events: list[dict[str, Any]]) -> None:
        groups: dict[str, list[dict[str, Any]]] = {}
        for event in events:
            event_type = event.get("type")
            if isinstance(event_type, str) and event_type in self._ephemeral:
                groups.setdefault(event_type, []).append(event)
        for event_type, group in groups.items():
            try:
                await self._ephemeral[event_type](txn_id, group)
            except Exception:
                log.exception("ephemeral event consumer failed", event_type=event_type)

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
                except RetryTransaction:
                    raise
                except Exception as exc:
                    # A database that is away is no fault of the events, whichever path (and so
                    # whichever error family) noticed it: never counted towards giving them up.
                    if database_unavailable(exc):
                        raise RetryTransaction(f"{event_type}: database unavailable") from exc
                    self._failed(txn_id, event_type, group, exc)
        self._failed_attempts.pop(txn_id, None)

    def _failed(
        self, txn_id: str, event_type: str, group: list[dict[str, Any]], exc: Exception
    ) -> None:
        """Raise RetryTransaction while the transaction has attempts left; else give up."""
        attempt = self._failed_attempts.pop(txn_id, 0) + 1
        ids = [e.get("event_id") for e in group[:20]]
        if attempt < MAX_ATTEMPTS:
            self._failed_attempts[txn_id] = attempt
            while len(self._failed_attempts) > _REMEMBERED:
                self._failed_attempts.popitem(last=False)
            log.warning(
                "event consumer failed; the transaction will come again",
                txn_id=txn_id,
                event_type=event_type,
                attempt=attempt,
                error=repr(exc),
            )
            self._metrics.matrix_events_in.labels("retried").inc(len(group))
            raise RetryTransaction(f"{event_type} consumer failed: {exc!r}") from exc
        log.error(
            "event consumer failed on every attempt; these events are given up",
            txn_id=txn_id,
            event_type=event_type,
            attempts=attempt,
            events=len(group),
            event_ids=ids,
            exc_info=exc,
        )
        self._metrics.matrix_events_in.labels("failed").inc(len(group))
