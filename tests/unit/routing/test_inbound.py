"""Where the homeserver's pushed events enter: a consumer's unexpected failure fails the
transaction (the homeserver sends it again) a bounded number of times, then its events are given
up so that one poisonous event cannot stop every later transaction."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from adapter.observability import NodeMetrics
from adapter.routing.inbound import MAX_ATTEMPTS, InboundEvents, RetryTransaction
from adapter.storage.database import storage_error, unavailable

EVENTS = [{"type": "m.test", "event_id": "$1"}, {"type": "m.other", "event_id": "$2"}]


def inbound() -> tuple[InboundEvents, CollectorRegistry]:
    registry = CollectorRegistry()
    return InboundEvents(NodeMetrics(registry)), registry


def counted(registry: CollectorRegistry, outcome: str) -> float:
    name = "rethink_mn_matrix_events_received_total"
    return registry.get_sample_value(name, {"outcome": outcome}) or 0.0


async def test_a_passing_failure_fails_the_transaction_and_the_retry_delivers() -> None:
    events, registry = inbound()
    seen: list[str] = []
    calls = {"n": 0}

    async def flaky(_txn: str, group: list[dict[str, Any]]) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError("a bug on a bad day")
        seen.extend(e["event_id"] for e in group)

    events.subscribe("m.test", flaky)
    with pytest.raises(RetryTransaction):
        await events.handle_events("t1", EVENTS)
    await events.handle_events("t1", EVENTS)  # the homeserver sends it again
    assert seen == ["$1"]
    assert counted(registry, "retried") == 1 and counted(registry, "failed") == 0
    assert counted(registry, "ignored") == 2  # m.other, on both attempts


async def test_a_poisonous_transaction_is_given_up_after_its_attempts() -> None:
    events, registry = inbound()

    async def broken(_txn: str, _group: list[dict[str, Any]]) -> None:
        raise ValueError("cannot take this event")

    events.subscribe("m.test", broken)
    for _ in range(MAX_ATTEMPTS - 1):
        with pytest.raises(RetryTransaction):
            await events.handle_events("t2", EVENTS)
    await events.handle_events("t2", EVENTS)  # given up: the transaction succeeds
    assert counted(registry, "failed") == 1
    # Another transaction gets its own attempts.
    with pytest.raises(RetryTransaction):
        await events.handle_events("t3", EVENTS)


def _outages() -> list[BaseException]:
    """The database away, as each execution path's driver reports it: SQLAlchemy's wrapper
    (``run``), the drivers' own errors (``run_small`` and ``execute_small``), a pool with no
    connection. The Database raises each as the one DatabaseUnavailable."""
    return [
        OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked")),
        sqlite3.OperationalError("disk I/O error"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.InterfaceError("the connection is closed"),
        PoolTimeout("QueuePool limit reached"),
        DBAPIError("SELECT 1", {}, ConnectionResetError(), connection_invalidated=True),
    ]


@pytest.mark.parametrize("outage", _outages(), ids=lambda e: type(e).__name__)
async def test_a_database_outage_on_any_path_is_retried_and_never_given_up(
    outage: BaseException,
) -> None:
    events, registry = inbound()

    raised = storage_error(outage)
    assert unavailable(raised) and raised.__cause__ is outage

    async def database_away(_txn: str, _group: list[dict[str, Any]]) -> None:
        raise raised

    events.subscribe("m.test", database_away)
    # Far past the attempts a poisonous event gets: each one still fails the transaction.
    for _ in range(MAX_ATTEMPTS * 3):
        with pytest.raises(RetryTransaction):
            await events.handle_events("t4", EVENTS)
    assert counted(registry, "failed") == 0 and counted(registry, "retried") == 0


def test_a_bug_is_not_an_outage() -> None:
    assert not unavailable(storage_error(ValueError("cannot take this event")))
    for conflict in (
        IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE")),
        psycopg.errors.UniqueViolation("duplicate key"),
    ):
        assert not unavailable(storage_error(conflict))
